"""Crash-safe checkpoints of a whole run, and what resuming needs besides them.

A checkpoint (``checkpoints/state.pt``) holds everything a run needs to go on: agent and
optimisers, reward ensemble and its optimiser, replay buffer (or PPO's episode store), counters,
teacher statistics, running statistics and every random generator. It is written atomically
(temporary file, fsync, rename) together with a SHA-256 checksum file; the previous checkpoint is
kept as ``state.prev.pt`` (each rename is one step, ordered so that a crash anywhere leaves an
intact checkpoint: :func:`save_checkpoint`). :func:`load_checkpoint` verifies the checksum and
falls back to the previous checkpoint when the newest one is corrupt or truncated.

The preference labels are not in the checkpoint: they live in the run's ``preferences/`` folder,
which is saved the moment labels arrive (see :mod:`themis.reward.dataset`).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import logging
import os
import random
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from themis.core.safe_loading import UnsafeFileError, check_finite_tensors, safe_load
from themis.reward import save_reward_model
from themis.utils import ConfigError, replace_durably, save_durably

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
PREVIOUS_FILE = "state.prev.pt"


class CheckpointError(RuntimeError):
    """No usable checkpoint in a run dir."""


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    replace_durably(tmp, path)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """Ctrl-C or SIGTERM while a checkpoint is written takes effect once it is on disk: the
    signal's handler (the launcher's one-line stop) runs after the block, not inside
    ``torch.save``, where the interrupted zip writer turned it into a ``RuntimeError`` and a
    traceback, and left a partial temporary file beside the checkpoints. One line on stderr
    says why the stop waits. Outside the main thread (where Python runs signal handlers)
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def later(signum: int, frame: Any) -> None:
        if not caught:
            print("themis: stopping once the checkpoint being written is on disk",
                  file=sys.stderr, flush=True)
        caught.append(signum)

    previous: dict[int, Any] = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in STOP_SIGNALS:
        signal.signal(s, later)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if caught:  # as if the signal came now: the handler it had, or the default action
        handler = previous[caught[0]]
        if callable(handler):
            handler(caught[0], None)
        elif handler == signal.SIG_DFL:
            signal.raise_signal(caught[0])


def save_checkpoint(state: dict[str, Any], ckpt_dir: Path) -> Path:
    """Write ``state`` as ``ckpt_dir/state.pt`` (+ ``.sha256``), keeping the previous one.

    Every step is a single rename (of a file written and fsynced under a temporary name), in
    an order that leaves an intact checkpoint with its own checksum at every instant: the
    checksum of the current checkpoint is copied to ``state.prev.pt.sha256`` before the
    checkpoint is renamed to ``state.prev.pt``, and the new checksum is in place before the
    new file is renamed to ``state.pt``. A crash at any point resumes from the new checkpoint
    or from the one before it.

    Returns:
        the checkpoint path.
    """
    with stops_deferred():  # Ctrl-C or SIGTERM: once the new checkpoint is in place
        return _save_checkpoint(state, ckpt_dir)


