"""Stable-Baselines3 ``.zip`` policies, loaded without unpickling (weights only).

An SB3 save is a zip with ``policy.pth`` (the policy's ``state_dict``) and ``data`` (JSON; class
objects in it are base64 cloudpickles under ``":serialized:"``, which are never decoded here).
:func:`load_sb3_policy` reads ``policy.pth`` with ``torch.load(weights_only=True)``, rebuilds
the network that fits its keys and shapes, and reads the activation function from the readable
``"activation_fn"`` text of ``policy_kwargs`` (SB3's defaults otherwise: ``Tanh`` for
actor-critic policies, ``ReLU`` for SAC, TD3 and DQN).

Supported (what ``MlpPolicy``/``CnnPolicy`` of SB3 2.x save): PPO and A2C (``Discrete`` and
``Box`` actions), SAC, TD3, DQN; features from a flattened vector or SB3's ``NatureCNN``
(pixels scaled by 1/255). Not supported: ``VecNormalize`` statistics (not in the zip), dict
observations, gSDE, custom feature extractors (a clear error names the unknown keys).

This is a minimal reader for rollouts (:mod:`themis.interpret.rollouts`). The policy must have
been trained on the observations Themis' env gives
(:func:`themis.environments.domains.make_env`); a first layer of another width is refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from themis.agents.sb3 import read_sb3_zip

ACTIVATIONS = {"Tanh": nn.Tanh, "ReLU": nn.ReLU, "LeakyReLU": nn.LeakyReLU, "ELU": nn.ELU,
               "GELU": nn.GELU, "SiLU": nn.SiLU, "Sigmoid": nn.Sigmoid}


class SB3FormatError(ValueError):
    """Not a Stable-Baselines3 zip this reader understands (one line: why)."""


def _mlp(state: dict[str, torch.Tensor], prefix: str, activation: type[nn.Module],
         last_activation: bool = True) -> nn.Sequential:
    """``nn.Sequential`` of the ``Linear`` layers ``prefix{i}.weight`` (SB3 puts the activation
    at the odd indices), loaded."""
    indices = sorted(int(m.group(1)) for k in state
                     if (m := re.fullmatch(re.escape(prefix) + r"(\d+)\.weight", k)))
    layers: list[nn.Module] = []
    for n, i in enumerate(indices):
        w, b = state[f"{prefix}{i}.weight"], state[f"{prefix}{i}.bias"]
        linear = nn.Linear(w.shape[1], w.shape[0])
        linear.weight.data.copy_(w)
        linear.bias.data.copy_(b)
        layers.append(linear)
        if last_activation or n < len(indices) - 1:
            layers.append(activation())
    return nn.Sequential(*layers)


def _linear(state: dict[str, torch.Tensor], prefix: str) -> nn.Linear:
    w, b = state[f"{prefix}.weight"], state[f"{prefix}.bias"]
    layer = nn.Linear(w.shape[1], w.shape[0])
    layer.weight.data.copy_(w)
    layer.bias.data.copy_(b)
    return layer


class _NatureCNN(nn.Module):
    """SB3's ``NatureCNN`` (Mnih et al. 2015) from its saved weights."""

    def __init__(self, state: dict[str, torch.Tensor], prefix: str) -> None:
        super().__init__()
        convs: list[nn.Module] = []
        for i, stride in ((0, 4), (2, 2), (4, 1)):
            w = state[f"{prefix}cnn.{i}.weight"]
            conv = nn.Conv2d(w.shape[1], w.shape[0], w.shape[2], stride=stride)
            conv.weight.data.copy_(w)
            assert conv.bias is not None
            conv.bias.data.copy_(state[f"{prefix}cnn.{i}.bias"])
            convs += [conv, nn.ReLU()]
        self.cnn = nn.Sequential(*convs, nn.Flatten())
        self.linear = nn.Sequential(_linear(state, f"{prefix}linear.0"), nn.ReLU())
        self.in_channels = int(state[f"{prefix}cnn.0.weight"].shape[1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(self.cnn(obs.float() / 255.0))


class SB3Policy(nn.Module):
    """A deterministic (or sampled) SB3 policy rebuilt from weights.

    Args:
        kind: ``"actor_critic"`` (PPO, A2C), ``"sac"``, ``"td3"`` or ``"dqn"``.
        features: the feature extractor (``nn.Flatten`` or a CNN).
        body: the latent network after the features.
        head: the action head (logits, mean, Q-values).
        discrete: whether the action is an index.

    Shapes: :meth:`forward` ``obs (B, *obs_shape)`` -> head output ``(B, out_dim)``.
    """

    def __init__(self, kind: str, features: nn.Module, body: nn.Module, head: nn.Module,
                 discrete: bool, in_dim: int | None, log_std: torch.Tensor | None = None
                 ) -> None:
        super().__init__()
        self.kind, self.features, self.body, self.head = kind, features, body, head
        self.discrete, self.in_dim = discrete, in_dim
        self.log_std = None if log_std is None else nn.Parameter(log_std, requires_grad=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.features(obs)))

    @torch.no_grad()
    def act(self, obs: np.ndarray, sample: bool = False,
            generator: torch.Generator | None = None) -> Any:
        """The action for one observation: an ``int`` for discrete policies, else a float32
        vector in [-1, 1] for SAC/TD3 (Themis rescales bounded ``Box`` actions to [-1, 1]) or
        the Gaussian mean (clipped to [-1, 1]) for PPO/A2C.

        Raises:
            ValueError: the observation does not fit the policy's first layer.
        """
        x = torch.as_tensor(np.asarray(obs))[None]
        if self.in_dim is not None:
            x = x.reshape(1, -1).float()
            if x.shape[1] != self.in_dim:
                raise ValueError(f"the SB3 policy takes {self.in_dim} inputs, the env's "
                                 f"observation has {x.shape[1]}")
        out = self(x)[0]
        if self.discrete:
            if sample and self.kind == "actor_critic":
                probs = torch.softmax(out, -1)
                return int(torch.multinomial(probs, 1, generator=generator).item())
            return int(out.argmax().item())
        if self.kind in ("sac", "td3"):
            return torch.tanh(out).numpy().astype(np.float32) if self.kind == "sac" else \
                out.numpy().astype(np.float32)
        if sample and self.log_std is not None:
            out = out + torch.randn(out.shape, generator=generator) * self.log_std.exp()
        return out.clamp(-1.0, 1.0).numpy().astype(np.float32)


def _activation(data: dict[str, Any], default: type[nn.Module]) -> type[nn.Module]:
    kwargs = data.get("policy_kwargs")
    text = kwargs.get("activation_fn") if isinstance(kwargs, dict) else None
    if not isinstance(text, str):
        return default
    match = re.search(r"activation\.(\w+)'", text)
    if match is None or match.group(1) not in ACTIVATIONS:
        raise SB3FormatError(f"activation {text} is not one this reader knows "
                             f"({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[match.group(1)]


def _features(state: dict[str, torch.Tensor], prefix: str) -> tuple[nn.Module, int | None]:
    if f"{prefix}cnn.0.weight" in state:
        return _NatureCNN(state, prefix), None
    return nn.Flatten(), -1  # the width is read from the first linear layer


def load_sb3_policy(path: str | Path) -> SB3Policy:
    """Rebuild the policy of a Stable-Baselines3 save (``model.save(path)``) from its weights.

    Raises:
        FileNotFoundError: no file at ``path``.
        SB3FormatError: not a zip with ``policy.pth`` and ``data``, a ``policy.pth`` that needs
            more than plain tensors (it is never unpickled), or a policy this reader does not
            know (the unknown keys are named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no Stable-Baselines3 zip at {path}")
    try:  # the one reader of SB3 archives (size limits, weights only, JSON data)
        model = read_sb3_zip(path)
    except ValueError as e:
        raise SB3FormatError(f"{path}: {e}") from None
    state, data = model.state, model.data
    try:
        return _build(state, data)
    except KeyError as e:
        raise SB3FormatError(f"{path}: policy.pth lacks {e.args[0]!r}; keys: "
                             f"{', '.join(sorted(state))[:300]}") from None
    except (RuntimeError, IndexError) as e:
        raise SB3FormatError(f"{path}: weights that do not fit together ({e})") from None


def _build(state: dict[str, torch.Tensor], data: dict[str, Any]) -> SB3Policy:
    if "action_net.weight" in state:  # ActorCriticPolicy (PPO, A2C)
        activation = _activation(data, nn.Tanh)
        features, in_dim = _features(state, "pi_features_extractor." if any(
            k.startswith("pi_features_extractor.") for k in state) else "features_extractor.")
        body = _mlp(state, "mlp_extractor.policy_net.", activation)
        if "mlp_extractor.shared_net.0.weight" in state:
            body = nn.Sequential(_mlp(state, "mlp_extractor.shared_net.", activation), body)
        head = _linear(state, "action_net")
        discrete = "log_std" not in state
        policy = SB3Policy("actor_critic", features, body, head, discrete, None,
                           None if discrete else state["log_std"].clone())
    elif "actor.mu.weight" in state:  # SAC
        activation = _activation(data, nn.ReLU)
        features, in_dim = _features(state, "actor.features_extractor.")
        policy = SB3Policy("sac", features, _mlp(state, "actor.latent_pi.", activation),
                           _linear(state, "actor.mu"), False, None)
    elif "actor.mu.0.weight" in state:  # TD3 (tanh at the end)
        activation = _activation(data, nn.ReLU)
        features, in_dim = _features(state, "actor.features_extractor.")
        policy = SB3Policy("td3", features, nn.Identity(),
                           nn.Sequential(_mlp(state, "actor.mu.", activation, False), nn.Tanh()),
                           False, None)
    elif "q_net.q_net.0.weight" in state or any(k.startswith("q_net.q_net.") for k in state):
        activation = _activation(data, nn.ReLU)
        features, in_dim = _features(state, "q_net.features_extractor.")
        policy = SB3Policy("dqn", features, nn.Identity(),
                           _mlp(state, "q_net.q_net.", activation, False), True, None)
    else:
        raise SB3FormatError("not an SB3 PPO, A2C, SAC, TD3 or DQN policy (keys: "
                             f"{', '.join(sorted(state))[:300]})")
    if in_dim is not None:  # a flat vector: the first Linear's width
        first = next(m for m in policy.modules() if isinstance(m, nn.Linear))
        policy.in_dim = first.in_features
    return policy.eval()
