"""State-entropy intrinsic reward for unsupervised pretraining (PEBBLE, Lee et al. 2021, Eq. 3).

The particle-based entropy estimate (Singh et al. 2003; Liu & Abbeel 2021, APT) rewards a state by
its distance to its k-th nearest neighbour among the visited states:
``d(s) = ||s - s^{kNN}||₂``, normalised with running statistics of d: ``d / σ`` (PEBBLE,
``state_entropy_scale=std``) or ``clip((d − μ) / 3σ, −1, 1)`` (Cheng et al. 2024, ``centred``:
CJReinforce/RIME_ICML2024 ``agent/sac_RIME.py`` ``update_critic_state_ent``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

if TYPE_CHECKING:
    from themis.agents.buffers import ReplayBuffer

SCALES = ("std", "centred")
"""``state_entropy_scale`` values: PEBBLE's ``d / σ`` and the centred
``clip((d − μ) / 3σ, −1, 1)``."""


class NoveltySample(NamedTuple):
    """A batch of states with their standardised novelty (a warm-start target of r̂).

    Attributes:
        observations: ``(B, *obs_shape)``.
        actions: ``(B, a)``.
        novelty: ``(B,)`` z = (d(s) − μ) / σ under the running statistics of d.
        bound: max |z| over the smallest and largest d seen so far (> 0), so that
            ``novelty / bound`` lies in [−1, 1] for the distances seen.
    """

    observations: torch.Tensor
    actions: torch.Tensor
    novelty: torch.Tensor
    bound: float


class RunningMeanStd:
    """Running mean and variance of a stream of batches (Chan, Golub & LeVeque 1979).

    Batches are merged with the parallel-variance formula
    ``M2 = M2_a + M2_b + δ² n_a n_b / (n_a + n_b)``, in float64, so the statistics equal those of
    the concatenated data up to rounding.

    Args:
        shape: shape of one sample.
        epsilon: initial pseudo-count, avoids dividing by zero before the first update.
    """

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = epsilon

    def update(self, batch: np.ndarray | torch.Tensor) -> None:
        """Merge a batch of shape ``(n, *shape)`` into the statistics."""
        if isinstance(batch, torch.Tensor):
            batch = batch.detach().cpu().double().numpy()
        batch = np.asarray(batch, dtype=np.float64)
        n = batch.shape[0]
        if n == 0:
            return
        b_mean, b_var = batch.mean(0), batch.var(0)
        delta = b_mean - self.mean
        total = self.count + n
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.var)

    def state_dict(self) -> dict[str, object]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.mean = np.asarray(state["mean"], dtype=np.float64)
        self.var = np.asarray(state["var"], dtype=np.float64)
        self.count = float(state["count"])  # type: ignore[arg-type]


def knn_distance(x: torch.Tensor, pool: torch.Tensor, k: int,
                 exclude_self: bool = False) -> torch.Tensor:
    """Euclidean distance from each row of ``x`` to its ``k``-th nearest row of ``pool``.

    Args:
        x: ``(B, d)`` query points.
        pool: ``(N, d)`` reference points, ``N >= k``.
        k: neighbour rank, 1-based (``k = 1`` is the nearest).
        exclude_self: a row of ``x`` that is itself in ``pool`` (distance exactly 0) is not
            its own neighbour: its ``k``-th nearest *other* row is measured. B-Pref uses
            ``kthvalue(k + 1)`` on a pool that always holds the state; this also holds when the
            pool is a sample that may not hold it (PEBBLE Eq. 3 counts other states only).

    Returns:
        ``(B,)`` distances.

    Raises:
        ValueError: the pool has fewer than ``k`` points.
    """
    if pool.shape[0] < k:
        raise ValueError(f"k-NN with k={k} needs at least {k} reference points, got {len(pool)}")
    extra = 5 if exclude_self else 4  # one more candidate when the state itself is among them
    return kth_of_sorted(smallest_distances(x, pool, k + extra), k, exclude_self)


def smallest_distances(x: torch.Tensor, pool: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` smallest Euclidean distances from each row of ``x (B, d)`` to the rows of
    ``pool (N, d)``, sorted ascending: ``(B, min(count, N))``.

    Ranks the pool by ``|p|² − 2 x·p`` (one matrix product; ``|x|²`` is constant per row), keeps
    the ``count`` best candidates and measures their distances exactly: 3-4× faster than cdist's
    exact pairwise mode, and exact unless float32 rounding reorders points around rank
    ``count`` (callers ask a few more than they use).
    """
    center = pool.float().mean(0)  # distances do not change; rounding of |p|² does
    x, pool = x.float() - center, pool.float() - center
    rank = torch.addmm(pool.square().sum(1).expand(len(x), -1), x, pool.T, beta=1.0, alpha=-2.0)
    candidates = rank.topk(min(count, len(pool)), dim=1, largest=False).indices
    return (x[:, None, :] - pool[candidates]).norm(dim=-1).sort(dim=1).values


