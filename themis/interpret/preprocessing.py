"""Reward preprocessing for interpretability (Jenner & Gleave 2022): potential shaping that makes
a reward easier to read without changing what it asks for.

Given a reward r̂, find a potential Φ (and optionally a constant offset c) so that

    r'(s, a, s') = r̂(s, a, s') + γ Φ(s') · (1 − terminal) − Φ(s) + c

minimises an interpretability objective over a distribution of transitions:

- ``sparse_l1``: mean |r'| (the paper's main objective: reward only where it matters);
- ``sparse_log``: mean log(1 + |r'|) (closer to counting non-zero rewards);
- ``smooth_l1`` / ``smooth_log``: the same of r'(t₁) − r'(t₂) over neighbouring transitions
  (tabular: transitions that share a state; rollouts: consecutive steps);
- ``reference_l2``: mean (r' − r_ref)², the closest reward to a reference (e.g. the true one) in
  r̂'s equivalence class (as in evaluating-rewards' ``closest_potential``).

Potential shaping keeps optimal policies (Ng et al. 1999); the potential after a terminal step is
0, as episodic tasks need. A constant offset keeps them only where episode lengths do not depend
on the policy; it is optional (``offset=True``), as the paper's ``ScaleShift`` is, and EPIC is
invariant to it. The scale is not learned (sparsity would shrink it to 0); ``normalize`` divides
the result by its standard deviation or largest magnitude, for pictures and comparisons.

Tabular (:func:`preprocess_tabular`: one Φ per state, every transition of a gridworld): L1
objectives are solved exactly as linear programs (SciPy's HiGHS), ``reference_l2`` by sparse
least squares, the log objectives by Adam from the L1 solution. Otherwise
(:func:`preprocess_neural`) Φ is a network over observations trained by Adam on rollout
transitions, as in HumanCompatibleAI/reward-function-interpretability's ``preprocess.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import optimize, sparse
from scipy.sparse import linalg as sparse_linalg
from torch import nn

OBJECTIVES = ("sparse_l1", "sparse_log", "smooth_l1", "smooth_log", "reference_l2")
NORMALIZE = ("none", "std", "max")


@dataclass
class Preprocessed:
    """The result of preprocessing.

    Attributes:
        objective: which objective was minimised.
        rewards: ``(T,)`` r' on the transitions it was fitted on (after normalisation).
        offset: c (0 without ``offset``), in r̂'s units.
        scale: the normalisation factor applied last (1 for ``normalize="none"``).
        before: the objective of r̂ (Φ = 0, c = 0).
        after: the objective of r' before normalisation (same units as ``before``).
        potential: tabular: ``(S,)`` Φ per state; neural: the trained ``nn.Module``.
        gamma: the discount of the shaping.
    """

    objective: str
    rewards: np.ndarray
    offset: float
    scale: float
    before: float
    after: float
    potential: Any
    gamma: float


def check_objective(objective: str, normalize: str = "none",
                    reference: np.ndarray | None = None) -> None:
    """Raises ValueError for an unknown objective or normalisation, or ``reference_l2``
    without a reference."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize {normalize!r} is not one of {', '.join(NORMALIZE)}")
    if objective == "reference_l2" and reference is None:
        raise ValueError("objective reference_l2 needs a reference reward")


def objective_value(objective: str, rewards: np.ndarray, pairs: np.ndarray | None = None,
                    reference: np.ndarray | None = None,
                    weights: np.ndarray | None = None) -> float:
    """The objective of a reward vector ``(T,)`` (``pairs (P, 2)`` for smoothness; weights for
    the sparsity and reference objectives, default uniform)."""
    r = np.asarray(rewards, np.float64)
    if objective.startswith("smooth"):
        if pairs is None or len(pairs) == 0:
            return 0.0
        r = r[pairs[:, 0]] - r[pairs[:, 1]]
        weights = None
    elif objective == "reference_l2":
        assert reference is not None
        r = r - np.asarray(reference, np.float64)
    w = np.full(len(r), 1.0 / max(len(r), 1)) if weights is None else weights / weights.sum()
    if objective == "reference_l2":
        return float(w @ (r * r))
    return float(w @ (np.log1p(np.abs(r)) if objective.endswith("log") else np.abs(r)))


def _normalize(r: np.ndarray, how: str, weights: np.ndarray | None) -> float:
    w = np.full(len(r), 1.0 / len(r)) if weights is None else weights / weights.sum()
    if how == "std":
        sd = float(np.sqrt(w @ (r - w @ r) ** 2))
        return 1.0 / sd if sd > 1e-12 else 1.0
    if how == "max":
        top = float(np.abs(r).max(initial=0.0))
        return 1.0 / top if top > 1e-12 else 1.0
    return 1.0