def _save_checkpoint(state: dict[str, Any], ckpt_dir: Path) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    current, previous = ckpt_dir / STATE_FILE, ckpt_dir / PREVIOUS_FILE
    tmp = current.with_name(current.name + ".tmp")
    save_durably(state, tmp)  # the old checkpoints are untouched until the new one is on disk
    digest = _sha256(tmp)
    kept = _intact_digest(current, ckpt_dir)
    if kept is not None:  # the current checkpoint becomes the previous one, sum first
        _write_atomic(_sum_file(previous), f"{kept}  {PREVIOUS_FILE}\n".encode())
        replace_durably(current, previous)
    else:  # the previous one stays: its checksum beside it (an earlier crash may have left
        older = _intact_digest(previous, ckpt_dir)  # it with state.pt's, rewritten next)
        if older is not None and _recorded(_sum_file(previous)) != older:
            _write_atomic(_sum_file(previous), f"{older}  {PREVIOUS_FILE}\n".encode())
    _write_atomic(_sum_file(current), f"{digest}  {STATE_FILE}\n".encode())
    replace_durably(tmp, current)
    return current


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sum_file(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _recorded(path: Path) -> str | None:
    """The digest in a ``.sha256`` file (``None``: missing or empty)."""
    try:
        text = path.read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    return text[0] if text else None


def _intact_digest(path: Path, ckpt_dir: Path) -> str | None:
    """The SHA-256 of ``path`` when it is an intact checkpoint, else ``None``.

    Intact: its digest is the one recorded beside it, or the one beside the other checkpoint
    (earlier Themis versions renamed a checkpoint and its checksum in two steps; a crash
    between them left an intact file with the other one's checksum)."""
    if not path.is_file():
        return None
    recorded = {_recorded(_sum_file(ckpt_dir / name)) for name in (STATE_FILE, PREVIOUS_FILE)}
    recorded.discard(None)
    if not recorded:
        return None
    digest = _sha256(path)
    return digest if digest in recorded else None


def _verify(path: Path) -> bool:
    """Whether ``path`` exists and matches a recorded SHA-256 (see :func:`_intact_digest`)."""
    return _intact_digest(path, path.parent) is not None


def load_checkpoint(ckpt_dir: Path, map_location: Any = "cpu") -> tuple[dict[str, Any], Path]:
    """The newest intact checkpoint in ``ckpt_dir``.

    Returns:
        ``(state, path)``; ``path`` is ``state.prev.pt`` when ``state.pt`` failed its checksum
        (a warning says so).

    Raises:
        CheckpointError: neither checkpoint is present and intact.
    """
    current, previous = ckpt_dir / STATE_FILE, ckpt_dir / PREVIOUS_FILE
    for path in (current, previous):
        if _verify(path):
            if path == previous:
                log.warning("checkpoint %s is missing or corrupt (checksum mismatch); resuming "
                            "from the previous one, %s", current, previous)
            try:
                state = safe_load(path, map_location)
                if isinstance(state, dict):  # the networks: NaN weights would play NaN
                    check_finite_tensors({k: state.get(k) for k in ("agent", "reward_model")},
                                         path)
                return state, path
            except UnsafeFileError as e:
                raise CheckpointError(str(e)) from None
    problem = "corrupt (checksum mismatch)" if current.exists() else "missing"
    raise CheckpointError(f"no intact checkpoint in {ckpt_dir}: {STATE_FILE} is {problem} and "
                          f"{PREVIOUS_FILE} is {'corrupt' if previous.exists() else 'missing'}")


def rng_states() -> dict[str, Any]:
    """The global generators: Python ``random``, NumPy's legacy global one, torch (CPU, CUDA)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.random.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore :func:`rng_states` output."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["torch"])
    if states.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def truncate_csv(path: Path, max_step: int) -> int:
    """Drop the rows of a log CSV written after step ``max_step`` (and a torn last line).

    Rows a crashed run wrote after its last checkpoint are written again when it resumes, so
    the file continues without duplicate or missing rows.

    Returns:
        the number of rows kept.
    """
    if not path.is_file():
        return 0
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return 0
    header, body = rows[0], rows[1:]
    step_col = header.index("step") if "step" in header else None
    kept = [r for r in body if len(r) == len(header)
            and (step_col is None or _as_int(r[step_col]) <= max_step)]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(kept)
    _write_atomic(path, out.getvalue().encode())
    return len(kept)


def _as_int(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return float("inf")


def save_models(run_dir: Path, step: int, env_id: str, agent: Any, learner: Any,
                finished: bool = False) -> None:
    """The files a user takes from a run: ``checkpoints/agent.pt`` (the agent's state dict,
    its step, and ``finished``: whether the run's end — the last answers gathered, the final
    checkpoint — is behind it), ``checkpoints/reward_model.pt`` and the preference dataset
    (``preferences/``), each written atomically (a crash leaves the old file or the new one).
    ``learner``: the run's :class:`themis.feedback.PreferenceLearner`, or ``None`` without
    reward learning."""
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir(exist_ok=True)
    save_durably({"agent": agent.state_dict(), "step": step, "env": env_id,
                  "finished": finished}, ckpt / "agent.pt")
    if learner is not None:
        save_reward_model(learner.model, ckpt / "reward_model.pt", step=step, env=env_id)
        learner.dataset.save(run_dir / "preferences")


def resume_state(run_dir: Path, env_id: str, label_store: Any = None,
                 num_train_steps: int | None = None) -> tuple[dict[str, Any], Path]:
    """The run's last intact checkpoint for ``resume=``, its tensors on the CPU (generators'
    states must be CPU tensors; modules and optimisers copy theirs to their device), and its
    path. ``label_store``: the run's web label store, if any (its answers are named in the
    error's hint). The rows of ``train.csv``, ``eval.csv`` and ``reward.csv`` after the
    checkpoint's step are dropped: the resumed run writes them again.

    Raises:
        ConfigError: none intact (with where the labels given so far are; a run stopped before
            its first checkpoint: run the command again), not a Themis checkpoint, one of
            another env, or one at or past ``num_train_steps`` (a smaller one given).
    """
    try:
        state, path = load_checkpoint(run_dir / "checkpoints", "cpu")
    except CheckpointError as e:
        prefs = run_dir / "preferences"
        hint = (f"; the labels given so far are in {prefs}: start a new run with "
                f"prefs_path={prefs} to keep them") if (prefs / "meta.json").is_file() else ""
        if label_store is not None and label_store.status()["answers"]:
            hint = ("; the answers people gave are in labels.sqlite: python "
                    f"scripts/store_to_prefs.py {run_dir} DIR writes them as a preference "
                    "dataset, and a new run with prefs_path=DIR keeps them")
        ckpt = run_dir / "checkpoints"
        if not hint and not any((ckpt / name).exists() for name in (STATE_FILE,
                                                                      "state.prev.pt")):
            raise ConfigError(f"resume={run_dir}: the run stopped before its first checkpoint "
                              "(no label to keep); run its command again to start over") \
                from None
        raise ConfigError(f"resume: {e}{hint}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ConfigError(f"resume: {path} is not a Themis checkpoint (no step counter in it); "
                          "was it replaced?")
    if state.get("env") != env_id:
        raise ConfigError(f"resume: the checkpoint {path} is for env={state.get('env')}, not "
                          f"{env_id}")
    if num_train_steps is not None and state["step"] > num_train_steps:
        raise ConfigError(f"resume={run_dir}: this run is at step {state['step']}; "
                          f"num_train_steps={num_train_steps} must be larger to train on")
    for stream in ("train", "eval", "reward"):
        truncate_csv(run_dir / f"{stream}.csv", state["step"])
    return state, path
