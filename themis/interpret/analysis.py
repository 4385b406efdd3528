"""Preprocess a reward model and measure what changed: the pipelines behind
``scripts/preprocess_reward.py``.

- :func:`analyse_grid` (MiniGrid/BabyAI): every transition of the layout, a tabular potential,
  the fraction of |r| on the true reward's support, EPIC to the true reward before and after,
  and the same for a copy of the true reward shaped by a random potential (the control: EPIC 0
  throughout, while its direct distance and support fraction recover after preprocessing).
- :func:`analyse_rollouts` (any env): rollout transitions, a neural potential, correlations
  with the true reward along the rollouts, EPIC between raw and preprocessed (sampled; it must
  stay ≈ 0) and to a reference model when one is given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from themis.interpret.epic import (
    epic_sampled,
    epic_state_action,
    epic_tabular,
    pearson_distance,
    shaped_tabular,
)
from themis.interpret.gridworld import GridMDP, enumerate_grid
from themis.interpret.preprocessing import (
    Preprocessed,
    preprocess_neural,
    preprocess_tabular,
    shaping_fn,
)
from themis.interpret.report import plot_grid_preprocessing, plot_preprocessed_curves
from themis.interpret.rollouts import Rollouts
from themis.reward.ensemble import RewardEnsemble

FULL_EPIC_STATES = 400
"""Up to this many states EPIC is computed on the full ``(S, A, S)`` arrays (the shaping is
added and canonicalised away numerically); above, by the closed form for ``r(s, a)`` plus
shaping (:func:`themis.interpret.epic.epic_state_action`), where it cancels exactly."""


def support_mass(rewards: np.ndarray, support: np.ndarray) -> float:
    """Fraction of Σ|r| on the transitions in ``support`` (NaN when r is all 0)."""
    a = np.abs(np.asarray(rewards, np.float64))
    total = a.sum()
    return float(a[support].sum() / total) if total > 0 else float("nan")


def _table(mdp: GridMDP, values: np.ndarray) -> np.ndarray:
    """``(S, A)`` table of a per-transition quantity (each (s, a) is one transition)."""
    out = np.zeros((mdp.n_states, mdp.n_actions))
    out[mdp.state, mdp.action] = values
    return out


def _epic(mdp: GridMDP, r_sa: np.ndarray, potential: np.ndarray | None, offset: float,
          true_sa: np.ndarray, gamma: float) -> float:
    if mdp.n_states <= FULL_EPIC_STATES:
        return epic_tabular(shaped_tabular(r_sa, potential, gamma, offset),
                            shaped_tabular(true_sa, None, gamma), gamma)
    return epic_state_action(r_sa, true_sa, gamma)


def analyse_grid(model: RewardEnsemble, env: gym.Env, out_dir: Path, objective: str,
                 gamma: float = 0.99, offset: bool = False, normalize: str = "none",
                 seed: int = 0, max_states: int = 20_000, title: str = "",
                 target: tuple[float, float] | None = None) -> dict[str, Any]:
    """Preprocess ``model`` on every transition of ``env``'s layout and write
    ``preprocessing.json``, ``preprocess_grid.png`` and ``preprocess_grid.md`` into ``out_dir``.

    Args:
        model: the reward model.
        env: a MiniGrid/BabyAI env after ``reset(seed=...)`` (the layout).
        out_dir: where the files go.
        objective, gamma, offset, normalize: see :mod:`themis.interpret.preprocessing`.
        seed: the random potential of the shaped control.
        max_states: refuse bigger layouts.
        title: the pictures' title.
        target: a supervised net's ``(target_offset, target_scale)``: r̂ is mapped back to the
            reward's units first (EPIC does not depend on it; the support fraction does,
            through the constant).

    Returns:
        the metrics written to ``preprocessing.json``.
    """
    mdp = enumerate_grid(env, max_states)
    raw = model.predict(mdp.flat_obs(), mdp.action_vectors()).astype(np.float64)
    if target is not None:
        raw = target[0] + target[1] * raw
    true = mdp.true_reward
    support = np.abs(true) > 1e-9
    reference = true if objective == "reference_l2" else None
    pre = preprocess_tabular(raw, mdp.state, mdp.next_state, mdp.terminal, mdp.n_states, gamma,
                             objective, offset, reference, normalize=normalize)
    rng = np.random.default_rng(seed)
    phi_rand = np.concatenate([rng.normal(0.0, 1.0, mdp.n_states), [0.0]])
    shaped_true = true + gamma * phi_rand[mdp.next_state] * ~mdp.terminal - phi_rand[mdp.state]
    pre_shaped = preprocess_tabular(shaped_true, mdp.state, mdp.next_state, mdp.terminal,
                                    mdp.n_states, gamma, objective, offset, reference,
                                    normalize=normalize)
    true_sa, raw_sa = _table(mdp, true), _table(mdp, raw)
    metrics: dict[str, Any] = {
        "env": env.spec.id if env.spec else None, "objective": objective, "gamma": gamma,
        "offset": offset, "normalize": normalize, "states": mdp.n_states,
        "transitions": len(mdp.state), "support_transitions": int(support.sum()),
        "objective_before": pre.before, "objective_after": pre.after,
        "fitted_offset": pre.offset,
        "learned": {
            "support_mass_before": support_mass(raw, support),
            "support_mass_after": support_mass(pre.rewards, support),
            "epic_before": _epic(mdp, raw_sa, None, 0.0, true_sa, gamma),
            "epic_after": _epic(mdp, raw_sa, pre.potential, pre.offset, true_sa, gamma),
            "direct_pearson_distance_before": pearson_distance(raw, true),
            "direct_pearson_distance_after": pearson_distance(pre.rewards, true),
            "mean_on_support_after": float(pre.rewards[support].mean()) if support.any()
            else float("nan"),
            "mean_off_support_after": float(pre.rewards[~support].mean()),
        },
        "shaped_true": {
            "support_mass_before": support_mass(shaped_true, support),
            "support_mass_after": support_mass(pre_shaped.rewards, support),
            "epic_before": _epic(mdp, true_sa, phi_rand[:-1], 0.0, true_sa, gamma),
            "epic_after": _epic(mdp, true_sa, phi_rand[:-1] + pre_shaped.potential,
                                pre_shaped.offset, true_sa, gamma),
            "direct_pearson_distance_before": pearson_distance(shaped_true, true),
            "direct_pearson_distance_after": pearson_distance(pre_shaped.rewards, true),
            "objective_before": pre_shaped.before, "objective_after": pre_shaped.after,
        },
        "epic_method": "full (S, A, S) arrays" if mdp.n_states <= FULL_EPIC_STATES
        else "closed form for r(s, a) + shaping",
        "true_support_mass": support_mass(true, support),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    base: Any = env.unwrapped
    frame = base.get_frame(highlight=False, tile_size=32) if hasattr(base, "get_frame") \
        else None
    plot_grid_preprocessing(frame, mdp, raw, pre.rewards, true, pre.potential,
                            out_dir / "preprocess_grid.png", title)
    np.savez_compressed(out_dir / "preprocess_grid.npz", potential=pre.potential,
                        raw=raw, preprocessed=pre.rewards, true=true, state=mdp.state,
                        action=mdp.action, next_state=mdp.next_state, terminal=mdp.terminal)
    (out_dir / "preprocessing.json").write_text(json.dumps(metrics, indent=1))
    (out_dir / "preprocess_grid.md").write_text(grid_fragment(metrics, out_dir))
    return metrics


def _f(x: float) -> str:
    return "nan" if x != x else f"{x:.3f}"


def grid_fragment(m: dict[str, Any], out_dir: Path) -> str:
    """The report's Markdown for :func:`analyse_grid`'s metrics."""
    lr, st = m["learned"], m["shaped_true"]
    rows = [
        "### Reward preprocessing (gridworld, every transition)", "",
        f"Objective `{m['objective']}` (γ = {m['gamma']}, offset {'on' if m['offset'] else 'off'}"
        f"), {m['states']} states, {m['transitions']} transitions, "
        f"{m['support_transitions']} of them rewarded by the env. Objective "
        f"{_f(m['objective_before'])} → {_f(m['objective_after'])}.", "",
        f"![preprocessed reward]({_rel(out_dir, 'preprocess_grid.png')})", "",
        "| reward | |r| on the true support, before → after | EPIC to true, before → after "
        "| direct Pearson distance, before → after |", "|---|---|---|---|",
        f"| learned r̂ | {_f(lr['support_mass_before'])} → {_f(lr['support_mass_after'])} | "
        f"{_f(lr['epic_before'])} → {_f(lr['epic_after'])} | "
        f"{_f(lr['direct_pearson_distance_before'])} → "
        f"{_f(lr['direct_pearson_distance_after'])} |",
        f"| true reward + random shaping | {_f(st['support_mass_before'])} → "
        f"{_f(st['support_mass_after'])} | {_f(st['epic_before'])} → {_f(st['epic_after'])} | "
        f"{_f(st['direct_pearson_distance_before'])} → "
        f"{_f(st['direct_pearson_distance_after'])} |", "",
        "Preprocessing only adds a potential shaping (and a constant with `--offset`), so EPIC "
        "must not move; the shaped copy of the true reward shows what preprocessing undoes.",
    ]
    return "\n".join(rows) + "\n"


def _rel(out_dir: Path, name: str) -> str:
    """A picture's link from ``RUN_DIR/report/`` when ``out_dir`` is ``RUN_DIR/interpret``."""
    return f"../{out_dir.name}/{name}"


