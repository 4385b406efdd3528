"""Soft Actor-Critic (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications").

Double Q critic with target networks, a tanh-squashed Gaussian actor and a learned temperature
(Haarnoja et al. 2018b, Eq. 18), in the pytorch_sac tradition that PEBBLE builds on. The agent
never sees the logger: :meth:`SAC.update` returns a dict of metrics (detached tensors, so that no
host synchronisation happens on CUDA unless somebody reads them).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from themis.agents.buffers import ReplayBufferSamples
from themis.agents.networks import EnsembleMLP, mlp
from themis.core.precision import autocast
from themis.utils import make_adam, polyak_update

_LOG2 = math.log(2.0)


@dataclass
class SACConfig:
    """Hyper-parameters of :class:`SAC` (defaults as in Stable-Baselines3 / pytorch_sac)."""

    hidden_dim: int = 256
    """Width of every hidden layer of actor and critic."""
    hidden_depth: int = 2
    """Number of hidden layers of actor and critic."""
    batch_size: int = 256
    """Transitions per gradient update."""
    discount: float = 0.99
    """Discount factor gamma."""
    actor_lr: float = 3e-4
    """Actor learning rate (Adam)."""
    critic_lr: float = 3e-4
    """Critic learning rate (Adam)."""
    alpha_lr: float = 3e-4
    """Temperature learning rate (Adam)."""
    init_temperature: float = 0.1
    """Initial entropy temperature alpha."""
    learnable_temperature: bool = True
    """Tune alpha towards the target entropy -|A| (Haarnoja et al. 2018b, Eq. 18)."""
    critic_tau: float = 0.005
    """Polyak coefficient of the target critic."""
    actor_update_frequency: int = 1
    """Actor and temperature update every this many critic updates."""
    critic_target_update_frequency: int = 1
    """Polyak update of the target critic every this many updates."""
    log_std_min: float = -5.0
    """Lower bound of the policy's log standard deviation."""
    log_std_max: float = 2.0
    """Upper bound of the policy's log standard deviation."""


class SquashedGaussianActor(nn.Module):
    """pi(a|s) = tanh(N(mu(s), sigma(s))), actions in [-1, 1].

    Shapes: ``obs (B, obs_dim)`` -> actions ``(B, action_dim)`` and log-probabilities ``(B,)``.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_dim: int, hidden_depth: int,
                 log_std_min: float, log_std_max: float) -> None:
        super().__init__()
        self.trunk = mlp(obs_dim, hidden_dim, 2 * action_dim, hidden_depth)
        self.log_std_min = log_std_min
        self.log_std_max = log_std_max

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the pre-squash mean and log standard deviation, each ``(B, action_dim)``."""
        mu, log_std = self.trunk(obs).chunk(2, dim=-1)
        # Soft-bound log_std into [log_std_min, log_std_max] (pytorch_sac).
        log_std = torch.tanh(log_std)
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1)
        return mu, log_std

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample ``a = tanh(mu + sigma * eps)`` and its log-probability.

        The change-of-variables term uses the numerically stable
        ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))`` (SAC paper, Appendix C).
        """
        mu, log_std = self(obs)
        std = log_std.exp()
        eps = torch.randn_like(mu)
        u = mu + std * eps
        action = torch.tanh(u)
        log_prob = (-0.5 * eps.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - (2.0 * (_LOG2 - u - F.softplus(-2.0 * u))).sum(-1)
        return action, log_prob

    def sample_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The action of :meth:`sample` without its log-probability (acting): the same random
        draw, so the same action for the same generator state. ``(B, action_dim)``."""
        mu, log_std = self(obs)
        return torch.tanh(mu + log_std.exp() * torch.randn_like(mu))

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action ``tanh(mu(s))`` used for evaluation."""
        mu, _ = self(obs)
        return torch.tanh(mu)


class DoubleQCritic(nn.Module):
    """Two Q networks evaluated in one batched matmul. ``(B, obs), (B, act) -> (2, B)``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_dim: int, hidden_depth: int) -> None:
        super().__init__()
        self.q = EnsembleMLP(2, obs_dim + action_dim, hidden_dim, 1, hidden_depth)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.q(torch.cat([obs, action], dim=-1)).squeeze(-1)


