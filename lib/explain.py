"""Captum explanations of the policy's action and of the learned reward, drawn under query clips.

Two targets (``xplain_action``, ``xplain_state``) and three attribution methods from Captum
(Kokhlikyan et al. 2020), chosen with ``xplain_method``:

- ``integrated_gradients`` (Sundararajan et al. 2017): path integral of the gradient from a
  baseline (zeros or the replay-buffer mean, ``xplain_baseline``) to the input; completeness:
  the attributions sum to ``f(x) - f(baseline)``.
- ``saliency`` (Simonyan et al. 2014): absolute gradient of the output at the input.
- ``gradient_shap`` (Lundberg & Lee 2017): expected gradients with baselines drawn from the
  replay buffer and Gaussian noise.

Adding a method is one entry in :data:`METHODS`: a function ``(forward, inputs, baselines,
target) -> attributions`` where ``inputs`` and ``baselines`` are tuples of tensors (baselines of
shape ``(n, *input.shape[1:])``, ``n >= 1``) and the attributions have the inputs' shapes.

Panels (:func:`vector_panel`, :func:`image_panel`) turn one segment's attributions into frames
of the clip's width that :func:`lib.human_interface.side_by_side` puts under each side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from themis.core.figures import pyplot, save_figure

Forward = Callable[..., torch.Tensor]
Method = Callable[[Forward, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...],
                   torch.Tensor | None], tuple[torch.Tensor, ...]]


# ---------------------------------------------------------------------------- methods
def integrated_gradients(forward: Forward, inputs: tuple[torch.Tensor, ...],
                         baselines: tuple[torch.Tensor, ...],
                         target: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Integrated gradients against the first baseline (Sundararajan et al. 2017, Eq. 1)."""
    from captum.attr import IntegratedGradients

    base = tuple(b[:1].expand_as(x) for b, x in zip(baselines, inputs, strict=True))
    return _as_tuple(IntegratedGradients(forward).attribute(inputs, baselines=base,
                                                            target=target, n_steps=32))


