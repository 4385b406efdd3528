"""Feature visualisation of pixel reward nets: the observation that maximises (or minimises) r̂,
and the dataset examples with the highest and lowest r̂.

Activation maximisation (Olah et al. 2017, "Feature Visualization"; the practice of Lucent, the
PyTorch port of Lucid, which reward-function-interpretability uses) with its usual regularisers:

- a **decorrelated image parameterisation**: the image is the inverse real FFT of a learned
  spectrum scaled by ``1 / frequency`` (so gradient steps favour low frequencies over
  pixel-level noise), RGB images are further decorrelated by Lucid's colour-correlation matrix,
  and a sigmoid maps the result into [0, 1] (×255 for the reward net);
- **transformation robustness**: every step sees the image padded, jittered, slightly scaled
  and rotated (Lucent's ``standard_transforms``: pad 12, jitter 8, scale 0.9–1.1, rotate ±10°,
  jitter 4, scaled to the image size), so the optimum cannot rely on single pixels.

Lucent itself (``torch-lucent`` 0.1.8, its newest release) is not used: installing it replaces
this project's PyTorch 2.13 CPU build with another PyTorch and the CUDA stack and pins
``kornia==0.4.1`` (2020); the loop it would run is the ~80 lines below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from themis.core.figures import pyplot, save_figure
from themis.reward.ensemble import RewardEnsemble

# Lucid's square root of the ImageNet colour correlation (lucent.optvis.param.color)
_COLOR_SQRT = torch.tensor([[0.26, 0.09, 0.02], [0.27, 0.00, -0.05], [0.27, -0.09, 0.03]])
_COLOR_SQRT = _COLOR_SQRT / _COLOR_SQRT.norm(dim=0).max()


class FourierImage(torch.nn.Module):
    """An image ``(C, H, W)`` in [0, 1] parameterised by its scaled Fourier spectrum.

    Args:
        shape: ``(C, H, W)``.
        sd: standard deviation of the initial spectrum.
        decay_power: the spectrum is scaled by ``1 / frequency ** decay_power``.
        decorrelate: mix 3 channels through Lucid's colour-correlation matrix.
        generator: seeds the initial spectrum.
    """

    def __init__(self, shape: tuple[int, int, int], sd: float = 0.01, decay_power: float = 1.0,
                 decorrelate: bool = True, generator: torch.Generator | None = None) -> None:
        super().__init__()
        c, h, w = shape
        fy = torch.fft.fftfreq(h)[:, None]
        fx = torch.fft.rfftfreq(w)[None, :]
        freqs = torch.sqrt(fx * fx + fy * fy)
        self.register_buffer("scale", 1.0 / torch.clamp(freqs, min=1.0 / max(h, w))
                             ** decay_power * math.sqrt(h * w))
        self.spectrum = torch.nn.Parameter(
            torch.randn((c, h, w // 2 + 1, 2), generator=generator) * sd)
        self.shape = (c, h, w)
        self.decorrelate = decorrelate and c == 3

    def forward(self) -> torch.Tensor:
        _, h, w = self.shape
        scale: torch.Tensor = self.scale  # type: ignore[assignment]
        spectrum = torch.view_as_complex(self.spectrum) * scale
        image = torch.fft.irfft2(spectrum, s=(h, w), norm="ortho") / 4.0
        if self.decorrelate:
            image = torch.einsum("ij,jhw->ihw", _COLOR_SQRT, image)
        return torch.sigmoid(image)


def random_transform(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Lucent's standard transforms, as one random affine map per image and a crop back to
    the input size: pad (reflect) by 12/84 of the size, shift by up to 12/84, scale 0.9–1.1,
    rotate ±10°.

    Shapes: ``(B, C, H, W)`` -> ``(B, C, H, W)``.
    """
    b, _, h, w = images.shape
    pad = max(1, round(12 * min(h, w) / 84))
    x = F.pad(images, (pad, pad, pad, pad), mode="reflect")
    u = torch.rand((b, 4), generator=generator)
    scale = 0.9 + 0.2 * u[:, 0]
    angle = (u[:, 1] - 0.5) * (20.0 * math.pi / 180.0)
    shift = (u[:, 2:] - 0.5) * 2.0 * (pad / (h + 2 * pad))
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1),
                         torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    return x[:, :, pad:pad + h, pad:pad + w]


@dataclass
class Visualisation:
    """Result of :func:`maximise_reward`.

    Attributes:
        image: ``(C, H, W)`` uint8 observation.
        reward: r̂ (ensemble mean) of the final image (no transforms).
        history: r̂ before its tanh, of the transformed batch, per step (mean).
        action: the action index (or ``None`` for vector actions given directly).
    """

    image: np.ndarray
    reward: float
    history: list[float]
    action: int | None


