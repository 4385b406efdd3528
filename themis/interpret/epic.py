"""EPIC: the Equivalent-Policy Invariant Comparison of two rewards (Gleave et al. 2021).

EPIC canonicalises each reward so that potential shaping disappears,

    C(R)(s, a, s') = R(s, a, s') + E[γ R(s', A, S') − R(s, A, S') − γ R(S, A, S')],

with ``S, S' ~ D_S`` and ``A ~ D_A`` independent (the coverage distributions), and then takes
the Pearson distance ``D_ρ = sqrt((1 − ρ) / 2)`` of the canonical rewards over a distribution of
transitions. The result lies in [0, 1], is 0 for rewards that differ only by potential shaping
and a positive scale (and a constant), and bounds the regret of optimising one for the other.

Three ways to compute it here (following HumanCompatibleAI/evaluating-rewards'
``tabular.fully_connected_random_canonical_reward`` and ``epic_sample.sample_canon_shaping``):

- :func:`epic_tabular`: rewards as ``(S, A, S)`` arrays, the Pearson distance over
  ``D_S × D_A × D_S``;
- :func:`epic_state_action`: rewards ``r(s, a) + γ Φ(s') − Φ(s)`` given as ``r (S, A)`` tables
  (a Themis reward model on a gridworld, the true reward of a deterministic gridworld, and their
  shaped versions): the same value in closed form, without an ``S × A × S`` array;
- :func:`epic_sampled`: reward functions on observations (continuous envs): canonicalised with
  samples of ``(A, S')`` from rollouts, the Pearson distance over a batch of transitions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

RewardFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""``(obs (n, ...), action vectors (n, action_dim), next_obs (n, ...)) -> rewards (n,)``."""


def pearson_distance(a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None) -> float:
    """``sqrt((1 − ρ) / 2)`` with ρ the (weighted) Pearson correlation of ``a`` and ``b``.

    A constant reward has no correlation with anything: the distance is 0 when both are
    constant, else ``sqrt(1/2)`` (ρ taken as 0).

    Raises:
        ValueError: shapes differ, or weights that are negative or sum to 0.
    """
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"rewards of different shapes: {a.shape} and {b.shape}")
    w = np.ones_like(a) if weights is None else np.asarray(weights, np.float64).reshape(-1)
    if w.shape != a.shape or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative, one per reward, not all 0")
    w = w / w.sum()
    a = a - w @ a
    b = b - w @ b
    va, vb = w @ (a * a), w @ (b * b)
    scale = max(np.abs(a).max(initial=0.0), np.abs(b).max(initial=0.0), 1e-300)
    tiny = 1e-20 * scale * scale
    if va <= tiny and vb <= tiny:
        return 0.0
    if va <= tiny or vb <= tiny:
        return float(np.sqrt(0.5))
    rho = min(1.0, max(-1.0, float(w @ (a * b) / np.sqrt(va * vb))))
    return float(np.sqrt(0.5 * (1.0 - rho)))


def _dist(d: np.ndarray | None, n: int) -> np.ndarray:
    if d is None:
        return np.full(n, 1.0 / n)
    d = np.asarray(d, dtype=np.float64)
    if d.shape != (n,) or np.any(d < 0) or not np.isclose(d.sum(), 1.0):
        raise ValueError(f"a coverage distribution must be {n} non-negative numbers summing to 1")
    return d


