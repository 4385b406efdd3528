"""Publishing reward-model versions from the learner process to the agent's process.

The learner writes each new version of the reward ensemble into one flat float32 array in
shared memory, with the running statistics to normalise r̂ by, under a lock, and counts up
the version (:class:`SharedWeights`). The agent's side copies a newer version out only when the
lock is free at that moment (never waiting on the learner) and evaluates r̂ on its own copy:
with NumPy for vector observations (:class:`NumpyEnsemble`, a few µs for one step, no PyTorch
dispatch), with the PyTorch ensemble for images.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import torch

from themis.reward.ensemble import RewardEnsemble

STATS = 4
"""Published with a version: the normalisation statistics of its r̂ (mean, variance, sample
count) and the passes over the labels it was trained with (DRLHP's training steps; ``inf`` for
a pretrained model)."""

COUNTERS = ("total_feedback", "labeled_feedback", "labels", "reward_accuracy")
"""The learner's counters, published after each round (:meth:`SharedWeights.count`)."""


def flat_size(model: RewardEnsemble) -> int:
    """Floats in the model's state dict."""
    return sum(int(t.numel()) for t in model.state_dict().values())


class SharedWeights:
    """A reward ensemble's weights and r̂ statistics in shared memory, with a version counter.

    Args:
        ctx: the multiprocessing context the learner process is started with.
        size: floats of the model's state dict (:func:`flat_size`).

    Made in the agent's process and passed to the learner process (it pickles as the shared
    arrays, not their contents).
    """

    def __init__(self, ctx: Any, size: int) -> None:
        self.size = size
        self.weights = ctx.RawArray(ctypes.c_float, size)
        self.stats = ctx.RawArray(ctypes.c_double, STATS)
        self.version = ctx.RawValue(ctypes.c_int64, 0)
        self.trained_steps = ctx.RawValue(ctypes.c_int64, 0)
        """``reward_schedule=passes``: the agent steps the label-passes trained so far are
        owed for (the agent's side waits on it with ``reward_max_lag``)."""
        self.counters = ctx.RawArray(ctypes.c_double, len(COUNTERS))
        self.counters[3] = float("nan")
        self.lock = ctx.Lock()

    def count(self, values: tuple[float, ...]) -> None:
        """Publish the learner's counters (:data:`COUNTERS`; learner side, no lock: each is
        read on its own, for logs)."""
        self.counters[:] = [float(v) for v in values]

    def counts(self) -> dict[str, float]:
        """The last published counters, by name (:data:`COUNTERS`)."""
        return dict(zip(COUNTERS, self.counters[:], strict=True))

    def publish(self, model: RewardEnsemble, stats: tuple[float, float, float],
                version: int, epochs: float = float("inf")) -> None:
        """Write ``model``'s weights, ``(mean, var, count)`` of its r̂ and the ``epochs`` (passes
        over the labels) it was trained with as ``version`` (learner side; it waits only for an
        agent-side copy in progress)."""
        flat = torch.cat([t.detach().reshape(-1).float().cpu()
                          for t in model.state_dict().values()]).numpy()
        with self.lock:
            np.frombuffer(self.weights, dtype=np.float32)[:] = flat
            np.frombuffer(self.stats, dtype=np.float64)[:] = (*stats, epochs)
            self.version.value = version

    def read(self, known: int) -> tuple[int, np.ndarray, np.ndarray] | None:
        """A version newer than ``known``, copied out: ``(version, weights (size,), stats
        (4,))`` (:data:`STATS`); ``None`` when there is none, or the learner is writing one
        right now."""
        if self.version.value == known or not self.lock.acquire(block=False):
            return None
        try:
            return (int(self.version.value), np.frombuffer(self.weights, np.float32).copy(),
                    np.frombuffer(self.stats, np.float64).copy())
        finally:
            self.lock.release()


def load_flat(model: RewardEnsemble, flat: np.ndarray) -> None:
    """Load a flat state dict (the order of ``model.state_dict()``) into ``model``."""
    state, at = {}, 0
    for key, value in model.state_dict().items():
        n = int(value.numel())
        state[key] = torch.from_numpy(flat[at:at + n].copy()).reshape(value.shape).to(value.dtype)
        at += n
    model.load_state_dict(state)


class NumpyEnsemble:
    """r̂ of a vector-observation :class:`RewardEnsemble` evaluated with NumPy.

    The same function as the PyTorch model (LeakyReLU hidden layers, tanh output, members
    batched): for the one or few rows of an env step it costs a few µs, where a PyTorch call
    costs tens. Shapes: :meth:`members` ``(n, obs_dim), (n, action_dim) -> (E, n)``.
    """

    def __init__(self, model: RewardEnsemble) -> None:
        assert model.encoders is None, "NumpyEnsemble evaluates vector observations only"
        self.template = model
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        self.load(model)

    def load(self, model: RewardEnsemble) -> None:
        """Take ``model``'s weights."""
        from themis.agents.networks import EnsembleLinear

        linear = [m for m in model.net.net if isinstance(m, EnsembleLinear)]
        self.layers = [(m.weight.detach().cpu().numpy().copy(),
                        m.bias.detach().cpu().numpy().copy()) for m in linear]

    def members(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Per-member r̂, ``(E, n)`` float32."""
        h = np.concatenate([obs.reshape(len(obs), -1).astype(np.float32, copy=False),
                            actions.astype(np.float32, copy=False)], axis=1)
        last = len(self.layers) - 1
        for i, (w, b) in enumerate(self.layers):
            h = np.matmul(h, w) + b  # (n, in) @ (E, in, out) -> (E, n, out)
            if i < last:
                h = np.where(h > 0, h, np.float32(0.01) * h)  # LeakyReLU
        return np.tanh(h[..., 0])


class Ensemble:
    """The agent side's copy of the reward model: :class:`NumpyEnsemble` for vectors, the
    PyTorch ensemble (on the CPU, no gradients) for images and grids."""

    def __init__(self, model: RewardEnsemble) -> None:
        self.model = model.cpu().eval()
        self.fast = NumpyEnsemble(model) if model.encoders is None else None

    def load_flat(self, flat: np.ndarray) -> None:
        """Take a published version's weights."""
        load_flat(self.model, flat)
        if self.fast is not None:
            self.fast.load(self.model)

    def members(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Per-member r̂ ``(E, n)`` of ``obs (n, *obs_shape)`` and ``actions (n, action_dim)``."""
        if self.fast is not None:
            return self.fast.members(obs, actions)
        with torch.inference_mode():
            return self.model(torch.as_tensor(obs).reshape(len(obs), -1),
                              torch.as_tensor(actions, dtype=torch.float32)).numpy()


__all__ = ["Ensemble", "NumpyEnsemble", "SharedWeights", "flat_size", "load_flat"]
