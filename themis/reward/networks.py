"""The reward networks of Deep RL from Human Preferences (``reward_net=drlhp`` / ``drlhp_dot``).

- :class:`DRLHPCNN`: the paper's Atari reward network's convolutions (Christiano et al. 2017,
  App. A.2: "4 convolutional layers of size 7x7, 5x5, 3x3, and 3x3 with strides 3, 2, 1, 1, each
  having 16 filters, with leaky ReLU nonlinearities (α = 0.01). This is followed by a fully
  connected layer of size 64 and then a scalar output. All convolutional layers use batch norm
  and dropout with α = 0.5"); the fully connected layers are the ensemble's batched head
  (:class:`themis.reward.RewardEnsemble`). Dropout follows the first three convolutions, as
  mrahtz/learning-from-human-preferences ``reward_predictor_core_network.py`` ``net_cnn``.
- :class:`MovingDotFeatures`: mrahtz's MovingDot network's input (``net_moving_dot_features``):
  no CNN, the dot's position read from the last frame (argmax of the column and row sums),
  scaled to [0, 1], beside the action index / 4; the ensemble's head is its 64-64-64-1 MLP.
  ``drlhp_dot_onehot`` gives the head the action one-hot instead (five inputs), as Themis's
  other reward networks: the index / 4 makes the MLP carve one input into five actions, and
  learns MovingDot's reward from the same labels far more slowly (docs/results/drlhp.md).

:data:`REWARD_NETS` names every choice of ``reward_net``; ``bpref`` is Themis's default (a
Nature-DQN CNN per member for pixels, then a 3×256 tanh MLP over features and action).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from themis.agents.encoders import Encoder

REWARD_NETS = ("bpref", "drlhp", "drlhp_dot", "drlhp_dot_onehot")
"""``reward_net`` values: B-Pref's MLP (and Nature CNN on pixels), DRLHP's Atari network,
mrahtz's MovingDot feature network, and the same with the action one-hot."""

DOT_NETS = ("drlhp_dot", "drlhp_dot_onehot")
"""The ``reward_net`` values that read the dot's position (:class:`MovingDotFeatures`)."""

LEAKY_SLOPE = 0.01
"""α of DRLHP's leaky ReLUs (App. A.2)."""


def dropout_mask(shape: torch.Size | tuple[int, ...], p: float,
                 device: torch.device | None = None) -> torch.Tensor:
    """A bool mask that keeps each element with probability ``1 − p`` (resolution 2⁻¹⁶), drawn
    as 16-bit slices of random 64-bit words: one generator call per four elements, where
    :func:`torch.bernoulli` makes one per element (timings: docs/results/drlhp.md).

    Raises:
        ValueError: ``p`` outside ``[0, 1)``.
    """
    if not 0 <= p < 1:
        raise ValueError(f"a dropout probability must be in [0, 1), got {p}")
    n = math.prod(shape)
    words = torch.randint(-2**63, 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    halves = words.view(torch.int16)[:n].view(shape)
    return halves < (-32768 + round(65536 * (1 - p)))


class FastDropout(nn.Module):
    """Inverted dropout (:class:`torch.nn.Dropout`'s semantics: in train mode each element is
    zeroed with probability ``p`` and the rest scaled by ``1 / (1 − p)``; identity in eval mode)
    with the mask of :func:`dropout_mask`, drawn with a quarter of the generator calls of
    ``torch.bernoulli`` (DRLHP's conv activations are large: docs/results/drlhp.md).

    Shapes: any ``(*)`` -> the same.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"a dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        scaled = dropout_mask(x.shape, self.p, x.device).to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * scaled  # a float mask: the product in x's dtype (with a bool one, 2.5× slower)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class DRLHPCNN(Encoder):
    """DRLHP's four convolutions, flattened: 7×7/3, 5×5/2, 3×3/1, 3×3/1, 16 filters each,
    batch norm (``batchnorm``) before each leaky ReLU (α = 0.01), dropout (``dropout``) after
    the first three; inputs divided by 255.

    Args:
        obs_shape: ``(C, H, W)``; Atari's ``(4, 84, 84)`` gives 16 × 7 × 7 = 784 features.
        dropout: dropout probability after the convolutions (DRLHP: 0.5).
        batchnorm: batch normalisation of every convolution (DRLHP: on).

    Shapes: ``(B, C, H, W)`` uint8 or float in [0, 255] -> ``(B, feature_dim)`` float32.

    Raises:
        ValueError: an image too small for the stack (under 43 pixels on a side).
    """

    LAYERS = ((7, 3), (5, 2), (3, 1), (3, 1))
    FILTERS = 16

    def __init__(self, obs_shape: tuple[int, ...], dropout: float = 0.0,
                 batchnorm: bool = False) -> None:
        super().__init__()
        c, h, w = obs_shape
        layers: list[nn.Module] = []
        for i, (kernel, stride) in enumerate(self.LAYERS):
            layers.append(nn.Conv2d(c, self.FILTERS, kernel, stride=stride))
            if batchnorm:
                layers.append(nn.BatchNorm2d(self.FILTERS))
            layers.append(nn.LeakyReLU(LEAKY_SLOPE))
            if dropout > 0 and i < len(self.LAYERS) - 1:
                layers.append(FastDropout(dropout))
            c = self.FILTERS
            h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
        if min(h, w) < 1:
            raise ValueError(f"reward_net=drlhp needs images of at least 43×43 pixels, got "
                             f"{obs_shape[1]}×{obs_shape[2]}")
        self.convs = nn.Sequential(*layers, nn.Flatten())
        self.feature_dim = self.FILTERS * h * w

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32, copy=True).div_(255.0)
        return self.convs(x.contiguous(memory_format=torch.channels_last))


class MovingDotFeatures(Encoder):
    """The dot's position in the last frame of a stack, ``(x, y)`` scaled to [0, 1]: the arg-max
    of the frame's column sums and of its row sums (mrahtz's ``get_dot_position``).

    Shapes: ``(B, C, H, W)`` -> ``(B, 2)`` float32 (``x / (W − 1)``, ``y / (H − 1)``).
    """

    feature_dim = 2

    def __init__(self, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.obs_shape = tuple(obs_shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        last = obs[:, -1].float()  # (B, H, W)
        h, w = last.shape[-2:]
        x = last.sum(1).argmax(1).float() / max(w - 1, 1)
        y = last.sum(2).argmax(1).float() / max(h - 1, 1)
        return torch.stack([x, y], dim=1)


def action_index_feature(action: torch.Tensor) -> torch.Tensor:
    """mrahtz's MovingDot action input: the action's index / 4 (``a = s[..., -1] / 4.0``),
    from a one-hot ``(..., n)`` -> ``(..., 1)`` float32."""
    index = action.argmax(-1, keepdim=True).float()
    return index / 4.0


__all__ = ["DOT_NETS", "DRLHPCNN", "REWARD_NETS", "FastDropout", "MovingDotFeatures",
           "action_index_feature", "dropout_mask"]