def saliency(forward: Forward, inputs: tuple[torch.Tensor, ...],
             baselines: tuple[torch.Tensor, ...],
             target: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """|∂f/∂x| (Simonyan et al. 2014); baselines are not used."""
    from captum.attr import Saliency

    return _as_tuple(Saliency(forward).attribute(inputs, target=target))


def gradient_shap(forward: Forward, inputs: tuple[torch.Tensor, ...],
                  baselines: tuple[torch.Tensor, ...],
                  target: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """GradientSHAP (Lundberg & Lee 2017) with the given baseline distribution."""
    from captum.attr import GradientShap

    torch.manual_seed(0)  # Captum draws baselines and noise from torch's global generator
    return _as_tuple(GradientShap(forward).attribute(inputs, baselines=baselines, target=target,
                                                     n_samples=16, stdevs=0.01))


def _as_tuple(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, tuple | list) else (result,)


METHODS: dict[str, Method] = {
    "integrated_gradients": integrated_gradients,
    "saliency": saliency,
    "gradient_shap": gradient_shap,
}
"""``xplain_method`` name -> attribution method. Register a new method here."""


def attribute(method: str, forward: Forward, inputs: Sequence[torch.Tensor],
              baselines: Sequence[torch.Tensor], target: torch.Tensor | None = None,
              chunk: int = 64) -> tuple[np.ndarray, ...]:
    """Attributions of ``forward``'s output to ``inputs``, computed ``chunk`` rows at a time.

    Args:
        method: a key of :data:`METHODS`.
        forward: ``(*inputs) -> (B,)`` scalar per row, or ``(B, K)`` with ``target`` ``(B,)``.
        inputs: float tensors ``(B, ...)``.
        baselines: one tensor ``(n, ...)`` per input.
        target: output index per row for vector outputs.

    Returns:
        One float32 array per input, with its shape.

    Raises:
        ValueError: unknown method.
    """
    if method not in METHODS:
        raise ValueError(f"xplain_method={method} is unknown; use one of {', '.join(METHODS)}")
    fn = METHODS[method]
    parts: list[list[np.ndarray]] = [[] for _ in inputs]
    for lo in range(0, len(inputs[0]), chunk):
        x = tuple(t[lo:lo + chunk].detach().float().requires_grad_(True) for t in inputs)
        tgt = None if target is None else target[lo:lo + chunk]
        with torch.enable_grad():
            out = fn(forward, x, tuple(b.float() for b in baselines), tgt)
        for store, a in zip(parts, out, strict=True):
            store.append(a.detach().cpu().numpy().astype(np.float32))
    return tuple(np.concatenate(p) for p in parts)


# ---------------------------------------------------------------------------- targets
def action_forward(agent: Any, discrete: bool, action_dim: int = -1) -> Forward:
    """What ``xplain_action`` explains: for SAC the mean action ``tanh(mu(s))``, one dimension
    (``action_dim >= 0``) or its Euclidean norm (``-1``), ``(B,)``; for PPO the action
    probabilities ``softmax(logits)``, ``(B, n_actions)`` (target: the taken action)."""
    if discrete:
        net = agent.net
        return lambda obs: torch.softmax(net(obs)[0], dim=-1)
    actor = agent.actor
    if action_dim >= 0:
        return lambda obs: actor.mean_action(obs)[:, action_dim]
    return lambda obs: actor.mean_action(obs).norm(dim=-1)


def reward_forward(reward_model: Any) -> Forward:
    """What ``xplain_state`` explains: the ensemble-mean reward r̂(s, a), ``(B,)``."""
    def forward(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return reward_model(obs.reshape(len(obs), -1), action).mean(0)
    return forward


# ---------------------------------------------------------------------------- names
def feature_names(env: Any, obs_dim: int) -> list[str]:
    """Names of vector observation features: MuJoCo joints from the model and the env's
    ``observation_structure`` (positions ``qpos:NAME``, velocities ``qvel:NAME``, then other
    blocks as ``BLOCK[i]``); ``obs[i]`` where an env documents nothing."""
    names: list[str] = []
    inner: Any = env
    while inner is not None:  # a wrapper that names its features (DMC, Meta-World)
        listed = inner.__dict__.get("feature_names") if hasattr(inner, "__dict__") else None
        if listed is not None and len(listed) == obs_dim:
            return list(listed)
        inner = getattr(inner, "env", None)
    base = getattr(env, "unwrapped", env)
    structure = getattr(base, "observation_structure", None)
    model = getattr(base, "model", None)
    if isinstance(structure, dict) and model is not None:
        try:
            import mujoco

            qpos: list[str] = []
            qvel: list[str] = []
            sizes = {0: (7, 6), 1: (4, 3), 2: (1, 1), 3: (1, 1)}  # free, ball, slide, hinge
            for j in range(model.njnt):
                name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) or f"joint{j}"
                npos, nvel = sizes[int(model.jnt_type[j])]
                qpos += [name] if npos == 1 else [f"{name}[{k}]" for k in range(npos)]
                qvel += [name] if nvel == 1 else [f"{name}[{k}]" for k in range(nvel)]
            skipped = int(structure.get("skipped_qpos", 0))
            names = [f"qpos:{n}" for n in qpos[skipped:skipped + int(structure.get("qpos", 0))]]
            names += [f"qvel:{n}" for n in qvel[: int(structure.get("qvel", 0))]]
            for key, size in structure.items():
                if key not in ("skipped_qpos", "qpos", "qvel") and isinstance(size, int):
                    names += [f"{key}[{i}]" for i in range(size)]
        except Exception:  # a model we cannot read: generic names
            names = []
    if len(names) != obs_dim:
        names = [f"obs[{i}]" for i in range(obs_dim)]
    return names


# ---------------------------------------------------------------------------- panels
def _fitted(text: str, max_width: int, scale: float) -> str:
    """``text`` cut (ending in ``.``) to at most ``max_width`` pixels in OpenCV's simplex font."""
    def width(t: str) -> int:
        return int(cv2.getTextSize(t, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0])

    if width(text) <= max_width:
        return text
    if " (" in text and width(text.split(" (")[0]) <= max_width:  # "bthigh (hinge)": "bthigh"
        return text.split(" (")[0]
    while len(text) > 1 and width(text + ".") > max_width:
        text = text[:-1]
    return text.rstrip() + "."


CAPTION_HEIGHT = 11
"""Pixels at the bottom of a bar panel kept for its caption (no bar or name under it)."""


def vector_panel(attributions: np.ndarray, names: Sequence[str], width: int, height: int,
                 top_k: int = 5, caption: str = "") -> np.ndarray:
    """Bar chart of the ``top_k`` features by |attribution| for each step.

    Shapes: ``attributions (T, d)`` -> ``(T, height, width, 3)`` uint8 (red = positive, blue =
    negative; bar lengths relative to the largest |attribution| of the segment). Names fill the
    left half, cut to fit it; the ``caption`` has its own strip at the bottom.
    """
    steps, d = attributions.shape
    k = min(top_k, d)
    scale = float(np.abs(attributions).max()) or 1.0
    out = np.full((steps, height, width, 3), 255, dtype=np.uint8)
    strip = CAPTION_HEIGHT if caption else 0
    row = max(1, (height - strip) // k)
    label_w = width // 2
    font = max(0.25, min(0.4, row / 40))
    fitted = {i: _fitted(str(names[i]), label_w - 4, font) for i in range(d)}
    for t in range(steps):
        order = np.argsort(-np.abs(attributions[t]), kind="stable")[:k]
        for r, i in enumerate(order):
            y = r * row
            value = float(attributions[t, i])
            length = int((width - label_w - 2) * abs(value) / scale)
            color = (210, 40, 40) if value >= 0 else (40, 80, 210)
            cv2.rectangle(out[t], (label_w, y + 2), (label_w + length, y + row - 2), color, -1)
            cv2.putText(out[t], fitted[i], (2, y + row - 4), cv2.FONT_HERSHEY_SIMPLEX, font,
                        (0, 0, 0), 1, cv2.LINE_AA)
        if caption:
            cv2.putText(out[t], _fitted(caption, width - 4, 0.3), (2, height - 3),
                        cv2.FONT_HERSHEY_SIMPLEX, 0.3, (90, 90, 90), 1, cv2.LINE_AA)
    return out


def image_panel(observations: np.ndarray, attributions: np.ndarray, width: int,
                height: int) -> np.ndarray:
    """Heatmap of |attribution| over each step's observation image.

    Shapes: ``observations``, ``attributions`` ``(T, C, H, W)`` (pixels: frame stacks, the last
    frame is drawn; grids: the object-type plane is drawn) -> ``(T, height, width, 3)`` uint8.
    The heat is summed over channels and scaled by the segment's maximum.
    """
    heat = np.abs(attributions).sum(axis=1)  # (T, H, W)
    heat = heat / (heat.max() or 1.0)
    pixels = observations.shape[-1] > 16  # 84x84 frames vs 7x7 grids
    background = observations[:, -1] if pixels else observations[:, 0] * (255.0 / 10.0)
    interp = cv2.INTER_LINEAR if pixels else cv2.INTER_NEAREST
    out = np.empty((len(heat), height, width, 3), dtype=np.uint8)
    for t in range(len(heat)):
        gray = cv2.resize(np.clip(background[t], 0, 255).astype(np.uint8), (width, height),
                          interpolation=interp)
        hot = cv2.applyColorMap(cv2.resize((heat[t] * 255).astype(np.uint8), (width, height),
                                           interpolation=interp), cv2.COLORMAP_JET)
        hot = cv2.cvtColor(hot, cv2.COLOR_BGR2RGB)
        base = np.repeat(gray[..., None], 3, axis=2)
        out[t] = (0.5 * base + 0.5 * hot).astype(np.uint8)
    return out


def summary_png(segments: Sequence[np.ndarray], names: Sequence[str], path: str | Path,
                title: str) -> Path:
    """Mean |attribution| per feature over each segment of a clip, one subplot per segment
    ("segment 1", "segment 2"): bars for vectors ``(T, d)`` (the 15 largest), a heatmap for
    images ``(T, C, H, W)`` (summed over channels)."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(segments), figsize=(5 * len(segments), 4), squeeze=False)
    for s, (ax, attr) in enumerate(zip(axes[0], segments, strict=True)):
        mean = np.abs(attr).mean(axis=0)
        if mean.ndim == 1:
            order = np.argsort(-mean)[:15]
            ax.barh([str(names[i]) for i in order][::-1], mean[order][::-1], color="tab:red")
            ax.set_xlabel("mean |attribution|")
        else:
            im = ax.imshow(mean.sum(axis=0), cmap="jet")
            fig.colorbar(im, ax=ax, label="mean |attribution|")
            ax.set_axis_off()
        ax.set_title(f"segment {s + 1}")
    return save_figure(fig, path, title)


# ---------------------------------------------------------------------------- explainer
class Explainer:
    """Explains query segments for the run: the policy's action (``xplain_action``) and/or the
    reward model's r̂(s, a) (``xplain_state``), drawn as panels under the clip.

    Args:
        method: a key of :data:`METHODS`.
        obs_shape: one observation's shape (vector ``(d,)``, pixels or grid ``(C, H, W)``).
        reference_obs, reference_actions: replay-buffer samples ``(N, *obs_shape)``, ``(N, A)``:
            the baseline distribution of ``gradient_shap`` and, with ``baseline="mean"``, the
            mean baseline of the other methods.
        baseline: ``zeros`` or ``mean``.
        action_forward_fn: see :func:`action_forward` (None: no action explanations).
        reward_forward_fn: see :func:`reward_forward` (None: no reward explanations).
        discrete: PPO agent (the action target is the taken action's probability).
        names: observation feature names (vectors).
        top_k: bars per frame in vector panels.
    """

    def __init__(self, method: str, obs_shape: tuple[int, ...], reference_obs: np.ndarray,
                 reference_actions: np.ndarray, baseline: str = "zeros",
                 action_forward_fn: Forward | None = None,
                 reward_forward_fn: Forward | None = None, discrete: bool = False,
                 names: Sequence[str] = (), top_k: int = 5,
                 device: torch.device | str = "cpu") -> None:
        if method not in METHODS:
            raise ValueError(f"xplain_method={method} is unknown; use one of "
                             f"{', '.join(METHODS)}")
        if baseline not in ("zeros", "mean"):
            raise ValueError(f"xplain_baseline={baseline} is unknown; use zeros or mean")
        self.method = method
        self.obs_shape = tuple(obs_shape)
        self.vector = len(self.obs_shape) == 1
        self.device = torch.device(device)
        ref_obs = torch.as_tensor(reference_obs, dtype=torch.float32, device=self.device)
        ref_act = torch.as_tensor(reference_actions, dtype=torch.float32, device=self.device)
        if method == "gradient_shap":
            self.baselines = (ref_obs, ref_act)
        elif baseline == "mean":
            self.baselines = (ref_obs.mean(0, keepdim=True), ref_act.mean(0, keepdim=True))
        else:
            self.baselines = (torch.zeros_like(ref_obs[:1]), torch.zeros_like(ref_act[:1]))
        self.action_fn = action_forward_fn
        self.reward_fn = reward_forward_fn
        self.discrete = discrete
        action_dim = ref_act.shape[1]
        self.names = list(names) or [f"obs[{i}]" for i in range(int(np.prod(obs_shape)))]
        self.action_names = [f"action[{i}]" for i in range(action_dim)]
        self.top_k = top_k

    def explain(self, obs: np.ndarray, actions: np.ndarray) -> dict[str, np.ndarray]:
        """Attributions for one segment.

        Shapes: ``obs (T, *obs_shape)``, ``actions (T, A)`` -> ``{"action": (T, *obs_shape),
        "reward": (T, *obs_shape), "reward_action": (T, A)}`` (the enabled targets only).
        """
        o = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        a = torch.as_tensor(actions, dtype=torch.float32, device=self.device)
        out: dict[str, np.ndarray] = {}
        if self.action_fn is not None:
            target = a.argmax(-1) if self.discrete else None
            (out["action"],) = attribute(self.method, self.action_fn, (o,), self.baselines[:1],
                                         target)
        if self.reward_fn is not None:
            out["reward"], out["reward_action"] = attribute(self.method, self.reward_fn, (o, a),
                                                            self.baselines)
        return out

    def panel(self, obs: np.ndarray, attributions: dict[str, np.ndarray], width: int,
              height: int) -> np.ndarray:
        """The panels of one segment stacked vertically (action above reward), each
        ``height`` high and captioned: ``(T, n_panels * height, width, 3)`` uint8."""
        panels = []
        for key, caption in (("action", "policy action"), ("reward", "learned reward")):
            if key not in attributions:
                continue
            attr = attributions[key]
            if self.vector:
                values, names = attr, self.names
                if key == "reward":  # the action's share of r̂(s, a) too
                    values = np.concatenate([attr, attributions["reward_action"]], axis=1)
                    names = [*self.names, *self.action_names]
                p = vector_panel(values, names, width, height, self.top_k, caption)
            else:
                p = image_panel(obs.astype(np.float32), attr, width, height)
                for frame in p:  # over the heatmap, on a light strip
                    frame[height - CAPTION_HEIGHT:] = 255 - (255 - frame[height -
                                                                         CAPTION_HEIGHT:]) // 3
                    cv2.putText(frame, _fitted(caption, width - 4, 0.3), (2, height - 3),
                                cv2.FONT_HERSHEY_SIMPLEX, 0.3, (60, 60, 60), 1, cv2.LINE_AA)
            panels.append(p)
        return np.concatenate(panels, axis=1)

    def summaries(self, attributions: Sequence[dict[str, np.ndarray]], stem: Path) -> list[Path]:
        """Per-clip summary PNGs ``STEM_action.png`` / ``STEM_reward.png``: mean |attribution|
        per feature over each segment (segment 1 and 2 side by side)."""
        written = []
        for key in ("action", "reward"):
            if key not in attributions[0]:
                continue
            per_segment = []
            for attr in attributions:
                values, names = attr[key], self.names
                if key == "reward" and self.vector:
                    values = np.concatenate([values, attr["reward_action"]], axis=1)
                    names = [*self.names, *self.action_names]
                per_segment.append(values)
            written.append(summary_png(per_segment, names, stem.with_name(
                f"{stem.name}_{key}.png"), f"{key}: {self.method}"))
        return written
