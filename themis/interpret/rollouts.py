"""Rollouts with true rewards: one documented, pickle-free format, and collecting them.

**Format** (version 1): a folder with

- ``rollouts.npz`` (``np.savez_compressed``; plain arrays, read with ``allow_pickle=False``):

  ======================  ==========================  ==========================================
  key                     shape                       what
  ======================  ==========================  ==========================================
  ``obs``                 ``(N + E, *obs_shape)``     observations; each episode's ``T + 1``
                                                      (the last one after its final step), as
                                                      imitation's ``TrajectoryWithRew`` stores them
  ``acts``                ``(N, *act_shape)``         the env's actions (integers for
                                                      ``Discrete``, vectors for ``Box``)
  ``rews``                ``(N,)`` float32            the true (environment) rewards
  ``terminated``          ``(N,)`` bool               the step ended the episode (a terminal state)
  ``truncated``           ``(N,)`` bool               the step hit a time limit
  ``lengths``             ``(E,)`` int64              steps per episode, in order (sum ``N``)
  ``source``              ``(E,)`` int64              index into ``meta.json``'s ``sources``
  ``seeds``               ``(E,)`` int64              the ``reset`` seed of each episode (-1:
                                                      unknown)
  ``info_<key>``          ``(N,)``                    scalar numbers the env reported in
                                                      ``info`` at every step (``success``, ...)
  ======================  ==========================  ==========================================

- ``meta.json``: ``format: "themis-rollouts"``, ``format_version``, ``domain``, ``env``,
  ``episodes``, ``steps``, ``obs_shape``, ``obs_dtype``, ``action_space`` (``{"type":
  "Discrete", "n": 7}`` or ``{"type": "Box", "shape": [6]}``), ``sources`` (one entry per
  policy: ``kind`` random/agent/sb3/imitation, ``path``, ``episodes``), ``info_keys``. It is
  written last, so a folder without it is an unfinished write.

:func:`load_rollouts` also reads **imitation's npz files** (``imitation.data.serialize`` before
its HuggingFace format; keys ``obs``, ``acts``, ``rews``, ``terminal``, ``indices``, ``infos``):
the same layout, except that ``infos`` is an array of pickled dicts, which is not read (it would
need unpickling); a Themis folder is written back with :func:`save_rollouts`.

Policies for :func:`collect_rollouts`: a random policy, a Themis run's saved agent
(``checkpoints/agent.pt``, rebuilt through :func:`themis.interpret.inspection.load_run`) or a
Stable-Baselines3 ``.zip`` (:mod:`themis.interpret.sb3`, weights only).
"""

from __future__ import annotations

import json
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

FORMAT = "themis-rollouts"
FORMAT_VERSION = 1
ARRAYS = "rollouts.npz"
META = "meta.json"


class RolloutFormatError(ValueError):
    """A file or folder that is not readable rollouts (one line: what is wrong)."""