def kth_of_sorted(nearest: torch.Tensor, k: int, exclude_self: bool) -> torch.Tensor:
    """``(B,)``: the ``k``-th (1-based) of each row's ascending distances ``nearest (B, m)``;
    with ``exclude_self`` a first distance of exactly 0 (the state itself) is skipped. Past the
    row's last finite distance (a pool of fewer than ``k + 1`` points), its last one."""
    rank_k = torch.full((len(nearest),), k - 1, dtype=torch.long, device=nearest.device)
    if exclude_self:  # the same row gives exactly 0: skip one such neighbour
        rank_k = rank_k + (nearest[:, 0] == 0).long()
    last = torch.isfinite(nearest).sum(1) - 1
    return nearest.gather(1, torch.minimum(rank_k, last)[:, None]).squeeze(1)


class ReplayKNN:
    """The ``k + 1`` smallest distances from every stored next state ``s'_j`` to the stored
    states ``s_0 … s_{n−1}``, kept up to date while a replay buffer grows.

    Unsupervised pretraining rewards a batch of stored next states by their k-NN distance to
    every stored state (PEBBLE Eq. 3; B-Pref ``compute_state_entropy`` measures against the
    whole buffer). Recomputed per batch that is a ``B × N`` distance matrix and a top-k over it
    every update. A new state can only shorten distances, so this keeps each ``s'_j``'s sorted
    ``k + 1`` nearest: a new transition costs one pass of its state against the stored next
    states and one of its next state against the stored states (``O(N d)``), and a batch's
    distances are a lookup. The distances are the ones :func:`knn_distance` measures (exact
    differences; the state itself, at distance exactly 0, skipped) up to float32 rounding.

    Only for buffers whose slots ``0 … n−1`` hold the transitions in order (not wrapped).
    Before each use it checks the last row it has seen against the buffer and starts over when
    the buffer was replaced (a loaded checkpoint or snapshot) or shrank.

    Args:
        k: neighbour rank (``topK``).
    """

    BULK = 64
    """More new transitions than this at once are measured by :func:`smallest_distances`."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.nearest = torch.empty(0, k + 1)
        self.synced = 0
        self._last: tuple[np.ndarray, np.ndarray] | None = None

    def reset(self) -> None:
        """Forget every distance (the next :meth:`sync` measures the buffer anew)."""
        self.nearest = torch.empty(0, self.k + 1)
        self.synced = 0
        self._last = None

    def sync(self, obs: np.ndarray, next_obs: np.ndarray) -> None:
        """Bring the distances up to the first ``n`` transitions ``obs (n, *shape)`` and
        ``next_obs (n, *shape)`` (the buffer's slots ``0 … n−1``)."""
        n, s = len(obs), self.synced
        if n < s or (self._last is not None and not (
                np.array_equal(obs[s - 1], self._last[0])
                and np.array_equal(next_obs[s - 1], self._last[1]))):
            self.reset()
            s = 0
        if n == s:
            return
        states = torch.as_tensor(obs[:n]).flatten(1).float()
        targets = torch.as_tensor(next_obs[:n]).flatten(1).float()
        if len(self.nearest) < n:  # room for at least twice as many rows
            grown = torch.full((max(n, 2 * len(self.nearest)), self.k + 1), torch.inf)
            grown[:s] = self.nearest[:s]
            self.nearest = grown
        if s and n - s <= self.BULK:  # the stored next states meet the new states
            new = torch.cdist(targets[:s], states[s:], compute_mode="donot_use_mm_for_euclid_dist")
            rows = (new.min(1).values < self.nearest[:s, -1]).nonzero().squeeze(1)
            if len(rows):
                merged = torch.cat([self.nearest[rows], new[rows]], 1).sort(1).values
                self.nearest[rows] = merged[:, : self.k + 1]
        elif s:  # many at once: measure everything anew
            s = 0
        for lo in range(s, n, 1024):  # the new next states against every stored state
            near = smallest_distances(targets[lo: lo + 1024], states, self.k + 5)
            width = min(self.k + 1, near.shape[1])
            self.nearest[lo: lo + len(near), :width] = near[:, :width]
        self.synced = n
        self._last = (obs[n - 1].copy(), next_obs[n - 1].copy())

    def distances(self, idx: np.ndarray) -> torch.Tensor:
        """``(B,)`` k-NN distances of the synced next states in slots ``idx``, the state itself
        not its own neighbour."""
        if len(idx) and int(np.max(idx)) >= self.synced:
            raise IndexError(f"slot {int(np.max(idx))} is not synced ({self.synced} are)")
        return kth_of_sorted(self.nearest[torch.as_tensor(idx)], self.k, exclude_self=True)


class StateEntropyReward:
    """Intrinsic reward of ``d = knn_distance(s', sample of replay states, k)`` under running
    statistics of d (``scale``); the state itself, when it is in the sample, is not its own
    neighbour.

    Args:
        k: neighbour rank (``topK``).
        pool_size: replay states drawn as the reference sample for each batch.
        encoder: maps ``(B, *obs_shape)`` observations to features; distances are measured
            between features. Pixels and grids use a fixed random CNN (RE3, Seo et al. 2021:
            :func:`themis.agents.encoders.random_encoder`); default: the flattened observation.
        scale: ``std`` (PEBBLE: ``d / σ``) or ``centred`` (Cheng et al. 2024:
            ``clip((d − μ) / 3σ, −1, 1)``).

    Attributes:
        stats: running mean and variance of every d rewarded so far.
        low, high: the smallest and largest d rewarded so far (the warm-start scale).
        replay_knn: the stored next states' nearest distances (:meth:`replay_reward`).

    Raises:
        ValueError: an unknown ``scale``.
    """

    def __init__(self, k: int = 5, pool_size: int = 10_000,
                 encoder: torch.nn.Module | None = None, scale: str = "std") -> None:
        if scale not in SCALES:
            raise ValueError(f"state_entropy_scale={scale} is not one of {', '.join(SCALES)}")
        self.k = k
        self.pool_size = pool_size
        self.encoder = encoder
        self.scale = scale
        self.stats = RunningMeanStd()
        self.low, self.high = float("inf"), float("-inf")
        self.replay_knn = ReplayKNN(k)

    @torch.no_grad()
    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """``(B, *obs_shape) -> (B, d)`` float features the distances are measured in."""
        if self.encoder is None:
            return obs.flatten(1).float()
        device = next(self.encoder.parameters()).device
        return self.encoder(obs.to(device)).to(obs.device)

    def distances(self, obs: torch.Tensor, replay_obs: np.ndarray,
                  rng: np.random.Generator) -> torch.Tensor:
        """``(B,)`` k-NN distances of ``obs (B, *obs_shape)`` to a sample of ``replay_obs
        (N, *obs_shape)`` (statistics unchanged)."""
        n = len(replay_obs)
        idx = rng.choice(n, size=self.pool_size, replace=False) if n > self.pool_size \
            else np.arange(n)
        pool = torch.as_tensor(replay_obs[idx], device=obs.device)
        return knn_distance(self.features(obs), self.features(pool), self.k, exclude_self=True)

    def update(self, dist: torch.Tensor) -> None:
        """Merge rewarded distances ``(B,)`` into :attr:`stats`, :attr:`low`, :attr:`high`."""
        if len(dist):
            self.stats.update(dist)
            self.low = min(self.low, float(dist.min()))
            self.high = max(self.high, float(dist.max()))

    def normalise(self, dist: torch.Tensor) -> torch.Tensor:
        """The reward of distances ``(B,)`` under the current statistics (:attr:`scale`)."""
        std = float(self.stats.std + 1e-8)
        if self.scale == "centred":
            return ((dist - float(self.stats.mean)) / (3 * std)).clamp(-1.0, 1.0)
        return dist / std

    def standardise(self, dist: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``(z, bound)``: z = (d − μ) / σ of distances ``(B,)`` and max |z| of :attr:`low` and
        :attr:`high` (1 before any update), as a warm start of r̂ scales its target
        (``train_RIME.py``: ``scale = ((s_ent_stats − mean) / std).abs().max()``)."""
        mean, std = float(self.stats.mean), float(self.stats.std + 1e-8)
        bound = max(abs(self.low - mean), abs(self.high - mean)) / std \
            if self.high >= self.low else 1.0
        return (dist - mean) / std, max(bound, 1e-8)

    def range_state(self) -> list[float]:
        """``[low, high]`` for checkpoints and snapshots."""
        return [self.low, self.high]

    def __call__(self, next_obs: torch.Tensor, replay_obs: np.ndarray,
                 rng: np.random.Generator) -> torch.Tensor:
        """Normalised state-entropy reward for a batch (statistics updated first).

        Args:
            next_obs: ``(B, *obs_shape)`` states to reward.
            replay_obs: ``(N, *obs_shape)`` stored observations to sample the reference pool from.
            rng: generator for the pool sample.

        Returns:
            ``(B,)`` rewards on ``next_obs``'s device.
        """
        dist = self.distances(next_obs, replay_obs, rng)
        self.update(dist)
        return self.normalise(dist)

    def replay_reward(self, next_obs: torch.Tensor, idx: np.ndarray, buffer: ReplayBuffer,
                      rng: np.random.Generator) -> torch.Tensor:
        """The reward of the stored transitions in slots ``idx`` of ``buffer``: the same as
        ``self(next_obs, buffer.obs[:len(buffer)], rng)``, ``next_obs (B, *obs_shape)`` being
        ``buffer.next_obs[idx]`` on the agent's device (statistics updated first).

        While every stored state fits the pool (``len(buffer) <= pool_size``), the buffer has
        not wrapped and distances are measured between raw vectors, they come from
        :attr:`replay_knn` (the same distances up to float32 rounding, no pool sample drawn);
        otherwise from :meth:`distances`.

        Returns:
            ``(B,)`` rewards on ``next_obs``'s device.
        """
        n = len(buffer)
        if self.encoder is None and n <= self.pool_size and n < buffer.capacity:
            self.replay_knn.sync(buffer.obs[:n], buffer.next_obs[:n])
            dist = self.replay_knn.distances(idx).to(next_obs.device)
        else:
            if self.replay_knn.synced:
                self.replay_knn.reset()
            dist = self.distances(next_obs, buffer.obs[:n], rng)
        self.update(dist)
        return self.normalise(dist)