def canonicalize_tabular(reward: np.ndarray, gamma: float, state_dist: np.ndarray | None = None,
                         action_dist: np.ndarray | None = None) -> np.ndarray:
    """``C(R)`` of an ``(S, A, S)`` reward array (Gleave et al. 2021, Definition 4.1).

    Raises:
        ValueError: not an ``(S, A, S)`` array, ``gamma`` outside [0, 1], bad distributions.
    """
    if reward.ndim != 3 or reward.shape[0] != reward.shape[2]:
        raise ValueError(f"a tabular reward is (S, A, S), got {reward.shape}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    n_s, n_a, _ = reward.shape
    ds, da = _dist(state_dist, n_s), _dist(action_dist, n_a)
    mean_s = np.einsum("sat,a,t->s", reward, da, ds)  # E[R(s, A, S')]
    total = ds @ mean_s  # E[R(S, A, S')]
    return reward + gamma * mean_s[None, None, :] - mean_s[:, None, None] - gamma * total


def epic_tabular(reward_a: np.ndarray, reward_b: np.ndarray, gamma: float,
                 state_dist: np.ndarray | None = None,
                 action_dist: np.ndarray | None = None) -> float:
    """EPIC distance of two ``(S, A, S)`` reward arrays, over ``D_S × D_A × D_S``.

    Raises:
        ValueError: arrays of other shapes (see :func:`canonicalize_tabular`).
    """
    if reward_a.shape != reward_b.shape:
        raise ValueError(f"rewards of different shapes: {reward_a.shape}, {reward_b.shape}")
    n_s, n_a, _ = reward_a.shape
    ds, da = _dist(state_dist, n_s), _dist(action_dist, n_a)
    weights = ds[:, None, None] * da[None, :, None] * ds[None, None, :]
    return pearson_distance(canonicalize_tabular(reward_a, gamma, ds, da),
                            canonicalize_tabular(reward_b, gamma, ds, da), weights)


def shaped_tabular(reward_sa: np.ndarray, potential: np.ndarray | None, gamma: float,
                   offset: float = 0.0) -> np.ndarray:
    """The ``(S, A, S)`` array ``r(s, a) + γ Φ(s') − Φ(s) + offset``."""
    r = np.repeat(np.asarray(reward_sa, np.float64)[:, :, None], reward_sa.shape[0], axis=2)
    if potential is not None:
        r = r + gamma * potential[None, None, :] - potential[:, None, None]
    return r + offset


def epic_state_action(reward_a: np.ndarray, reward_b: np.ndarray, gamma: float,
                      state_dist: np.ndarray | None = None,
                      action_dist: np.ndarray | None = None) -> float:
    """EPIC distance of rewards ``r(s, a)`` (up to any potential shaping), from ``(S, A)``
    tables, in ``O(S·A)``.

    For ``R(s, a, s') = r(s, a) + γΦ(s') − Φ(s)`` the canonical reward is
    ``u(s, a) + γ m(s')`` with ``m(s) = E_A r(s, A)`` and ``u = r − m − γ E_S m(S)`` (the
    shaping cancels exactly); with ``s, a, s'`` independent the covariance of two such rewards is
    ``Cov(u_a, u_b) + γ² Cov(m_a, m_b)``. Equal to :func:`epic_tabular` of the full arrays.
    """
    ra, rb = np.asarray(reward_a, np.float64), np.asarray(reward_b, np.float64)
    if ra.shape != rb.shape or ra.ndim != 2:
        raise ValueError(f"state-action rewards must be two (S, A) tables, got {ra.shape}, "
                         f"{rb.shape}")
    ds, da = _dist(state_dist, ra.shape[0]), _dist(action_dist, ra.shape[1])
    w_sa = ds[:, None] * da[None, :]

    def parts(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = r @ da
        u = r - m[:, None]
        return u - w_sa.reshape(-1) @ u.reshape(-1), m - ds @ m  # centred

    ua, ma = parts(ra)
    ub, mb = parts(rb)
    cov = (w_sa * ua * ub).sum() + gamma**2 * ds @ (ma * mb)
    va = (w_sa * ua * ua).sum() + gamma**2 * ds @ (ma * ma)
    vb = (w_sa * ub * ub).sum() + gamma**2 * ds @ (mb * mb)
    tiny = 1e-24 * max(np.abs(ra).max(initial=0), np.abs(rb).max(initial=0), 1e-300) ** 2
    if va <= tiny and vb <= tiny:
        return 0.0
    if va <= tiny or vb <= tiny:
        return float(np.sqrt(0.5))
    rho = min(1.0, max(-1.0, float(cov / np.sqrt(va * vb))))
    return float(np.sqrt(0.5 * (1.0 - rho)))


def _mean_rewards(fn: RewardFn, obs: np.ndarray, acts: np.ndarray, next_obs: np.ndarray,
                  chunk: int) -> np.ndarray:
    """``E_{(A, S') ~ samples} R(o, A, S')`` for each row ``o`` of ``obs``."""
    m = len(acts)
    out = np.empty(len(obs))
    per = max(1, chunk // m)
    for lo in range(0, len(obs), per):
        o = obs[lo:lo + per]
        rep = np.repeat(o, m, axis=0)
        r = fn(rep, np.tile(acts, (len(o), 1)), np.tile(next_obs, (len(o),) + (1,) *
                                                         (next_obs.ndim - 1)))
        out[lo:lo + per] = np.asarray(r, np.float64).reshape(len(o), m).mean(1)
    return out


def canonicalize_sampled(fn: RewardFn, obs: np.ndarray, acts: np.ndarray, next_obs: np.ndarray,
                         sample_acts: np.ndarray, sample_next_obs: np.ndarray, gamma: float,
                         chunk: int = 65536) -> np.ndarray:
    """Sample-based ``C(R)`` of a batch of transitions (``epic_sample.sample_canon_shaping``):
    ``R(s, a, s') + γ m(s') − m(s) − γ E m(S')``, ``m(x)`` the mean of ``R(x, A, S')`` over the
    samples ``(sample_acts[i], sample_next_obs[i])``. Episodes are treated as never ending.

    Shapes: ``obs``/``next_obs (n, ...)``, ``acts (n, action_dim)``; samples ``(m, ...)`` ->
    ``(n,)``.
    """
    raw = np.asarray(fn(obs, acts, next_obs), np.float64)
    means = _mean_rewards(fn, np.concatenate([obs, next_obs, sample_next_obs]), sample_acts,
                          sample_next_obs, chunk)
    n = len(obs)
    m_obs, m_next, m_samples = means[:n], means[n:2 * n], means[2 * n:]
    return raw + gamma * m_next - m_obs - gamma * m_samples.mean()


def epic_sampled(fns: Mapping[str, RewardFn], obs: np.ndarray, acts: np.ndarray,
                 next_obs: np.ndarray, sample_acts: np.ndarray, sample_next_obs: np.ndarray,
                 gamma: float, reference: str) -> dict[str, float]:
    """EPIC distance of each reward function to ``fns[reference]`` over a batch of transitions.

    Returns:
        ``{name: distance}`` (the reference's own is 0).

    Raises:
        KeyError: ``reference`` is not one of ``fns``.
    """
    canon = {k: canonicalize_sampled(f, obs, acts, next_obs, sample_acts, sample_next_obs, gamma)
             for k, f in fns.items()}
    ref = canon[reference]
    return {k: pearson_distance(v, ref) for k, v in canon.items()}