def total_variation(image: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels of ``(C, H, W)`` (Mahendran & Vedaldi
    2015): small for smooth images."""
    return (image[:, 1:] - image[:, :-1]).abs().mean() + \
        (image[:, :, 1:] - image[:, :, :-1]).abs().mean()


def maximise_reward(model: RewardEnsemble, action: np.ndarray, sign: float = 1.0,
                    steps: int = 256, lr: float = 0.05, batch: int = 4, seed: int = 0,
                    decorrelate: bool = True, transforms: bool = True, tv: float = 0.0,
                    l2: float = 0.0, prior: np.ndarray | None = None,
                    progress: Any = None) -> Visualisation:
    """The observation that maximises ``sign · r̂(obs, action)`` (``sign = -1``: minimises).

    Args:
        model: a reward ensemble over pixel observations ``(C, H, W)`` in [0, 255].
        action: ``(action_dim,)`` the action vector (one-hot for discrete actions).
        sign: 1 to maximise, -1 to minimise.
        steps, lr: Adam on the Fourier parameters.
        batch: transformed copies per step (their mean r̂ is the objective).
        seed: initial spectrum and transforms.
        decorrelate, transforms: the regularisers (on by default).
        tv: weight of a total-variation penalty (smoother images; 0: none).
        l2: weight of a penalty ``mean((x − prior)²)`` (pixels in [0, 1]) that keeps the image
            near ``prior`` (e.g. the mean observation of the rollouts; default mid-grey).
        prior: ``(C, H, W)`` in [0, 255].
        progress: called with 1 after each step.

    Raises:
        ValueError: the model's observations are not images.
    """
    shape = tuple(model.obs_shape)
    if len(shape) != 3 or model.encoders is None:
        raise ValueError(f"feature visualisation needs a reward net over images (C, H, W); "
                         f"this one takes observations of shape {shape}")
    generator = torch.Generator().manual_seed(seed)
    param = FourierImage(shape, decorrelate=decorrelate, generator=generator)  # type: ignore[arg-type]
    opt = torch.optim.Adam(param.parameters(), lr=lr)
    act = torch.as_tensor(np.asarray(action, np.float32))[None].expand(batch, -1)
    for p in model.parameters():
        p.requires_grad_(False)
    history = []
    # the objective is r̂ before its tanh: the saturated tanh would stop the gradient at ±1
    layers = model.net.net
    squash = layers[-1] if isinstance(layers[-1], torch.nn.Tanh) else None
    if squash is not None:
        layers[-1] = torch.nn.Identity()
    try:
        centre = torch.full(shape, 0.5) if prior is None else \
            torch.as_tensor(np.asarray(prior, np.float32) / 255.0)
        history = _ascend(model, param, opt, act, sign, steps, batch, generator, transforms, tv,
                          l2, centre, progress)
    finally:
        if squash is not None:
            layers[-1] = squash
    with torch.no_grad():
        final = param()
        reward = float(model((final * 255.0).reshape(1, -1), act[:1]).mean())
    out = (final.detach().numpy() * 255.0).round().clip(0, 255).astype(np.uint8)
    return Visualisation(out, reward, history,
                         int(np.argmax(action)) if np.ndim(action) == 1 else None)


def _ascend(model: RewardEnsemble, param: FourierImage, opt: torch.optim.Optimizer,
            act: torch.Tensor, sign: float, steps: int, batch: int,
            generator: torch.Generator, transforms: bool, tv: float, l2: float,
            centre: torch.Tensor, progress: Any) -> list[float]:
    """The optimisation loop of :func:`maximise_reward`; the pre-tanh r̂ per step."""
    history = []
    for _ in range(steps):
        image = param()[None].expand(batch, -1, -1, -1)
        x = random_transform(image, generator) if transforms else image
        r = model(x.reshape(batch, -1) * 255.0, act).mean()
        opt.zero_grad()
        penalty = tv * total_variation(image[0]) + l2 * ((image[0] - centre) ** 2).mean()
        (-sign * r + penalty).backward()
        opt.step()
        history.append(r.item())
        if progress is not None:
            progress(1)
    return history


def dataset_examples(rewards: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the ``k`` highest and ``k`` lowest rewards (highest first, lowest first)."""
    order = np.argsort(rewards, kind="stable")
    k = min(k, len(rewards))
    return order[::-1][:k], order[:k]


def as_picture(obs: np.ndarray) -> np.ndarray:
    """An observation ``(C, H, W)`` as an ``(H, W', 3)`` uint8 picture: RGB as it is, a stack
    of grayscale frames side by side (oldest first)."""
    obs = np.asarray(obs)
    if obs.shape[0] == 3:
        return np.transpose(obs, (1, 2, 0)).astype(np.uint8)
    frames = np.concatenate(list(obs), axis=1)
    return np.repeat(frames[:, :, None], 3, axis=2).astype(np.uint8)


def plot_feature_vis(best: Visualisation, worst: Visualisation, top: list[tuple[np.ndarray,
                     float, int]], bottom: list[tuple[np.ndarray, float, int]],
                     path: str | Path, title: str = "") -> Path:
    """One picture: the maximising and minimising observations, then the top and bottom dataset
    examples (each with its r̂ and action)."""
    plt = pyplot()

    cols = max(2, len(top))
    aspect = as_picture(best.image).shape[0] / as_picture(best.image).shape[1]
    fig, axes = plt.subplots(3, cols, figsize=(3.2 * cols, 3 * (3.2 * aspect + 0.5) + 0.4),
                             squeeze=False)
    for ax in axes.ravel():
        ax.set_axis_off()
    for ax, vis, name in ((axes[0, 0], best, "maximises r̂"), (axes[0, 1], worst,
                                                                "minimises r̂")):
        ax.imshow(as_picture(vis.image))
        ax.set_title(f"{name}: {vis.reward:.3f} (action {vis.action})", fontsize=8)
    for row, examples, name in ((1, top, "top"), (2, bottom, "bottom")):
        for ax, (obs, r, a) in zip(axes[row], examples, strict=False):
            ax.imshow(as_picture(obs))
            ax.set_title(f"{name}: r̂ {r:.3f}, action {a}", fontsize=8)
    return save_figure(fig, path, title)
