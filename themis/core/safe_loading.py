"""Loading what a user may have received from someone else, without running code from it.

- PyTorch files (snapshots, checkpoints, a run's ``agent.pt``, ``reward_model.pt``) as plain
  data only: :func:`safe_load` (``torch.load(weights_only=True)`` with NumPy arrays allowed),
  :class:`UnsafeFileError`; restoring from such data fails with one of :data:`MALFORMED`,
  :func:`describe` gives its line.
- Configs (a run's ``config.yaml``) as values only: :func:`check_no_resolvers` refuses
  ``${oc.env:...}`` and every other resolver call (:func:`resolver_calls`), and
  :func:`check_yaml_file` refuses YAML aliases (a few hundred bytes of nested ``*aliases``
  expand to billions of nodes), special files and files over 1 MB before any YAML is built.

The reward model, the run's checkpoints, the online learner, the crowd audit and the run
reports all read received files: this module is on a floor below all of them.
"""

from __future__ import annotations

import importlib
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from themis.utils import ConfigError


class UnsafeFileError(ValueError):
    """A file that would need more than plain data to load (it could run code), or no
    PyTorch file at all."""


# NumPy arrays and scalars in checkpoints and snapshots (replay buffers, running statistics,
# NumPy's generator state): the only globals allowed besides PyTorch's own plain types.
_multiarray = importlib.import_module("numpy._core.multiarray" if hasattr(np, "_core")
                                      else "numpy.core.multiarray")  # NumPy 2 / NumPy 1
_NUMPY_GLOBALS: list[Any] = [np.ndarray, np.dtype, _multiarray._reconstruct,
                             _multiarray.scalar, bytes]  # bytes(): empty arrays' data
_NUMPY_GLOBALS += [type(np.dtype(t)) for t in (np.float32, np.float64, np.int32, np.int64,
                                                 np.uint8, np.uint32, np.bool_)]


