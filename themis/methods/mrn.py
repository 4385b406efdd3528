"""MRN: Meta-Reward-Net, the reward model trained through the critic it teaches.

Liu, Bai, Wang, Zhang, Zhou & Zhang, "Meta-Reward-Net: Implicitly Differentiable Reward
Learning for Preference-based Reinforcement Learning", NeurIPS 2022; the implementation
followed is the one in CJReinforce/RIME_ICML2024 (``train_MRN.py`` ``bilevel_update``,
``utils.py`` ``MetaOptim``, ``config/MRN.py``, ``run_parallel.sh``).

Every ``meta_steps`` environment steps while feedback is open, on one SAC batch:

1. inner step: a copy φ of the critic takes one SGD step (learning rate ``sac.critic_lr``) on
   the TD loss Σ_heads mean_b (Q_φ(s_b, a_b) − y_b)², y_b = r̂_θ(s_b, a_b) + γ (1 − d_b) V̄(s'_b),
   with V̄ the target critic's soft value (no gradient) and r̂_θ the ensemble mean, so that
   φ' = φ − lr ∇_φ depends on the reward parameters θ;
2. outer step: each of the updated critic's heads scores the first (state, action) of both
   segments of the last ``reward_batch`` labelled pairs; the Bradley–Terry cross-entropy of
   these two scores with the labels, summed over the two heads and weighted ``outer_weight``,
   is differentiated through φ' to θ, and the reward model's optimiser takes one step.

The agent's own critic is not touched (the official code does the same on a copy); the loop
then relabels the replay buffer with the updated r̂ and takes its usual SAC step on a new batch
(the official code takes it on the same batch with the new r̂). The official runs
(RyanLiu112/MRN README) use ``num_meta_steps`` 1000 on DeepMind Control and 10000 on
Meta-World (not ``config/train_MRN.yaml``'s default 5000, which CJReinforce/RIME_ICML2024
``run_parallel.sh`` passes), ``outer_weight`` 0.1, ``feed_type=1``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from themis.agents.buffers import ReplayBufferSamples
from themis.core.ranges import NON_NEGATIVE, POSITIVE, Range
from themis.core.run_keys import RunKeys
from themis.methods.base import Method, MethodContext
from themis.reward.dataset import PreferenceDataset
from themis.reward.trainer import bradley_terry_loss
from themis.utils import ConfigError


@dataclass
class MRNConfig:
    """``mrn.*`` keys (``method=mrn`` sets ``enabled``); defaults: the official README's DMC
    runs (``method=mrn domain=MetaWorld``: ``meta_steps`` 10000)."""

    enabled: bool = False
    """Switch MRN on (``method=mrn``)."""
    meta_steps: int = 1000
    """Environment steps between two bilevel updates of the reward model (``num_meta_steps``:
    1000 on DMC and MuJoCo, 10000 on Meta-World)."""
    outer_weight: float = 0.1
    """Weight of the outer (preference) loss through the updated critic."""


def meta_outer_loss(critic: nn.Module, rewards: torch.Tensor, obs: torch.Tensor,
                    actions: torch.Tensor, bootstrap: torch.Tensor, lr: float,
                    pair_obs: torch.Tensor, pair_actions: torch.Tensor,
                    labels: torch.Tensor) -> torch.Tensor:
    """The preference loss of the critic after one SGD step on rewards ``rewards``.

    Args:
        critic: a module ``(obs (B, o), actions (B, a)) -> (heads, B)`` Q-values (SAC's
            double critic); its parameters are read, never changed.
        rewards: ``(B,)`` r̂ of the batch, carrying the gradient to the reward model.
        obs, actions: the batch, ``(B, o)`` and ``(B, a)``.
        bootstrap: ``(B,)`` γ (1 − d) V̄(s'), without gradient.
        lr: the inner SGD step size (the critic's learning rate).
        pair_obs, pair_actions: the first step of both segments of each pair, ``(n, 2, o)`` and
            ``(n, 2, a)``.
        labels: ``(n,)`` probability that segment 2 is preferred.

    Returns:
        Scalar: Σ over heads of the mean Bradley–Terry cross-entropy of (Q'(first step of
        segment 1), Q'(first step of segment 2)) with the labels (MRN's outer objective,
        before ``outer_weight``).
    """
    params = {k: p.detach().requires_grad_(True) for k, p in critic.named_parameters()}
    q = functional_call(critic, params, (obs, actions))
    target = rewards + bootstrap
    inner = F.mse_loss(q, target.expand_as(q), reduction="none").mean(1).sum()
    grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
    stepped = {k: p - lr * g for (k, p), g in zip(params.items(), grads, strict=True)}
    n = len(labels)
    scores = functional_call(critic, stepped, (pair_obs.reshape(2 * n, -1),
                                               pair_actions.reshape(2 * n, -1)))
    scores = scores.reshape(-1, n, 2)  # (heads, n, segment)
    return bradley_terry_loss(scores[..., 0], scores[..., 1], labels.expand(len(scores), n)).sum()


class MetaRewardUpdate:
    """MRN's bilevel update of the reward model (module docstring).

    Args:
        model: the reward ensemble (r̂ is its members' mean).
        optimizer: the reward model's optimiser (the reward trainer's, as in the official
            code, which steps ``reward_model.opt``).
        cfg: the ``mrn.*`` keys.

    Attributes:
        updates: bilevel updates so far; ``outer_loss``: the last one's weighted outer loss
            (``mrn_updates``, ``mrn_outer_loss`` in ``reward.csv``).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 cfg: MRNConfig) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.updates = 0
        self.outer_loss = float("nan")

    def due(self, step: int) -> bool:
        """Whether a bilevel update comes at environment step ``step``."""
        return step % self.cfg.meta_steps == 0

    def __call__(self, agent: Any, batch: ReplayBufferSamples, dataset: PreferenceDataset,
                 pairs: int) -> float:
        """One bilevel update on ``batch`` and the last ``pairs`` labelled pairs.

        Args:
            agent: the SAC agent (``critic``, ``critic_target``, ``actor``, ``alpha``,
                ``cfg.discount``, ``cfg.critic_lr``).
            batch: a SAC batch from the replay buffer.
            dataset: the preference labels (pairwise).
            pairs: how many of the most recent labels the outer loss uses (``reward_batch``).

        Returns:
            The weighted outer loss before the step.
        """
        device = batch.observations.device
        obs, actions, labels = dataset.tensors(device)
        n = min(pairs, len(labels))
        with torch.no_grad():
            next_action, next_log_prob = agent.actor.sample(batch.next_observations)
            next_v = agent.critic_target(batch.next_observations, next_action).min(0).values \
                - agent.alpha * next_log_prob
            bootstrap = batch.not_dones * agent.cfg.discount * next_v
        rewards = self.model(batch.observations, batch.actions).mean(0)
        loss = self.cfg.outer_weight * meta_outer_loss(
            agent.critic, rewards, batch.observations, batch.actions, bootstrap,
            agent.cfg.critic_lr, obs[-n:, :, 0].float(), actions[-n:, :, 0], labels[-n:])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward(inputs=list(self.model.parameters()))
        self.optimizer.step()
        self.updates += 1
        self.outer_loss = float(loss.detach())
        return self.outer_loss

    def stats(self) -> dict[str, float]:
        """``reward.csv`` columns: bilevel updates so far, the last one's weighted loss."""
        return {"mrn_updates": self.updates, "mrn_outer_loss": self.outer_loss}

    def state_dict(self) -> dict[str, float]:
        return {"updates": self.updates, "outer_loss": self.outer_loss}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.updates, self.outer_loss = int(state["updates"]), float(state["outer_loss"])


