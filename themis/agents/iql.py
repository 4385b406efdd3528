"""Implicit Q-Learning (Kostrikov, Nair & Levine, ICLR 2022): offline RL from a fixed dataset.

IQL never queries the critic at actions outside the dataset. Three losses, each one step per
batch, in the order of the official ``learner.py`` (github ikostrikov/implicit_q_learning):

1. value (Eq. 5): ``V(s)`` fits an upper expectile ``τ`` of ``min_i Q̄_i(s, a)`` (target critics)
   over the dataset's actions: ``L_V = E[|τ − 1(u < 0)| u²]``, ``u = min Q̄(s, a) − V(s)``;
2. actor (Eq. 7, advantage-weighted regression): ``L_π = −E[exp(β (min Q̄(s, a) − V(s)))
   log π(a|s)]`` with the weights clipped at 100;
3. critic (Eq. 6): both ``Q_i(s, a)`` fit ``r + γ (1 − terminal) V(s')``; then a Polyak step of
   the target critics (0.005).

Defaults are the paper's MuJoCo ones (App. B; the official ``configs/mujoco_config.py``):
expectile 0.7, inverse temperature β 3.0, Adam 3e-4 for all three networks (the actor's decayed
by a cosine to 0 over training), two hidden layers of 256 (ReLU), discount 0.99. The policy is a
Gaussian with mean ``tanh(μ(s))`` and a state-independent log standard deviation (the official
``NormalTanhPolicy`` with ``state_dependent_std=False``, ``tanh_squash_distribution=False``);
evaluation acts with its mean. Dataset rewards of locomotion tasks are scaled by
``1000 / (max return − min return)`` over the dataset's episodes (:func:`return_range_scale`).

The agent is written as Themis's SAC is: one module, ``update(batch, step)`` returns detached
metrics, ``device`` and ``precision`` (:mod:`themis.core.precision`) as SAC's, and a
``state_dict`` of plain tensors for checkpoints.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from themis.agents.buffers import ReplayBufferSamples
from themis.agents.networks import EnsembleMLP, mlp
from themis.core.precision import autocast
from themis.utils import make_adam, polyak_update


@dataclass
class IQLConfig:
    """Hyper-parameters of :class:`IQL` (defaults: the paper's MuJoCo settings)."""

    hidden_dim: int = 256
    """Width of every hidden layer of actor, critics and value."""
    hidden_depth: int = 2
    """Number of hidden layers."""
    batch_size: int = 256
    """Transitions per gradient step."""
    discount: float = 0.99
    """Discount factor gamma."""
    actor_lr: float = 3e-4
    """Actor learning rate (Adam), decayed by a cosine to 0 over ``total_steps``."""
    critic_lr: float = 3e-4
    """Critic learning rate (Adam)."""
    value_lr: float = 3e-4
    """Value learning rate (Adam)."""
    expectile: float = 0.7
    """tau of the value's expectile loss (0.5: the mean; -> 1: the max)."""
    temperature: float = 3.0
    """beta, the inverse temperature of the advantage weights exp(beta A)."""
    max_weight: float = 100.0
    """Advantage weights are clipped at this value."""
    critic_tau: float = 0.005
    """Polyak coefficient of the target critics."""
    log_std_min: float = -5.0
    """Lower bound of the policy's log standard deviation."""
    log_std_max: float = 2.0
    """Upper bound of the policy's log standard deviation."""


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """``E[|τ − 1(u < 0)| u²]`` of ``u = diff`` (IQL Eq. 5; the official ``loss`` in
    ``value_net.py``): asymmetric least squares whose minimiser over a constant ``V`` is the
    ``τ``-expectile of ``V + diff``.

    Args:
        diff: ``(B,)`` target minus prediction.
        expectile: ``τ`` in (0, 1).

    Returns:
        the scalar mean loss.
    """
    weight = torch.where(diff > 0, expectile, 1.0 - expectile)
    return (weight * diff.pow(2)).mean()


def advantage_weights(advantage: torch.Tensor, temperature: float,
                      max_weight: float = 100.0) -> torch.Tensor:
    """``min(exp(β A), max_weight)`` (IQL Eq. 7 as the official ``actor.py`` clips it).

    Shapes: ``(B,) -> (B,)``.
    """
    return torch.exp(advantage * temperature).clamp(max=max_weight)


def return_range_scale(episode_returns: np.ndarray) -> float:
    """``1000 / (max − min)`` of the dataset's episode returns: the factor the official
    ``train_offline.py`` multiplies MuJoCo rewards by (1.0 when every return is the same).

    Raises:
        ValueError: no episodes.
    """
    if len(episode_returns) == 0:
        raise ValueError("no episodes to scale rewards by")
    spread = float(np.max(episode_returns) - np.min(episode_returns))
    return 1000.0 / spread if spread > 0 else 1.0


class GaussianActor(nn.Module):
    """pi(a|s) = N(tanh(mu(s)), exp(log_std)), log_std a parameter per action dimension.

    Shapes: ``obs (B, obs_dim)`` -> mean ``(B, action_dim)``; :meth:`log_prob` -> ``(B,)``.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_dim: int, hidden_depth: int,
                 log_std_min: float, log_std_max: float) -> None:
        super().__init__()
        self.trunk = mlp(obs_dim, hidden_dim, action_dim, hidden_depth)
        self.log_std = nn.Parameter(torch.zeros(action_dim))
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.trunk(obs))

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Log-density of ``actions (B, action_dim)`` under the policy at ``obs``."""
        mean = self(obs).float()
        log_std = self.log_std.clamp(self.log_std_min, self.log_std_max)
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


class IQL:
    """Implicit Q-Learning for ``Box`` action spaces rescaled to [-1, 1].

    Args:
        obs_dim: size of the flat observation vector.
        action_dim: size of the action vector.
        device: where networks live.
        cfg: hyper-parameters.
        total_steps: gradient steps of the whole run (the actor's cosine schedule).
        precision: ``torch.bfloat16``: matrix products in bfloat16 inside :meth:`update`
            (:mod:`themis.core.precision`); ``None``: float32.

    Interface (as :class:`themis.agents.sac.SAC`): :meth:`act`, :meth:`update`,
    :meth:`state_dict`, :meth:`load_state_dict`.
    """

    METRICS = ("value_loss", "v_mean", "actor_loss", "adv_mean", "weight_mean", "critic_loss",
               "q_mean")
    """Names of the metrics :meth:`update` returns."""

    def __init__(self, obs_dim: int, action_dim: int, device: torch.device,
                 cfg: IQLConfig | None = None, total_steps: int = 1_000_000,
                 precision: torch.dtype | None = None) -> None:
        self.cfg = cfg = cfg or IQLConfig()
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.device, self.precision = device, precision
        self.actor = GaussianActor(obs_dim, action_dim, cfg.hidden_dim, cfg.hidden_depth,
                                   cfg.log_std_min, cfg.log_std_max).to(device)
        self.critic = EnsembleMLP(2, obs_dim + action_dim, cfg.hidden_dim, 1,
                                  cfg.hidden_depth).to(device)
        self.critic_target = copy.deepcopy(self.critic)
        self.critic_target.requires_grad_(False)
        self.value = mlp(obs_dim, cfg.hidden_dim, 1, cfg.hidden_depth).to(device)
        self.actor_optimizer = make_adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_optimizer = make_adam(self.critic.parameters(), cfg.critic_lr)
        self.value_optimizer = make_adam(self.value.parameters(), cfg.value_lr)
        self.actor_schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.actor_optimizer, T_max=max(1, total_steps))
        self.metrics: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ acting
    def train(self, training: bool = True) -> None:
        for net in (self.actor, self.critic, self.value):
            net.train(training)

    @torch.no_grad()
    def act(self, obs: np.ndarray, sample: bool = False) -> np.ndarray:
        """The policy's mean action ``(action_dim,)`` for one observation, or ``(B,
        action_dim)`` for a batch (``sample``: a draw from the Gaussian, clipped to [-1, 1])."""
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        single = obs_t.dim() == 1
        obs_t = obs_t.unsqueeze(0) if single else obs_t
        action = self.actor(obs_t).float()
        if sample:
            std = self.actor.log_std.clamp(self.cfg.log_std_min, self.cfg.log_std_max).exp()
            action = (action + std * torch.randn_like(action)).clamp(-1.0, 1.0)
        out = action.cpu().numpy()
        return out[0] if single else out

    # ---------------------------------------------------------------- learning
    def _target_q(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.critic_target(torch.cat([obs, actions], -1)).squeeze(-1).min(0).values

    def update(self, batch: ReplayBufferSamples, step: int) -> dict[str, torch.Tensor]:
        """One IQL step on ``batch`` (value, actor, critic, target critics); returns the
        metrics as detached scalar tensors (also kept as :attr:`metrics`)."""
        cfg = self.cfg
        with autocast(self.precision, self.device):
            target_q = self._target_q(batch.observations, batch.actions).float()
            # 1. value: the expectile of the target critics' minimum
            v = self.value(batch.observations).squeeze(-1).float()
            value_loss = expectile_loss(target_q - v, cfg.expectile)
            self.value_optimizer.zero_grad(set_to_none=True)
            value_loss.backward()
            self.value_optimizer.step()
            # 2. actor: advantage-weighted regression on the dataset's actions
            with torch.no_grad():
                advantage = target_q - self.value(batch.observations).squeeze(-1).float()
                weights = advantage_weights(advantage, cfg.temperature, cfg.max_weight)
            actor_loss = -(weights * self.actor.log_prob(batch.observations,
                                                         batch.actions)).mean()
            self.actor_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_optimizer.step()
            self.actor_schedule.step()
            # 3. critic: r + gamma (1 - terminal) V(s')
            with torch.no_grad():
                next_v = self.value(batch.next_observations).squeeze(-1).float()
                target = batch.rewards + cfg.discount * batch.not_dones * next_v
            q = self.critic(torch.cat([batch.observations, batch.actions], -1)).squeeze(-1)
            critic_loss = (q.float() - target).pow(2).mean(1).sum()
            self.critic_optimizer.zero_grad(set_to_none=True)
            critic_loss.backward()
            self.critic_optimizer.step()
        polyak_update(self.critic.parameters(), self.critic_target.parameters(), cfg.critic_tau)
        self.metrics = {"value_loss": value_loss.detach(), "v_mean": v.detach().mean(),
                        "actor_loss": actor_loss.detach(), "adv_mean": advantage.mean(),
                        "weight_mean": weights.mean(), "critic_loss": critic_loss.detach(),
                        "q_mean": q.detach().float().mean()}
        return self.metrics

    # -------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Networks, optimisers and the actor's schedule, for checkpoints (plain tensors)."""
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                "critic_target": self.critic_target.state_dict(),
                "value": self.value.state_dict(),
                "actor_optimizer": self.actor_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "value_optimizer": self.value_optimizer.state_dict(),
                "actor_schedule": self.actor_schedule.state_dict(),
                "obs_dim": self.obs_dim, "action_dim": self.action_dim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Raises:
            ValueError: the checkpoint is for other observation or action sizes.
        """
        if (state["obs_dim"], state["action_dim"]) != (self.obs_dim, self.action_dim):
            raise ValueError(
                f"checkpoint is for obs_dim={state['obs_dim']}, action_dim={state['action_dim']}; "
                f"this agent has obs_dim={self.obs_dim}, action_dim={self.action_dim}")
        for name in ("actor", "critic", "critic_target", "value", "actor_optimizer",
                     "critic_optimizer", "value_optimizer", "actor_schedule"):
            getattr(self, name).load_state_dict(state[name])
