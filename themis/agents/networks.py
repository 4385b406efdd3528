"""Network building blocks: plain MLPs and ensembles of MLPs evaluated in one batched matmul.

An ensemble of ``E`` MLPs is stored as weights of shape ``(E, in, out)`` so that all members run
in one ``torch.baddbmm`` call per layer. SAC's double Q critic (``E = 2``) and the reward ensemble
(``E = ensemble_size``) both use it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class FullPrecisionLinear(nn.Linear):
    """``nn.Linear`` that computes in float32 also inside ``torch.autocast`` (output layers:
    Q values, rewards and policy means keep float32's precision; :mod:`themis.core.precision`).
    Outside autocast it is ``nn.Linear``, bit for bit."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), self.weight, self.bias)


def mlp(input_dim: int, hidden_dim: int, output_dim: int, hidden_depth: int,
        activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """A multilayer perceptron ``input_dim -> hidden_dim x hidden_depth -> output_dim``; its
    output layer is a :class:`FullPrecisionLinear`."""
    if hidden_depth == 0:
        return nn.Sequential(FullPrecisionLinear(input_dim, output_dim))
    layers: list[nn.Module] = [nn.Linear(input_dim, hidden_dim), activation()]
    for _ in range(hidden_depth - 1):
        layers += [nn.Linear(hidden_dim, hidden_dim), activation()]
    layers.append(FullPrecisionLinear(hidden_dim, output_dim))
    return nn.Sequential(*layers)


class EnsembleLinear(nn.Module):
    """``E`` independent linear layers applied at once.

    Args:
        ensemble_size: number of members ``E``.
        in_features: input width.
        out_features: output width.
        full_precision: compute in float32 also inside ``torch.autocast`` (output layers).

    Shapes:
        input ``(E, B, in_features)`` or ``(B, in_features)`` (shared by all members);
        output ``(E, B, out_features)``.
    """

    SMALL_DOT = 1 << 18
    """Up to this many input elements (per member, times the members), a one-unit layer (Q
    values, rewards) is a multiply and a sum: PyTorch's CPU ``baddbmm`` runs ``(E, B, in) @
    (E, in, 1)`` far below memory speed (2 × 256 × 256: 200 against 120 µs forward and
    backward, two threads), while at the reward model's large batches (3 × 12800 × 256, a
    batch of 128 pairs of 50-step segments) it is the faster one."""

    def __init__(self, ensemble_size: int, in_features: int, out_features: int,
                 full_precision: bool = False) -> None:
        super().__init__()
        self.full_precision = full_precision
        self.ensemble_size = ensemble_size
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(ensemble_size, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(ensemble_size, 1, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise each member like ``nn.Linear``: U(-1/sqrt(in), 1/sqrt(in))."""
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.out_features == 1 and x.numel() * (
                self.ensemble_size if x.dim() == 2 else 1) <= self.SMALL_DOT:
            # float32 weights promote bfloat16 inputs exactly: float32 also inside autocast
            return (x * self.weight.transpose(1, 2)).sum(-1, keepdim=True) + self.bias
        if self.full_precision:
            with torch.autocast(x.device.type, enabled=False):
                return self._forward(x.float())
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            # the product's dtype for the bias too: inside autocast the sum stays bfloat16
            # (as baddbmm's) instead of promoting (E, B, out) to float32 and back
            out = torch.matmul(x, self.weight)
            return out + self.bias.to(out.dtype)
        return torch.baddbmm(self.bias, x, self.weight)

    def extra_repr(self) -> str:
        return f"ensemble_size={self.ensemble_size}, in={self.in_features}, out={self.out_features}"


class EnsembleBatchNorm(nn.Module):
    """Batch normalisation of ``E`` members' activations, each member and unit with its own
    statistics and affine parameters (``nn.BatchNorm1d`` over ``E × features`` channels).

    Shapes: ``(E, B, features)`` -> the same.
    """

    def __init__(self, ensemble_size: int, features: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(ensemble_size * features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ens, batch, features = x.shape
        flat = x.transpose(0, 1).reshape(batch, ens * features)
        return self.bn(flat).reshape(batch, ens, features).transpose(0, 1)


class EnsembleMLP(nn.Module):
    """``E`` MLPs with identical architecture, evaluated together.

    Args:
        ensemble_size: number of members ``E``.
        input_dim, hidden_dim, output_dim, hidden_depth: architecture of each member.
        activation: hidden activation class.
        output_activation: optional module applied to the output (e.g. ``nn.Tanh``).

        dropout: probability of :class:`torch.nn.Dropout` after each hidden activation (0: none).
        batchnorm: batch normalisation of each hidden layer before its activation, statistics
            per member and unit (:class:`EnsembleBatchNorm`).

    Shapes:
        input ``(E, B, input_dim)`` or ``(B, input_dim)``; output ``(E, B, output_dim)``.

    The output layer computes in float32 also inside ``torch.autocast``
    (:mod:`themis.core.precision`).
    """

    def __init__(self, ensemble_size: int, input_dim: int, hidden_dim: int, output_dim: int,
                 hidden_depth: int, activation: type[nn.Module] = nn.ReLU,
                 output_activation: type[nn.Module] | None = None, dropout: float = 0.0,
                 batchnorm: bool = False) -> None:
        super().__init__()
        self.ensemble_size = ensemble_size
        dims = [input_dim] + [hidden_dim] * hidden_depth + [output_dim]
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            layers.append(EnsembleLinear(ensemble_size, dims[i], dims[i + 1],
                                         full_precision=i == len(dims) - 2))
            if i < len(dims) - 2:
                if batchnorm:
                    layers.append(EnsembleBatchNorm(ensemble_size, dims[i + 1]))
                layers.append(activation())
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
        if output_activation is not None:
            layers.append(output_activation())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