class MRN(Method[MRNConfig]):
    """MRN as a method (module docstring): the bilevel update between feedback rounds."""

    name, title, published = "mrn", "MRN", "2022-10"
    Config = MRNConfig
    RANGES: ClassVar[Mapping[str, Range]] = {
        "meta_steps": POSITIVE, "outer_weight": NON_NEGATIVE}
    inside_agent = "trains the reward model through the agent's critic"

    def __init__(self, cfg: MRNConfig, context: MethodContext) -> None:
        super().__init__(cfg, context)
        self.update: MetaRewardUpdate | None = None

    @classmethod
    def check(cls, run_cfg: RunKeys, agent: str | None, where: str) -> None:
        """SAC only: the inner step is one of SAC's critic."""
        if agent in ("ppo", "a2c"):
            raise ConfigError("method=mrn trains the reward model through one step of SAC's "
                              "critic; PPO has no Q-function: use it with SAC (Box actions)")

    def bind(self, model: Any, optimizer: torch.optim.Optimizer) -> None:
        self.update = MetaRewardUpdate(model, optimizer, self.cfg)

    def between_rounds(self, agent: Any, step: int, sample: Callable[[], Any],
                       dataset: Any, reward_batch: int) -> bool:
        """A bilevel update every ``meta_steps`` steps."""
        if self.update is None or not self.update.due(step):
            return False
        self.update(agent, sample(), dataset, reward_batch)
        return True

    def stats(self) -> dict[str, float]:
        return self.update.stats() if self.update is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return {"mrn": self.update.state_dict()} if self.update is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "mrn" in state and self.update is not None:
            self.update.load_state_dict(state["mrn"])


__all__ = ["MRN", "MRNConfig", "MetaRewardUpdate", "meta_outer_loss"]