def episode_pairs(rollouts: Rollouts) -> np.ndarray:
    """``(P, 2)`` consecutive steps ``(t, t + 1)`` within episodes (smoothness pairs)."""
    done = rollouts.dones
    t = np.arange(rollouts.num_steps - 1)
    t = t[~done[:-1]] if len(t) else t
    return np.stack([t, t + 1], 1)


def analyse_rollouts(model: RewardEnsemble, rollouts: Rollouts, out_dir: Path, objective: str,
                     gamma: float = 0.99, offset: bool = False, normalize: str = "none",
                     epochs: int = 20, seed: int = 0, reference: RewardEnsemble | None = None,
                     epic_batch: int = 1000, epic_samples: int = 128, title: str = "",
                     progress: Any = None) -> dict[str, Any]:
    """Preprocess ``model`` on rollout transitions with a neural potential and write
    ``preprocessing.json``, ``preprocess_curves.png`` and ``preprocess_curves.md``.

    Returns:
        the metrics written to ``preprocessing.json``.
    """
    obs, _, next_obs, true, terminal = rollouts.transitions()
    acts = rollouts.action_vectors()
    n = rollouts.num_steps
    flat = obs.reshape(n, -1)
    raw = model.predict(flat, acts).astype(np.float64)
    pairs = episode_pairs(rollouts)
    ref = true.astype(np.float64) if objective == "reference_l2" else None
    pre: Preprocessed = preprocess_neural(raw, obs, next_obs, terminal, gamma, objective,
                                          offset, ref, pairs, normalize, epochs, seed=seed,
                                          progress=progress)
    support = np.abs(true) > 1e-9
    sparse_truth = 0 < support.mean() < 0.5
    shaping = shaping_fn(pre.potential, gamma, pre.offset)

    def raw_fn(o: np.ndarray, a: np.ndarray, _n: np.ndarray) -> np.ndarray:
        return model.predict(o.reshape(len(o), -1), a).astype(np.float64)

    def pre_fn(o: np.ndarray, a: np.ndarray, nx: np.ndarray) -> np.ndarray:
        return raw_fn(o, a, nx) + shaping(o, nx)

    fns = {"raw": raw_fn, "preprocessed": pre_fn}
    if reference is not None:
        fns["reference"] = lambda o, a, _n: reference.predict(o.reshape(len(o), -1), a
                                                              ).astype(np.float64)
    rng = np.random.default_rng(seed)
    batch = rng.choice(n, size=min(epic_batch, n), replace=False)
    samples_a, samples_s = rng.choice(n, epic_samples), rng.choice(n, epic_samples)
    epic_raw = epic_sampled(fns, obs[batch], acts[batch], next_obs[batch], acts[samples_a],
                            next_obs[samples_s], gamma, "raw")
    metrics: dict[str, Any] = {
        "env": rollouts.meta.get("env"), "objective": objective, "gamma": gamma,
        "offset": offset, "normalize": normalize, "transitions": n,
        "objective_before": pre.before, "objective_after": pre.after,
        "fitted_offset": pre.offset,
        "pearson_with_true_before": _corr(raw, true), "pearson_with_true_after":
        _corr(pre.rewards, true),
        "epic_raw_vs_preprocessed": epic_raw["preprocessed"],
        "epic_batch": len(batch), "epic_samples": epic_samples,
    }
    if sparse_truth:
        metrics["support_mass_before"] = support_mass(raw, support)
        metrics["support_mass_after"] = support_mass(pre.rewards, support)
    if reference is not None:
        epic_ref = epic_sampled(fns, obs[batch], acts[batch], next_obs[batch], acts[samples_a],
                                next_obs[samples_s], gamma, "reference")
        metrics["epic_to_reference_before"] = epic_ref["raw"]
        metrics["epic_to_reference_after"] = epic_ref["preprocessed"]
    metrics.update(documented_fields(raw, pre, true, obs, next_obs, terminal, gamma, objective,
                                     offset, ref, pairs, normalize, epochs, seed,
                                     metrics.get("epic_to_reference_before"),
                                     metrics.get("epic_to_reference_after")))
    out_dir.mkdir(parents=True, exist_ok=True)
    episodes = []
    for steps, _ in list(rollouts.episodes())[:3]:
        episodes.append((true[steps], raw[steps], pre.rewards[steps]))
    plot_preprocessed_curves(episodes, out_dir / "preprocess_curves.png", title)
    (out_dir / "preprocessing.json").write_text(json.dumps(metrics, indent=1))
    lines = ["### Reward preprocessing (rollouts, neural potential)", "",
             f"Objective `{objective}` (γ = {gamma}, offset {'on' if offset else 'off'}) on "
             f"{n} rollout transitions: {_f(pre.before)} → {_f(pre.after)}. Pearson with the "
             f"true reward {_f(metrics['pearson_with_true_before'])} → "
             f"{_f(metrics['pearson_with_true_after'])}; EPIC between raw and preprocessed "
             f"{_f(metrics['epic_raw_vs_preprocessed'])} (sampled: {len(batch)} transitions, "
             f"{epic_samples} coverage samples; 0 up to sampling of the canonicalisation).", ""]
    if reference is not None:
        lines += [f"EPIC to the reference model: {_f(metrics['epic_to_reference_before'])} → "
                  f"{_f(metrics['epic_to_reference_after'])}.", ""]
    lines += [f"![reward curves]({_rel(out_dir, 'preprocess_curves.png')})", ""]
    (out_dir / "preprocess_curves.md").write_text("\n".join(lines))
    return metrics


