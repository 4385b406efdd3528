"""Pretraining snapshots and other starting points of a run: what ``./themis_pretrain.sh``
leaves (agent, replay buffer, counters, state-entropy statistics; :func:`save_snapshot`), read
without pickle — a snapshot may come from someone else — with the schedule a training run
continues with (``pretrained_snapshot=``; :func:`load_snapshot`), and a Stable-Baselines3 model
as the agent's start (``pretrained_policy=``; :func:`load_pretrained_policy`); :func:`start_from`
picks the run's start among them and ``resume=``'s checkpoint. The split follows PEBBLE's
(B-Pref's ``train_PEBBLE.py`` after its unsupervised phase)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from themis.core.safe_loading import (
    MALFORMED,
    UnsafeFileError,
    check_finite_tensors,
    describe,
    safe_load,
)
from themis.utils import ConfigError, save_durably

if TYPE_CHECKING:
    from themis.run.config import TrainConfig

SNAPSHOT_VERSION = 1
"""Written into snapshots and checkpoints; bumped when their layout changes."""


def read_snapshot(path: Path, device: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """A pretraining snapshot (:meth:`Workspace.save_snapshot`), loaded without pickle.

    Raises:
        ConfigError: the file is missing, unsafe or unreadable, or not a snapshot.
    """
    if not path.is_file():
        raise ConfigError(f"pretrained_snapshot={path} does not exist; run "
                          "./themis_pretrain.sh first or drop the option")
    try:
        snap = safe_load(path, device, mmap=mmap)
        check_finite_tensors(snap.get("agent") if isinstance(snap, dict) else None, path)
    except UnsafeFileError as e:
        raise ConfigError(f"pretrained_snapshot: {e}") from None
    if not isinstance(snap, dict) or "step" not in snap:
        raise ConfigError(f"pretrained_snapshot={path} is not a Themis snapshot")
    return snap


def agent_only(snap: dict[str, Any]) -> bool:
    """Whether a file read by :func:`read_snapshot` is a run's ``checkpoints/agent.pt`` (the
    agent and its step, no replay buffer) rather than a pretraining snapshot."""
    return "agent" in snap and "buffer" not in snap


def run_checkpoint(snap: dict[str, Any]) -> bool:
    """Whether a file read by :func:`read_snapshot` is a run's ``checkpoints/state.pt``
    (:meth:`Workspace.state_dict`: counters of a training run and its generators) rather than
    a pretraining snapshot."""
    return "pretraining_done" in snap and "num_unsup_steps" not in snap


def snapshot_schedule(cfg: TrainConfig) -> tuple[int, int, str]:
    """The ``num_seed_steps`` and ``num_unsup_steps`` of the pretraining the snapshot of
    ``cfg.pretrained_snapshot`` ran (saved in it; for a snapshot of an earlier version, a
    pretraining that ended at its step), so the run continues where it ended: neither random
    actions again nor pretraining to the defaults' step 6000, and no pretraining keys to
    repeat; with the console line that says so. An agent checkpoint keeps ``cfg``'s.

    Raises:
        ConfigError: see :func:`read_snapshot`.
    """
    path = Path(str(cfg.pretrained_snapshot))
    snap = read_snapshot(path, mmap=True)
    if agent_only(snap):  # a run's agent.pt: a warm start, the run's own schedule
        return cfg.num_seed_steps, cfg.num_unsup_steps, (
            f"pretrained_snapshot={path} is an agent checkpoint (agent.pt), not a pretraining "
            "snapshot: the agent is loaded, nothing else (empty buffer, step 0, "
            f"num_seed_steps={cfg.num_seed_steps}, num_unsup_steps={cfg.num_unsup_steps})")
    if run_checkpoint(snap):  # a run's state.pt: no pretraining schedule to take from it
        run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        raise ConfigError(f"pretrained_snapshot={path} is a training run's checkpoint "
                          f"(checkpoints/state.pt), not a pretraining snapshot: continue that "
                          f"run with resume={run}, or start a new run from its agent with "
                          f"pretrained_snapshot={path.parent / 'agent.pt'}")
    step = int(snap["step"])
    seed = int(snap.get("num_seed_steps", min(cfg.num_seed_steps, step)))
    unsup = int(snap.get("num_unsup_steps", step - seed))
    given = (cfg.num_seed_steps, cfg.num_unsup_steps)
    end = seed + unsup
    then = "reward learning starts at once" if step >= end else \
        f"pretraining continues to step {end}, then reward learning starts"
    note = f" (instead of {given[0]} and {given[1]})" if given != (seed, unsup) else ""
    return seed, unsup, (f"pretraining from the snapshot: num_seed_steps={seed}, "
                         f"num_unsup_steps={unsup}{note}; it ended at step {step}: {then}")


def save_snapshot(ws: Any, path: Path | None = None) -> Path:
    """Write a workspace's (``ws``) snapshot after pretraining to ``path`` (default
    ``RUN_DIR/snapshot.pt``, durably) and return it: agent, store, counters, the pretraining
    schedule it ran, entropy statistics and the recent returns (the teacher's first
    margin). Plain tensors and lists: :func:`themis.run.snapshot.read_snapshot` loads it
    without pickle."""
    path = path or ws.run_dir / "snapshot.pt"
    save_durably({
        "version": SNAPSHOT_VERSION, "env": ws.facts.env_id, "domain": ws.cfg.domain,
        "step": ws.step, "episode": ws.episode,
        "num_seed_steps": ws.cfg.num_seed_steps,  # the pretraining it ran
        "num_unsup_steps": ws.cfg.num_unsup_steps,
        "agent_name": ws.driver.NAME, "agent": ws.agent.state_dict(),
        "buffer": ws.buffer.state_dict(),
        "state_entropy_stats": ws.state_entropy.stats.state_dict(),
        "state_entropy_range": ws.state_entropy.range_state(),
        "recent_returns": list(ws.recent_returns),
        "recent_lengths": list(ws.recent_lengths),
    }, path)
    return path

def load_snapshot(ws: Any, path: Path) -> None:
    """Continue a workspace from a pretraining snapshot (or start its agent from a run's
    ``agent.pt``: :func:`agent_only`).

    Raises:
        ConfigError: the file is missing or was written for another env or shape.
    """
    snap = read_snapshot(path, ws.device)
    if snap.get("env") != ws.facts.env_id:
        raise ConfigError(f"pretrained_snapshot={path} was made for env={snap.get('env')}, "
                          f"not {ws.facts.env_id}")
    if agent_only(snap):  # a run's agent.pt: its networks and optimisers only
        try:
            ws.agent.load_state_dict(snap["agent"])
        except MALFORMED as e:
            raise ConfigError(f"pretrained_snapshot={path}: the agent does not fit this "
                              f"run: {describe(e)}") from None
        ws.logger.info(f"loaded the agent of {path} (trained {int(snap['step'])} steps); "
                         "the run starts at step 0 with an empty buffer", "cyan")
        return
    try:  # other shapes, or a crafted file that is plain data but not a snapshot
        ws.agent.load_state_dict(snap["agent"])
        ws.buffer.load_state_dict(snap["buffer"])
        ws.state_entropy.stats.load_state_dict(snap["state_entropy_stats"])
        ws.state_entropy.low, ws.state_entropy.high = snap.get(
            "state_entropy_range", [float("inf"), float("-inf")])
        ws.recent_returns.extend(float(r) for r in snap.get("recent_returns", []))
        ws.recent_lengths.extend(int(n) for n in snap.get("recent_lengths", []))
        ws.step = int(snap["step"])
        ws.episode = int(snap["episode"]) + 1
        stored = ws.buffer.episode[: len(ws.buffer)]  # new episode ids after the stored ones
        ws.episodes_started = int(stored.max()) + 1 if len(stored) else 0
    except MALFORMED as e:
        raise ConfigError(f"pretrained_snapshot={path}: {describe(e)}") from None
    ws.logger.info(f"loaded snapshot {path} at step {ws.step}", "cyan")

def start_from(ws: Any, resumed: dict[str, Any] | None) -> None:
    """Where a workspace starts: ``resumed`` (``resume=``'s checkpoint, read by
    :func:`themis.run.checkpoint.resume_state`), else ``pretrained_snapshot=``, else
    ``pretrained_policy=``, else step 0 as built.

    Raises:
        ConfigError: the checkpoint, snapshot or policy does not fit this run.
    """
    if resumed is not None:
        try:
            ws.load_state_dict(resumed)
        except MALFORMED as e:  # other observation/action shapes, a crafted state.pt
            ws.logger.close()
            raise ConfigError(f"resume: the checkpoint {ws.checkpoint_path} does not fit this "
                              f"run: {describe(e)}") from None
        ws.logger.info(f"resumed from {ws.run_dir / 'checkpoints'} at step {ws.step} "
                       f"({ws.total_feedback} queries asked)", "cyan")
    elif ws.cfg.pretrained_snapshot:
        load_snapshot(ws, Path(ws.cfg.pretrained_snapshot))
    elif ws.cfg.pretrained_policy:
        load_pretrained_policy(ws, Path(ws.cfg.pretrained_policy))


def load_pretrained_policy(ws: Any, path: Path) -> None:
    """Start a workspace's agent from a Stable-Baselines3 model (:mod:`themis.agents.sb3`).

    Raises:
        ConfigError: one line: the file is missing or unsafe, holds another algorithm, or
            its networks do not have this run's shapes (what was expected).
    """
    try:
        from themis.agents.sb3 import load_sb3_policy  # Stable-Baselines3's zip reader

        loaded = load_sb3_policy(path, ws.agent)
    except ValueError as e:
        raise ConfigError(f"pretrained_policy={path}: {e}") from None
    ws.logger.info(f"loaded {loaded} from {path}", "cyan")