class SAC:
    """Soft Actor-Critic for ``Box`` action spaces rescaled to [-1, 1].

    Args:
        obs_dim: size of the flat observation vector.
        action_dim: size of the action vector.
        device: where networks live.
        cfg: hyper-parameters.
        precision: ``torch.bfloat16`` runs :meth:`update`'s matrix products in bfloat16
            (:mod:`themis.core.precision`); ``None`` (default): float32 throughout.

    Interface (shared with every Themis agent): :meth:`act`, :meth:`update`,
    :meth:`reset_critic`, :meth:`state_dict`, :meth:`load_state_dict`.
    """

    METRICS = ("critic_loss", "q_mean", "actor_loss", "entropy", "alpha_loss", "alpha")
    """Names of the metrics :meth:`update` can return."""

    def __init__(self, obs_dim: int, action_dim: int, device: torch.device,
                 cfg: SACConfig | None = None, precision: torch.dtype | None = None) -> None:
        self.cfg = cfg = cfg or SACConfig()
        self.precision = precision
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.device = device
        self.target_entropy = -float(action_dim)
        self.actor = SquashedGaussianActor(obs_dim, action_dim, cfg.hidden_dim, cfg.hidden_depth,
                                           cfg.log_std_min, cfg.log_std_max).to(device)
        self.log_alpha = torch.tensor(math.log(cfg.init_temperature), device=device,
                                      requires_grad=True)
        # one optimiser step for the actor and the temperature (two parameter groups)
        groups: list[dict[str, Any]] = [{"params": list(self.actor.parameters()),
                                         "lr": cfg.actor_lr}]
        if cfg.learnable_temperature:
            groups.append({"params": [self.log_alpha], "lr": cfg.alpha_lr})
        self.actor_optimizer = make_adam(groups, cfg.actor_lr)
        self._actor_params = [p for group in groups for p in group["params"]]
        self.reset_critic()
        self.training = True
        self.metrics: dict[str, torch.Tensor] = {}  # of the last update (train.csv's columns)

    # ------------------------------------------------------------------ acting
    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()

    def train(self, training: bool = True) -> None:
        self.training = training
        self.actor.train(training)
        self.critic.train(training)

    @torch.no_grad()
    def act(self, obs: np.ndarray, sample: bool = True) -> np.ndarray:
        """Choose an action for one observation ``(obs_dim,)`` or a batch ``(B, obs_dim)``.

        Args:
            obs: observation(s).
            sample: draw from the policy (training) or take the mean action (evaluation).

        Returns:
            action(s) in [-1, 1], shape ``(action_dim,)`` or ``(B, action_dim)``.
        """
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        single = obs_t.dim() == 1
        if single:
            obs_t = obs_t.unsqueeze(0)
        action = self.actor.sample_action(obs_t) if sample else self.actor.mean_action(obs_t)
        action_np = action.cpu().numpy()
        return action_np[0] if single else action_np

    # ---------------------------------------------------------------- learning
    def reset_critic(self) -> None:
        """Re-initialise critic, target critic and critic optimiser.

        PEBBLE (Lee et al. 2021, Sec. 4.1) resets Q after unsupervised pretraining because the
        critic has learned values of the intrinsic reward, not of the task.
        """
        cfg = self.cfg
        self.critic = DoubleQCritic(self.obs_dim, self.action_dim, cfg.hidden_dim,
                                    cfg.hidden_depth).to(self.device)
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_target.requires_grad_(False)
        self.critic_optimizer = make_adam(self.critic.parameters(), cfg.critic_lr)
        # parameter lists walked once, not per update: 10 against 49 µs per update for the
        # gradient clearing, the critic's freeze and the Polyak step (2×128, one thread)
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())

    def update_critic(self, batch: ReplayBufferSamples) -> dict[str, torch.Tensor]:
        """One TD step on ``Q(s,a) -> r + gamma * (1 - d) * (min Q'(s',a') - alpha log pi)``."""
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(batch.next_observations)
            target_q = self.critic_target(batch.next_observations, next_action).min(0).values
            target_v = target_q - self.alpha * next_log_prob
            target = batch.rewards + batch.not_dones * self.cfg.discount * target_v
        q = self.critic(batch.observations, batch.actions)
        critic_loss = F.mse_loss(q, target.expand_as(q), reduction="none").mean(1).sum()
        _clear_grads(self._critic_params)
        critic_loss.backward()
        self.critic_optimizer.step()
        return {"critic_loss": critic_loss.detach(), "q_mean": q.detach().mean()}

    def update_actor_and_alpha(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Minimise ``E[alpha log pi(a|s) - min Q(s, a)]`` and tune alpha (Eq. 7 and 18).

        One backward pass and one optimiser step for both: the actor loss sees alpha detached
        and the temperature loss ``log pi`` detached, so the sum's gradients are each loss's own.
        """
        _set_requires_grad(self._critic_params, False)
        action, log_prob = self.actor.sample(obs)
        q = self.critic(obs, action).min(0).values
        actor_loss = (self.alpha.detach() * log_prob - q).mean()
        metrics = {"actor_loss": actor_loss.detach(), "entropy": -log_prob.detach().mean()}
        loss = actor_loss
        if self.cfg.learnable_temperature:
            alpha_loss = (self.alpha * (-log_prob.detach() - self.target_entropy)).mean()
            loss = actor_loss + alpha_loss
            metrics["alpha_loss"] = alpha_loss.detach()
        _clear_grads(self._actor_params)
        try:
            loss.backward()
        finally:
            _set_requires_grad(self._critic_params, True)
        self.actor_optimizer.step()
        metrics["alpha"] = self.alpha.detach()
        return metrics

    def update(self, batch: ReplayBufferSamples, step: int,
               update_actor: bool = True) -> dict[str, torch.Tensor]:
        """One SAC gradient step on ``batch``; returns metrics as detached scalar tensors (also
        kept as :attr:`metrics`)."""
        with autocast(self.precision, self.device):
            metrics = self.update_critic(batch)
            if update_actor and step % self.cfg.actor_update_frequency == 0:
                metrics.update(self.update_actor_and_alpha(batch.observations))
        if step % self.cfg.critic_target_update_frequency == 0:
            polyak_update(self._critic_params, self._target_params, self.cfg.critic_tau)
        self.metrics = metrics
        return metrics

    # -------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Networks, temperature and optimisers, for checkpoints and snapshots."""
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "actor_optimizer": self.actor_optimizer.state_dict(),  # actor and temperature
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (shapes must match)."""
        if (state["obs_dim"], state["action_dim"]) != (self.obs_dim, self.action_dim):
            raise ValueError(
                f"checkpoint is for obs_dim={state['obs_dim']}, action_dim={state['action_dim']}; "
                f"this agent has obs_dim={self.obs_dim}, action_dim={self.action_dim}"
            )
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_optimizer.load_state_dict(_joined_optimizer_state(state, self.actor_optimizer))
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])


def _clear_grads(params: Sequence[torch.Tensor]) -> None:
    """``Optimizer.zero_grad(set_to_none=True)`` for a known parameter list, without the
    optimiser's per-call bookkeeping."""
    for p in params:
        p.grad = None


def _set_requires_grad(params: Sequence[torch.Tensor], flag: bool) -> None:
    """``Module.requires_grad_`` for a known parameter list (no walk of the module tree)."""
    for p in params:
        p.requires_grad_(flag)


def _joined_optimizer_state(state: dict[str, Any], optimizer: torch.optim.Optimizer
                            ) -> dict[str, Any]:
    """The actor optimiser's state, also from checkpoints written before the actor and the
    temperature shared one optimiser (``alpha_optimizer`` saved on its own): its one parameter
    becomes the second group."""
    actor = state["actor_optimizer"]
    alpha = state.get("alpha_optimizer")
    if alpha is None or len(actor["param_groups"]) != 1:
        return actor
    if len(optimizer.param_groups) == 1:  # temperature fixed now: its old state is not needed
        return actor
    n = len(actor["param_groups"][0]["params"])
    return {"state": {**actor["state"], **{n + int(k): v for k, v in alpha["state"].items()}},
            "param_groups": [actor["param_groups"][0],
                             {**alpha["param_groups"][0], "params": [n]}]}