@dataclass
class Rollouts:
    """Episodes of one env, concatenated (see the module docstring for the layout).

    Attributes:
        obs: ``(N + E, *obs_shape)`` observations, ``T + 1`` per episode.
        acts: ``(N, *act_shape)`` actions as the env takes them.
        rews: ``(N,)`` true rewards.
        terminated: ``(N,)`` terminal steps.
        truncated: ``(N,)`` time-limit steps.
        lengths: ``(E,)`` episode lengths.
        source: ``(E,)`` index into ``sources`` per episode.
        seeds: ``(E,)`` reset seeds (-1 unknown).
        infos: ``{key: (N,)}`` scalar infos.
        meta: ``domain``, ``env``, ``action_space``, ``sources`` and the rest of ``meta.json``.
    """

    obs: np.ndarray
    acts: np.ndarray
    rews: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    lengths: np.ndarray
    source: np.ndarray
    seeds: np.ndarray
    infos: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("obs", "acts", "rews", "terminated", "truncated", "lengths", "source",
                     "seeds", *(f"info_{k}" for k in self.infos)):
            array = self.infos[name[5:]] if name.startswith("info_") else getattr(self, name)
            if np.ndim(array) == 0:  # a crafted file: 0-d arrays have no rows
                raise RolloutFormatError(f"{name} is a single value (0-d), not one row per "
                                         "step or episode")
        n, e = int(self.lengths.sum()), len(self.lengths)
        if np.any(self.lengths < 0) or len(self.obs) != n + e:
            raise RolloutFormatError(f"obs has {len(self.obs)} rows; {e} episodes of "
                                     f"{n} steps need {n + e}")
        for name in ("acts", "rews", "terminated", "truncated"):
            if len(getattr(self, name)) != n:
                raise RolloutFormatError(f"{name} has {len(getattr(self, name))} rows, not the "
                                         f"{n} steps of the episodes")
        for name in ("source", "seeds"):
            if len(getattr(self, name)) != e:
                raise RolloutFormatError(f"{name} has {len(getattr(self, name))} rows, not "
                                         f"{e} (one per episode)")
        for key, values in self.infos.items():
            if len(values) != n:
                raise RolloutFormatError(f"info_{key} has {len(values)} rows, not {n}")

    # ------------------------------------------------------------------ views
    @property
    def num_steps(self) -> int:
        """``N``: transitions in all episodes."""
        return int(self.lengths.sum())

    @property
    def num_episodes(self) -> int:
        """``E``."""
        return len(self.lengths)

    @property
    def step_obs_index(self) -> np.ndarray:
        """``(N,)`` row of ``obs`` before each step (``+1``: the row after it)."""
        episode = np.repeat(np.arange(self.num_episodes), self.lengths)
        return np.arange(self.num_steps) + episode

    @property
    def dones(self) -> np.ndarray:
        """``(N,)`` the last step of each episode (terminated or truncated)."""
        done = np.zeros(self.num_steps, dtype=bool)
        done[np.cumsum(self.lengths)[self.lengths > 0] - 1] = True
        return done

    def transitions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(obs, acts, next_obs, rews, terminated)`` per step, ``obs``/``next_obs``
        ``(N, *obs_shape)`` (copies)."""
        idx = self.step_obs_index
        return self.obs[idx], self.acts, self.obs[idx + 1], self.rews, self.terminated

    def action_vectors(self) -> np.ndarray:
        """``(N, action_dim)`` float32 actions as a reward model takes them: one-hot for
        ``Discrete`` spaces, flattened vectors for ``Box``."""
        space = self.meta.get("action_space", {})
        if space.get("type") == "Discrete":
            n = int(space["n"])
            return np.eye(n, dtype=np.float32)[self.acts.astype(np.int64).reshape(-1)]
        return self.acts.reshape(self.num_steps, -1).astype(np.float32)

    def episodes(self) -> Iterator[tuple[slice, slice]]:
        """``(step_slice, obs_slice)`` of each episode: ``rews[step_slice]``,
        ``obs[obs_slice]`` (``T + 1`` rows)."""
        start = 0
        for e, length in enumerate(self.lengths):
            yield slice(start, start + int(length)), slice(start + e, start + e + int(length) + 1)
            start += int(length)

    def select(self, episodes: Sequence[int] | np.ndarray) -> Rollouts:
        """The rollouts of the given episode indices (in that order)."""
        parts = list(self.episodes())
        steps = [np.arange(parts[e][0].start, parts[e][0].stop) for e in episodes]
        obs_rows = [np.arange(parts[e][1].start, parts[e][1].stop) for e in episodes]
        s = np.concatenate(steps) if steps else np.zeros(0, np.int64)
        o = np.concatenate(obs_rows) if obs_rows else np.zeros(0, np.int64)
        ep = np.asarray(episodes, dtype=np.int64)
        return Rollouts(self.obs[o], self.acts[s], self.rews[s], self.terminated[s],
                        self.truncated[s], self.lengths[ep], self.source[ep], self.seeds[ep],
                        {k: v[s] for k, v in self.infos.items()}, dict(self.meta))


def concatenate(parts: Sequence[Rollouts]) -> Rollouts:
    """One :class:`Rollouts` of several of the same env (sources renumbered; infos kept where
    every part has them).

    Raises:
        RolloutFormatError: no parts, or parts of different envs or observation shapes.
    """
    if not parts:
        raise RolloutFormatError("no rollouts to join")
    first = parts[0]
    for p in parts[1:]:
        if p.obs.shape[1:] != first.obs.shape[1:] or p.meta.get("env") != first.meta.get("env"):
            raise RolloutFormatError(f"cannot join rollouts of {p.meta.get('env')} "
                                     f"{p.obs.shape[1:]} with {first.meta.get('env')} "
                                     f"{first.obs.shape[1:]}")
    sources: list[dict[str, Any]] = []
    renumbered = []
    for p in parts:
        renumbered.append(p.source + len(sources))
        sources += list(p.meta.get("sources", [{"kind": "unknown"}]))
    keys = set(first.infos).intersection(*(p.infos for p in parts[1:])) if len(parts) > 1 \
        else set(first.infos)
    meta = {**first.meta, "sources": sources}
    return Rollouts(np.concatenate([p.obs for p in parts]),
                    np.concatenate([p.acts for p in parts]),
                    np.concatenate([p.rews for p in parts]),
                    np.concatenate([p.terminated for p in parts]),
                    np.concatenate([p.truncated for p in parts]),
                    np.concatenate([p.lengths for p in parts]),
                    np.concatenate(renumbered), np.concatenate([p.seeds for p in parts]),
                    {k: np.concatenate([p.infos[k] for p in parts]) for k in sorted(keys)}, meta)


# ---------------------------------------------------------------------- files
def save_rollouts(rollouts: Rollouts, folder: str | Path) -> Path:
    """Write ``folder/rollouts.npz`` then ``folder/meta.json`` (see the module docstring).

    Returns:
        the folder.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; rollouts are written into a folder")
    folder.mkdir(parents=True, exist_ok=True)
    meta_path = folder / META
    meta_path.unlink(missing_ok=True)  # an unfinished rewrite is not mistaken for the old one
    arrays: dict[str, Any] = {"obs": rollouts.obs, "acts": rollouts.acts,
              "rews": rollouts.rews.astype(np.float32),
              "terminated": rollouts.terminated.astype(bool),
              "truncated": rollouts.truncated.astype(bool),
              "lengths": rollouts.lengths.astype(np.int64),
              "source": rollouts.source.astype(np.int64),
              "seeds": rollouts.seeds.astype(np.int64),
              **{f"info_{k}": v for k, v in rollouts.infos.items()}}
    tmp = folder / (ARRAYS + ".tmp")
    with tmp.open("wb") as f:
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
    tmp.replace(folder / ARRAYS)
    meta = {**rollouts.meta, "format": FORMAT, "format_version": FORMAT_VERSION,
            "episodes": rollouts.num_episodes, "steps": rollouts.num_steps,
            "obs_shape": list(rollouts.obs.shape[1:]), "obs_dtype": str(rollouts.obs.dtype),
            "info_keys": sorted(rollouts.infos)}
    meta.setdefault("sources", [{"kind": "unknown"}])
    meta.setdefault("action_space", _space_meta_from_actions(rollouts.acts))
    tmp_meta = folder / (META + ".tmp")
    tmp_meta.write_text(json.dumps(meta, indent=1, default=_json_default))
    tmp_meta.replace(meta_path)
    return folder


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _space_meta_from_actions(acts: np.ndarray) -> dict[str, Any]:
    if np.issubdtype(acts.dtype, np.integer) and acts.ndim == 1:
        return {"type": "Discrete", "n": int(acts.max()) + 1 if len(acts) else 1}
    return {"type": "Box", "shape": list(acts.shape[1:])}