# ---------------------------------------------------------------------- tabular
def neighbour_pairs(state: np.ndarray, next_state: np.ndarray, limit: int = 2_000_000
                    ) -> np.ndarray:
    """``(P, 2)`` pairs of transitions ``(i, j)``, ``i < j`` or ``i > j``, that share a state:
    ``state[i] == next_state[j]`` (j leads into i) or ``state[i] == state[j]`` (i ≠ j), as the
    official tabular smoothness objective pairs them.

    Raises:
        ValueError: more than ``limit`` pairs (use the neural preprocessing's consecutive
            steps instead).
    """
    by_state: dict[int, list[int]] = {}
    for i, s in enumerate(state):
        by_state.setdefault(int(s), []).append(i)
    rows: list[np.ndarray] = []
    count = 0
    for j, s2 in enumerate(next_state):  # j enters s2; every i leaving s2 follows it
        out = by_state.get(int(s2))
        if out:
            rows.append(np.stack([np.asarray(out), np.full(len(out), j)], 1))
            count += len(out)
    for members in by_state.values():
        m = np.asarray(members)
        if len(m) > 1:
            a, b = np.meshgrid(m, m, indexing="ij")
            keep = a != b
            rows.append(np.stack([a[keep], b[keep]], 1))
            count += int(keep.sum())
        if count > limit:
            raise ValueError(f"more than {limit} neighbouring transition pairs")
    return np.concatenate(rows) if rows else np.zeros((0, 2), np.int64)


def _shaping_matrix(state: np.ndarray, next_state: np.ndarray, terminal: np.ndarray,
                    n_states: int, gamma: float, offset: bool) -> sparse.csr_matrix:
    """``M (T, S [+1])`` with ``r' = r + M x``, ``x = [Φ, c]``."""
    t = len(state)
    rows = np.arange(t)
    live = ~terminal & (next_state < n_states)
    data = [np.full(t, -1.0), np.full(int(live.sum()), gamma)]
    r_idx = [rows, rows[live]]
    c_idx = [state, next_state[live]]
    if offset:
        data.append(np.ones(t))
        r_idx.append(rows)
        c_idx.append(np.full(t, n_states))
    return sparse.csr_matrix((np.concatenate(data), (np.concatenate(r_idx),
                                                     np.concatenate(c_idx))),
                             shape=(t, n_states + int(offset)))


