"""Frame stacks without duplicated frames.

An Atari observation is a stack of the last ``k`` frames, ``(k, H, W)``, oldest first
(gymnasium's ``FrameStackObservation``). Consecutive observations share ``k - 1`` frames, so
storing whole stacks keeps every frame ``k`` times. ``L`` consecutive steps of one episode are
exactly ``L + k - 1`` frames: step ``t``'s stack is frames ``t .. t + k - 1``. The episode store
and the preference dataset keep those frames and hand out stacks as strided views of them (no
copy). A flattened stack is one contiguous window of ``k * H * W`` values, so the view is a
plain ``as_strided`` in NumPy and in torch.
"""

from __future__ import annotations

import numpy as np
import torch


def unstack(observations: np.ndarray, frame_ndim: int) -> np.ndarray:
    """The frames of stacked observations of consecutive steps.

    Args:
        observations: ``(..., L, k, *frame_shape)``: stacks of ``L`` consecutive steps, step
            ``t + 1``'s stack being step ``t``'s shifted by one frame.
        frame_ndim: ``len(frame_shape)``.

    Returns:
        ``(..., L + k - 1, *frame_shape)``: the first stack's ``k`` frames, then the newest frame
        of every later step.
    """
    time_axis = observations.ndim - frame_ndim - 2
    lead, (steps, k), frame = (observations.shape[:time_axis],
                               observations.shape[time_axis:time_axis + 2],
                               observations.shape[time_axis + 2:])
    flat = observations.reshape(-1, steps, k, int(np.prod(frame)))
    frames = np.concatenate([flat[:, 0], flat[:, 1:, k - 1]], axis=1)
    return frames.reshape(*lead, steps + k - 1, *frame)


def stacked(frames: np.ndarray, k: int, frame_ndim: int, flat: bool = False,
            writeable: bool = False) -> np.ndarray:
    """View of the stacks over consecutive frames (no copy).

    Args:
        frames: ``(..., L + k - 1, *frame_shape)``, C-contiguous from the frame axis on.
        k: frames per stack.
        frame_ndim: ``len(frame_shape)``.
        flat: give flattened stacks ``(..., L, k * prod(frame_shape))``.
        writeable: let the view be written (one frame is shared by ``k`` stacks, so a write
            shows in all of them); for frames nobody else reads, so that ``torch.as_tensor``
            takes the view without a warning. Read-only by default.

    Returns:
        ``(..., L, k, *frame_shape)`` (or flattened): step ``t``'s stack is frames ``t..t+k-1``.

    Raises:
        ValueError: a row of frames is not C-contiguous or holds fewer than ``k`` frames.
    """
    shape, strides = _stacked_layout(frames.shape, frames.strides, frames.itemsize, k,
                                     frame_ndim, flat)
    return np.lib.stride_tricks.as_strided(frames, shape, strides, writeable=writeable)


def stacked_tensor(frames: torch.Tensor, k: int, frame_ndim: int,
                   flat: bool = False) -> torch.Tensor:
    """:func:`stacked` for a tensor (strides in elements; works on CPU and CUDA)."""
    shape, strides = _stacked_layout(tuple(frames.shape), frames.stride(), 1, k, frame_ndim,
                                     flat)
    return torch.as_strided(frames, shape, strides)


def _stacked_layout(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int, k: int,
                    frame_ndim: int, flat: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides of the stacks; the frames of each row must be one C-contiguous block
    (the leading axes may have any strides)."""
    time_axis = len(shape) - frame_ndim - 1
    contiguous = itemsize
    for axis in range(len(shape) - 1, time_axis - 1, -1):
        if shape[axis] > 1 and strides[axis] != contiguous:
            raise ValueError("each row of frames must be C-contiguous to be viewed as stacks")
        contiguous *= shape[axis]
    if shape[time_axis] < k:
        raise ValueError(f"{shape[time_axis]} frames are too few for stacks of {k}")
    lead, frame = shape[:time_axis], shape[time_axis + 1:]
    lead_strides, step = strides[:time_axis], strides[time_axis]
    steps = shape[time_axis] - k + 1
    if flat:
        return (*lead, steps, k * int(np.prod(frame))), (*lead_strides, step, itemsize)
    return (*lead, steps, k, *frame), (*lead_strides, step, step, *strides[time_axis + 1:])