def safe_load(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """Load a PyTorch file without running code from it: ``torch.load(weights_only=True)``
    with NumPy arrays and scalars allowed. Tensors, numbers, strings, lists, tuples, dicts and
    NumPy arrays load; anything else (a pickled class or function) is refused.

    Use it for every file a user may have received from someone else: snapshots, checkpoints,
    a run's ``agent.pt``. ``mmap``: tensors stay on disk until read (a few keys of a large
    file, cheaply).

    Raises:
        FileNotFoundError: no file at ``path``.
        UnsafeFileError: the file needs more than plain data, is not a PyTorch file, or holds
            a tensor larger than its data (:func:`check_tensor_sizes`).
    """
    try:
        with torch.serialization.safe_globals(_NUMPY_GLOBALS):
            loaded = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        check_tensor_sizes(loaded, path)  # a small file may announce huge tensors
        return loaded
    except UnsafeFileError:
        raise
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as e:
        lines = str(e).splitlines()
        what = next((line.split("GLOBAL ", 1)[1].split(" ")[0] for line in lines
                     if "Unsupported global: GLOBAL" in line), None)
        if what is None:  # not a pickle of anything: random bytes, a truncated file
            detail = next((line.split("error:", 1)[1].strip() for line in lines
                           if "WeightsUnpickler error:" in line), "unreadable")
            raise UnsafeFileError(f"{path} is not a readable PyTorch file ({detail})") from None
        raise UnsafeFileError(f"{path} was refused: it needs {what}, more than plain tensors "
                              "and arrays (loading it could run code from the file)") from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        raise UnsafeFileError(f"{path} is not a readable PyTorch file "
                              f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                              ) from None


def check_tensor_sizes(value: Any, where: str | Path) -> None:
    """Refuse tensors (anywhere in dicts, lists, tuples) that announce more elements than
    their storage holds: a 2 KB file can hold a weight of shape (60000, 60000) with stride 0,
    which every later operation (a copy, a ``load_state_dict``, a network built to its shape)
    would expand to gigabytes. Themis never saves such views.

    Raises:
        UnsafeFileError: the first such tensor, its shape and its storage's size.
    """
    todo, key = [(value, "")], ""
    while todo:
        node, key = todo.pop()
        if isinstance(node, torch.Tensor):
            if node.layout != torch.strided:
                continue
            need = node.numel() * node.element_size()
            have = node.untyped_storage().nbytes()
            if need > have:
                raise UnsafeFileError(
                    f"{where}: tensor {key or '(top)'} of shape {tuple(node.shape)} announces "
                    f"{need:,} bytes over a storage of {have:,} (stride 0 or overlapping "
                    "views): not a file Themis wrote; refused before it is expanded")
        elif isinstance(node, dict):
            todo += [(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()]
        elif isinstance(node, list | tuple):
            todo += [(v, f"{key}[{i}]") for i, v in enumerate(node)]


def check_finite_tensors(state: Any, where: str | Path) -> None:
    """Refuse floating-point tensors (anywhere in dicts, lists, tuples, e.g. a state dict or an
    agent's networks with their optimiser) that hold NaN or infinite values: weights that would
    make every action or reward NaN without an error.

    Raises:
        UnsafeFileError: the first such tensor, by its key path.
    """
    todo: list[tuple[Any, str]] = [(state, "")]
    while todo:
        node, key = todo.pop()
        if isinstance(node, torch.Tensor):
            if node.is_floating_point() and not bool(torch.isfinite(node).all()):
                raise UnsafeFileError(f"{where}: {key or '(top)'} holds NaN or infinite "
                                      "values; refused (it would play or predict NaN)")
        elif isinstance(node, dict):
            todo += [(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()]
        elif isinstance(node, list | tuple):
            todo += [(v, f"{key}[{i}]") for i, v in enumerate(node)]


def npy_header(f: Any) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype an ``.npy`` stream's header announces, read without its data.

    Raises:
        ValueError: not an ``.npy`` header.
    """
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
        np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    return tuple(int(d) for d in shape), dtype


def check_npz(data: Any, where: str | Path) -> None:
    """Refuse an ``.npz`` archive (opened with ``np.load``) whose ``.npy`` headers announce more
    bytes than the archive's entries hold: NumPy allocates the announced array (10¹² elements)
    before it reads a byte. Call it before touching an array.

    Raises:
        UnsafeFileError: the first such array, or an entry that is not an ``.npy`` stream.
    """
    import zipfile

    archive = data.zip
    for info in archive.infolist():
        if not info.filename.endswith(".npy"):
            continue
        try:
            with archive.open(info) as f:
                shape, dtype = npy_header(f)
                header = f.tell()
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError,
                NotImplementedError) as e:
            raise UnsafeFileError(f"{where}: {info.filename} is not a readable array "
                                  f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                                  ) from None
        announced = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if announced > info.file_size - header:
            raise UnsafeFileError(f"{where}: {info.filename} announces shape {shape} "
                                  f"({announced:,} bytes) but holds {info.file_size:,}; refused "
                                  "before allocating")


def check_npy_file(path: str | Path) -> None:
    """:func:`check_npz` for a single ``.npy`` file: its header against the file's size.

    Raises:
        UnsafeFileError: a header announcing more bytes than the file holds.
    """
    import os

    try:
        with open(path, "rb") as f:
            shape, dtype = npy_header(f)
            header = f.tell()
    except (ValueError, OSError, EOFError) as e:
        raise UnsafeFileError(f"{path} is not a readable .npy file "
                              f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                              ) from None
    announced = int(np.prod(shape, dtype=object)) * dtype.itemsize
    size = os.path.getsize(path)
    if announced > size - header:
        raise UnsafeFileError(f"{path} announces shape {shape} ({announced:,} bytes) but holds "
                              f"{size:,}; refused before allocating")


MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError,
             OverflowError)
"""What restoring from plain data that Themis did not write raises (a crafted or replaced
``state.pt``, snapshot, ``agent.pt`` or ``reward_model.pt`` that :func:`safe_load` read):
a missing key, a wrong type, a tensor of another shape."""


YAML_LIMIT = 1 << 20
"""Bytes of the largest YAML file read from a run folder (a config is a few kB)."""
YAML_DEPTH = 64
"""The deepest nesting of lists and mappings read (a config nests 3 levels; PyYAML's composer
recurses once per level and ends in a ``RecursionError`` near 1000)."""


def _flow_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in ``text`` (brackets inside quotes or comments
    count too: an upper bound, linear in the text)."""
    deepest = depth = 0
    for match in re.finditer(r"[\[\]{}]", text):
        depth = depth + 1 if match.group() in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def check_yaml_file(path: str | Path, limit: int = YAML_LIMIT) -> None:
    """Refuse a YAML file that could hang or exhaust its reader: not a regular file (a FIFO
    would block), larger than ``limit`` bytes, holding YAML aliases (``*name``: nested ones
    expand exponentially — Themis writes none), or nested deeper than :data:`YAML_DEPTH`. Only
    the event stream is parsed (linear in the text, no recursion), nothing is built.

    Raises:
        FileNotFoundError: no such file.
        UnsafeFileError: one of the above, named with the file.
    """
    import stat

    import yaml

    path = Path(path)
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFileError(f"{path} is not a regular file")
    if info.st_size > limit:
        raise UnsafeFileError(f"{path} is {info.st_size} bytes, more than a config's "
                              f"{limit} (not read)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return  # not YAML: the reader says so in its own words
    deep = UnsafeFileError(f"{path} nests lists or mappings more than {YAML_DEPTH} deep, which "
                           "a config Themis wrote never does; not read")
    if _flow_depth(text) > YAML_DEPTH:  # before PyYAML, whose scanner is quadratic in it
        raise deep
    aliases, depth = 0, 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
            elif isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > YAML_DEPTH:
                    raise deep
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError):
        return  # not YAML: the reader says so in its own words
    if aliases:
        raise UnsafeFileError(f"{path} uses YAML aliases ({aliases} *references), which a "
                              "config Themis wrote never does; not read")


def describe(error: BaseException) -> str:
    """One line for an error of :data:`MALFORMED`: ``'agent' is missing`` for a ``KeyError``,
    else the error's first line (at most 200 characters)."""
    if isinstance(error, KeyError) and error.args:
        return f"{error.args[0]!r} is missing"
    text = str(error).strip().splitlines()
    return (f"{type(error).__name__}: {text[0]}" if text else type(error).__name__)[:200]


# ---------------------------------------------------------------- configs
def resolver_calls(text: str) -> list[str]:
    """Names of the OmegaConf resolvers a string calls when resolved (``${oc.env:HOME}`` →
    ``["oc.env"]``; plain references such as ``${segment}`` and escaped ``\\${...}`` call
    none).

    Raises:
        ValueError: the string is no valid OmegaConf value (a broken interpolation).
    """
    if "${" not in text:
        return []
    from omegaconf.errors import GrammarParseError
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser
    from omegaconf.grammar_parser import parse

    try:
        tree = parse(text, parser_rule="configValue", lexer_mode="DEFAULT_MODE")
    except GrammarParseError as e:
        raise ValueError(str(e).splitlines()[0]) from None
    names, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            names.append(node.resolverName().getText())
        todo += getattr(node, "children", None) or []
    return names


def check_no_resolvers(cfg: object, where: str | Path) -> None:
    """Refuse a received config (a run's ``config.yaml`` from someone else) whose values call
    resolvers: ``${oc.env:SECRET}``, or any resolver registered in this process, could read
    this machine's environment or files into the run (and its saved config). Configs Themis
    writes hold resolved values only.

    Args:
        cfg: the config as loaded, unresolved (``OmegaConf.load``), or plain containers.
        where: the file, for the message.

    Raises:
        ConfigError: the first value that calls a resolver, or is a broken interpolation.
    """
    from omegaconf import OmegaConf

    def visit(node: Any, key: str) -> None:
        if isinstance(node, dict | list):
            for k, value in node.items() if isinstance(node, dict) else enumerate(node):
                visit(value, f"{key}.{k}" if key else str(k))
        elif isinstance(node, str):
            try:
                calls = resolver_calls(node)
            except ValueError as e:
                raise ConfigError(f"{where}: {key}={node!r} is a broken interpolation ({e})"
                                  ) from None
            if calls:
                raise ConfigError(f"{where}: {key}={node!r} calls the resolver {calls[0]}; a "
                                  "received config may hold values only (it could read this "
                                  "machine's environment or files): write the value itself")

    from omegaconf.errors import OmegaConfBaseException

    try:
        plain = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    except OmegaConfBaseException as e:
        raise ConfigError(f"{where}: {getattr(e, 'full_key', '') or 'a value'} is a broken "
                          f"interpolation ({str(e).splitlines()[0]})") from None
    visit(plain, "")
