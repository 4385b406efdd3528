"""Human teacher in the terminal: query clips as video, one key per answer.

With ``human_teacher=true`` the Workspace hands each feedback round's queries to
:class:`TerminalTeacher`. For every query it writes the two segments as one side-by-side clip
(:func:`side_by_side`, :func:`write_clip`: left = segment 1, right = segment 2), shows it
(:func:`open_clip`) and reads one key (:class:`KeyReader`). Every answer is handed to a callback
the moment it is given, which appends it to the run's preference store on disk, so Ctrl-C, a
crash or ``q`` loses no label.

Extending: subclass :class:`TerminalTeacher` and override :meth:`TerminalTeacher.show` (another
viewer) or :meth:`TerminalTeacher.prompt` (other keys); ``KEYS`` maps keys to actions.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import cv2
import numpy as np
from termcolor import colored

LEFT, RIGHT, EQUAL = 0.0, 1.0, 0.5
"""Preference labels (B-Pref): 0 = segment 1 (left) better, 1 = segment 2 (right), 0.5 equal."""

KEYS: dict[str, str] = {
    "1": "left", "l": "left", "L": "left",
    "2": "right", "R": "right",
    "0": "equal", "e": "equal", "E": "equal",
    "s": "skip", "S": "skip", "\n": "skip", "\r": "skip",
    "r": "replay",
    "?": "help", "h": "help",
    "q": "quit", "Q": "quit",
}
"""Key -> action of the labeling prompt (``r`` replays, ``R`` means right)."""

LABELS = {"left": LEFT, "right": RIGHT, "equal": EQUAL}
HELP = ("1/L left better · 2/R right better · 0/E equally good · s/Enter can't tell (skip) · "
        "r replay · ? help · q stop labeling this round")

GAP = 8  # pixels between the two clips
BANNER = 24  # pixels of caption above the clips


# ---------------------------------------------------------------------------- clips
def side_by_side(left: np.ndarray, right: np.ndarray, left_panel: np.ndarray | None = None,
                 right_panel: np.ndarray | None = None) -> np.ndarray:
    """One clip showing two segments next to each other, captioned "1" and "2" with a frame
    counter, and optional explanation panels under each side.

    Shapes: ``left``, ``right`` ``(T, h, w, 3)`` uint8; panels ``(T, p, w, 3)`` -> ``(T, h', 2 w
    + 8, 3)`` uint8 with ``h' = 24 + h + p`` rounded up to even (H.264 needs even sizes; the
    width is padded likewise).

    Raises:
        ValueError: the segments (or the panels) differ in shape, or a panel's width or length
            does not match its segment.
    """
    if left.shape != right.shape or left.ndim != 4:
        raise ValueError(f"segments must have equal (T, h, w, 3) shapes, got {left.shape} and "
                         f"{right.shape}")
    steps, h, w, _ = left.shape
    panel_h = 0
    if left_panel is not None or right_panel is not None:
        if left_panel is None or right_panel is None or left_panel.shape != right_panel.shape \
                or left_panel.shape[0] != steps or left_panel.shape[2] != w:
            raise ValueError(f"panels must both be (T={steps}, p, w={w}, 3), got "
                             f"{None if left_panel is None else left_panel.shape} and "
                             f"{None if right_panel is None else right_panel.shape}")
        panel_h = left_panel.shape[1]
    height = BANNER + h + panel_h
    height += height % 2
    width = 2 * w + GAP + (2 * w + GAP) % 2
    out = np.full((steps, height, width, 3), 255, dtype=np.uint8)
    out[:, BANNER:BANNER + h, :w] = left
    out[:, BANNER:BANNER + h, w + GAP:2 * w + GAP] = right
    if left_panel is not None and right_panel is not None:
        out[:, BANNER + h:BANNER + h + panel_h, :w] = left_panel
        out[:, BANNER + h:BANNER + h + panel_h, w + GAP:2 * w + GAP] = right_panel
    font, scale = cv2.FONT_HERSHEY_SIMPLEX, 0.6
    for t in range(steps):
        frame = out[t]
        cv2.putText(frame, "1", (4, 18), font, scale, (200, 30, 30), 2, cv2.LINE_AA)
        cv2.putText(frame, "2", (w + GAP + 4, 18), font, scale, (30, 30, 200), 2, cv2.LINE_AA)
        counter = f"{t + 1}/{steps}"  # right-aligned: clear of the "2" caption
        (text_w, _), _ = cv2.getTextSize(counter, font, 0.45, 1)
        cv2.putText(frame, counter, (width - text_w - 4, 18), font, 0.45, (0, 0, 0), 1,
                    cv2.LINE_AA)
    return out


def single_clip(segment: np.ndarray, panel: np.ndarray | None = None) -> np.ndarray:
    """One segment to rate (``feedback=rating``), with a frame counter above and an optional
    explanation panel under it. Shapes: ``(T, h, w, 3)``, panel ``(T, p, w, 3)`` -> ``(T, 24 +
    h + p, w, 3)`` rounded up to even sizes.

    Raises:
        ValueError: a panel whose length or width does not match the segment.
    """
    steps, h, w, _ = segment.shape
    if panel is not None and (panel.shape[0] != steps or panel.shape[2] != w):
        raise ValueError(f"the panel must be (T={steps}, p, w={w}, 3), got {panel.shape}")
    panel_h = 0 if panel is None else panel.shape[1]
    out = np.full((steps, BANNER + h + panel_h + (h + panel_h) % 2, w + w % 2, 3), 255, np.uint8)
    out[:, BANNER:BANNER + h, :w] = segment
    if panel is not None:
        out[:, BANNER + h:BANNER + h + panel_h, :w] = panel
    for t in range(steps):
        cv2.putText(out[t], f"{t + 1}/{steps}", (4, 18), cv2.FONT_HERSHEY_SIMPLEX, 0.45,
                    (0, 0, 0), 1, cv2.LINE_AA)
    return out


def query_clip(segments: np.ndarray, panels: tuple[np.ndarray | None, ...] | None = None,
               ) -> np.ndarray:
    """The clip of one query: two segments side by side (:func:`side_by_side`) or one segment
    to rate (:func:`single_clip`). Shapes: ``segments (w, T, h, w, 3)``, ``w`` = 2 or 1."""
    extra = panels if panels is not None else (None,) * len(segments)
    if len(segments) == 1:
        return single_clip(segments[0], extra[0])
    return side_by_side(segments[0], segments[1], *extra)


def write_clip(frames: np.ndarray, path: str | Path, fps: int = 20) -> Path:
    """Write frames as an mp4 (H.264 through the ffmpeg that imageio-ffmpeg bundles, via
    moviepy); if that fails, as a gif beside it.

    Shapes: ``frames (T, H, W, 3)`` uint8 with even ``H`` and ``W``.

    Returns:
        The file written (``path``, or ``path`` with suffix ``.gif``).
    """
    from moviepy import VideoClip

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Frame k is shown at t = k / fps. moviepy's ImageSequenceClip finds the frame of a time
    # through float sums and repeats/drops frames (8 frames at 20 fps came out as 7); rounding
    # t * fps picks each frame exactly once, and half a frame more of duration makes the
    # writer emit exactly len(frames) frames.
    last = len(frames) - 1
    clip = VideoClip(frame_function=lambda t: frames[min(last, int(np.rint(t * fps)))],
                     duration=(len(frames) + 0.5) / fps)
    try:
        clip.write_videofile(str(path), fps=fps, codec="libx264", audio=False, logger=None,
                             ffmpeg_params=["-pix_fmt", "yuv420p"])
        return path
    except Exception:  # no ffmpeg or no H.264 encoder: fall back to a gif
        gif = path.with_suffix(".gif")
        clip.write_gif(str(gif), fps=fps, logger=None)
        return gif


def has_display() -> bool:
    """Whether a window can be opened (macOS, Windows, or an X11/Wayland display)."""
    if platform.system() in ("Darwin", "Windows"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def open_clip(path: Path, viewer: str = "auto") -> bool:
    """Open a clip in the system's viewer (``viewer`` = ``system``, or ``auto`` when a display
    exists); ``none`` never opens one. Returns whether a viewer was started."""
    if viewer == "none" or (viewer == "auto" and not has_display()):
        return False
    system = platform.system()
    if system == "Windows":
        os.startfile(str(path))  # type: ignore[attr-defined]
        return True
    opener = "open" if system == "Darwin" else shutil.which("xdg-open")
    if not opener:
        return False
    subprocess.Popen([opener, str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return True


# ---------------------------------------------------------------------------- input
class KeyReader:
    """Reads one answer at a time from the person.

    On a terminal it reads a single key without Enter (cbreak mode, restored afterwards). With
    ``piped=True`` (answers piped on purpose, e.g. ``printf '1\\n2\\n' | ...``) it reads one
    line per answer and uses its first character (an empty line is Enter = skip).
    End of input reads as ``q``.
    """

    def __init__(self, stream: IO[str] | None = None, piped: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stdin
        self.piped = piped

    def read(self) -> str:
        if self.piped:
            line = self.stream.readline()
            if not line:
                return "q"
            return line.rstrip("\r\n")[:1] or "\n"
        import termios
        import tty

        fd = self.stream.fileno()
        saved = termios.tcgetattr(fd)
        try:
            tty.setcbreak(fd)
            key = os.read(fd, 1).decode(errors="replace")
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        return key or "q"


# ---------------------------------------------------------------------------- teacher
@dataclass
class RoundAnswers:
    """What the person did in one round: the first ``asked`` queries were shown; of those,
    ``keep[i]`` says whether query ``i`` got a label (not skipped) and ``labels[i]`` is it."""

    asked: int = 0
    keep: list[bool] = field(default_factory=list)
    labels: list[float] = field(default_factory=list)
    stopped: bool = False


class TerminalTeacher:
    """Asks a person to compare query clips in the terminal (Christiano et al. 2017's human
    labeling, with B-Pref's label convention).

    Args:
        clip_dir: where clips go (``query_000123.mp4``; numbered across the run).
        reader: where answers come from.
        viewer: ``auto``, ``system`` or ``none`` (see :func:`open_clip`).
        fps: clip frame rate.
        out: where prompts are printed.
        first_query: number of the next clip (continues after a resume).
    """

    def __init__(self, clip_dir: Path, reader: KeyReader, viewer: str = "auto", fps: int = 20,
                 out: IO[str] | None = None, first_query: int = 0) -> None:
        self.clip_dir = Path(clip_dir)
        self.reader = reader
        self.viewer = viewer
        self.fps = fps
        self.out = out if out is not None else sys.stdout
        self.query_number = first_query
        self.answered = 0
        self.skipped = 0
        self.keys: dict[str, str] = KEYS
        self.labels: dict[str, float] = LABELS
        self.help = HELP
        self.question = "which is better? 1/L left, 2/R right, 0/E equal"
        self.instructions = ""  # the run's label_instructions: shown first and with ? help
        self.told = False

    def say(self, text: str, color: str | None = None, end: str = "\n") -> None:
        self.out.write((colored(text, color) if color else text) + end)
        self.out.flush()

    def show(self, path: Path) -> None:
        """Show a clip: open the viewer if possible; always print the path."""
        opened = open_clip(path, self.viewer)
        self.say(f"  clip: {path}" + ("" if opened else "  (open it to watch)"), "white")

    def prompt(self, index: int, total: int, header: str) -> str:
        """Print the prompt line for query ``index`` of ``total`` and read one key."""
        self.say(f"[query {self.query_number} · {index + 1}/{total} this round · {header} · "
                 f"answered {self.answered}, skipped {self.skipped}] {self.question}, "
                 "s skip, r replay, ? help, q stop: ", "cyan", end="")
        key = self.reader.read()
        self.say(repr(key) if key in ("\n", "\r") else key)
        return key

    def ask(self, frames: np.ndarray, on_answer: Callable[[int, float | None], None],
            header: str | Callable[[int], str] = "",
            panels: Callable[[int, Path], tuple[np.ndarray, np.ndarray]] | None = None
            ) -> RoundAnswers:
        """Show each query's clip and read the person's answer.

        Args:
            frames: ``(n, 2, T, h, w, 3)`` uint8 frames of the ``n`` queries' segments
                (``(n, 1, …)``: ratings, :class:`RatingTerminalTeacher`).
            on_answer: called with ``(query index, label)`` the moment an answer is given
                (label ``None`` = skipped); it must make the answer durable.
            header: totals shown in the prompt (round, queries so far), or a function of
                the queries asked so far in this round that gives them (they advance as the
                person answers).
            panels: optional ``(query index, clip path) -> (left panel, right panel)``:
                explanation panels drawn under each side (see :mod:`lib.explain`).

        Returns:
            :class:`RoundAnswers` for the queries asked before the person pressed ``q`` (or
            input ended).
        """
        result = RoundAnswers()
        n = len(frames)
        if self.instructions and not self.told:  # what "better" means, before the first query
            self.say(f"instructions: {self.instructions}", "green")
            self.told = True
        for i in range(n):
            path = self.clip_dir / f"query_{self.query_number:06d}.mp4"
            extra = panels(i, path) if panels is not None else None
            clip = write_clip(query_clip(frames[i], extra), path, self.fps)
            self.show(clip)
            while True:
                action = self.keys.get(self.prompt(i, n, header(i) if callable(header)
                                                   else header))
                if action == "replay":
                    self.show(clip)
                elif action == "quit":
                    self.say(f"labeling stopped for this round ({n - i} queries not asked)",
                             "yellow")
                    result.stopped = True
                    return result
                elif action in self.labels or action == "skip":
                    break
                else:  # help or an unknown key: never a crash, just the keys again
                    if self.instructions and action == "help":
                        self.say(f"instructions: {self.instructions}", "green")
                    self.say(self.help, "yellow")
            label = self.labels.get(action or "")
            on_answer(i, label)
            result.asked += 1
            result.keep.append(label is not None)
            result.labels.append(label if label is not None else EQUAL)
            if label is None:
                self.skipped += 1
            else:
                self.answered += 1
            self.query_number += 1
        return result


class RatingTerminalTeacher(TerminalTeacher):
    """Rating feedback in the terminal (``feedback=rating``): one clip per query, keys ``1`` …
    ``n`` rate it from worst to best (the label is the class, 0 … n − 1); ``s``/Enter skip,
    ``r`` replay, ``?`` help, ``q`` stop. Same arguments as :class:`TerminalTeacher`, plus
    ``classes`` (2 … 9)."""

    def __init__(self, clip_dir: Path, reader: KeyReader, classes: int, viewer: str = "auto",
                 fps: int = 20, out: IO[str] | None = None, first_query: int = 0) -> None:
        super().__init__(clip_dir, reader, viewer, fps, out, first_query)
        self.classes = classes
        self.keys = {k: v for k, v in KEYS.items() if v not in LABELS}
        self.keys.update({str(c + 1): f"class{c}" for c in range(classes)})
        self.labels = {f"class{c}": float(c) for c in range(classes)}
        self.help = (f"1 … {classes} rate the clip (1 worst, {classes} best) · s/Enter can't "
                     "tell (skip) · r replay · ? help · q stop labeling this round")
        self.question = f"how good is it? 1 (worst) … {classes} (best)"
