"""Rendered frames of recent steps, kept only while a person may be shown them as clips.

A person judges clips, not observation vectors, so with ``human_teacher=true`` every step's RGB
frame is rendered, downscaled to ``human_frame_size`` pixels of height and kept in a ring of the
last ``human_frame_capacity`` steps (bounded memory: 5k frames of 256×256 RGB, the default for
people, are 1 GB; 10k of 128×128, the default for explained clips, 0.5 GB).
Frames are looked up by the replay-buffer slot of their step, so queries can only be cut from
segments whose frames are still in the ring (:meth:`FrameStore.has`).
"""

from __future__ import annotations

import cv2
import numpy as np


def downscale(frame: np.ndarray, height: int) -> np.ndarray:
    """Resize an RGB frame to ``height`` rows, keeping its aspect ratio (area interpolation).

    Shapes: ``(H, W, 3)`` uint8 -> ``(height, round(W * height / H), 3)`` uint8; frames already
    ``height`` rows high are returned unchanged.
    """
    h, w = frame.shape[:2]
    if h == height:
        return frame
    width = max(1, round(w * height / h))
    return cv2.resize(np.ascontiguousarray(frame), (width, height), interpolation=cv2.INTER_AREA)


class FrameStore:
    """Ring of the most recent ``capacity`` frames, indexed by replay-buffer slot.

    Args:
        capacity: frames kept (older ones are overwritten).
        buffer_capacity: size of the replay buffer (or episode store) whose slots index frames.
        height: frame height in pixels after :func:`downscale`.

    The frame width is fixed by the first frame added. Memory: ``capacity × height × width × 3``
    bytes plus 8 bytes per buffer slot.
    """

    def __init__(self, capacity: int, buffer_capacity: int, height: int) -> None:
        if capacity <= 0 or buffer_capacity <= 0 or height <= 0:
            raise ValueError("FrameStore sizes must be positive")
        self.capacity = capacity
        self.height = height
        self.frames: np.ndarray | None = None  # (capacity, height, width, 3), allocated lazily
        self.slot_of = np.full(buffer_capacity, -1, dtype=np.int64)  # buffer slot -> ring slot
        self.owner = np.full(capacity, -1, dtype=np.int64)  # ring slot -> buffer slot
        self.ptr = 0

    def add(self, buffer_slot: int, frame: np.ndarray) -> np.ndarray:
        """Store the frame of the step held in ``buffer_slot`` (``(H, W, 3)`` uint8, any size);
        returns it as stored (downscaled to ``height`` rows).

        Raises:
            ValueError: the frame is not an RGB image.
        """
        if frame is None or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"expected an RGB frame (H, W, 3), got "
                             f"{None if frame is None else frame.shape}; the env must be made "
                             "with render_mode='rgb_array'")
        small = downscale(frame, self.height)
        if self.frames is None:
            self.frames = np.zeros((self.capacity, *small.shape), dtype=np.uint8)
        old = self.owner[self.ptr]
        if old >= 0 and self.slot_of[old] == self.ptr:
            self.slot_of[old] = -1
        self.frames[self.ptr] = small
        self.owner[self.ptr] = buffer_slot
        self.slot_of[buffer_slot] = self.ptr
        self.ptr = (self.ptr + 1) % self.capacity
        return small

    def has(self, buffer_slots: np.ndarray) -> np.ndarray:
        """Whether the frame of each buffer slot is still stored; same shape as the input."""
        slots = np.asarray(buffer_slots, dtype=np.int64)
        ring = self.slot_of[slots]
        return (ring >= 0) & (self.owner[np.maximum(ring, 0)] == slots)

    def get(self, buffer_slots: np.ndarray) -> np.ndarray:
        """Frames of the given buffer slots: ``(*slots.shape, height, width, 3)`` uint8.

        Raises:
            KeyError: a slot's frame is no longer (or was never) stored.
        """
        slots = np.asarray(buffer_slots, dtype=np.int64)
        if self.frames is None or not self.has(slots).all():
            raise KeyError("some requested frames are not stored (older than the frame ring)")
        return self.frames[self.slot_of[slots]]
