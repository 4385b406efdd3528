"""Query clips for people and for inspection: frames of queried segments, explanation panels,
side-by-side videos.

A :class:`ClipMaker` is given the run's frame ring and, when ``xplain_*`` is on, a factory of
Captum explainers (:class:`lib.explain.Explainer`, built anew each round from the current agent
and reward model). The channels of :mod:`themis.feedback.channels` use it: the terminal teacher
shows its clips, the web channel writes one per posted query, and a synthetic teacher's first
queries of each round are saved with their explanations.
"""

from __future__ import annotations

import contextlib
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


EPISODE_PATTERN = "episode_{:08d}.mp4"
"""File name of an episode clip in ``web/episodes/``, from its integer ID."""


class EpisodeClips:
    """The last full episode the agent played, as a small clip beside the query pair (DRLHP's
    second window, "so you can see how qualitative behaviour is changing"; README of
    HumanCompatibleAI/learning-from-human-preferences, Human Preferences GUI).

    Frames arrive in runs of one episode (:class:`themis.online.segments.Run`: ``t0``, frames,
    ``ends``); when an episode's last run comes, its clip is written to
    ``web/episodes/episode_IIIIIIII.mp4`` (``I``: the episode number + 1, the integer ID the
    labeling server serves it by) at half the clip size, at most :attr:`max_frames` frames
    (longer episodes are shown with every k-th frame); the newest :attr:`keep` clips stay, and
    an older one until it is :attr:`grace` seconds old (short episodes end many times a
    second: a page that was just told the newest ID must still find its clip).

    Args:
        folder: ``RUN_DIR/web/episodes``.
        fps: frame rate of the clip.
        keep: clips kept whatever their age.
        max_frames: most frames of one clip.
        open_episodes: most episodes collected at once (sub-envs; older ones are dropped).
        grace: seconds an older clip stays after it was written.
    """

    def __init__(self, folder: Path, fps: int, keep: int = 3, max_frames: int = 400,
                 open_episodes: int = 64, grace: float = 10.0) -> None:
        self.folder, self.fps, self.keep, self.max_frames = folder, fps, keep, max_frames
        self.grace = grace
        self.open_episodes = open_episodes
        self.collecting: dict[int, list[np.ndarray]] = {}
        self.lengths: dict[int, int] = {}

    def add(self, episode: int, t0: int, frames: np.ndarray, ends: bool) -> Path | None:
        """Frames ``(n, h, w, 3)`` uint8 of steps ``t0 .. t0 + n - 1`` of ``episode`` (runs
        overlap: the steps already held are skipped); the clip written when ``ends``."""
        held = self.lengths.get(episode, 0)
        if episode not in self.collecting:
            if len(self.collecting) >= self.open_episodes:  # an episode never ended here
                oldest = min(self.collecting)
                del self.collecting[oldest], self.lengths[oldest]
            self.collecting[episode] = []
        new = frames[max(0, held - t0):]
        # halve the size (the pair is the main view), keep the sizes even for H.264
        small = new[:, ::2, ::2]
        self.collecting[episode].append(small[:, : small.shape[1] // 2 * 2,
                                              : small.shape[2] // 2 * 2])
        self.lengths[episode] = max(held, t0 + len(frames))
        if not ends:
            return None
        parts = self.collecting.pop(episode)
        self.lengths.pop(episode)
        clip = np.concatenate(parts) if parts else np.zeros((0, 2, 2, 3), np.uint8)
        if len(clip) == 0 or clip.shape[1] < 2 or clip.shape[2] < 2:
            return None
        stride = -(-len(clip) // self.max_frames)
        return self.write(episode + 1, np.ascontiguousarray(clip[::stride]))

    def write(self, clip_id: int, frames: np.ndarray) -> Path:
        """Write clip ``clip_id`` (atomically: a partial file is never served) and drop the
        clips beyond the newest :attr:`keep` that are more than :attr:`grace` seconds old."""
        import os
        import time

        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / EPISODE_PATTERN.format(clip_id)
        tmp = write_clip(frames, path.with_name(f".writing_{clip_id}.mp4"), self.fps)
        final = path.with_suffix(tmp.suffix)
        os.replace(tmp, final)
        now = time.time()
        for old in sorted(self.folder.glob("episode_*"))[:-self.keep]:
            with contextlib.suppress(FileNotFoundError):
                if now - old.stat().st_mtime > self.grace:
                    old.unlink()
        return final


def newest_episode_clip(folder: Path) -> int | None:
    """The integer ID of the newest episode clip in ``folder`` (``None``: none yet)."""
    ids = []
    for path in folder.glob("episode_*"):
        stem = path.stem.removeprefix("episode_")
        if stem.isdigit() and path.suffix in (".mp4", ".gif"):
            ids.append(int(stem))
    return max(ids) if ids else None
