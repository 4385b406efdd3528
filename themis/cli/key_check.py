"""A key typo refused in a fraction of a second: the launchers (``scripts/launch.sh``) run this
check before they start Python with PyTorch, Hydra and the envs.

The schema's keys come from PyTorch-importing modules (the agents' and methods' settings live
beside their code), so they are kept in an index file that the full check
(:func:`themis.cli.train.check_overrides`) writes on any launch: ``themis/keys-DIGEST.json`` in
the user's cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``), where DIGEST is a hash of
Themis's sources and config files — another version of the code reads another file. Without
the index (the first launch after a change) this check says nothing and the full check
refuses the typo with the same line.

It refuses only what it can tell alone, with the full check's line: a key that is not in the
schema at the top level or inside one of its groups (``sac.hiden_dim``), a removed key, and an
option a config group does not have (``teacher=nosy``) or an unknown domain (``domain=dmc``).
Everything else (values, ``+key``, the keys of ``env_kwargs``, config groups, Hydra's own keys
and flags) is left to the full check. Only the standard library is imported.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from themis.core.choices import unknown_choice
from themis.run.hints import help_command

ROOT = Path(__file__).resolve().parents[2]
CONFIG_NAMES = {"themis.cli.train": "train_themis", "themis.cli.pretrain": "pretrain_themis"}
"""The launchers' modules and their Hydra configs."""


def source_digest(root: Path = ROOT) -> str:
    """A hash of every ``themis/**/*.py`` and ``config/**/*.yaml`` under ``root`` (path and
    bytes), 16 hex digits: the schema's version."""
    digest = hashlib.sha256()
    files = sorted([*(root / "themis").rglob("*.py"), *(root / "config").rglob("*.yaml")])
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def index_path(root: Path = ROOT) -> Path:
    """Where the key index of this version of the code lives (see the module docstring)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "themis" / f"keys-{source_digest(root)}.json"


def save_index(make_index: Callable[[], dict[str, Any]], path: Path | None = None) -> None:
    """Write the index ``make_index()`` builds (:func:`themis.run.config.key_index`) unless it
    is there (then it is not built); a cache folder that cannot be written is skipped (the full
    check still runs)."""
    path = path or index_path()
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(make_index()))
        os.replace(temporary, path)
    except OSError:
        pass


def refusal(index: dict[str, Any], config_name: str, argv: list[str]) -> str | None:
    """The line that refuses the first unknown or removed key of ``argv`` (``key=value``
    overrides), as the full check words it, or ``None`` when this check cannot tell.

    ``index``: ``keys`` (every schema key, dotted, and the config groups: ``method``,
    ``teacher``, ...), ``groups`` (the schema's groups of keys: ``sac``, ``logger``, ...; not
    ``env_kwargs``, whose keys are the user's), ``removed`` (removed key -> why), ``options``
    (config group -> its options: ``teacher=nosy`` is refused as Hydra's composition is),
    ``domains`` (the domains, in order).
    """
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return None  # --help, --cfg, a key written as a flag: the full check's
    keys, groups = set(index["keys"]), set(index["groups"])
    for arg in argv:
        if "=" not in arg or arg.startswith(("-", "+", "~", "hydra.", "hydra/")):
            continue
        key, value = arg.split("=", 1)
        options = index["options"].get(key)
        if options is not None and re.fullmatch(r"[\w-]+", value) and value not in options:
            return f"{key}={value} is unknown; available: {', '.join(options)}"
        if key == "domain" and re.fullmatch(r"[\w-]+", value) and value not in index["domains"]:
            return unknown_choice(key, value, index["domains"])
        parent = key.rpartition(".")[0]
        if key in keys or "/" in key or "@" in key or (parent and parent not in groups):
            continue
        if key in index["removed"]:
            return f"{key} was removed from Themis ({index['removed'][key]}); drop it"
        close = difflib.get_close_matches(key, index["keys"], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"{key} is not a Themis config key{hint}; {help_command(config_name)} lists them"
    return None


def main(argv: list[str]) -> int:
    """``python -m themis.cli.key_check MODULE ARGS...``: exit 2 with the line on stderr when
    a key is refused, 0 otherwise (also without an index)."""
    config_name = CONFIG_NAMES.get(argv[0]) if argv else None
    if config_name is None:
        return 0
    try:
        index = json.loads(index_path().read_text())
    except (OSError, ValueError):
        return 0
    line = refusal(index, config_name, argv[1:])
    if line is None:
        return 0
    print(f"themis: error: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
