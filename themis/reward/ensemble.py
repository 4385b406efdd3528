"""Ensemble reward model r̂(s, a) (Christiano et al. 2017; PEBBLE, Lee et al. 2021, Sec. 4.2).

Each member is an MLP ``(obs, action) -> r`` with a tanh output, as in BPref. Members are
evaluated in one batched matmul (:class:`themis.agents.networks.EnsembleMLP`). For pixel and grid
observations each member first encodes the observation with its own CNN
(:mod:`themis.agents.encoders`); discrete actions arrive one-hot. ``reward_net=drlhp``,
``drlhp_dot`` and ``drlhp_dot_onehot`` give the members DRLHP's networks instead
(:mod:`themis.reward.networks`), and ``reward_shared_trunk`` one encoder with a head per member.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from themis.agents.encoders import Encoder, make_encoder, observation_kind
from themis.agents.networks import EnsembleMLP
from themis.core.precision import autocast
from themis.core.run_keys import RunKeys
from themis.core.safe_loading import MALFORMED, check_finite_tensors, describe, safe_load
from themis.reward.networks import (
    DOT_NETS,
    DRLHPCNN,
    REWARD_NETS,
    MovingDotFeatures,
    action_index_feature,
)
from themis.utils import save_durably


class RewardEnsemble(nn.Module):
    """``ensemble_size`` reward networks over the concatenated ``(observation, action)``.

    Args:
        obs_dim: flat observation size.
        action_dim: action vector size.
        ensemble_size: number of members ``E`` (>= 1).
        hidden_dim: hidden width (BPref: 256).
        hidden_depth: hidden layers (BPref: 3).
        obs_shape: the unflattened observation shape; pixel and grid shapes (``(C, H, W)``) give
            every member a CNN encoder. Default: a vector of ``obs_dim``.
        dropout: dropout probability after every convolution and hidden layer (``reward_dropout``;
            DRLHP's Atari reward network: 0.5 on its convolutions, Christiano et al. 2017,
            App. A.2). Active in train mode only.
        batchnorm: batch normalisation of every convolution and hidden layer
            (``reward_batchnorm``; DRLHP's Atari network: on). Statistics of the batch in train
            mode, running ones in eval mode.
        net: ``reward_net`` (:data:`themis.reward.networks.REWARD_NETS`): ``bpref`` (above);
            ``drlhp``: DRLHP's Atari network per member (:class:`DRLHPCNN`, then a fully
            connected layer of 64 and a scalar; no action input; ``dropout`` / ``batchnorm``
            on the convolutions only, as the paper); ``drlhp_dot``: mrahtz's MovingDot network
            (:class:`MovingDotFeatures` and the action index / 4 into an MLP 64-64-64-1; no
            dropout or batch norm); ``drlhp_dot_onehot``: the same with the action one-hot.
            ``hidden_dim`` / ``hidden_depth`` are then the paper's (64 and 1 for ``drlhp``, 64
            and 3 for the dot's), whatever is passed.
        shared_trunk: one encoder for every member, each with its own head
            (``reward_shared_trunk``): scoring shared observations runs the CNN once.

    Shapes:
        :meth:`forward`: ``obs (E, B, obs_dim)`` or ``(B, obs_dim)`` (flattened observations,
        any dtype) with matching actions -> per-member rewards ``(E, B)``.

    Raises:
        ValueError: ``ensemble_size < 1``, ``obs_shape`` does not hold ``obs_dim`` values, an
            unknown ``net``, or a DRLHP network for vector observations.
    """

    def __init__(self, obs_dim: int, action_dim: int, ensemble_size: int = 3,
                 hidden_dim: int = 256, hidden_depth: int = 3,
                 obs_shape: tuple[int, ...] | None = None, dropout: float = 0.0,
                 batchnorm: bool = False, net: str = "bpref",
                 shared_trunk: bool = False) -> None:
        super().__init__()
        if ensemble_size < 1:
            raise ValueError(f"ensemble_size must be >= 1, got {ensemble_size}")
        self.obs_shape = tuple(obs_shape) if obs_shape else (obs_dim,)
        if int(np.prod(self.obs_shape)) != obs_dim:
            raise ValueError(f"obs_shape {self.obs_shape} does not hold obs_dim={obs_dim} values")
        if net not in REWARD_NETS:
            raise ValueError(f"reward_net={net} is unknown; use one of {', '.join(REWARD_NETS)}")
        if net != "bpref" and observation_kind(self.obs_shape) != "pixels":
            raise ValueError(f"reward_net={net} reads pixel observations (C, H, W); "
                             f"{self.obs_shape} is not one")
        self.net_name, self.shared_trunk = net, bool(shared_trunk)
        if net != "bpref":  # the paper's head: FC 64 -> scalar; mrahtz's dot MLP 64-64-64-1
            hidden_dim, hidden_depth = 64, 1 if net == "drlhp" else 3
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.ensemble_size = ensemble_size
        self.hidden_dim = hidden_dim
        self.hidden_depth = hidden_depth
        self.dropout, self.batchnorm = float(dropout), bool(batchnorm)
        self.env_id: str | None = None
        """The env the model was trained on (set by :func:`load_reward_model`), if known."""
        self.precision: torch.dtype | None = None
        """``torch.bfloat16``: matrix products in bfloat16 (:mod:`themis.core.precision`); ``None``:
        float32. A runtime setting, not saved with the model."""
        self.encoders: nn.ModuleList | None = None
        feature_dim = obs_dim
        if observation_kind(self.obs_shape) != "vector":
            trunks = 1 if self.shared_trunk else ensemble_size
            encoders = [self._encoder(net, dropout, batchnorm) for _ in range(trunks)]
            feature_dim = encoders[0].feature_dim
            self.encoders = nn.ModuleList(encoders)
        if net == "bpref":
            self.uses_action = True
            self.net = EnsembleMLP(ensemble_size, feature_dim + action_dim, hidden_dim, 1,
                                   hidden_depth, activation=nn.LeakyReLU,
                                   output_activation=nn.Tanh, dropout=dropout,
                                   batchnorm=batchnorm)
        else:  # DRLHP: a linear scalar; regularisation on the convolutions only
            self.uses_action = net in DOT_NETS
            inputs = feature_dim + {"drlhp_dot": 1, "drlhp_dot_onehot": action_dim}.get(net, 0)
            self.net = EnsembleMLP(ensemble_size, inputs, hidden_dim, 1, hidden_depth,
                                   activation=nn.LeakyReLU)  # α = 0.01

    def _encoder(self, net: str, dropout: float, batchnorm: bool) -> Encoder:
        """One member's (or the shared) observation encoder for ``reward_net``."""
        if net == "drlhp":
            cnn = DRLHPCNN(self.obs_shape, dropout, batchnorm)
            cnn.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
            return cnn
        if net in DOT_NETS:
            return MovingDotFeatures(self.obs_shape)
        return make_encoder(self.obs_shape, dropout, batchnorm)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def fixed_encoder(self) -> bool:
        """Whether the observation encoder has no parameters (the dot's nets: the dot's
        position), so that a dataset's observations can be encoded once (:meth:`encode`) and
        trained on as features (``encoded=True``)."""
        return self.net_name in DOT_NETS

    @torch.no_grad()
    def encode(self, obs: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
        """The fixed encoder's features of observations, ``(..., obs_dim) -> (..., F)``
        float32, ``chunk`` at a time.

        Raises:
            ValueError: the encoder has parameters (:attr:`fixed_encoder` is false).
        """
        if not self.fixed_encoder or self.encoders is None:
            raise ValueError(f"reward_net={self.net_name} learns its encoder: nothing to "
                             "encode once")
        flat = obs.reshape(-1, self.obs_dim)
        encoder = self.encoders[0]
        parts = [encoder(flat[lo:lo + chunk].reshape(-1, *self.obs_shape))
                 for lo in range(0, len(flat), chunk)]
        width = MovingDotFeatures.feature_dim
        out = torch.cat(parts) if parts else torch.zeros((0, width), device=obs.device)
        return out.reshape(*obs.shape[:-1], width)

    def forward(self, obs: torch.Tensor, action: torch.Tensor,
                encoded: bool = False) -> torch.Tensor:
        with autocast(self.precision, obs.device):
            return self._forward(obs, action, encoded)

    def _forward(self, obs: torch.Tensor, action: torch.Tensor,
                 encoded: bool = False) -> torch.Tensor:
        action = action.float()
        if self.encoders is None:
            return self.net(torch.cat([obs.float(), action], dim=-1)).squeeze(-1)
        shared = obs.dim() == 2  # (B, obs_dim): every member sees the same batch
        batch = obs.shape[-2]
        ens = self.ensemble_size
        if encoded:  # features of a fixed encoder (:meth:`encode`)
            features = obs.float().expand(ens, batch, -1) if shared else obs.float()
        elif self.shared_trunk:  # one encoder: shared observations go through it once
            trunk = self.encoders[0]
            if shared:
                features = trunk(obs.reshape(batch, *self.obs_shape)).expand(ens, batch, -1)
            else:
                features = trunk(obs.reshape(ens * batch, *self.obs_shape)).reshape(
                    ens, batch, -1)
        else:
            features = torch.stack([
                enc((obs if shared else obs[e]).reshape(batch, *self.obs_shape))
                for e, enc in enumerate(self.encoders)])  # (E, B, F)
        if not self.uses_action:
            return self.net(features).squeeze(-1)
        if self.net_name == "drlhp_dot":
            action = action_index_feature(action)
        if action.dim() == 2:
            action = action.expand(ens, *action.shape)
        return self.net(torch.cat([features, action], dim=-1)).squeeze(-1)

    def segment_rewards(self, obs: torch.Tensor, action: torch.Tensor,
                        encoded: bool = False) -> torch.Tensor:
        """Predicted per-step rewards of segments for every member (one forward pass).

        Shapes: ``obs (E, n, H, obs_dim)`` (member-specific batches) or ``(n, H, obs_dim)``
        (shared) -> ``(E, n, H)``; ``encoded``: ``obs`` holds :meth:`encode`'s features
        (``F`` in place of ``obs_dim``).
        """
        *lead, horizon, _ = obs.shape
        flat_obs = obs.reshape(*lead[:-1], lead[-1] * horizon, -1)
        flat_act = action.reshape(*lead[:-1], lead[-1] * horizon, -1)
        rewards = self(flat_obs, flat_act, encoded)  # (E, n*H)
        return rewards.reshape(self.ensemble_size, lead[-1], horizon)

    def segment_returns(self, obs: torch.Tensor, action: torch.Tensor,
                        encoded: bool = False) -> torch.Tensor:
        """Predicted returns of segments for every member.

        Shapes: ``obs (E, n, H, obs_dim)`` (member-specific batches) or ``(n, H, obs_dim)``
        (shared) -> ``(E, n)``; ``encoded`` as :meth:`segment_rewards`.
        """
        return self.segment_rewards(obs, action, encoded).sum(-1)

    @property
    def chunk_rows(self) -> int:
        """Rows per forward pass when scoring without gradients: 2048 (observation, action) rows
        keep the hidden activations in the CPU cache (3× faster than one 100k-row batch on 2
        cores); 256 rows for pixel/grid observations, whose CNN activations are larger."""
        return 2048 if self.encoders is None else 256

    @torch.no_grad()
    def predict(self, obs: np.ndarray, action: np.ndarray,
                chunk_size: int | None = None) -> np.ndarray:
        """Ensemble-mean reward for a batch, as used to relabel the replay buffer.

        Shapes: ``obs (n, obs_dim)``, ``action (n, action_dim)`` -> ``(n,)`` float32.
        """
        return self.predict_members(obs, action, chunk_size).mean(0)

    @torch.no_grad()
    def predict_members(self, obs: np.ndarray, action: np.ndarray,
                        chunk_size: int | None = None) -> np.ndarray:
        """Per-member rewards, ``(E, n)`` float32, computed ``chunk_size`` rows at a time
        (default :attr:`chunk_rows`)."""
        device = self.device
        chunk_size = chunk_size or self.chunk_rows
        # one preallocated output: small per-chunk results kept alive between the large
        # temporaries fragment the heap (RSS grew linearly with n)
        out = torch.empty((self.ensemble_size, len(obs)), device=device)
        for lo in range(0, len(obs), chunk_size):
            o = torch.as_tensor(obs[lo:lo + chunk_size], device=device)
            a = torch.as_tensor(action[lo:lo + chunk_size], dtype=torch.float32, device=device)
            out[:, lo:lo + chunk_size] = self(o, a)
        return out.cpu().numpy()

    @torch.no_grad()
    def preference_probabilities(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Each member's Bradley–Terry probability that segment 2 is preferred.

        Shapes: ``obs (n, 2, H, obs_dim)`` (or ``(n, 2, H, *obs_shape)``), ``action (n, 2, H,
        action_dim)`` -> ``(E, n)``. Computed a few pairs at a time (about :attr:`chunk_rows`
        rows per pass), so memory stays bounded for pools of any size.
        """
        n, _, horizon = obs.shape[:3]
        pairs = max(1, self.chunk_rows // (2 * horizon))
        out = torch.empty((self.ensemble_size, n), device=self.device)  # see predict_members
        for lo in range(0, n, pairs):
            o = torch.as_tensor(obs[lo:lo + pairs], device=self.device)
            o = o.reshape(*o.shape[:3], -1)
            a = torch.as_tensor(action[lo:lo + pairs], dtype=torch.float32, device=self.device)
            returns = self.segment_returns(o.reshape(-1, horizon, o.shape[-1]),
                                           a.reshape(-1, horizon, a.shape[-1]))  # (E, 2m)
            returns = returns.reshape(self.ensemble_size, -1, 2)
            out[:, lo:lo + pairs] = torch.sigmoid(returns[..., 1] - returns[..., 0])
        return out.cpu().numpy()

    def config(self) -> dict[str, Any]:
        """Constructor arguments, stored in checkpoints so they can be rebuilt anywhere
        (``dropout`` / ``batchnorm`` only when set: checkpoints of models without them read in
        earlier Themis versions too)."""
        config: dict[str, Any] = {
            "obs_dim": self.obs_dim, "action_dim": self.action_dim,
            "ensemble_size": self.ensemble_size, "hidden_dim": self.hidden_dim,
            "hidden_depth": self.hidden_depth, "obs_shape": list(self.obs_shape)}
        if self.dropout:
            config["dropout"] = self.dropout
        if self.batchnorm:
            config["batchnorm"] = True
        if self.net_name != "bpref":
            config["net"] = self.net_name
        if self.shared_trunk:
            config["shared_trunk"] = True
        return config


def reward_model_from(cfg: RunKeys, obs_dim: int, action_dim: int,
                      obs_shape: tuple[int, ...]) -> RewardEnsemble:
    """The reward ensemble a run's config describes (``ensemble_size``, ``reward_hidden_dim``,
    ``reward_hidden_depth``, ``reward_dropout``, ``reward_batchnorm``, ``reward_net``,
    ``reward_shared_trunk``), on the CPU: the one place a run's model is built, so the learner,
    the agent side's copy of an async run and the wrapper's agree on its weights. With
    ``reward_compile`` its image encoders are compiled (:meth:`torch.nn.Module.compile`: the
    state dict keeps its keys).

    Raises:
        ValueError: as :class:`RewardEnsemble` (e.g. ``reward_net=drlhp`` for vectors).
    """
    model = RewardEnsemble(obs_dim, action_dim, cfg.ensemble_size, cfg.reward_hidden_dim,
                           cfg.reward_hidden_depth, obs_shape=obs_shape,
                           dropout=cfg.reward_dropout, batchnorm=cfg.reward_batchnorm,
                           net=cfg.reward_net, shared_trunk=cfg.reward_shared_trunk)
    if getattr(cfg, "reward_compile", False) and model.encoders is not None \
            and not model.fixed_encoder:
        for encoder in model.encoders:
            encoder.compile()
    return model


def save_reward_model(model: RewardEnsemble, path: str | Path, **extra: Any) -> Path:
    """Write ``model`` (weights and constructor arguments) so :func:`load_reward_model` can
    rebuild it anywhere; ``extra`` (env id, step, ...) is stored beside it. Written atomically.
    """
    path = Path(path)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    save_durably({"model": state, "config": model.config(), **extra}, path)
    return path


def load_reward_model(path: str | Path, device: str | torch.device = "cpu") -> RewardEnsemble:
    """Restore a trained reward ensemble, in eval mode, on ``device``.

    Args:
        path: a run dir (reads ``checkpoints/reward_model.pt``) or a checkpoint file written by
            :func:`save_reward_model`.
        device: where to put it (``"cpu"``, ``"cuda"``, ...).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: the file is not a Themis reward-model checkpoint: not a PyTorch file, one
            that needs more than plain tensors to load
            (:class:`themis.core.safe_loading.UnsafeFileError`; it is never unpickled), or weights
            that do not fit its recorded config.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / "reward_model.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no reward-model checkpoint at {path} (expected a run dir or "
                                "checkpoints/reward_model.pt)")
    ckpt = safe_load(path)  # a file someone sent: plain tensors only
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict) \
            or not isinstance(ckpt.get("config"), dict):
        raise ValueError(f"{path} is not a Themis reward-model checkpoint")
    config, weights = ckpt["config"], ckpt["model"]
    check_finite_tensors(weights, path)  # NaN weights would predict NaN rewards
    try:
        with torch.device("meta"):  # shapes only: a crafted config allocates nothing
            wanted = RewardEnsemble(**config).state_dict()
        if set(wanted) != set(weights) or any(
                not isinstance(weights[k], torch.Tensor) or weights[k].shape != v.shape
                for k, v in wanted.items()):
            raise ValueError("its weights do not fit its config")
        model = RewardEnsemble(**config)
        model.load_state_dict(weights)
    except MALFORMED as e:
        raise ValueError(f"{path} is not a Themis reward-model checkpoint ({describe(e)})"
                         ) from None
    model = model.to(device)
    model.eval()
    model.env_id = ckpt.get("env") if isinstance(ckpt.get("env"), str) else None
    return model
