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
option a config group does not have (``teacher=nosy``) or an unknown domain (``domain=dmc``),
and a number outside its range (``seed=-1``: the index holds
:data:`themis.run.validation.NUMERIC_KEYS`' ranges).
An ``env=`` name is refused (``domain=DMC env=walker_wlak``) when the lists of names it needs
were saved by an earlier launch (``themis/envs-DIGEST.json`` beside the index: each domain's
names, saved once a run has listed them, used only with the same versions of the packages that
define them; the rule is :mod:`themis.core.env_names`).
Everything else (other values and combinations, ``+key``, the keys of ``env_kwargs``, config
groups, Hydra's own keys and flags, a resumed run's env) is left to the full check. Only the
standard library is imported.
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
from themis.core.env_names import DISTRIBUTIONS, NotListed, find_env, unknown_env
from themis.core.foreign_keys import foreign_key
from themis.core.ranges import Range
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


CACHE_LIMIT = 16 << 20
"""Bytes of the largest cache file read (the key index is about 100 kB)."""

INDEX_KEYS = ("keys", "groups", "ranges", "removed", "options", "domains")
"""What a key index holds (:func:`themis.run.key_index.key_index`)."""


def read_cache(path: Path, required: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """A cache file's JSON object, or ``None`` when it cannot be trusted or read: not a regular
    file (a FIFO would block the launcher, a link may point anywhere), over
    :data:`CACHE_LIMIT`, not the user's own or writable by others (planted), not a JSON object
    with the ``required`` keys. ``None`` means: check in full, and write the cache anew."""
    import stat

    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > CACHE_LIMIT \
                or info.st_mode & 0o022 or (hasattr(os, "getuid") and
                                            info.st_uid != os.getuid()):
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(key in data for key in required):
        return None
    return data


def save_index(make_index: Callable[[], dict[str, Any]], path: Path | None = None) -> None:
    """Write the index ``make_index()`` builds (:func:`themis.run.key_index.key_index`) unless a
    trusted one is there (then it is not built; one :func:`read_cache` refuses is replaced); a
    cache folder that cannot be written is skipped (the full check still runs)."""
    path = path or index_path()
    if read_cache(path, INDEX_KEYS) is not None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(make_index()))
        os.chmod(temporary, 0o644)  # read_cache trusts no file others may write
        os.replace(temporary, path)
    except OSError:
        pass


def env_lists_path(root: Path = ROOT) -> Path:
    """Where the domains' saved lists of env names live, beside the key index."""
    return index_path(root).with_name(index_path(root).name.replace("keys-", "envs-", 1))


def _versions(domain: str) -> dict[str, str | None]:
    from importlib import metadata  # ~25 ms: only when an env name is checked or saved

    versions: dict[str, str | None] = {}
    for name in DISTRIBUTIONS[domain]:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def save_env_lists(listed: dict[str, tuple[list[str], str]], path: Path | None = None) -> None:
    """Add the domains' lists ``listed`` (name -> (env names, id prefix),
    :data:`themis.environments.domains.LISTED`) to the saved lists, with the versions of the
    packages that define them; nothing is written when they are there already, and a cache
    folder that cannot be written is skipped."""
    path = path or env_lists_path()
    saved = read_cache(path) or {}
    new = {name: {"ids": ids, "prefix": prefix, "versions": _versions(name)}
           for name, (ids, prefix) in listed.items() if name in DISTRIBUTIONS}
    if all(saved.get(name) == entry for name, entry in new.items()):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({**saved, **new}))
        os.chmod(temporary, 0o644)  # read_cache trusts no file others may write
        os.replace(temporary, path)
    except OSError:
        pass


def env_refusal(saved: dict[str, Any], domain: str, env: str) -> str | None:
    """The full check's line for ``env=env`` in ``domain`` when the name is not there, from the
    saved lists ``saved`` (:func:`save_env_lists`); ``None`` when the name is there or when a
    list the line needs was not saved (or was saved with other package versions)."""
    checked: dict[str, tuple[list[str], str]] = {}

    def listing(name: str) -> tuple[list[str], str]:
        entry = saved.get(name)
        if name not in checked:
            if not isinstance(entry, dict) or entry.get("versions") != _versions(name):
                raise NotListed(name)
            checked[name] = (list(entry["ids"]), str(entry["prefix"]))
        return checked[name]

    try:
        ids, prefix = listing(domain)
        if find_env(domain, env, ids, prefix) is not None:
            return None
        return unknown_env(domain, env, ids, prefix, listing)
    except (NotListed, KeyError, TypeError):
        return None


