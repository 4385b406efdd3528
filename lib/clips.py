"""Query clips for people and for inspection: frames of queried segments, explanation panels,
side-by-side videos.

A :class:`ClipMaker` is given the run's frame ring and, when ``xplain_*`` is on, a factory of
Captum explainers (:class:`lib.explain.Explainer`, built anew each round from the current agent
and reward model). The channels of :mod:`themis.feedback.channels` use it: the terminal teacher
shows its clips, the web channel writes one per posted query, and a synthetic teacher's first
queries of each round are saved with their explanations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lib.human_interface import query_clip, write_clip
from themis.agents.buffers import SegmentPairs
from themis.environments.frames import FrameStore

Panels = Callable[[int, Path], tuple[np.ndarray, ...]]


class ClipMaker:
    """Frames, panels and clip files of query pairs.

    Args:
        frames: the ring of recent frames, indexed by store slot.
        capacity: the store's capacity (segment slots wrap around it).
        run_dir: clips go to ``run_dir/web/clips`` (web) and ``run_dir/queries`` (saved).
        fps: clip frame rate.
        explainer: ``() -> Explainer`` or ``None`` (no panels).
    """

    def __init__(self, frames: FrameStore, capacity: int, run_dir: Path, fps: int,
                 explainer: Callable[[], Any] | None = None) -> None:
        self.ring, self.capacity, self.run_dir, self.fps = frames, capacity, run_dir, fps
        self.explainer = explainer
        saved = run_dir / "queries"
        self.saved = len(list(saved.glob("query_*.mp4"))) if saved.is_dir() else 0

    def frames(self, queries: SegmentPairs) -> np.ndarray:
        """Stored frames of the queries' segments, ``(n, w, H, h, w, 3)`` uint8 (``w`` = 2 for
        pairs, 1 for ratings)."""
        horizon = queries.observations.shape[2]
        slots = (queries.starts[..., None] + np.arange(horizon)) % self.capacity
        return self.ring.get(slots)

    def panels(self, queries: SegmentPairs, frames: np.ndarray) -> Panels | None:
        """``(query index, clip path) -> (left panel, right panel)`` (one panel for a rating)
        with the Captum
        explanations (and the clip's summary PNGs saved beside it), or ``None``."""
        if self.explainer is None:
            return None
        explainer = self.explainer()
        height, width = frames.shape[3:5]

        def panels(i: int, clip: Path) -> tuple[np.ndarray, ...]:
            sides = range(queries.observations.shape[1])
            attributions = [explainer.explain(queries.observations[i, s], queries.actions[i, s])
                            for s in sides]
            explainer.summaries(attributions, clip.with_suffix(""))
            return tuple(explainer.panel(queries.observations[i, s], attributions[s], width,
                                         height) for s in sides)

        return panels

    def write(self, queries: SegmentPairs, paths: list[Path],
              posters: bool = False) -> list[Path]:
        """One side-by-side clip per query (segment 1 left), with panels if any; ``posters``:
        its first frame as a PNG beside it (:func:`poster_path`)."""
        frames = self.frames(queries)
        panels = self.panels(queries, frames)
        written = []
        for i, path in enumerate(paths):
            path.parent.mkdir(parents=True, exist_ok=True)
            extra = panels(i, path) if panels is not None else None
            clip = query_clip(frames[i], extra)
            written.append(write_clip(clip, path, self.fps))
            if posters:
                write_poster(clip[0], poster_path(written[-1]))
        return written


    def write_web_clips(self, queries: SegmentPairs, round_number: int) -> list[Path]:
        """Clips of a web round: ``web/clips/roundRRRR_III.mp4``, each with its poster frame
        beside it (``roundRRRR_III.png``, the clip's first frame: the page shows it until the
        video paints)."""
        clip_dir = self.run_dir / "web" / "clips"
        return self.write(queries, [clip_dir / f"round{round_number:04d}_{i:03d}.mp4"
                                    for i in range(len(queries))], posters=True)

    def save_explained(self, queries: SegmentPairs) -> list[Path]:
        """Synthetic teachers: the queries' explained clips and summary PNGs in ``queries/``
        (no person watches them; they are there for inspection)."""
        paths = [self.run_dir / "queries" / f"query_{self.saved + i:06d}.mp4"
                 for i in range(len(queries))]
        self.saved += len(paths)
        return self.write(queries, paths) if len(queries) else []


def poster_path(clip: Path) -> Path:
    """The poster frame of a clip: the PNG beside it (``round0001_000.mp4`` ->
    ``round0001_000.png``)."""
    return clip.with_suffix(".png")


def write_poster(frame: np.ndarray, path: Path) -> Path:
    """Write one frame ``(H, W, 3)`` uint8 as a PNG (Pillow), atomically (a page never gets
    half a file)."""
    import os

    from PIL import Image

    tmp = path.with_name(path.name + ".tmp")
    Image.fromarray(np.ascontiguousarray(frame)).save(tmp, format="PNG")
    os.replace(tmp, path)
    return path