def documented_fields(raw: np.ndarray, pre: Preprocessed, true: np.ndarray, obs: np.ndarray,
                      next_obs: np.ndarray, terminal: np.ndarray, gamma: float, objective: str,
                      offset: bool, ref: np.ndarray | None, pairs: np.ndarray, normalize: str,
                      epochs: int, seed: int, epic_before: float | None,
                      epic_after: float | None) -> dict[str, Any]:
    """The fields ``preprocessing.json`` has for gridworlds (docs/guide/reward-understanding.md), on
    rollout transitions: for r̂ and for a copy of the true reward shaped by a random potential
    (``Φ(s) = w·s / √d``, ``w ~ N(0, I)``), preprocessed the same way, the fraction of |r| on
    the transitions the true reward rewards, the direct Pearson distance to the true reward,
    and EPIC to it before and after. The true reward is known on the rollouts only, so EPIC
    (which needs rewards of unseen transitions) is that to the ``--reference`` model when one
    is given, else ``null``; the shaped copy's EPIC to the true reward is 0 by construction.
    """
    n = len(raw)
    term = np.asarray(terminal, bool)
    support = np.abs(true) > 1e-9
    flat, flat_next = obs.reshape(n, -1).astype(np.float64), \
        next_obs.reshape(n, -1).astype(np.float64)
    w = np.random.default_rng(seed).normal(size=flat.shape[1]) / np.sqrt(flat.shape[1])
    shaped_true = true + gamma * (flat_next @ w) * ~term - flat @ w
    shaped = preprocess_neural(shaped_true, obs, next_obs, terminal, gamma, objective, offset,
                               ref, pairs, normalize, epochs, seed=seed)
    return {
        "support_transitions": int(support.sum()),
        "true_support_mass": support_mass(true, support),
        "learned": {
            "support_mass_before": support_mass(raw, support),
            "support_mass_after": support_mass(pre.rewards, support),
            "epic_before": epic_before, "epic_after": epic_after,
            "direct_pearson_distance_before": pearson_distance(raw, true),
            "direct_pearson_distance_after": pearson_distance(pre.rewards, true),
        },
        "shaped_true": {
            "support_mass_before": support_mass(shaped_true, support),
            "support_mass_after": support_mass(shaped.rewards, support),
            "epic_before": 0.0, "epic_after": 0.0,
            "direct_pearson_distance_before": pearson_distance(shaped_true, true),
            "direct_pearson_distance_after": pearson_distance(shaped.rewards, true),
            "objective_before": shaped.before, "objective_after": shaped.after,
        },
        "epic_method": "sampled, to the reference model (--reference)" if epic_before is not
        None else "none: the true reward is known on the rollouts only (give --reference)",
    }


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])
