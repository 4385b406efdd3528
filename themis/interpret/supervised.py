"""Supervised reward nets: a reward ensemble regressed on the true reward of rollouts.

The interpretability baseline of reward-function-interpretability (``train_regression.py``): the
same architecture as a learned reward model (:class:`themis.reward.RewardEnsemble`), trained on
the true reward instead of preferences, shows what the network can represent and gives every
tool (inspection, preprocessing, feature visualisation) a reference to compare a learned model
with. It is saved as a learned one is (:func:`themis.reward.save_reward_model`:
``OUT/checkpoints/reward_model.pt``, loadable with :func:`themis.load_reward_model`), with
``supervised.json`` beside it (held-out error and correlation, the target map, the data).

The members end in tanh (bounded output), so the regression target is the true reward mapped
affinely into [−0.9, 0.9]: ``t = (r − target_offset) / target_scale``; the checkpoint stores the
two numbers and :func:`predict_reward_units` maps predictions back. Episodes, not steps, are split
into training and held-out sets (steps of one episode are correlated).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from themis.interpret.rollouts import Rollouts
from themis.reward.ensemble import RewardEnsemble, save_reward_model
from themis.utils import make_adam


@dataclass
class SupervisedReport:
    """Quality of a supervised reward net (rewards in the env's units).

    Attributes:
        heldout_mse, heldout_pearson: on the held-out episodes' steps (ensemble mean).
        train_mse, train_pearson: on the training steps.
        heldout_steps, train_steps: sizes.
        target_offset, target_scale: ``t = (r − offset) / scale``.
        epochs: passes over the training steps.
    """

    heldout_mse: float
    heldout_pearson: float
    train_mse: float
    train_pearson: float
    heldout_steps: int
    train_steps: int
    target_offset: float
    target_scale: float
    epochs: int


def target_map(rewards: np.ndarray) -> tuple[float, float]:
    """``(offset, scale)`` mapping ``[min, max]`` of the rewards onto [−0.9, 0.9]."""
    lo, hi = float(np.min(rewards)), float(np.max(rewards))
    return (hi + lo) / 2.0, max((hi - lo) / 2.0 / 0.9, 1e-8)


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def predict_reward_units(model: RewardEnsemble, obs: np.ndarray, actions: np.ndarray,
                         offset: float, scale: float) -> np.ndarray:
    """Ensemble-mean prediction in the true reward's units: ``offset + scale · r̂``.
    Shapes: ``obs (n, obs_dim)``, ``actions (n, action_dim)`` -> ``(n,)``."""
    return offset + scale * model.predict(obs, actions).astype(np.float64)


def train_supervised(rollouts: Rollouts, ensemble_size: int = 3, hidden_dim: int = 256,
                     hidden_depth: int = 3, epochs: int = 20, batch_size: int = 256,
                     lr: float = 3e-4, heldout: float = 0.2, balance: bool = False,
                     seed: int = 0, device: str | torch.device = "cpu",
                     progress: Callable[[int], None] | None = None
                     ) -> tuple[RewardEnsemble, SupervisedReport]:
    """Regress a reward ensemble on the true rewards of ``rollouts``.

    Args:
        rollouts: episodes with true rewards (two or more episodes for a held-out split).
        ensemble_size, hidden_dim, hidden_depth: the ensemble (as ``ensemble_size``,
            ``reward_hidden_dim``, ``reward_hidden_depth`` of a run).
        epochs: passes over the training steps; each member draws its own minibatches.
        batch_size, lr: Adam.
        heldout: fraction of the episodes held out (at least one episode).
        balance: sample steps inversely to how common their reward is (10 bins), for sparse
            rewards where nearly every step is 0.
        seed: split, initialisation and minibatches.
        device: where to train.
        progress: called with 1 after each epoch.

    Returns:
        ``(model, report)``, the model in eval mode on ``device``.

    Raises:
        ValueError: fewer than 2 episodes, ``heldout`` outside (0, 1), no steps, or arrays
            that are not finite numbers.
    """
    if rollouts.num_episodes < 2:
        raise ValueError(f"need at least 2 episodes for a held-out split, got "
                         f"{rollouts.num_episodes}")
    if not 0.0 < heldout < 1.0:
        raise ValueError(f"heldout must be in (0, 1), got {heldout}")
    for name in ("obs", "acts", "rews"):  # a regression on NaN gives NaN weights, silently
        array = getattr(rollouts, name)
        if array.dtype.kind not in "fiub":
            raise ValueError(f"rollouts' {name} are {array.dtype}, not numbers")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise ValueError(f"rollouts' {name} hold NaN or infinite values; a reward cannot be "
                             "regressed on them")
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    order = rng.permutation(rollouts.num_episodes)
    n_held = min(rollouts.num_episodes - 1, max(1, round(heldout * rollouts.num_episodes)))
    held_eps, train_eps = np.sort(order[:n_held]), np.sort(order[n_held:])
    train, held = rollouts.select(train_eps), rollouts.select(held_eps)
    if train.num_steps == 0 or held.num_steps == 0:
        raise ValueError("the training or held-out episodes have no steps")
    obs_shape = tuple(rollouts.obs.shape[1:])
    obs_dim = int(np.prod(obs_shape))
    acts_train = train.action_vectors()
    offset, scale = target_map(train.rews)
    model = RewardEnsemble(obs_dim, acts_train.shape[1], ensemble_size, hidden_dim,
                           hidden_depth, obs_shape=obs_shape).to(device)
    optimizer = make_adam(model.parameters(), lr)
    o_train = torch.as_tensor(train.obs[train.step_obs_index].reshape(train.num_steps, -1),
                              device=device)
    a_train = torch.as_tensor(acts_train, device=device)
    t_train = torch.as_tensor((train.rews - offset) / scale, dtype=torch.float32, device=device)
    n = train.num_steps
    if balance:
        bins = np.digitize(train.rews, np.linspace(train.rews.min(), train.rews.max(), 11)[1:-1])
        counts = np.bincount(bins, minlength=10)
        p = 1.0 / counts[bins]
        p = p / p.sum()
    steps_per_epoch = max(1, n // batch_size)
    model.train()
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            idx = rng.choice(n, size=(ensemble_size, min(batch_size, n)), p=p) if balance else \
                rng.integers(0, n, size=(ensemble_size, min(batch_size, n)))
            i = torch.as_tensor(idx, device=device)
            pred = model(o_train[i], a_train[i])  # (E, B): each member its own batch
            loss = ((pred - t_train[i]) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if progress is not None:
            progress(1)
    model.eval()

    def score(part: Rollouts) -> tuple[float, float]:
        pred = predict_reward_units(model, part.obs[part.step_obs_index].reshape(
            part.num_steps, -1), part.action_vectors(), offset, scale)
        return float(np.mean((pred - part.rews) ** 2)), _pearson(pred, part.rews)

    held_mse, held_r = score(held)
    train_mse, train_r = score(train)
    return model, SupervisedReport(held_mse, held_r, train_mse, train_r, held.num_steps,
                                   train.num_steps, offset, scale, epochs)


def save_supervised(model: RewardEnsemble, report: SupervisedReport, out_dir: str | Path,
                    meta: dict[str, Any]) -> Path:
    """Write ``OUT/checkpoints/reward_model.pt`` (the learned-model format, with ``env``,
    ``domain``, ``supervised``, ``target_offset``, ``target_scale``) and ``OUT/supervised.json``.

    Returns:
        the checkpoint's path.
    """
    out = Path(out_dir)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    extra = {k: v for k, v in (("env", meta.get("env")), ("domain", meta.get("domain")))
             if isinstance(v, str)}
    path = save_reward_model(model, out / "checkpoints" / "reward_model.pt", step=0,
                             supervised=True, target_offset=report.target_offset,
                             target_scale=report.target_scale, **extra)
    (out / "supervised.json").write_text(json.dumps({**asdict(report), **meta}, indent=1,
                                                    default=str))
    return path