def space_meta(space: gym.Space) -> dict[str, Any]:
    """The ``action_space`` entry of ``meta.json`` for a gymnasium space."""
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape or ())}
    return {"type": type(space).__name__}


def load_rollouts(path: str | Path) -> Rollouts:
    """Read rollouts: a Themis folder (or its ``rollouts.npz``/``meta.json``) or an imitation
    npz file, without unpickling anything.

    Raises:
        FileNotFoundError: nothing at ``path``.
        RolloutFormatError: not rollouts (a missing key, shapes that do not fit, an unknown
            format version, an array that would need unpickling).
    """
    path = Path(path)
    if path.is_file() and path.name in (ARRAYS, META) and (path.parent / META).is_file():
        path = path.parent
    if path.is_dir():
        return _load_themis(path)
    if not path.exists():
        raise FileNotFoundError(f"no rollouts at {path}")
    return _load_imitation(path)


def _open_npz(path: Path) -> Any:
    from themis.core.safe_loading import UnsafeFileError, check_npy_file, check_npz

    try:
        with open(path, "rb") as f:
            single = f.read(6) == b"\x93NUMPY"
        if single:  # its header first: it may announce 10¹² elements
            check_npy_file(path)
        data = np.load(path, allow_pickle=False)
        if hasattr(data, "files"):
            check_npz(data, path)
    except UnsafeFileError as e:
        raise RolloutFormatError(str(e)) from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, MemoryError) as e:
        raise RolloutFormatError(f"{path} is not an npz file "
                                 f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                                 ) from None
    if not hasattr(data, "files"):
        raise RolloutFormatError(f"{path} is a single array, not an npz file of rollouts")
    return data


