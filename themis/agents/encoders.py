"""Observation encoders: identity for vectors, a Nature-DQN CNN for pixels, a small CNN for grids.

Every encoder maps a batch of observations ``(B, *obs_shape)`` (any dtype; uint8 images are
scaled here) to features ``(B, feature_dim)`` float32. :func:`observation_kind` decides which one
an observation space gets:

- ``vector``: 1-D observations (MuJoCo, Box2D, classic control) -> flattened as they are;
- ``pixels``: ``(C, H, W)`` images with ``H, W >= 16`` (Atari ``(4, 84, 84)``, CarRacing,
  ``(3, 32, 32)``) -> :class:`NatureCNN` (Mnih et al. 2015), inputs divided by 255;
- ``grid``: small ``(C, H, W)`` symbolic grids (MiniGrid/BabyAI ``(C, 7, 7)``) -> :class:`GridCNN`
  (the 2×2-convolution encoder of the MiniGrid RL baselines).

Images arrive channels-first: :func:`themis.environments.domains.make_env` transposes
channels-last ones (:mod:`themis.environments.observations`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

PIXELS_MIN_SIZE = 16
"""Images with both sides at least this long are pixels; smaller ``(C, H, W)`` are grids."""
NATURE_MIN_SIZE = 36
"""The smallest side the Nature-DQN stack (8×8/4, 4×4/2, 3×3/1) takes: it leaves 1×1."""


def observation_kind(obs_shape: tuple[int, ...]) -> str:
    """``"vector"``, ``"pixels"`` or ``"grid"`` for an observation shape.

    Raises:
        ValueError: shapes that are neither 1-D nor channels-first 3-D.
    """
    if len(obs_shape) == 1:
        return "vector"
    if len(obs_shape) == 3:
        return "pixels" if min(obs_shape[1:]) >= PIXELS_MIN_SIZE else "grid"
    raise ValueError(f"observations of shape {obs_shape} are not supported: Themis encodes "
                     "1-D vectors and channels-first (C, H, W) images or grids")


def conv_stack(convs: list[nn.Conv2d], dropout: float = 0.0,
               batchnorm: bool = False) -> list[nn.Module]:
    """Each convolution followed by batch normalisation (``batchnorm``), ReLU and dropout with
    probability ``dropout`` (> 0): DRLHP's reward network regularises every convolution with
    both ("All convolutional layers use batch norm and dropout with α = 0.5", Christiano et al.
    2017, App. A.2). Without either, ``[conv, ReLU, conv, ReLU, ...]`` as before (same module
    indices, so earlier checkpoints load)."""
    layers: list[nn.Module] = []
    for conv in convs:
        layers.append(conv)
        if batchnorm:
            layers.append(nn.BatchNorm2d(conv.out_channels))
        layers.append(nn.ReLU())
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
    return layers


class Encoder(nn.Module):
    """Base class: maps ``(B, *obs_shape)`` to ``(B, feature_dim)`` float32 features."""

    feature_dim: int


class FlattenEncoder(Encoder):
    """Vectors as they are: ``(B, *obs_shape) -> (B, prod(obs_shape))``."""

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.feature_dim = math.prod(obs_shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(len(obs), -1).float()


class ConvEncoder(Encoder):
    """Base class of the CNNs: ``convs`` (:func:`conv_stack`, flattened), then a linear layer
    with ReLU to ``feature_dim``."""

    convs: nn.Sequential
    head: nn.Sequential
    channels_last = False
    """Whether the convolutions run on channels-last tensors (:meth:`use_channels_last`)."""

    def use_channels_last(self) -> ConvEncoder:
        """Keep the convolutions' weights channels-last and convert each batch to it: oneDNN's
        convolutions are faster so on CPU (PPO's Nature CNN: fwd+bwd+Adam of a minibatch of
        32 about 1.5× faster, ``docs/benchmarks/pixels.md``). Same values up to float
        rounding; returns ``self``."""
        self.convs.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.channels_last = True
        return self

    def conv_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the convolutions' memory format."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def build(self, convs: list[nn.Conv2d], obs_shape: tuple[int, ...], feature_dim: int,
              dropout: float, batchnorm: bool) -> None:
        """Stack ``convs`` and size the head by a probe of one zero observation."""
        self.convs = nn.Sequential(*conv_stack(convs, dropout, batchnorm), nn.Flatten())
        with torch.no_grad():  # in eval mode: the probe draws no dropout mask
            n_flat = self.convs.eval()(torch.zeros(1, *obs_shape)).shape[1]
        self.convs.train()
        self.head = nn.Sequential(nn.Linear(n_flat, feature_dim), nn.ReLU())
        self.feature_dim = feature_dim


class NatureCNN(ConvEncoder):
    """The DQN encoder (Mnih et al. 2015): conv 8×8/4 (32), 4×4/2 (64), 3×3/1 (64), linear 512.

    Images smaller than :data:`NATURE_MIN_SIZE` (36) on a side, where that stack leaves
    nothing, get 3×3 convolutions with padding 1 and the same widths: 3×3/2 (32), 3×3/2 (64),
    3×3/2 (64) (a 32×32 image -> 4×4 features).
    Minimum: any image of at least 1×1 pixel works; ``pixels`` are 16×16 and up.

    Shapes: ``(B, C, H, W)`` uint8 or float in [0, 255] -> ``(B, feature_dim)``.
    """

    def __init__(self, obs_shape: tuple[int, ...], feature_dim: int = 512, dropout: float = 0.0,
                 batchnorm: bool = False) -> None:
        super().__init__()
        c = obs_shape[0]
        if min(obs_shape[1:]) >= NATURE_MIN_SIZE:
            layers = [(32, 8, 4, 0), (64, 4, 2, 0), (64, 3, 1, 0)]
        else:  # small images: strides of 2 with padding keep at least 1×1
            layers = [(32, 3, 2, 1), (64, 3, 2, 1), (64, 3, 2, 1)]
        convs = []
        for width, kernel, stride, padding in layers:
            convs.append(nn.Conv2d(c, width, kernel, stride=stride, padding=padding))
            c = width
        self.build(convs, obs_shape, feature_dim, dropout, batchnorm)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32, copy=True).div_(255.0)
        return self.head(self.convs(self.conv_input(x)))


class GridCNN(ConvEncoder):
    """Small CNN for symbolic grids: three 2×2 convolutions (16, 32, 64), then linear.

    A grid smaller than 4 on a side has 1×1 convolutions where a 2×2 would leave nothing.
    Minimum: 1×1.

    Shapes: ``(B, C, H, W)`` small integers (object/colour/state indices, direction, word
    counts) -> ``(B, feature_dim)``.
    """

    def __init__(self, obs_shape: tuple[int, ...], feature_dim: int = 128, dropout: float = 0.0,
                 batchnorm: bool = False) -> None:
        super().__init__()
        c, side = obs_shape[0], min(obs_shape[1:])
        convs = []
        for i, width in enumerate((16, 32, 64)):
            kernel = 2 if side - i >= 2 else 1  # each 2×2 convolution takes one row
            convs.append(nn.Conv2d(c, width, kernel))
            c = width
        self.build(convs, obs_shape, feature_dim, dropout, batchnorm)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.convs(obs.float()))


def make_encoder(obs_shape: tuple[int, ...], dropout: float = 0.0,
                 batchnorm: bool = False) -> Encoder:
    """The encoder for ``obs_shape`` (see :func:`observation_kind`); has ``feature_dim``.

    ``dropout`` / ``batchnorm``: regularise every convolution of a CNN (the reward model's
    recipe in Christiano et al. 2017, App. A.2; :func:`conv_stack`); vectors have no layers.
    """
    kind = observation_kind(obs_shape)
    if kind == "vector":
        return FlattenEncoder(obs_shape)
    cnn = NatureCNN if kind == "pixels" else GridCNN
    return cnn(obs_shape, dropout=dropout, batchnorm=batchnorm)


def random_encoder(obs_shape: tuple[int, ...], seed: int = 0) -> Encoder:
    """A frozen, randomly initialised encoder (RE3, Seo et al. 2021) for state-entropy features
    of pixels and grids: k-NN distances in its feature space rather than in raw pixels."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    encoder = make_encoder(obs_shape)
    torch.random.set_rng_state(generator_state)
    for p in encoder.parameters():
        p.requires_grad_(False)
    return encoder.eval()
