"""Advantage actor-critic for discrete actions (A2C: the synchronous A3C of Mnih et al. 2016).

The agent DRLHP trained Atari with (Christiano et al. 2017, App. A.2: A3C; mrahtz's
reproduction and OpenAI baselines' ``a2c``: the synchronous version): ``num_envs``
environments step ``num_steps`` steps, then **one** gradient step on the whole rollout with
the n-step returns ``R_t = r_t + γ r_{t+1} + … + γ^{n−t} V(s_n)`` (reset at episode ends), the
policy gradient ``−log π(a_t|s_t) (R_t − V(s_t))``, the value loss ``(R_t − V(s_t))²`` and an
entropy bonus (Mnih et al. 2016, Algorithm S3), RMSprop. Hyper-parameters as OpenAI baselines'
Atari A2C (``baselines/a2c/a2c.py``) and mrahtz's Pong run: 16 envs, 5 steps, RMSprop
(lr 7·10⁻⁴ decayed linearly to 0, α = 0.99, ε = 10⁻⁵), entropy 0.01, value 0.5, gradient
norm 0.5, the Nature CNN with its 512-unit layer then a linear policy and a linear value.

The network is PPO's (:class:`themis.agents.ppo.ActorCritic`) and so is the rollout
(:class:`themis.agents.ppo.Rollout`): the on-policy loop (:mod:`themis.loops.prefppo`) runs
either agent. One update costs one forward and backward pass per sample, where PPO's default
makes four (``update_epochs=4``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from themis.agents.ppo import ActorCriticAgent, Rollout, gae


@dataclass
class A2CConfig:
    """Hyper-parameters of :class:`A2C` (defaults: OpenAI baselines' Atari A2C, mrahtz's Pong)."""

    hidden_dim: int = 64
    """Width of the hidden layers of the policy and value heads."""
    hidden_depth: int | None = None
    """Hidden layers of the heads after the encoder; ``None``: as baselines' policies, 0 on
    pixels (linear heads on the Nature CNN's 512 features) and 2 elsewhere (its 64-64 tanh
    MLP policy); see :func:`themis.agents.ppo.head_depth`."""
    num_envs: int = 16
    """Environments stepped side by side (gymnasium SyncVectorEnv)."""
    num_steps: int = 5
    """Steps per environment before each update (the n of the n-step returns)."""
    learning_rate: float = 7e-4
    """RMSprop learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run (baselines: ``lrschedule='linear'``)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """λ of the advantage estimate; 1 = the n-step return minus V(s_t), as A2C."""
    ent_coef: float = 0.01
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Gradient norm clipping."""
    rms_alpha: float = 0.99
    """RMSprop's smoothing constant."""
    rms_eps: float = 1e-5
    """RMSprop's ε (inside the square root, as TensorFlow's: :class:`RMSpropTF`)."""
    num_minibatches: int = 1
    """Samples of a rollout per state-entropy minibatch divisor (the loop's warm start of r̂
    draws ``rollout / num_minibatches`` states); A2C itself updates on the whole rollout."""


class RMSpropTF(torch.optim.Optimizer):
    """RMSprop as TensorFlow's ``RMSPropOptimizer``, which OpenAI baselines' A2C uses: the
    running mean of squared gradients starts at 1 and ε is added inside the square root,
    ``θ ← θ − lr · g / sqrt(ms + ε)``, ``ms ← α ms + (1 − α) g²`` (PyTorch's RMSprop starts
    ``ms`` at 0 and adds ε outside: its first steps are about 10× larger; SB3's
    ``RMSpropTFLike`` exists for the same reason).

    Args:
        params: the parameters.
        lr: learning rate.
        alpha: smoothing constant α.
        eps: ε, inside the square root.
    """

    def __init__(self, params: Any, lr: float, alpha: float = 0.99, eps: float = 1e-5) -> None:
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["square_avg"] = torch.ones_like(p)
                square_avg = state["square_avg"]
                square_avg.mul_(group["alpha"]).addcmul_(p.grad, p.grad,
                                                          value=1 - group["alpha"])
                p.addcdiv_(p.grad, square_avg.add(group["eps"]).sqrt_(), value=-group["lr"])


class A2C(ActorCriticAgent[A2CConfig]):
    """A2C agent for a ``Discrete(n_actions)`` action space, with PPO's interface (``step``,
    ``value``, ``act``, ``update(Rollout)``), so that :mod:`themis.loops.prefppo` runs it.

    Args:
        obs_shape: shape of one observation.
        n_actions: number of discrete actions.
        device: torch device.
        cfg: :class:`A2CConfig`.
        total_updates: number of :meth:`update` calls planned (for learning-rate annealing).
    """

    METRICS = ("policy_loss", "value_loss", "entropy", "grad_norm")

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, device: torch.device,
                 cfg: A2CConfig, total_updates: int = 1) -> None:
        super().__init__(obs_shape, n_actions, device, cfg, total_updates)
        self.optimizer = RMSpropTF(self.net.parameters(), lr=cfg.learning_rate,
                                   alpha=cfg.rms_alpha, eps=cfg.rms_eps)

    def targets(self, rollout: Rollout) -> tuple[np.ndarray, np.ndarray]:
        """Advantages and return targets ``(T, N)`` of a rollout: with ``gae_lambda=1`` the
        n-step returns bootstrapped from ``next_values`` and cut at ``dones``, minus the
        rollout's values (:func:`themis.agents.ppo.gae` with λ = 1)."""
        return gae(rollout.rewards, rollout.values, rollout.dones, rollout.next_values,
                   self.cfg.gamma, self.cfg.gae_lambda)

    def update(self, rollout: Rollout) -> dict[str, float]:
        """One gradient step on the whole rollout.

        Loss = −mean(log π(a|s) · A) + c_v · mean((R − V(s))²) − c_e · mean(H[π(·|s)]), with
        ``A`` and ``R`` from :meth:`targets` (A fixed, from the rollout's values; baselines'
        ``a2c.py``); the learning rate decays linearly with the updates made.
        """
        cfg = self.cfg
        if cfg.anneal_lr:
            frac = 1.0 - self.num_updates / self.total_updates
            for group in self.optimizer.param_groups:
                group["lr"] = max(frac, 0.0) * cfg.learning_rate
        self.num_updates += 1
        advantages, returns = self.targets(rollout)
        t, n = rollout.rewards.shape
        obs = torch.as_tensor(rollout.obs.reshape(t * n, *rollout.obs.shape[2:]),
                              device=self.device)
        actions = torch.as_tensor(rollout.actions.reshape(-1), device=self.device,
                                  dtype=torch.int64)
        adv = torch.as_tensor(advantages.reshape(-1), device=self.device)
        ret = torch.as_tensor(returns.reshape(-1), device=self.device)
        logits, values = self.net(obs)
        dist = Categorical(logits=logits)
        policy_loss = -(dist.log_prob(actions) * adv).mean()
        value_loss = ((ret - values) ** 2).mean()
        entropy = dist.entropy().mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.net.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.metrics = {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                        "entropy": entropy.item(), "grad_norm": float(grad_norm)}
        return self.metrics