def _array(data: Any, key: str, path: Path) -> np.ndarray:
    if key not in data.files:
        raise RolloutFormatError(f"{path} has no '{key}' array (keys: "
                                 f"{', '.join(sorted(data.files))})")
    try:
        return np.asarray(data[key])
    except ValueError:  # object arrays need pickle
        raise RolloutFormatError(f"{path}: '{key}' holds Python objects (it would need "
                                 "unpickling, which is refused)") from None


def _load_themis(folder: Path) -> Rollouts:
    meta_path = folder / META
    if not meta_path.is_file():
        raise RolloutFormatError(f"{folder} has no {META} (not a rollouts folder, or its write "
                                 "did not finish)")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RolloutFormatError(f"{meta_path} is not JSON ({e})") from None
    except RecursionError:  # nesting deeper than the interpreter's stack
        raise RolloutFormatError(f"{meta_path} is nested too deeply to be a {FORMAT} file"
                                 ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RolloutFormatError(f"{meta_path} is not a {FORMAT} file")
    if not isinstance(meta.get("action_space", {}), dict):
        raise RolloutFormatError(f"{meta_path}: action_space is {meta['action_space']!r}, not "
                                 'a mapping such as {"type": "Box", "shape": [6]}')
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RolloutFormatError(f"{meta_path}: format_version {version!r} is newer than this "
                                 f"Themis reads ({FORMAT_VERSION}); update Themis")
    path = folder / ARRAYS
    if not path.is_file():
        raise RolloutFormatError(f"{folder} has no {ARRAYS}")
    with _open_npz(path) as data:
        arrays = {k: _array(data, k, path) for k in (
            "obs", "acts", "rews", "terminated", "truncated", "lengths", "source", "seeds")}
        infos = {k[5:]: _array(data, k, path) for k in data.files if k.startswith("info_")}
    return _build(arrays, infos, meta, path)


def _build(arrays: dict[str, np.ndarray], infos: dict[str, np.ndarray], meta: dict[str, Any],
           path: Path) -> Rollouts:
    try:
        return Rollouts(arrays["obs"], arrays["acts"], arrays["rews"].astype(np.float32),
                        arrays["terminated"].astype(bool), arrays["truncated"].astype(bool),
                        arrays["lengths"].astype(np.int64), arrays["source"].astype(np.int64),
                        arrays["seeds"].astype(np.int64), infos, meta)
    except RolloutFormatError as e:
        raise RolloutFormatError(f"{path}: {e}") from None


def _load_imitation(path: Path) -> Rollouts:
    """imitation's npz layout: ``indices`` split ``acts``/``rews`` into trajectories and
    ``obs`` (one more row each); ``terminal (E,)``."""
    with _open_npz(path) as data:
        for key in ("obs", "acts", "indices", "terminal"):
            if key not in data.files:
                raise RolloutFormatError(f"{path} is neither a Themis rollouts folder nor an "
                                         f"imitation trajectories npz (no '{key}' array)")
        if "rews" not in data.files:
            raise RolloutFormatError(f"{path} holds trajectories without rewards (imitation's "
                                     "Trajectory, not TrajectoryWithRew)")
        obs, acts = _array(data, "obs", path), _array(data, "acts", path)
        rews = _array(data, "rews", path).astype(np.float32)
        indices = _array(data, "indices", path).astype(np.int64).reshape(-1)
        terminal = _array(data, "terminal", path).astype(bool).reshape(-1)
    for key, array in (("obs", obs), ("acts", acts), ("rews", rews)):
        if array.ndim == 0:  # one number where steps go
            raise RolloutFormatError(f"{path}: '{key}' is a single number, not an array of "
                                     "steps")
    bounds = np.concatenate([[0], indices, [len(acts)]])
    lengths = np.diff(bounds)
    if np.any(lengths < 0) or len(terminal) != len(lengths):
        raise RolloutFormatError(f"{path}: 'indices' and 'terminal' do not describe "
                                 f"{len(terminal)} trajectories of the {len(acts)} steps")
    end = np.cumsum(lengths) - 1
    terminated = np.zeros(len(acts), dtype=bool)
    truncated = np.zeros(len(acts), dtype=bool)
    nonempty = lengths > 0
    terminated[end[nonempty & terminal]] = True
    truncated[end[nonempty & ~terminal]] = True
    e = len(lengths)
    meta = {"domain": None, "env": None, "sources": [{"kind": "imitation", "path": str(path),
                                                      "episodes": e}],
            "action_space": _space_meta_from_actions(acts),
            "note": "read from an imitation npz file; its infos were not read (pickled dicts)"}
    return _build({"obs": obs, "acts": acts, "rews": rews, "terminated": terminated,
                   "truncated": truncated, "lengths": lengths,
                   "source": np.zeros(e, np.int64), "seeds": np.full(e, -1, np.int64)},
                  {}, meta, path)


def save_imitation_npz(rollouts: Rollouts, path: str | Path) -> Path:
    """Write rollouts in imitation's npz layout (for tools built on imitation); ``infos`` are
    written as empty strings (imitation's are pickled dicts, which Themis does not write)."""
    path = Path(path)
    ends = np.cumsum(rollouts.lengths)
    terminal = rollouts.terminated[ends[rollouts.lengths > 0] - 1] if rollouts.num_steps else \
        np.zeros(0, bool)
    with path.open("wb") as f:
        np.savez_compressed(f, obs=rollouts.obs, acts=rollouts.acts, rews=rollouts.rews,
                            terminal=terminal, indices=ends[:-1],
                            infos=np.full(rollouts.num_steps, "", dtype="<U1"))
    return path


# ---------------------------------------------------------------------- collecting
Policy = Callable[[np.ndarray], Any]
"""An observation -> an action the env takes."""


def collect_rollouts(env: gym.Env, policy: Policy, episodes: int, seed: int = 0,
                     max_steps: int | None = None, source: dict[str, Any] | None = None,
                     progress: Callable[[int], None] | None = None) -> Rollouts:
    """Run ``policy`` for ``episodes`` episodes and record them.

    Episode ``i`` is reset with seed ``seed + i``; an episode longer than ``max_steps`` is cut
    there (``truncated``). Scalar numbers and booleans found in ``info`` at every step of every
    episode are kept as ``infos``.

    Args:
        env: a Themis env (:func:`themis.environments.domains.make_env`).
        policy: observation -> action.
        episodes: how many (>= 1).
        seed: seed of the first reset.
        max_steps: steps per episode at most (default: the env's own limit).
        source: the ``sources`` entry of these episodes (``kind``, ``path``).
        progress: called with the number of steps after each step (a progress bar).

    Raises:
        ValueError: ``episodes < 1``.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    obs_rows, acts, rews, terms, truncs, lengths, seeds = [], [], [], [], [], [], []
    info_rows: list[dict[str, Any]] = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        obs_rows.append(np.asarray(obs))
        t = 0
        while True:
            action = policy(obs)
            obs, reward, terminated, truncated, info = env.step(action)
            t += 1
            cut = max_steps is not None and t >= max_steps
            obs_rows.append(np.asarray(obs))
            acts.append(np.asarray(action))
            rews.append(float(reward))
            terms.append(bool(terminated))
            truncs.append(bool(truncated or (cut and not terminated)))
            info_rows.append({k: v for k, v in info.items()
                              if isinstance(v, bool | int | float | np.number | np.bool_)
                              and np.ndim(v) == 0})
            if progress is not None:
                progress(1)
            if terminated or truncated or cut:
                break
        lengths.append(t)
        seeds.append(seed + i)
    keys = set(info_rows[0]).intersection(*info_rows[1:]) if info_rows else set()
    infos = {k: np.asarray([row[k] for row in info_rows]) for k in sorted(keys)}
    meta = {"action_space": space_meta(env.action_space),
            "sources": [{**(source or {"kind": "unknown"}), "episodes": episodes}],
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if env.spec is not None:
        meta["env"] = env.spec.id
    return Rollouts(np.stack(obs_rows), np.stack(acts), np.asarray(rews, np.float32),
                    np.asarray(terms), np.asarray(truncs), np.asarray(lengths, np.int64),
                    np.zeros(episodes, np.int64), np.asarray(seeds, np.int64), infos, meta)


def random_policy(env: gym.Env, seed: int = 0) -> Policy:
    """Uniform random actions from ``env.action_space`` (seeded)."""
    env.action_space.seed(seed)
    return lambda _obs: env.action_space.sample()
