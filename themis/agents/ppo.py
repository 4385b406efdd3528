"""Proximal Policy Optimization for discrete actions (Schulman et al. 2017), CleanRL-style.

Clipped surrogate objective (Schulman et al. 2017, Eq. 7), generalized advantage estimation
(Schulman et al. 2016, Eq. 16), clipped value loss and an entropy bonus, minibatch epochs over a
rollout of ``num_steps`` steps from ``num_envs`` vectorised environments. The policy and value
heads share one observation encoder (:mod:`themis.agents.encoders`).

The agent never sees the environment: :class:`Rollout` arrays are filled by the on-policy
workspace (``themis/onpolicy.py``), which also decides what the rewards are (state entropy,
learned reward or the true one), as in B-Pref's PrefPPO.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from themis.agents.encoders import ConvEncoder, NatureCNN, make_encoder, observation_kind
from themis.utils import make_adam


@dataclass
class PPOConfig:
    """Hyper-parameters of :class:`PPO` (defaults as in CleanRL's ``ppo.py`` and, on pixels,
    ``ppo_atari.py`` / SB3)."""

    hidden_dim: int = 64
    """Width of the hidden layers of the policy and value heads."""
    hidden_depth: int | None = None
    """Hidden layers of the actor and critic heads after the encoder; ``None``: as CleanRL and
    SB3, 0 on pixels (linear heads on the Nature CNN's 512 features, ``ppo_atari.py``) and 2
    elsewhere (the 64-64 tanh MLP of ``ppo.py``); see :func:`head_depth`."""
    num_envs: int = 8
    """Environments stepped side by side (gymnasium SyncVectorEnv)."""
    num_steps: int = 128
    """Rollout length per environment; a rollout has ``num_envs * num_steps`` transitions."""
    learning_rate: float = 2.5e-4
    """Adam learning rate (annealed linearly to 0)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    num_minibatches: int = 4
    """Minibatches per update epoch."""
    update_epochs: int = 4
    """Passes over each rollout."""
    clip_coef: float = 0.2
    """PPO clipping coefficient."""
    clip_vloss: bool = True
    """Clip the value loss as the policy loss."""
    ent_coef: float = 0.01
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Gradient norm clipping."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""


def _init(layer: nn.Linear, std: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


def _head(in_dim: int, hidden_dim: int, depth: int, out_dim: int, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [_init(nn.Linear(in_dim, hidden_dim), np.sqrt(2)), nn.Tanh()]
        in_dim = hidden_dim
    layers.append(_init(nn.Linear(in_dim, out_dim), out_std))
    return nn.Sequential(*layers)


class HeadSizes(Protocol):
    """The head sizes :class:`ActorCritic` reads (the dataclasses :class:`PPOConfig`,
    ``A2CConfig``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    hidden_dim: int
    hidden_depth: int | None


def head_depth(obs_shape: tuple[int, ...], hidden_depth: int | None) -> int:
    """Hidden layers of the on-policy heads: ``hidden_depth``, or for ``None`` the rule of
    CleanRL's and OpenAI baselines' policies: 0 on pixels (linear heads on the Nature CNN,
    ``ppo_atari.py``, baselines' ``cnn``) and 2 elsewhere (the 64-64 tanh MLP of ``ppo.py``,
    baselines' ``mlp``; with linear heads on CartPole's four numbers A2C learns nothing)."""
    if hidden_depth is not None:
        return hidden_depth
    return 0 if observation_kind(obs_shape) == "pixels" else 2


class ActorCritic(nn.Module):
    """Shared encoder, categorical policy head and value head (PPO's and A2C's network).

    On pixels the Nature CNN's layers start orthogonal with gain √2 and zero biases, as
    CleanRL's ``ppo_atari.py`` (``layer_init``) and OpenAI baselines' ``nature_cnn``
    (``ortho_init(np.sqrt(2))``): with PyTorch's default initialisation its 512 features vary
    about 35× less across Pong's frames and the policy starts blind to them.

    Shapes: ``obs (B, *obs_shape)`` -> logits ``(B, n_actions)``, values ``(B,)``.
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, cfg: HeadSizes) -> None:
        super().__init__()
        self.encoder = make_encoder(obs_shape)
        if isinstance(self.encoder, NatureCNN):
            for layer in self.encoder.modules():
                if isinstance(layer, nn.Conv2d | nn.Linear):
                    nn.init.orthogonal_(layer.weight, np.sqrt(2))
                    if layer.bias is not None:
                        nn.init.zeros_(layer.bias)
        if isinstance(self.encoder, ConvEncoder):
            self.encoder.use_channels_last()
        feat = self.encoder.feature_dim
        depth = head_depth(obs_shape, cfg.hidden_depth)
        self.actor = _head(feat, cfg.hidden_dim, depth, n_actions, 0.01)
        self.critic = _head(feat, cfg.hidden_dim, depth, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(obs)
        return self.actor(features), self.critic(features).squeeze(-1)


@dataclass
class Rollout:
    """One rollout: ``T = num_steps`` steps of ``N = num_envs`` environments.

    Shapes: ``obs (T, N, *obs_shape)``, ``actions``, ``logprobs``, ``values``, ``rewards``,
    ``dones`` ``(T, N)``; ``dones[t]`` = the episode of env ``n`` ended at step ``t``
    (terminated; truncations are bootstrapped into ``rewards`` by the workspace);
    ``next_values (N,)`` = V(observation after the last step).
    """

    obs: np.ndarray
    actions: np.ndarray
    logprobs: np.ndarray
    values: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    next_values: np.ndarray


def gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, next_values: np.ndarray,
        gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation (Schulman et al. 2016, Eq. 16).

    ``A_t = δ_t + γλ(1 - d_t) A_{t+1}``, ``δ_t = r_t + γ(1 - d_t) V(s_{t+1}) - V(s_t)``, where
    ``d_t = 1`` when the episode ended at step ``t`` (the next state is a reset state).

    Args:
        rewards, values, dones: ``(T, N)``.
        next_values: ``(N,)`` values of the states after the last step.

    Returns:
        advantages and returns (= advantages + values), each ``(T, N)`` float32.
    """
    horizon = len(rewards)
    advantages = np.zeros_like(rewards, dtype=np.float32)
    last = np.zeros(rewards.shape[1], dtype=np.float32)
    for t in reversed(range(horizon)):
        next_value = next_values if t == horizon - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        last = delta + gamma * lam * not_done * last
        advantages[t] = last
    return advantages, advantages + values


SettingsT = TypeVar("SettingsT", bound=HeadSizes)
"""An on-policy agent's settings (:class:`PPOConfig`, ``A2CConfig``)."""


class ActorCriticAgent(Generic[SettingsT]):
    """What PPO and A2C share: acting with :class:`ActorCritic` (``self.net``) and the
    checkpointed state (network, optimiser, updates made)."""

    net: ActorCritic
    device: torch.device
    optimizer: torch.optim.Optimizer
    num_updates: int

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, device: torch.device,
                 cfg: SettingsT, total_updates: int) -> None:
        """The settings with the heads' depth resolved (:func:`head_depth`), the network on
        ``device`` and the update counters; the subclass adds its optimiser."""
        self.cfg = replace(cfg, hidden_depth=head_depth(obs_shape, cfg.hidden_depth))
        self.device = device
        self.n_actions = n_actions
        self.net = ActorCritic(obs_shape, n_actions, self.cfg).to(device)
        self.total_updates = max(1, total_updates)
        self.num_updates = 0
        self.metrics: dict[str, float] = {}  # of the last update (train.csv's columns)

    @torch.no_grad()
    def step(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample actions for a batch of observations ``(N, *obs_shape)``.

        Returns:
            actions ``(N,)`` int64, their log-probabilities ``(N,)`` and values ``(N,)``.
        """
        logits, values = self.net(torch.as_tensor(obs, device=self.device))
        dist = Categorical(logits=logits)
        actions = dist.sample()
        return (actions.cpu().numpy(), dist.log_prob(actions).cpu().numpy(),
                values.cpu().numpy())

    @torch.no_grad()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) for ``(N, *obs_shape)`` observations, ``(N,)``."""
        return self.net(torch.as_tensor(obs, device=self.device))[1].cpu().numpy()

    @torch.no_grad()
    def act(self, obs: np.ndarray, sample: bool = False) -> int:
        """One action for one observation: the most probable one, or a sample."""
        logits, _ = self.net(torch.as_tensor(obs[None], device=self.device))
        if sample:
            return int(Categorical(logits=logits).sample().item())
        return int(logits.argmax(-1).item())

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Raises:
            ValueError: the network shapes differ.
        """
        try:
            self.net.load_state_dict(state["net"])
        except RuntimeError as e:
            raise ValueError(f"{type(self).__name__} network shapes differ: {e}") from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_updates = int(state.get("num_updates", 0))


class PPO(ActorCriticAgent[PPOConfig]):
    """PPO agent for a ``Discrete(n_actions)`` action space.

    Args:
        obs_shape: shape of one observation.
        n_actions: number of discrete actions.
        device: torch device.
        cfg: :class:`PPOConfig`.
        total_updates: number of :meth:`update` calls planned (for learning-rate annealing).
    """

    METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, device: torch.device,
                 cfg: PPOConfig, total_updates: int = 1) -> None:
        super().__init__(obs_shape, n_actions, device, cfg, total_updates)
        self.optimizer = make_adam(self.net.parameters(), cfg.learning_rate, eps=1e-5)

    def update(self, rollout: Rollout) -> dict[str, float]:
        """Minibatch epochs of the clipped PPO objective on one rollout.

        Loss = -min(ρA, clip(ρ, 1±ε)A) + c_v · max((V-R)², (V_clip-R)²)/2 - c_e · H[π]
        (Schulman et al. 2017, Eq. 9; value clipping as in OpenAI baselines).
        """
        cfg = self.cfg
        if cfg.anneal_lr:
            frac = 1.0 - self.num_updates / self.total_updates
            for group in self.optimizer.param_groups:
                group["lr"] = max(frac, 0.0) * cfg.learning_rate
        self.num_updates += 1
        advantages, returns = gae(rollout.rewards, rollout.values, rollout.dones,
                                  rollout.next_values, cfg.gamma, cfg.gae_lambda)
        t, n = rollout.rewards.shape
        batch = t * n

        def flat(a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
            return torch.as_tensor(a.reshape(batch, *a.shape[2:]), device=self.device,
                                   dtype=dtype)

        obs = flat(rollout.obs)
        actions = flat(rollout.actions, torch.int64)
        old_logprobs = flat(rollout.logprobs, torch.float32)
        old_values = flat(rollout.values, torch.float32)
        adv_all = flat(advantages)
        ret_all = flat(returns)
        minibatch = max(1, batch // cfg.num_minibatches)
        stats: dict[str, list[float]] = {k: [] for k in self.METRICS}
        for _ in range(cfg.update_epochs):
            order = torch.randperm(batch, device=self.device)
            for lo in range(0, batch, minibatch):
                mb = order[lo:lo + minibatch]
                logits, values = self.net(obs[mb])
                dist = Categorical(logits=logits)
                logprob = dist.log_prob(actions[mb])
                log_ratio = logprob - old_logprobs[mb]
                ratio = log_ratio.exp()
                adv = adv_all[mb]
                if cfg.norm_adv and len(mb) > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(
                    1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
                if cfg.clip_vloss:
                    clipped = old_values[mb] + (values - old_values[mb]).clamp(
                        -cfg.clip_coef, cfg.clip_coef)
                    value_loss = 0.5 * torch.max((values - ret_all[mb]) ** 2,
                                                 (clipped - ret_all[mb]) ** 2).mean()
                else:
                    value_loss = 0.5 * ((values - ret_all[mb]) ** 2).mean()
                entropy = dist.entropy().mean()
                loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.net.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                with torch.no_grad():
                    stats["policy_loss"].append(float(policy_loss))
                    stats["value_loss"].append(float(value_loss))
                    stats["entropy"].append(float(entropy))
                    stats["approx_kl"].append(float(((ratio - 1) - log_ratio).mean()))
                    stats["clip_fraction"].append(
                        float(((ratio - 1).abs() > cfg.clip_coef).float().mean()))
        self.metrics = {k: float(np.mean(v)) for k, v in stats.items()}
        return self.metrics
