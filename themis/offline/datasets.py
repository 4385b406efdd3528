"""Offline datasets: fixed episodes of one env that preference labels and an offline agent use.

An :class:`OfflineDataset` holds episodes concatenated step by step (the layout of D4RL's and
Minari's flat arrays): ``observations``, ``next_observations``, ``actions`` (Box actions in
[-1, 1], the space Themis's agents act in), ``rewards`` (the true rewards, where the source has
them), ``terminals`` (the step ended the episode in a terminal state) and ``timeouts`` (a time
limit or the end of the recording cut it), with each episode's first step and length.

:func:`load_offline_dataset` reads, without unpickling anything:

- a **Minari** dataset on this machine: its folder (the one holding ``data/metadata.json``, or
  the ``data/`` folder itself), or ``minari:ID`` for ``minari.load_dataset(ID)`` under
  ``$MINARI_DATASETS_PATH`` (never downloaded). HDF5 through ``h5py``, metadata JSON; the env
  entry point a received dataset names is never imported (the env comes from ``env=`` or from
  its id when gymnasium has it registered). Box actions are rescaled from the dataset's action
  space to [-1, 1].
- a **Themis run folder** (``config.yaml`` and ``checkpoints/state.pt``): the replay buffer its
  last intact checkpoint holds (``safe_load``: plain tensors and arrays), unrolled oldest step
  first and cut into episodes at the buffer's episode numbers; actions are already in [-1, 1].
- **rollouts** (:func:`themis.interpret.rollouts.load_rollouts`: a Themis rollouts folder, or an
  imitation npz file); actions outside [-1, 1] are rescaled with the env's own action bounds.
- a **D4RL** dataset file (``.hdf5``: flat ``observations``, ``actions``, ``rewards``,
  ``terminals``, ``timeouts``; read with ``h5py``), in ``qlearning_dataset``'s order
  (:func:`load_d4rl_hdf5`).

Bad data ends with one line (:class:`DatasetError`): unreadable files, NaN or infinite values,
arrays whose lengths disagree, no episodes, observations that are not vectors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from themis.agents.buffers import SegmentPairs
from themis.utils import ConfigError, check_memory


class DatasetError(ConfigError):
    """A dataset that cannot be read or used (one line: what is wrong and where)."""


@dataclass
class OfflineDataset:
    """Episodes of one env, concatenated (``N`` steps, ``E`` episodes).

    Attributes:
        observations: ``(N, obs_dim)`` float32.
        next_observations: ``(N, obs_dim)`` float32, the observation after each step.
        actions: ``(N, action_dim)`` float32 in [-1, 1].
        rewards: ``(N,)`` float32 true rewards (zeros when ``has_rewards`` is false).
        terminals: ``(N,)`` bool, the step reached a terminal state (no bootstrap after it).
        timeouts: ``(N,)`` bool, the episode was cut after the step (time limit, end of data).
        starts: ``(E,)`` int64 index of each episode's first step.
        lengths: ``(E,)`` int64 steps per episode (``starts[e] + lengths[e]`` is the next
            episode's first step).
        has_rewards: whether ``rewards`` are the env's rewards.
        env_id: the env the steps came from, when the source says (a gymnasium id).
        source: where the steps were read (a path or ``minari:ID``).
        meta: facts of the source (format, reference scores, action rescaling).
    """

    observations: np.ndarray
    next_observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminals: np.ndarray
    timeouts: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    has_rewards: bool = True
    env_id: str | None = None
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check()

    # ------------------------------------------------------------------ facts
    @property
    def num_steps(self) -> int:
        return len(self.actions)

    @property
    def num_episodes(self) -> int:
        return len(self.lengths)

    @property
    def obs_dim(self) -> int:
        return int(self.observations.shape[1])

    @property
    def action_dim(self) -> int:
        return int(self.actions.shape[1])

    def episode_returns(self, rewards: np.ndarray | None = None) -> np.ndarray:
        """``(E,)`` undiscounted return of each episode under ``rewards`` ``(N,)`` (default:
        the true rewards)."""
        r = self.rewards if rewards is None else np.asarray(rewards)
        return np.add.reduceat(r.astype(np.float64), self.starts) if self.num_episodes \
            else np.zeros(0)

    def segment_starts(self, segment: int) -> np.ndarray:
        """Every step where a ``segment``-step segment starts and ends inside one episode:
        ``(n,)`` int64 (empty when no episode is that long)."""
        ok = self.lengths >= segment
        return np.concatenate([np.arange(s, s + n - segment + 1) for s, n in
                               zip(self.starts[ok], self.lengths[ok], strict=True)]
                              or [np.zeros(0, np.int64)]).astype(np.int64)

    def sample_segment_pairs(self, n: int, segment: int, rng: np.random.Generator,
                             min_episode: int = 0, usable: Any = None) -> SegmentPairs:
        """``n`` pairs of ``segment``-step segments drawn uniformly among those inside one
        episode each (episodes ``>= min_episode``): the replay buffer's method of the same name,
        so that :class:`themis.feedback.selector.QuerySelector` cuts queries from the dataset.
        ``usable`` (which replay-buffer slots still have frames) is not read: every step of a
        dataset can be drawn.

        Returns:
            :class:`SegmentPairs` (observations ``(n, 2, segment, obs_dim)``, actions, true
            rewards ``(n, 2, segment)``, starts ``(n, 2)``: step indices).

        Raises:
            DatasetError: no episode (from ``min_episode`` on) is ``segment`` steps long.
        """
        valid = self.segment_starts(segment)
        valid = valid[valid >= self.starts[min(min_episode, self.num_episodes - 1)]]
        if len(valid) == 0:
            raise DatasetError(f"segment={segment}: no episode of {self.source or 'the dataset'} "
                               f"is that long (longest: {int(self.lengths.max())} steps)")
        return self.pairs(valid[rng.integers(0, len(valid), size=(n, 2))], segment)

    def pairs(self, starts: np.ndarray, segment: int) -> SegmentPairs:
        """The pairs of ``segment``-step segments starting at steps ``starts`` ``(n, 2)``."""
        idx = np.asarray(starts, dtype=np.int64)[..., None] + np.arange(segment)
        return SegmentPairs(self.observations[idx], self.actions[idx], self.rewards[idx],
                            np.asarray(starts, dtype=np.int64))

    def check(self) -> None:
        """Refuse what an offline run cannot learn from.

        Raises:
            DatasetError: no episodes or steps, arrays of different lengths, observations that
                are not vectors, NaN or infinite values, episodes that do not tile the steps.
        """
        where = self.source or "the dataset"
        n = len(self.actions)
        if n == 0 or len(self.lengths) == 0:
            raise DatasetError(f"{where} holds no episodes")
        if self.observations.ndim != 2 or self.actions.ndim != 2:
            raise DatasetError(f"{where}: observations {self.observations.shape[1:]} and "
                               f"actions {self.actions.shape[1:]} must be vectors (offline mode "
                               "reads flat vector observations and Box actions)")
        sizes = {"observations": len(self.observations),
                 "next_observations": len(self.next_observations), "actions": n,
                 "rewards": len(self.rewards), "terminals": len(self.terminals),
                 "timeouts": len(self.timeouts)}
        if len(set(sizes.values())) != 1:
            raise DatasetError(f"{where}: arrays of different lengths ("
                               + ", ".join(f"{k} {v}" for k, v in sizes.items()) + ")")
        if np.any(self.lengths <= 0) or int(self.lengths.sum()) != n or not np.array_equal(
                self.starts, np.concatenate([[0], np.cumsum(self.lengths)[:-1]])):
            raise DatasetError(f"{where}: the episode lengths ({int(self.lengths.sum())} steps "
                               f"in all) do not tile the {n} steps")
        for name in ("observations", "next_observations", "actions", "rewards"):
            values = getattr(self, name)
            if not np.all(np.isfinite(values)):
                bad = int(np.argwhere(~np.isfinite(values).reshape(len(values), -1))[0, 0])
                raise DatasetError(f"{where}: {name} hold NaN or infinite values (first at "
                                   f"step {bad})")


# ---------------------------------------------------------------------- building
def from_episodes(episodes: list[dict[str, np.ndarray]], source: str, env_id: str | None = None,
                  has_rewards: bool = True, meta: dict[str, Any] | None = None,
                  ) -> OfflineDataset:
    """An :class:`OfflineDataset` from episodes given as arrays.

    Args:
        episodes: per episode ``obs (T + 1, obs_dim)`` (the last one after the final step),
            ``actions (T, action_dim)``, ``rewards (T,)``, ``terminated (T,)``; episodes of
            0 steps are dropped.
        source, env_id, has_rewards, meta: as :class:`OfflineDataset`.

    Raises:
        DatasetError: an episode whose arrays do not fit (observations not one more than
            actions), or the checks of :meth:`OfflineDataset.check`.
    """
    obs, nxt, acts, rews, terms, touts, lengths = [], [], [], [], [], [], []
    for i, ep in enumerate(episodes):
        o = np.asarray(ep["obs"], dtype=np.float32)
        a = np.asarray(ep["actions"], dtype=np.float32)
        t = len(a)
        if t == 0:
            continue
        o = o.reshape(len(o), -1)
        a = a.reshape(t, -1)
        r = np.asarray(ep["rewards"], dtype=np.float32).reshape(-1)
        d = np.asarray(ep["terminated"], dtype=bool).reshape(-1)
        if len(o) != t + 1 or len(r) != t or len(d) != t:
            raise DatasetError(f"{source}: episode {i} has {len(o)} observations, {t} actions, "
                               f"{len(r)} rewards and {len(d)} terminal flags (observations "
                               "must be one more than actions, the rest as many)")
        obs.append(o[:-1])
        nxt.append(o[1:])
        acts.append(a)
        rews.append(r)
        terms.append(d)
        tout = np.zeros(t, dtype=bool)
        tout[-1] = not d[-1]
        touts.append(tout)
        lengths.append(t)
    if not lengths:
        raise DatasetError(f"{source} holds no episodes")
    if len({o.shape[1] for o in obs}) != 1 or len({a.shape[1] for a in acts}) != 1:
        raise DatasetError(f"{source}: episodes with observations or actions of different sizes")
    length_array = np.asarray(lengths, dtype=np.int64)
    return OfflineDataset(np.concatenate(obs), np.concatenate(nxt), np.concatenate(acts),
                          np.concatenate(rews), np.concatenate(terms), np.concatenate(touts),
                          np.concatenate([[0], np.cumsum(length_array)[:-1]]).astype(np.int64),
                          length_array, has_rewards, env_id, source, dict(meta or {}))


def rescale_actions(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Actions of a Box ``[low, high]`` mapped linearly to [-1, 1] (what
    ``gymnasium.wrappers.RescaleAction`` undoes): ``2 (a - low) / (high - low) - 1``.

    Shapes: ``actions (N, action_dim)``, ``low``/``high`` ``(action_dim,)``.

    Raises:
        DatasetError: unbounded or empty bounds.
    """
    low = np.asarray(low, np.float64).reshape(-1)
    high = np.asarray(high, np.float64).reshape(-1)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise DatasetError("the action space is unbounded; offline mode needs bounded Box "
                           "actions")
    return (2.0 * (actions - low) / (high - low) - 1.0).astype(np.float32)


# ----------------------------------------------------------------------- loaders
def load_offline_dataset(path: str | Path, env_id: str | None = None) -> OfflineDataset:
    """Read a dataset from a Minari folder (or ``minari:ID``), a Themis run folder or rollouts
    (see the module docstring for each).

    Args:
        path: where the data is.
        env_id: the env, when the source does not say (or to rescale rollouts' actions).

    Raises:
        DatasetError: nothing readable at ``path``, or data an offline run cannot use.
    """
    text = str(path)
    if text.startswith("minari:"):
        return _load_minari_id(text.split(":", 1)[1])
    p = Path(path).expanduser()
    if not p.exists():
        raise DatasetError(f"dataset={text}: no such file or folder")
    if p.is_dir() and ((p / "data" / "metadata.json").is_file()
                       or ((p / "metadata.json").is_file() and _is_minari(p / "metadata.json"))):
        return load_minari(p)
    if p.is_dir() and (p / "config.yaml").is_file() and (p / "checkpoints").is_dir():
        return load_run_buffer(p)
    if p.is_file() and p.suffix in (".hdf5", ".h5"):
        return load_d4rl_hdf5(p, env_id)
    return load_rollouts_dataset(p, env_id)


def _is_minari(meta: Path) -> bool:
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "minari_version" in data


def _load_minari_id(dataset_id: str) -> OfflineDataset:
    try:
        import minari
        from minari.storage.datasets_root_dir import get_dataset_path
    except ImportError as e:  # the offline extra is not installed
        raise DatasetError(f"dataset=minari:{dataset_id} needs Minari ({e.name} is missing): "
                           "pip install 'themis[offline]'") from None
    del minari
    try:
        folder = Path(get_dataset_path(dataset_id))
    except Exception as e:  # Minari raises several types for a bad id
        raise DatasetError(f"dataset=minari:{dataset_id}: {str(e).splitlines()[0]}") from None
    if not (folder / "data" / "metadata.json").is_file():
        raise DatasetError(f"dataset=minari:{dataset_id}: not on this machine ({folder}); "
                           "download it first with `minari download "
                           f"{dataset_id}`, or set MINARI_DATASETS_PATH")
    return load_minari(folder, source=f"minari:{dataset_id}")


def load_minari(folder: str | Path, source: str | None = None) -> OfflineDataset:
    """A Minari dataset's episodes (``folder`` holds ``data/metadata.json``, or is ``data/``).

    Raises:
        DatasetError: Minari is not installed, the files are not a Minari dataset, or the
            data does not fit (vector observations and Box actions only).
    """
    folder = Path(folder)
    data_dir = folder / "data" if (folder / "data").is_dir() else folder
    where = source or str(folder)
    try:
        import gymnasium as gym
        from minari.dataset.minari_storage import MinariStorage
    except ImportError as e:
        raise DatasetError(f"dataset={where} is a Minari dataset; reading it needs Minari "
                           f"({e.name} is missing): pip install 'themis[offline]'") from None
    try:
        storage = MinariStorage.read(data_dir)
        metadata = storage.metadata
        action_space = metadata["action_space"]
        if (data_dir / "main_data.hdf5").is_file():  # what its arrays announce, before reading
            check_memory(f"the arrays {where} announces",
                         _hdf5_announced_bytes(data_dir / "main_data.hdf5"))
        raw_episodes = list(storage.get_episodes(range(storage.total_episodes)))
    except MemoryError as e:
        raise DatasetError(f"dataset={where}: {e}") from None
    except Exception as e:  # h5py, JSON and Minari's own errors: unreadable data
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DatasetError(f"dataset={where} is not a readable Minari dataset ({first})"
                           ) from None
    if not isinstance(action_space, gym.spaces.Box):
        raise DatasetError(f"dataset={where}: actions are {type(action_space).__name__}; "
                           "offline mode reads Box actions")
    env_id = None
    spec = metadata.get("env_spec")
    if isinstance(spec, str):
        try:
            env_id = json.loads(spec).get("id")
        except (ValueError, AttributeError, RecursionError):
            env_id = None
    episodes = []
    for ep in raw_episodes:
        obs = ep.get("observations")
        if not isinstance(obs, np.ndarray):
            raise DatasetError(f"dataset={where}: observations are not one array per episode "
                               "(a dict or tuple space); offline mode reads vector observations")
        acts = rescale_actions(np.asarray(ep["actions"], np.float64).reshape(
            len(ep["actions"]), -1), action_space.low, action_space.high)
        episodes.append({"obs": obs, "actions": acts, "rewards": ep["rewards"],
                         "terminated": ep["terminations"]})
    meta = {"format": "minari", "dataset_id": metadata.get("dataset_id"),
            "ref_min_score": metadata.get("ref_min_score"),
            "ref_max_score": metadata.get("ref_max_score"), "actions": "rescaled to [-1, 1]"}
    return from_episodes(episodes, where, env_id=env_id if isinstance(env_id, str) else None,
                         meta=meta)


def _hdf5_announced_bytes(path: Path) -> int:
    """The bytes every dataset of an HDF5 file would take once read (shape × item size, from
    the file's metadata: nothing is read)."""
    import h5py

    total = 0

    def count(_: str, node: Any) -> None:
        nonlocal total
        if isinstance(node, h5py.Dataset):
            total += int(np.prod(node.shape, dtype=np.int64)) * node.dtype.itemsize

    with h5py.File(path, "r") as f:
        f.visititems(count)
    return total


def load_d4rl_hdf5(path: str | Path, env_id: str | None = None) -> OfflineDataset:
    """A D4RL dataset file (its flat HDF5 arrays ``observations``, ``actions``, ``rewards``,
    ``terminals``, ``timeouts``), in the order of D4RL's ``qlearning_dataset``: every step but
    the last of the file and those that hit a time-out (whose next observation the file does not
    hold), each step's next observation the file's next row. Indices into this dataset are
    therefore indices into ``qlearning_dataset``'s arrays, which Uni-RLHF's label files use.

    Raises:
        DatasetError: not an HDF5 file of those arrays, or arrays that do not fit.
    """
    path = Path(path)
    try:
        import h5py
    except ImportError:
        raise DatasetError(f"dataset={path} is HDF5; reading it needs h5py: "
                           "pip install 'themis[offline]'") from None
    keys = ("observations", "actions", "rewards", "terminals", "timeouts")
    try:
        check_memory(f"the arrays {path} announces", _hdf5_announced_bytes(path))
        with h5py.File(path, "r") as f:
            missing = [k for k in keys if not isinstance(f.get(k), h5py.Dataset)]
            if missing:
                raise DatasetError(f"dataset={path} is not a D4RL dataset file (no "
                                   f"{', '.join(missing)})")
            obs, acts, rews, terms, touts = (np.asarray(f[k][()]) for k in keys)
    except DatasetError:
        raise
    except MemoryError as e:
        raise DatasetError(f"dataset={path}: {e}") from None
    except (OSError, ValueError, TypeError) as e:
        raise DatasetError(f"dataset={path} is not a readable HDF5 file "
                           f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    n = len(acts)
    if not len(obs) == len(rews) == len(terms) == len(touts) == n or obs.ndim != 2:
        raise DatasetError(f"dataset={path}: arrays of different lengths or shapes "
                           f"(observations {obs.shape}, actions {acts.shape}, rewards "
                           f"{rews.shape}, terminals {terms.shape}, timeouts {touts.shape})")
    terms, touts = terms.astype(bool).reshape(-1), touts.astype(bool).reshape(-1)
    keep = ~touts
    keep[-1:] = False
    episode = np.concatenate([[0], np.cumsum(terms | touts)[:-1]])[keep]
    if not keep.any():
        raise DatasetError(f"{path} holds no episodes")
    cuts = np.flatnonzero(np.diff(episode) != 0) + 1
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    lengths = np.diff(np.concatenate([starts, [int(keep.sum())]])).astype(np.int64)
    idx = np.flatnonzero(keep)
    acts = acts.reshape(n, -1).astype(np.float64)
    meta = {"format": "d4rl-hdf5", "order": "qlearning_dataset", "actions": "as stored"}
    if acts.size and np.abs(acts).max() > 1 + 1e-6:
        acts = rescale_actions(acts, *_env_action_bounds(env_id, path))
        meta["actions"] = "rescaled to [-1, 1] with the env's bounds"
    terminals = terms[idx]
    timeouts = np.zeros(len(idx), dtype=bool)
    ends = starts + lengths - 1
    timeouts[ends] = ~terminals[ends]
    return OfflineDataset(obs[idx].astype(np.float32), obs[idx + 1].astype(np.float32),
                          acts[idx].astype(np.float32), rews[idx].reshape(-1).astype(np.float32),
                          terminals, timeouts, starts, lengths, True, env_id, str(path), meta)


def load_run_buffer(run_dir: str | Path) -> OfflineDataset:
    """The replay buffer of a Themis run's last intact checkpoint, as episodes.

    Raises:
        DatasetError: no intact checkpoint, or one without a replay buffer of vector
            observations (a PPO run keeps no replay buffer).
    """
    from themis.run.checkpoint import CheckpointError, load_checkpoint

    run_dir = Path(run_dir)
    try:
        state, _ = load_checkpoint(run_dir / "checkpoints")
    except CheckpointError as e:
        raise DatasetError(f"dataset={run_dir}: {e}") from None
    buf = state.get("buffer") if isinstance(state, dict) else None
    keys = ("obs", "next_obs", "actions", "true_rewards", "not_dones", "episode", "size", "ptr",
            "capacity")
    if not isinstance(buf, dict) or any(k not in buf for k in keys):
        raise DatasetError(f"dataset={run_dir}: its checkpoint holds no replay buffer (an "
                           "off-policy run's state.pt has one)")
    n, ptr, capacity = int(buf["size"]), int(buf["ptr"]), int(buf["capacity"])
    order = np.roll(np.arange(n), -ptr) if n == capacity and ptr else np.arange(n)

    def arr(key: str) -> np.ndarray:
        return np.asarray(buf[key])[:n][order]

    obs, nxt = arr("obs"), arr("next_obs")
    if obs.ndim != 2:
        raise DatasetError(f"dataset={run_dir}: observations {obs.shape[1:]} are not vectors")
    episode = arr("episode").astype(np.int64)
    terminals = arr("not_dones").astype(np.float32) == 0
    cuts = np.flatnonzero(np.diff(episode) != 0) + 1
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    lengths = np.diff(np.concatenate([starts, [n]])).astype(np.int64)
    timeouts = np.zeros(n, dtype=bool)
    ends = starts + lengths - 1
    timeouts[ends] = ~terminals[ends]
    env_id = _saved_env(run_dir)
    return OfflineDataset(obs.astype(np.float32), nxt.astype(np.float32),
                          arr("actions").astype(np.float32),
                          arr("true_rewards").astype(np.float32), terminals, timeouts, starts,
                          lengths, True, env_id, str(run_dir),
                          {"format": "themis-run", "actions": "[-1, 1] (the run's)"})


def _saved_env(run_dir: Path) -> str | None:
    """The ``env`` of a run's ``config.yaml`` (read as data: YAML's safe loader)."""
    import yaml

    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    env = saved.get("env") if isinstance(saved, dict) else None
    return env if isinstance(env, str) else None


def load_rollouts_dataset(path: Path, env_id: str | None = None) -> OfflineDataset:
    """Rollouts (:func:`themis.interpret.rollouts.load_rollouts`) as an offline dataset.

    Raises:
        DatasetError: not readable rollouts, non-Box actions, or actions outside [-1, 1]
            without an env whose bounds rescale them.
    """
    from themis.interpret.rollouts import RolloutFormatError, load_rollouts

    try:
        rollouts = load_rollouts(path)
    except (RolloutFormatError, FileNotFoundError) as e:
        said = str(e)  # most of load_rollouts' lines name the file already
        raise DatasetError(f"dataset={said}" if said.startswith(str(path))
                           else f"dataset={path}: {said}") from None
    if len(rollouts.acts) == 0:
        raise DatasetError(f"dataset={path} holds no episodes")
    if rollouts.meta.get("action_space", {}).get("type") == "Discrete":
        raise DatasetError(f"dataset={path}: actions are Discrete; offline mode reads Box "
                           "actions")
    saved = rollouts.meta.get("env")  # a received file's env names no module to import
    env_id = env_id or (saved if isinstance(saved, str) and saved and ":" not in saved
                        else None)
    acts = np.asarray(rollouts.acts, np.float64).reshape(len(rollouts.acts), -1)
    meta: dict[str, Any] = {"format": "rollouts", "actions": "as stored"}
    if acts.size and np.abs(acts).max() > 1 + 1e-6:
        low, high = _env_action_bounds(env_id, path)
        acts = rescale_actions(acts, low, high)
        meta["actions"] = "rescaled to [-1, 1] with the env's bounds"
    episodes = []
    for steps, obs in rollouts.episodes():
        episodes.append({"obs": rollouts.obs[obs], "actions": acts[steps],
                         "rewards": rollouts.rews[steps],
                         "terminated": rollouts.terminated[steps]})
    return from_episodes(episodes, str(path), env_id=env_id, meta=meta)


def _env_action_bounds(env_id: str | None, path: Path) -> tuple[np.ndarray, np.ndarray]:
    import gymnasium as gym

    if not env_id:
        raise DatasetError(f"dataset={path}: actions lie outside [-1, 1] and no env= says how "
                           "to rescale them")
    try:
        env = gym.make(env_id)
    except Exception as e:  # gymnasium raises several types for an unknown id
        raise DatasetError(f"dataset={path}: env={env_id} cannot be made to read its action "
                           f"bounds ({str(e).splitlines()[0]})") from None
    space = env.action_space
    env.close()
    if not isinstance(space, gym.spaces.Box):
        raise DatasetError(f"dataset={path}: {env_id} has no Box actions")
    return space.low, space.high
