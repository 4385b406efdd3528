"""RIME: robust reward learning from noisy preference labels.

Cheng, Xiong, Zhang, Wang, Ji, Li & Wang, "RIME: Robust Preference-based Reinforcement
Learning with Noisy Preferences", ICML 2024; official code CJReinforce/RIME_ICML2024
``reward_model_RIME.py`` (``train_reward``), ``train_RIME.py`` and ``run_parallel.sh``.

**Sample selection** (:class:`RobustLabelFilter`), before every reward-training epoch: each
label's cross-entropy ℓᵢ = −[yᵢ log p̄ᵢ + (1 − yᵢ) log(1 − p̄ᵢ)] under the ensemble-mean
probability p̄ᵢ = mean_m sigmoid(R¹ − R⁰);

- trusted (kept as given) when ℓᵢ < τ_lower = −ln(x) + α·x + min(β_t · var, 3), where x is a
  running average (rate 0.1) of the largest trusted ℓ of earlier epochs (0 at first: every label
  is trusted), var the pooled variance of the trusted ℓ so far, and β_t falls linearly from
  ``beta_init`` to ``beta_min`` over ``beta_decay_epochs`` reward epochs;
- flipped (trained with 1 − yᵢ) when ℓᵢ > τ_upper = −ln(``flip_tau``) (the model contradicts
  the label with probability > 1 − flip_tau); ties are never flipped;
- otherwise left out of this epoch (kept in the dataset: the next epoch decides again).

**Epochs**: each round trains at least ``least_reward_update + 2`` epochs (up to
``reward_update``) and then stops once train accuracy exceeds 0.98 (``train_RIME.py``
``learn_reward``: ``total_acc > 0.98 and epoch > least_reward_update``), so β falls over the
rounds as the official schedule intends (BPref's 0.97 stop ends most rounds after 1–3 epochs).

A label both trusted and flipped (possible only when τ_lower > τ_upper) is flipped once here;
the official code trains on it twice. Its loss counts in the running statistics (x, var) as
in the official code.

**Warm start** (:class:`WarmStart`): during unsupervised pretraining, after every agent
update, the reward model takes ``warm_start_steps`` (5) Adam steps, each on a fresh replay batch,
regressing r̂(s, a) onto z / max|z| (mean squared error, summed over members), with
z = (d(s) − μ) / σ the standardised novelty of the state ``s`` (its k-NN distance d under the
running statistics of the agent's pretraining reward) and max|z| that of the smallest and
largest d seen: a target centred in about [−1, 1], the ensemble's tanh range
(``train_RIME.py``, ``update reward model to fit with intrinsic reward``). The agent's own
pretraining reward is ``clip((d − μ) / 3σ, −1, 1)`` (``agent/sac_RIME.py``
``update_critic_state_ent``; ``state_entropy_scale=centred``), so its critic's values stay in
the range of the warm-started r̂ and RIME keeps it: **no critic reset** at the end of
pretraining (``config/method/rime.yaml`` sets ``reset_critic=false``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from themis.core.ranges import NON_NEGATIVE, POSITIVE, UNIT, Range
from themis.core.run_keys import RunKeys
from themis.methods.base import Method, MethodContext
from themis.utils import ConfigError

if TYPE_CHECKING:
    from themis.agents.intrinsic import NoveltySample
    from themis.reward.ensemble import RewardEnsemble


@dataclass
class RIMEConfig:
    """``rime.*`` keys (``method=rime`` sets ``enabled``); defaults: ``run_parallel.sh``."""

    enabled: bool = False
    """Switch RIME on (``method=rime``)."""
    threshold_alpha: float = 0.5
    """α of the lower threshold −ln(x) + α·x."""
    beta_init: float = 3.0
    """β at the first reward epoch (weight of the loss variance in the lower threshold)."""
    beta_min: float = 1.0
    """β after ``beta_decay_epochs`` epochs."""
    beta_decay_epochs: int = 60
    """Reward epochs over which β falls linearly (60 on DMC, 600 on Meta-World)."""
    flip_tau: float = 0.001
    """Labels the model contradicts with probability above 1 − flip_tau are flipped."""
    warm_start_steps: int = 5
    """Reward-model steps on the intrinsic reward per pretraining update (0: no warm start)."""
    least_reward_update: int = 15
    """Reward training stops early (train accuracy > ``target_accuracy``) only after epoch
    index ``least_reward_update`` (0-based): at least ``least_reward_update + 2`` epochs per
    round, up to ``reward_update`` (15 on DMC and MuJoCo, 5 on Meta-World)."""
    target_accuracy: float = 0.98
    """Train accuracy that ends a round's reward training early (``train_RIME.py``: 0.98)."""