def assignments(argv: list[str]) -> dict[str, str]:
    """``key=value`` overrides of a command line as key -> value text (the last one of a key
    wins, as in Hydra); additions (``+key``), deletions (``~key``) and flags are left out."""
    return dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith(("+", "~", "-")))


def chosen_env(index: dict[str, Any], argv: list[str]) -> tuple[str, str] | None:
    """The domain and the ``env=`` a command line gives (the default domain where it gives
    none), or ``None`` when it gives no env, sweeps it, names a module (``module:EnvId``) or
    takes the env from an earlier run (``resume=``) or a snapshot (``pretrained_snapshot=``)."""
    given = assignments(argv)
    resume = given.get("resume", "").lower()
    if resume not in ("", "false", "no", "0", "none", "null") or "env" not in given \
            or given.get("pretrained_snapshot"):  # read before the env is made
        return None
    domain, env = given.get("domain", index.get("default_domain", "")), given["env"]
    # a name, not a value Hydra reads as another type (null, true, 3) or a sweep (a,b)
    if not re.fullmatch(r"[\w./-]*[A-Za-z][\w./-]*", env) or domain not in DISTRIBUTIONS \
            or env.lower() in ("null", "none", "true", "false"):
        return None
    return domain, env


INTEGER = re.compile(r"[+-]?(0|[1-9][0-9]*)")
FLOAT = re.compile(r"[+-]?(([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
                   r"|[0-9]+[eE][+-]?[0-9]+|inf|nan)")
"""Values Hydra reads as an integer or a float (a subset of its grammar; others are left to the
full check)."""
BEFORE_THE_RANGES = ("reward_batch", "torch_threads", "precision", "resume", "pretrained_snapshot")
"""Keys the full check looks at before the ranges (or that bring another run's values): a
command line that gives one is left to it."""


def value_refusal(index: dict[str, Any], argv: list[str]) -> str | None:
    """The full check's line for the first number outside its range (in the order of
    :data:`themis.run.validation.NUMERIC_KEYS`, with its :class:`~themis.core.ranges.Range`
    rule: ``seed=-1 is outside [0, 2147483647]``), or ``None``. Only plain ``key=value``
    numbers of the type the key holds are looked at (``seed=1.5`` is a type error, the full
    check's)."""
    given = assignments(argv)
    if any(key in given for key in BEFORE_THE_RANGES):
        return None
    for key, kind, lo, hi, lo_open, hi_open, text, cap in index.get("ranges", []):
        raw = given.get(key)
        if raw is None:
            continue
        value: float
        if INTEGER.fullmatch(raw):
            value = int(raw) if kind == "int" else float(raw)
        elif kind == "float" and FLOAT.fullmatch(raw):
            value = float(raw)
        else:
            continue
        allowed = Range(lo, hi, lo_open, hi_open, text, cap)
        if not allowed.holds(value):
            return f"{key}={value} {allowed.rule(value)}"
    return None


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
            return unknown_choice(key, value, options)
        if key == "domain" and re.fullmatch(r"[\w-]+", value) and value not in index["domains"]:
            return unknown_choice(key, value, index["domains"])
        parent = key.rpartition(".")[0]
        if key in keys or "/" in key or "@" in key or (parent and parent not in groups):
            continue
        if key in index["removed"]:
            return f"{key} was removed from Themis ({index['removed'][key]}); drop it"
        if (foreign := foreign_key(key)) is not None:
            return foreign
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
    index = read_cache(index_path(), INDEX_KEYS)
    if index is None:
        return 0
    try:
        line = refusal(index, config_name, argv[1:]) or value_refusal(index, argv[1:])
        if line is None and (chosen := chosen_env(index, argv[1:])) is not None:
            saved = read_cache(env_lists_path())
            if saved is None:
                return 0
            line = env_refusal(saved, *chosen)
    except (KeyError, TypeError, ValueError, AttributeError):  # a cache of another shape
        return 0
    if line is None:
        return 0
    print(f"themis: error: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
