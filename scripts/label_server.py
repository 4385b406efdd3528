#!/usr/bin/env python
"""Serve a run's labeling page on its own, e.g. while the run trains on a cluster.

    python scripts/label_server.py RUN_DIR                          # http://127.0.0.1:8765/
    python scripts/label_server.py RUN_DIR --host 0.0.0.0 --labelers 5   # prints 5 token URLs
    python scripts/label_server.py RUN_DIR --labelers 5 --new-tokens     # new links for all 5

Only a hash of each token is stored: a labeler's link is printed once, when it is created, and
so is the link of the run's owner (the status page with every labeler's scores; a labeler sees
only their own); ``--new-tokens`` replaces lost links (the old ones stop working).

Reads and writes ``RUN_DIR/labels.sqlite`` (the run's posted queries and the answers; see
``themis/crowd/label_store.py``); the run gathers the answers at its next feedback round. Stop with
Ctrl-C: every answer is already on disk.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
from pathlib import Path

from themis.core.script_args import ScriptParser


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="label_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--labelers", type=int, default=0, help="labeler tokens to create")
    parser.add_argument("--new-tokens", action="store_true",
                        help="give existing labelers new tokens (their old links stop working)")
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"label_server: error: --port {args.port} is not a TCP port (0-65535; 0: any free "
              "port)", file=sys.stderr)
        return 2
    db = args.run_dir / "labels.sqlite"
    if not db.is_file():
        print(f"label_server: error: {db} not found; start the run with human_teacher=true "
              "teacher_ui=web", file=sys.stderr)
        return 2
    from lib.label_server import LabelServer  # FastAPI and the store: after the arguments
    from themis.crowd.label_store import OWNER, LabelStore, UnsafeStoreError

    try:
        store = LabelStore(db, args.run_dir / "web")
    except UnsafeStoreError as e:  # a received store's triggers or views: nothing runs
        print(f"label_server: error: {e}", file=sys.stderr)
        return 2
    tokens = store.add_labelers(args.labelers, renew=args.new_tokens) if args.labelers else []
    owner = store.owner_token(renew=args.new_tokens) if args.labelers else None
    try:
        server = LabelServer(store, args.host, args.port, args.run_dir).start()
    except (RuntimeError, ValueError) as e:
        print(f"label_server: error: {e}", file=sys.stderr)
        return 2
    for name, token in tokens:
        if token is None:
            print(f"{name}: keeps its link (only its token's hash is stored; --new-tokens "
                  "gives new links)")
        else:
            print(f"{name}: {server.url}?token={token}")
    if owner is not None:
        print(f"{OWNER} (status of every labeler): {server.url}status?token={owner}")
    elif tokens:
        print(f"{OWNER}: keeps the status link printed when it was created (--new-tokens gives "
              "a new one)")
    if not tokens:
        print(f"labeling page: {server.url}  (status: {server.url}status)")
    try:
        server.thread.join()
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