class RobustLabelFilter:
    """Chooses, each epoch, which labels to train on as given, flipped, or not at all.

    Args:
        cfg: the ``rime.*`` keys.
    """

    def __init__(self, cfg: RIMEConfig) -> None:
        self.cfg = cfg
        self.epochs = 0
        self.max_ema = 0.0  # x: running average of the largest trusted loss
        self.mean, self.var, self.count = 0.0, 1.0, 0  # pooled statistics of trusted losses
        self.kept = self.flipped = self.dropped = 0
        self.caught = self.discarded_clean = 0

    def beta(self) -> float:
        c = self.cfg
        return max(c.beta_min, c.beta_init - (c.beta_init - c.beta_min) / c.beta_decay_epochs
                   * self.epochs)

    def thresholds(self) -> tuple[float, float]:
        """``(τ_lower, τ_upper)`` for the coming epoch."""
        x = self.max_ema
        lower = -np.log(x + 1e-8) + self.cfg.threshold_alpha * x + min(self.beta() * self.var,
                                                                       3.0)
        return float(lower), float(-np.log(self.cfg.flip_tau))

    @torch.no_grad()
    def select(self, model: RewardEnsemble, obs: torch.Tensor, act: torch.Tensor,
               labels: torch.Tensor, oracle: np.ndarray | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The labels of this epoch.

        Args:
            model: the reward ensemble.
            obs, act, labels: the dataset's tensors ``(n, 2, H, d)``, ``(n, 2, H, a)``, ``(n,)``.
            oracle: ``(n,)`` labels of the true returns (for the caught / discarded-clean
                counts; a synthetic teacher's or the env's truth), or ``None``.

        Returns:
            ``(index, labels)``: dataset rows to train on and their (possibly flipped) labels.
        """
        n = len(labels)
        chunk = 256
        p = torch.cat([
            torch.sigmoid(model.segment_returns(obs[i:i + chunk, 1], act[i:i + chunk, 1])
                          - model.segment_returns(obs[i:i + chunk, 0], act[i:i + chunk, 0])
                          ).mean(0) for i in range(0, n, chunk)])
        loss = F.binary_cross_entropy(p.clamp(1e-7, 1 - 1e-7), labels, reduction="none")
        lower, upper = self.thresholds()
        strict = labels != 0.5
        flipped = (loss > upper) & strict
        below = loss < lower
        trusted = below & ~flipped
        # the statistics take every label below τ_lower, those also flipped included, as
        # the official KL_div.update(KL_div[trust_sample_bool_index])
        trusted_loss = loss[below].double().cpu().numpy()
        if len(trusted_loss):  # official RunningMeanStd(mode="fixed", lr=0.1)
            self.max_ema += 0.1 * (float(trusted_loss.max()) - self.max_ema)
            m, v, k = float(trusted_loss.mean()), float(trusted_loss.var()), len(trusted_loss)
            delta, total = m - self.mean, self.count + k
            self.var = (self.var * self.count + v * k + delta ** 2 * self.count * k / total) \
                / total
            self.mean += 0.1 * delta
            self.count = total
        self.epochs += 1
        self.kept, self.flipped = int(trusted.sum()), int(flipped.sum())
        self.dropped = n - self.kept - self.flipped
        if oracle is not None:
            truth = torch.as_tensor(oracle, device=labels.device)
            wrong = (labels != truth) & strict & (truth != 0.5)
            removed = ~trusted  # dropped or flipped: not trained on as given
            self.caught = int((wrong & removed).sum())
            self.discarded_clean = int((~wrong & removed).sum())
        index = torch.cat([torch.nonzero(trusted).squeeze(1), torch.nonzero(flipped).squeeze(1)])
        return index, torch.cat([labels[trusted], 1.0 - labels[flipped]])

    def stats(self) -> dict[str, float]:
        """``reward.csv`` columns: the last epoch's labels kept, flipped, left out, and
        against the true returns, wrong ones caught and right ones discarded."""
        return {"rime_kept": self.kept, "rime_flipped": self.flipped,
                "rime_dropped": self.dropped, "rime_caught": self.caught,
                "rime_discarded_clean": self.discarded_clean}

    def state_dict(self) -> dict[str, float]:
        return {"epochs": self.epochs, "max_ema": self.max_ema, "mean": self.mean,
                "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.epochs, self.count = int(state["epochs"]), int(state["count"])
        self.max_ema, self.mean, self.var = (float(state[k]) for k in ("max_ema", "mean", "var"))


class WarmStart:
    """Regresses the reward ensemble onto the standardised novelty of replay states.

    Args:
        model: the reward ensemble.
        optimizer: its Adam optimiser (shared with preference training).
        steps: gradient steps per call, each on a fresh batch.
    """

    def __init__(self, model: RewardEnsemble, optimizer: torch.optim.Optimizer,
                 steps: int) -> None:
        self.model, self.optimizer, self.steps = model, optimizer, steps
        self.loss = float("nan")

    def stats(self) -> dict[str, float]:
        """``reward.csv`` column: the last warm-start loss."""
        return {"warm_start_loss": self.loss}

    def __call__(self, draw: Callable[[], NoveltySample]) -> None:
        """``steps`` Adam steps; ``draw()`` gives each one a fresh batch: observations
        ``(B, *obs_shape)``, actions ``(B, a)``, novelty z ``(B,)`` and its bound max|z|; the
        target is z / bound."""
        self.model.train()
        loss = torch.full((), float("nan"))
        for _ in range(self.steps):
            batch = draw()
            target = batch.novelty.reshape(-1).float() / batch.bound
            pred = self.model(batch.observations, batch.actions)  # (E, B)
            loss = ((pred - target) ** 2).mean(-1).sum()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.loss = float(loss.detach())


class RIME(Method[RIMEConfig]):
    """RIME as a method (module docstring): the label filter each epoch, its stop rule, the
    warm start during pretraining."""

    name, title, published = "rime", "RIME", "2024-02"
    Config = RIMEConfig
    RANGES: ClassVar[Mapping[str, Range]] = {
        "threshold_alpha": NON_NEGATIVE, "beta_init": NON_NEGATIVE, "beta_min": NON_NEGATIVE,
        "beta_decay_epochs": POSITIVE, "flip_tau": UNIT, "warm_start_steps": NON_NEGATIVE,
        "least_reward_update": NON_NEGATIVE, "target_accuracy": UNIT}

    def __init__(self, cfg: RIMEConfig, context: MethodContext) -> None:
        super().__init__(cfg, context)
        self.filter = RobustLabelFilter(cfg)
        self.warm: WarmStart | None = None

    @classmethod
    def check(cls, run_cfg: RunKeys, agent: str | None, where: str) -> None:
        """The warm start needs pretraining in the learner's reach."""
        warm = cls.own_keys(run_cfg).warm_start_steps
        if run_cfg.pretrained_snapshot and warm:
            raise ConfigError("method=rime warm-starts the reward model during pretraining, and "
                              "a pretraining snapshot keeps no reward model: drop "
                              "pretrained_snapshot (RIME pretrains itself), or set "
                              "rime.warm_start_steps=0 to start from it without the warm start")
        if where == "async" and warm and run_cfg.num_unsup_steps:
            raise ConfigError("reward_training=async: RIME's warm start trains the reward model "
                              "on the agent's pretraining batches; set rime.warm_start_steps=0; "
                              "use reward_training=sync")

    def bind(self, model: Any, optimizer: torch.optim.Optimizer) -> None:
        if self.cfg.warm_start_steps:
            self.warm = WarmStart(model, optimizer, self.cfg.warm_start_steps)

    def stop_rule(self) -> tuple[float, int]:
        return self.cfg.target_accuracy, self.cfg.least_reward_update

    def select_labels(self, model: Any, obs: torch.Tensor, act: torch.Tensor,
                      labels: torch.Tensor, oracle: np.ndarray | None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.filter.select(model, obs, act, labels, oracle)

    def pretraining_step(self, draw: Callable[[], Any]) -> None:
        if self.warm is not None:
            self.warm(draw)

    def stats(self) -> dict[str, float]:
        return {**self.filter.stats(), **(self.warm.stats() if self.warm is not None else {})}

    def state_dict(self) -> dict[str, Any]:
        return {"rime_filter": self.filter.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "rime_filter" in state:
            self.filter.load_state_dict(state["rime_filter"])


__all__ = ["RIME", "RIMEConfig", "RobustLabelFilter", "WarmStart"]