def _l1_lp(a: sparse.csr_matrix, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``argmin_x Σ w_k |b_k + (A x)_k|`` as a linear program in ``[x, u]``."""
    k, n = a.shape
    eye = sparse.identity(k, format="csr")
    a_ub = sparse.vstack([sparse.hstack([a, -eye]), sparse.hstack([-a, -eye])]).tocsc()
    b_ub = np.concatenate([-b, b])
    c = np.concatenate([np.zeros(n), w])
    bounds = [(None, None)] * n + [(0, None)] * k
    res = optimize.linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"the linear program did not solve: {res.message}")
    return np.asarray(res.x[:n])


def _adam(objective: str, a: sparse.csr_matrix, b: np.ndarray, w: np.ndarray, x0: np.ndarray,
          steps: int, lr: float) -> np.ndarray:
    """Minimise the (log) objective of ``b + A x`` by full-batch Adam from ``x0``."""
    coo = a.tocoo()
    a_t = torch.sparse_coo_tensor(torch.as_tensor(np.stack([coo.row, coo.col])),
                                  torch.as_tensor(coo.data), a.shape,
                                  dtype=torch.float64, check_invariants=True)
    b_t, w_t = torch.as_tensor(b), torch.as_tensor(w)
    x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([x], lr=lr)
    best, best_x = float("inf"), np.asarray(x0, np.float64)
    for _ in range(steps + 1):
        opt.zero_grad()
        v = b_t + torch.sparse.mm(a_t, x[:, None])[:, 0]
        loss = (w_t * (torch.log1p(v.abs()) if objective.endswith("log") else v.abs())).sum()
        if loss.item() < best:  # Adam's steps need not descend: keep the best point
            best, best_x = loss.item(), x.detach().numpy().copy()
        loss.backward()
        opt.step()
    return best_x


def preprocess_tabular(rewards: np.ndarray, state: np.ndarray, next_state: np.ndarray,
                       terminal: np.ndarray, n_states: int, gamma: float = 0.99,
                       objective: str = "sparse_l1", offset: bool = False,
                       reference: np.ndarray | None = None, weights: np.ndarray | None = None,
                       normalize: str = "none", adam_steps: int = 3000,
                       lr: float = 0.01) -> Preprocessed:
    """Preprocess a reward given on every transition of a finite MDP.

    Args:
        rewards: ``(T,)`` r̂ of each transition.
        state, next_state: ``(T,)`` state indices in ``[0, n_states)``; ``next_state`` may be
            ``n_states`` (an absorbing state, potential 0).
        terminal: ``(T,)`` steps that end the episode (potential 0 after them).
        n_states: S.
        gamma: discount of the shaping, in [0, 1].
        objective: one of :data:`OBJECTIVES`.
        offset: also fit a constant c.
        reference: ``(T,)`` the reference reward (``reference_l2``).
        weights: ``(T,)`` how much each transition counts (default uniform).
        normalize: ``none``, ``std`` or ``max`` (see the module docstring).
        adam_steps, lr: for the log objectives.

    Returns:
        :class:`Preprocessed` with ``potential (S,)``.

    Raises:
        ValueError: unknown objective/normalisation, ``gamma`` outside [0, 1], arrays that do
            not fit together.
    """
    check_objective(objective, normalize, reference)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    r = np.asarray(rewards, np.float64)
    state, next_state = np.asarray(state, np.int64), np.asarray(next_state, np.int64)
    terminal = np.asarray(terminal, bool)
    if not (len(r) == len(state) == len(next_state) == len(terminal)):
        raise ValueError("rewards, state, next_state and terminal must have one row per "
                         "transition")
    if len(r) and (state.min() < 0 or state.max() >= n_states or next_state.min() < 0
                   or next_state.max() > n_states):
        raise ValueError(f"state indices must lie in [0, {n_states}]")
    w = np.full(len(r), 1.0 / len(r)) if weights is None else \
        np.asarray(weights, np.float64) / np.sum(weights)
    m = _shaping_matrix(state, next_state, terminal, n_states, gamma, offset)
    pairs = neighbour_pairs(state, next_state) if objective.startswith("smooth") else None
    before = objective_value(objective, r, pairs, reference, w)
    if objective == "reference_l2":
        assert reference is not None
        sw = np.sqrt(w)
        x = sparse_linalg.lsqr(sparse.diags(sw) @ m, sw * (np.asarray(reference) - r),
                               atol=1e-12, btol=1e-12, iter_lim=100_000)[0]
    else:
        if pairs is not None:  # differences of neighbouring transitions
            a = (m[pairs[:, 0]] - m[pairs[:, 1]]).tocsr()
            b = r[pairs[:, 0]] - r[pairs[:, 1]]
            pw = np.full(len(pairs), 1.0 / max(len(pairs), 1))
        else:
            a, b, pw = m, r, w
        x = _l1_lp(a, b, pw) if len(b) else np.zeros(m.shape[1])
        if objective.endswith("log"):
            x = _adam(objective, a, b, pw, x, adam_steps, lr)
    shaped = r + m @ x
    after = objective_value(objective, shaped, pairs, reference, w)
    scale = _normalize(shaped, normalize, w)
    return Preprocessed(objective, shaped * scale, float(x[n_states]) if offset else 0.0, scale,
                        before, after, x[:n_states].copy(), gamma)


# ---------------------------------------------------------------------- neural
class PotentialNet(nn.Module):
    """Φ(s): an MLP over flattened vector observations, or a Themis encoder
    (:func:`themis.agents.encoders.make_encoder`: grid CNN, Nature CNN) and a linear head for
    grids and pixels.

    Shapes: ``obs (B, obs_dim)`` (flattened) -> ``(B,)``.
    """

    def __init__(self, obs_shape: tuple[int, ...], hidden_dim: int = 128,
                 hidden_depth: int = 2) -> None:
        super().__init__()
        from themis.agents.encoders import make_encoder, observation_kind

        self.obs_shape = tuple(obs_shape)
        self.encoder: nn.Module | None = None
        width = int(np.prod(obs_shape))
        if observation_kind(self.obs_shape) != "vector":
            encoder = make_encoder(self.obs_shape)
            self.encoder, width = encoder, encoder.feature_dim
        layers: list[nn.Module] = []
        for _ in range(hidden_depth):
            layers += [nn.Linear(width, hidden_dim), nn.ReLU()]
            width = hidden_dim
        layers.append(nn.Linear(width, 1))
        self.head = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.encoder is not None:
            x = self.encoder(obs.reshape(len(obs), *self.obs_shape))
        else:
            x = obs.reshape(len(obs), -1).float()
        return self.head(x).squeeze(-1)


def preprocess_neural(rewards: np.ndarray, obs: np.ndarray, next_obs: np.ndarray,
                      terminal: np.ndarray, gamma: float = 0.99,
                      objective: str = "sparse_l1", offset: bool = False,
                      reference: np.ndarray | None = None, pairs: np.ndarray | None = None,
                      normalize: str = "none", epochs: int = 20, batch_size: int = 256,
                      lr: float = 1e-3, hidden_dim: int = 128, seed: int = 0,
                      progress: Any = None) -> Preprocessed:
    """Preprocess a reward on rollout transitions with a neural potential.

    Args:
        rewards: ``(T,)`` r̂ of each transition (fixed: computed once from the model).
        obs, next_obs: ``(T, *obs_shape)``.
        terminal: ``(T,)``.
        objective, offset, reference, normalize, gamma: as in :func:`preprocess_tabular`.
        pairs: ``(P, 2)`` neighbouring transitions for the smoothness objectives (default:
            consecutive rows ``(t, t + 1)``; pass the pairs within episodes).
        epochs, batch_size, lr, hidden_dim, seed: Adam training of Φ (a minibatch of
            transitions, or of pairs for smoothness).
        progress: called with 1 after each epoch (a progress bar), if given.

    Returns:
        :class:`Preprocessed` with the trained :class:`PotentialNet` (and ``offset``).

    Raises:
        ValueError: unknown objective/normalisation, arrays that do not fit together.
    """
    check_objective(objective, normalize, reference)
    r = np.asarray(rewards, np.float64)
    if not (len(r) == len(obs) == len(next_obs) == len(terminal)):
        raise ValueError("rewards, obs, next_obs and terminal must have one row per transition")
    if objective.startswith("smooth") and pairs is None:
        pairs = np.stack([np.arange(len(r) - 1), np.arange(1, len(r))], 1)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    net = PotentialNet(tuple(obs.shape[1:]), hidden_dim)  # float32; r' in float64
    c = torch.zeros((), dtype=torch.float64, requires_grad=offset)
    params = [*net.parameters(), *([c] if offset else [])]
    opt = torch.optim.Adam(params, lr=lr)
    obs_t, next_t = torch.as_tensor(obs), torch.as_tensor(next_obs)
    r_t = torch.as_tensor(r)
    live = torch.as_tensor(~np.asarray(terminal, bool), dtype=torch.float64)
    ref_t = torch.as_tensor(np.asarray(reference, np.float64)) if reference is not None else None

    def shaped(idx: torch.Tensor) -> torch.Tensor:
        phi = net(obs_t[idx]).double()
        phi_next = net(next_t[idx]).double()
        return r_t[idx] + gamma * phi_next * live[idx] - phi + c

    units = len(pairs) if objective.startswith("smooth") and pairs is not None else len(r)
    for _ in range(epochs):
        order = rng.permutation(units)
        for lo in range(0, units, batch_size):
            batch = torch.as_tensor(order[lo:lo + batch_size])
            opt.zero_grad()
            if objective.startswith("smooth"):
                assert pairs is not None
                p = torch.as_tensor(pairs)[batch]
                v = shaped(p[:, 0]) - shaped(p[:, 1])
            elif objective == "reference_l2":
                assert ref_t is not None
                v = shaped(batch) - ref_t[batch]
            else:
                v = shaped(batch)
            if objective == "reference_l2":
                loss = (v * v).mean()
            else:
                loss = (torch.log1p(v.abs()) if objective.endswith("log") else v.abs()).mean()
            loss.backward()
            opt.step()
        if progress is not None:
            progress(1)
    net.eval()
    with torch.no_grad():
        out = np.concatenate([shaped(torch.arange(lo, min(lo + 4096, len(r)))).numpy()
                              for lo in range(0, len(r), 4096)]) if len(r) else np.zeros(0)
    before = objective_value(objective, r, pairs, reference)
    after = objective_value(objective, out, pairs, reference)
    scale = _normalize(out, normalize, None)
    return Preprocessed(objective, out * scale, float(c.detach()), scale, before, after, net,
                        gamma)


def shaping_fn(potential: nn.Module, gamma: float, offset: float = 0.0) -> Any:
    """``(obs, next_obs) -> γ Φ(s') − Φ(s) + c`` (numpy in, numpy out, no episode ends): what
    EPIC's sampled canonicalisation needs of a neural preprocessing."""
    def fn(obs: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            o, n = torch.as_tensor(obs), torch.as_tensor(next_obs)
            return (gamma * potential(n) - potential(o)).double().numpy() + offset
    return fn
