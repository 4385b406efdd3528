#!/usr/bin/env python
"""Queries on an offline dataset for people: pairs of its segments, rendered as clips, posted to
a label store that the web labeling page serves.

    python scripts/offline_queries.py DATASET OUT_DIR --env HalfCheetah-v5 --queries 100
    python scripts/label_server.py OUT_DIR --labelers 3        # people answer on the web page
    python scripts/store_to_prefs.py OUT_DIR OUT_DIR/preferences
    ./themis_train.sh mode=offline dataset=DATASET env=HalfCheetah-v5 domain=Control \\
        labels=OUT_DIR/preferences

The segments are drawn uniformly inside the dataset's episodes (the offline runs' query
selector) and rendered from their observations (:mod:`themis.offline.render`: gymnasium's MuJoCo
locomotion envs). ``OUT_DIR/labels.sqlite`` is an online run's label store: every answer the
server accepts is on disk before it says so, the segments of each query are saved beside it
(``web/queries/q_ID.npz``), and ``store_to_prefs.py`` turns the answers into a preference
dataset. Running the script again on the same folder adds a new round of queries.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import sys
from pathlib import Path

from themis.core.script_args import ScriptParser, int_at_least


def main(argv: list[str] | None = None) -> int:
    parser = ScriptParser(prog="offline_queries", description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a dataset mode=offline reads (Minari folder or "
                        "minari:ID, D4RL file, run folder, rollouts)")
    parser.add_argument("out", type=Path, help="the label store's folder (made if missing)")
    parser.add_argument("--env", default="", help="the gymnasium id to render with (default: "
                        "the dataset's)")
    parser.add_argument("--domain", default="Gym")
    parser.add_argument("--queries", type=int_at_least(1), default=50)
    parser.add_argument("--segment", type=int_at_least(1), default=50)
    parser.add_argument("--labels-per-query", type=int_at_least(1), default=1,
                        help="people who answer each query (a crowd's aggregation reads them)")
    parser.add_argument("--size", type=int_at_least(16), default=128, help="frame pixels")
    parser.add_argument("--fps", type=int_at_least(1), default=30)
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    args = parser.parse_args(argv)

    import numpy as np

    from lib.clips import poster_path, write_poster
    from lib.human_interface import query_clip, write_clip
    from themis.crowd.label_store import LabelStore, UnsafeStoreError
    from themis.environments.domains import make_env
    from themis.offline.datasets import load_offline_dataset
    from themis.offline.render import segment_frames
    from themis.utils import ConfigError

    try:
        data = load_offline_dataset(args.dataset, args.env or None)
        env_id = args.env or data.env_id or ""
        if not env_id or (":" in env_id and not args.env):
            raise ConfigError("give --env: the gymnasium id whose simulator renders the segments")
        pairs = data.sample_segment_pairs(args.queries, args.segment,
                                          np.random.default_rng(args.seed))
        env = make_env(args.domain, env_id, seed=args.seed, render_mode="rgb_array",
                       render_size=args.size)
        env.reset(seed=args.seed)
        store = LabelStore(args.out / "labels.sqlite", args.out / "web")
        previous = store.db.execute("SELECT MAX(round) FROM queries").fetchone()[0]
        round_ = 0 if previous is None else int(previous) + 1
        clips = []
        for i in range(len(pairs)):
            frames = np.stack([segment_frames(env, pairs.observations[i, side])
                               for side in (0, 1)])
            clip = query_clip(frames)  # segment 1 left, as an online run's
            path = write_clip(clip, args.out / "web" / "clips" / f"offline{round_:04d}_{i:03d}.mp4",
                              args.fps)
            write_poster(clip[0], poster_path(path))
            clips.append(path)
        env.close()
        ids = store.post(round_, pairs, clips, labels_needed=args.labels_per_query)
    except (ConfigError, UnsafeStoreError) as e:
        print(f"offline_queries: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(ids)} queries posted to {args.out / 'labels.sqlite'} (round {round_}); serve "
          f"them with: python scripts/label_server.py {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
