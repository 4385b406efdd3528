"""Preference dataset: the labelled queries the reward model is trained on."""

from __future__ import annotations

import contextlib
import json
import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from themis.agents.buffers import SegmentPairs
from themis.core.safe_loading import check_npz, npy_header
from themis.environments.framestack import stacked, stacked_tensor, unstack
from themis.utils import check_memory, open_private, replace_durably

FORMAT_NAME = "themis-preferences"
FORMAT_VERSION = 4
"""Newest on-disk preference-dataset format :meth:`PreferenceDataset.save` writes (1: one
``segments.npz``; 2: segments may be split into shards listed in ``meta.json``; 3: stacked-frame
observations are stored as their frames, ``frames`` instead of ``observations``, with
``frame_stack`` in ``meta.json``; 4: ratings of single segments, ``rating_classes`` in
``meta.json``). Each dataset is written with the oldest version that holds it (pairs without
frame stacks: version 2), so older Themis versions read what they can."""
MAX_SHARDS = 32
"""Incremental saves append shard files; past this many they are compacted into one file."""
_STRUCTURAL_KEYS = {"format", "format_version", "num_pairs", "segment", "obs_dim", "action_dim",
                    "shards", "frame_stack", "rating_classes"}


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[IO[bytes]]:
    """Write ``path`` through a temporary file that is fsynced and renamed over it (the
    directory synced after the rename); owner-only (0600): a dataset holds people's labels."""
    tmp = path.with_name(path.name + ".tmp")
    with open_private(tmp) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())
    replace_durably(tmp, path)


def _announced_bytes(archive: zipfile.ZipFile, key: str) -> int:
    """Bytes the array ``key`` of an ``.npz`` archive says it holds (its ``.npy`` header, read
    without loading the array: a crafted header may announce 10¹² elements).

    Raises:
        KeyError: no such array.
        ValueError: not an ``.npy`` header.
    """
    with archive.open(f"{key}.npy") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    return int(np.prod(shape, dtype=object)) * dtype.itemsize


class PreferenceDataset:
    """Append-only store of labelled segment pairs, preallocated to ``capacity`` pairs.

    Args:
        capacity: maximum number of labelled pairs (``max_feedback``).
        segment: steps per segment ``H``.
        obs_dim, action_dim: feature sizes (observations flattened).
        metadata: free-form JSON-able facts saved with the dataset (env, teacher, ...).
        obs_dtype: float32 for vector observations, uint8 for pixels and grids.
        frame_stack: ``k > 1`` when each observation is a stack of the last ``k`` frames
            (flattened ``(k, H, W)``, oldest first; Atari): each segment is stored as its
            ``H + k - 1`` frames and :attr:`observations` is a read-only view of the stacks
            (:mod:`themis.environments.framestack`; 4× less memory).
        rating_classes: ``n > 0`` for rating feedback (``feedback=rating``): each row is one
            segment (axis 1 has size 1) with a rating ``0 … n-1`` (worst to best) as its label.

    Labels follow BPref: 0.0 = segment 1 preferred, 1.0 = segment 2 preferred, 0.5 = equally
    preferred (ratings: the class index). The dataset grows past ``capacity`` when more labels
    come (people's answers arrive when they arrive: an accepted answer is never refused for
    lack of room).
    """

    def __init__(self, capacity: int, segment: int, obs_dim: int, action_dim: int,
                 metadata: dict[str, Any] | None = None,
                 obs_dtype: np.dtype | type = np.float32, frame_stack: int = 1,
                 rating_classes: int = 0) -> None:
        if frame_stack < 1 or obs_dim % frame_stack:
            raise ValueError(f"obs_dim={obs_dim} is not a stack of {frame_stack} frames")
        self.rating_classes = rating_classes
        self.width = 1 if rating_classes else 2  # segments per row
        self.capacity = capacity
        self.frame_stack = frame_stack
        self.segment = segment
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.labelers = np.full(capacity, "", dtype=object)
        if frame_stack > 1:
            self.frames = np.zeros((capacity, self.width, segment + frame_stack - 1,
                                    obs_dim // frame_stack), dtype=obs_dtype)
            self.observations = stacked(self.frames, frame_stack, frame_ndim=1, flat=True)
        else:
            self.observations = np.zeros((capacity, self.width, segment, obs_dim),
                                         dtype=obs_dtype)
        self.actions = np.zeros((capacity, self.width, segment, action_dim), dtype=np.float32)
        self.true_rewards = np.zeros((capacity, self.width, segment), dtype=np.float32)
        self.labels = np.zeros(capacity, dtype=np.float32)
        self.timestamps = np.full(capacity, np.nan)  # when each label was given, Unix seconds
        self.answers = np.full(capacity, "", dtype=object)  # label-store answer IDs ("3;7")
        self.size = 0
        self._tensors: tuple[torch.Tensor, ...] | None = None
        self._saved_to: Path | None = None  # folder of the last save and its shard list
        self._shards: list[tuple[str, int, int]] = []

    def __len__(self) -> int:
        return self.size

    def add(self, pairs: SegmentPairs, labels: np.ndarray, labeler: str = "",
            answers: list[str] | None = None, timestamps: np.ndarray | None = None) -> None:
        """Append labelled pairs; ``labeler`` names who answered (``"oracle"``, a person, ...),
        ``answers`` the label-store answer IDs behind each label (web teacher; ``"3;7"`` when
        a label aggregates several answers), ``timestamps`` ``(n,)`` when each label was given
        (Unix seconds; default now).

        Raises:
            ValueError: lengths differ, a label is not in {0, 0.5, 1} (a rating not a class
                index), or (``frame_stack > 1``) the observations are not consecutive frame
                stacks.
        """
        n = len(pairs)
        labels = np.asarray(labels, dtype=np.float32).reshape(-1)
        if len(labels) != n or (answers is not None and len(answers) != n) or (
                timestamps is not None and len(timestamps) != n):
            raise ValueError(f"{n} pairs but {len(labels)} labels"
                             + (f", {len(answers)} answer IDs" if answers is not None else "")
                             + (f", {len(timestamps)} timestamps" if timestamps is not None
                                else ""))
        allowed = np.arange(self.rating_classes) if self.rating_classes else (0.0, 0.5, 1.0)
        if not np.all(np.isin(labels, allowed)):
            raise ValueError(f"{self.label_kind()} must be {self.label_kind(values=True)}, got "
                             f"{np.unique(labels)}")
        self.reserve(self.size + n)
        sl = slice(self.size, self.size + n)
        self.answers[sl] = answers if answers is not None else ""
        self._set_observations(sl, pairs.observations)
        self.actions[sl] = pairs.actions
        self.true_rewards[sl] = pairs.true_rewards
        self.labels[sl] = labels
        self.labelers[sl] = labeler
        self.timestamps[sl] = time.time() if timestamps is None else timestamps
        self.size += n
        self._tensors = None

    def label_kind(self, values: bool = False) -> str:
        """``preference labels`` / ``ratings``, or (``values``) the values they may take."""
        if values:
            return f"0 … {self.rating_classes - 1}" if self.rating_classes else "0, 0.5 or 1"
        return "ratings" if self.rating_classes else "preference labels"

    def reserve(self, total: int) -> None:
        """Make room for ``total`` pairs (doubling the capacity at least: amortised O(1) adds).
        """
        if total <= self.capacity:
            return
        capacity = max(total, 2 * self.capacity)
        grow = capacity - self.capacity

        def grown(a: np.ndarray, fill: Any = 0) -> np.ndarray:
            return np.concatenate([a, np.full((grow, *a.shape[1:]), fill, dtype=a.dtype)])

        if self.frame_stack > 1:
            self.frames = grown(self.frames)
            self.observations = stacked(self.frames, self.frame_stack, frame_ndim=1, flat=True)
        else:
            self.observations = grown(self.observations)
        self.actions, self.true_rewards = grown(self.actions), grown(self.true_rewards)
        self.labels, self.timestamps = grown(self.labels), grown(self.timestamps, np.nan)
        self.labelers, self.answers = grown(self.labelers, ""), grown(self.answers, "")
        self.capacity = capacity

    def answer_ids(self) -> set[int]:
        """The label-store answer IDs (web teacher) of every stored label."""
        return {int(a) for joined in self.answers[: self.size] if joined
                for a in str(joined).split(";")}

    def _set_observations(self, sl: slice, observations: np.ndarray) -> None:
        """Store ``(n, width, H, ...)`` observations (whole stacks or flattened) in rows
        ``sl``."""
        n, k, w = sl.stop - sl.start, self.frame_stack, self.width
        if k == 1:
            self.observations[sl] = observations.reshape(n, w, self.segment, self.obs_dim)
        else:
            stacks = observations.reshape(n, w, self.segment, k, self.obs_dim // k)
            frames = unstack(stacks, frame_ndim=1)
            if not np.array_equal(stacked(frames, k, frame_ndim=1), stacks):
                raise ValueError(f"these observations are not stacks of {k} consecutive frames "
                                 "(step t+1's stack = step t's shifted by one frame); they "
                                 "cannot go into a frame-stacked preference dataset")
            self.frames[sl] = frames

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """``(observations, actions, labels)`` of the stored pairs as tensors (cached).

        Shapes: ``(n, w, H, obs_dim)``, ``(n, w, H, action_dim)``, ``(n,)``, ``w`` = 2 (pairs)
        or 1 (ratings). With frame stacks
        the observations are a strided view of the frames (on CPU they share this dataset's
        memory; on CUDA only the frames are copied).
        """
        if self._tensors is None or self._tensors[0].device != device:
            n = self.size
            if self.frame_stack > 1:
                frames = torch.as_tensor(self.frames[:n], device=device)
                obs = stacked_tensor(frames, self.frame_stack, frame_ndim=1, flat=True)
            else:
                obs = torch.as_tensor(self.observations[:n], device=device)
            self._tensors = (obs, *(torch.as_tensor(a[:n], device=device)
                                    for a in (self.actions, self.labels)))
        return self._tensors

    def save(self, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
        """Write the labelled pairs as a preference-dataset folder (format below), crash-safe.

        Layout of ``path/`` (format version :data:`FORMAT_VERSION`; no pickled objects):

        - segment shards, ``segments.npz`` and possibly ``segments-NNNNNNN.npz`` (rows from
          ``NNNNNNN`` on): ``observations (m, 2, H, obs_dim)``, ``actions (m, 2, H,
          action_dim)``, ``true_rewards (m, 2, H)``; float32, except observations of pixel and
          grid envs, which are uint8 (flattened ``(C, H, W)`` images); with frame stacks
          (version 3) ``frames (m, 2, H + k - 1, frame_size)`` instead of observations;
          ratings (version 4) have 1 instead of 2 segments per row;
        - ``labels.csv``: columns ``pair, label, labeler, timestamp`` (label 0 = segment 1
          preferred, 1 = segment 2, 0.5 = equal; ratings: the class, 0 = worst; timestamp =
          when it was given, Unix seconds, empty if unknown) and, for people's answers from
          the web, ``answers`` (the label-store answer IDs behind the label, ``;``-separated);
        - ``meta.json``: ``format``, ``format_version``, ``num_pairs``, ``segment``, ``obs_dim``,
          ``action_dim``, ``frame_stack`` (version 3), ``rating_classes`` (version 4),
          ``shards`` (``[file, first row, end row]`` in order) and the caller's ``metadata``
          (env, teacher, ...).

        Saving again to the same folder appends only the new pairs as a new shard (a person's
        answer is on disk at once without rewriting every earlier segment); after
        :data:`MAX_SHARDS` shards everything is compacted into ``segments.npz``. Each file is
        written to a temporary name, fsynced and renamed; ``meta.json`` goes last and
        :meth:`load` reads only its ``num_pairs`` rows, so a crash mid-save leaves a readable
        dataset (the dataset only grows).

        Returns:
            ``path``.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        n = self.size
        shards = self._shards if self._saved_to == path.resolve() else []
        on_disk = shards[-1][2] if shards else 0
        stale: list[str] = []
        if not shards or on_disk > n or len(shards) >= MAX_SHARDS:
            stale = [name for name, _, _ in shards if name != "segments.npz"]
            self._write_segments(path / "segments.npz", 0, n)
            shards = [("segments.npz", 0, n)]
        elif n > on_disk:
            name = f"segments-{on_disk:07d}.npz"
            self._write_segments(path / name, on_disk, n)
            shards = [*shards, (name, on_disk, n)]
        import pandas as pd  # 0.3 s to import: not in a run that stops before its first save

        labels = pd.DataFrame({"pair": np.arange(n), "label": self.labels[:n],
                               "labeler": self.labelers[:n],
                               "timestamp": np.round(self.timestamps[:n], 3)})
        if any(self.answers[:n]):  # web teacher: which label-store answers each label is
            labels["answers"] = self.answers[:n]
        with _atomic(path / "labels.csv") as f:
            f.write(labels.to_csv(index=False).encode())
        meta = {**self.metadata, **(metadata or {}), "format": FORMAT_NAME,
                "format_version": 4 if self.rating_classes else 3 if self.frame_stack > 1 else 2,
                "num_pairs": n, "segment": self.segment, "obs_dim": self.obs_dim,
                "action_dim": self.action_dim, "shards": [list(s) for s in shards]}
        if self.frame_stack > 1:
            meta["frame_stack"] = self.frame_stack
        if self.rating_classes:
            meta["rating_classes"] = self.rating_classes
        self.metadata = {k: v for k, v in meta.items() if k not in _STRUCTURAL_KEYS}
        with _atomic(path / "meta.json") as f:
            f.write(json.dumps(meta, indent=2, sort_keys=True).encode())
        for name in stale:  # compacted: meta.json no longer points at them
            (path / name).unlink(missing_ok=True)
        self._saved_to, self._shards = path.resolve(), shards
        return path

    def _write_segments(self, file: Path, lo: int, hi: int) -> None:
        with _atomic(file) as f:
            arrays = {"frames": self.frames[lo:hi]} if self.frame_stack > 1 else \
                {"observations": self.observations[lo:hi]}
            arrays.update(actions=self.actions[lo:hi], true_rewards=self.true_rewards[lo:hi])
            np.savez(f, **arrays)  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: str | Path, capacity: int | None = None) -> PreferenceDataset:
        """Read a folder written by :meth:`save`.

        Args:
            path: the dataset folder.
            capacity: room for at least this many pairs in total (default: exactly the stored
                ones), so labelling can continue.

        Raises:
            FileNotFoundError: ``path`` holds no ``meta.json``.
            ValueError: not a Themis preference dataset, a newer format version, files that
                disagree with ``meta.json``, or segments with NaN or infinite values.
        """
        path = Path(path)
        meta_file = path / "meta.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{path} is not a preference dataset (no meta.json)")
        try:
            meta = json.loads(meta_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"{meta_file} is not JSON Themis reads ({e})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise ValueError(f"{path}: meta.json format is "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r}, "
                             f"not {FORMAT_NAME!r}")

        def whole(key: str, low: int, default: int | None = None) -> int:
            value = meta.get(key, default)
            if value is None:
                raise ValueError(f"{meta_file}: field {key!r} is missing")
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{meta_file}: field {key!r} is {repr(value)[:40]}, not an "
                                 f"integer >= {low}")
            return value

        version = whole("format_version", 1, default=1)
        if version > FORMAT_VERSION:
            raise ValueError(f"{path} has preference format_version {version}; this Themis reads "
                             f"versions up to {FORMAT_VERSION}: upgrade Themis to load it")
        n, segment = whole("num_pairs", 0), whole("segment", 1)
        obs_dim, action_dim = whole("obs_dim", 1), whole("action_dim", 1)
        frame_stack, classes = whole("frame_stack", 1, 1), whole("rating_classes", 0, 0)
        shards = meta.get("shards") or [["segments.npz", 0, n]]
        if not isinstance(shards, list) or not all(
                isinstance(sh, list) and len(sh) == 3 and isinstance(sh[0], str)
                and all(isinstance(i, int) and not isinstance(i, bool) for i in sh[1:])
                and 0 <= sh[1] <= sh[2] for sh in shards):
            raise ValueError(f"{meta_file}: field shards must be a list of [file, first, end] "
                             "(end >= first >= 0)")
        ends = [0] + [int(sh[2]) for sh in shards[:-1]]
        if [int(sh[1]) for sh in shards] != ends or len({sh[0] for sh in shards}) < len(shards):
            raise ValueError(f"{meta_file}: field shards must cover the pairs once, in order "
                             "(each first = the end before it, each file once)")
        parts: dict[str, list[np.ndarray]] = {"observations": [], "actions": [],
                                              "true_rewards": []}
        for name, lo, hi in shards:
            if Path(name).name != name or not name.endswith(".npz"):  # stays in the folder
                raise ValueError(f"{meta_file}: shard {name!r} is not a file name in {path}")
            if int(lo) >= n and parts["observations"]:
                break
            try:
                with np.load(path / name, allow_pickle=False) as arrays:
                    check_npz(arrays, path / name)  # headers against the data they hold
                    for key, chunks in parts.items():
                        stored = "frames" if key == "observations" and "frames" in arrays \
                            else key
                        check_memory(f"its {stored}", _announced_bytes(arrays.zip, stored))
                        with arrays.zip.open(f"{stored}.npy") as f:
                            rows = (npy_header(f)[0] or (0,))[0]
                        if rows > int(hi) - int(lo):  # more than meta.json says: not read
                            raise ValueError(f"its {stored} holds {rows} pairs, meta.json "
                                             f"says {int(hi) - int(lo)}")
                        chunks.append(arrays[stored][: min(int(hi), n) - int(lo)])
            except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError,
                    MemoryError) as e:
                raise ValueError(f"{path / name}: not a readable segment shard ({e})") from None
        obs, act, true = (np.concatenate(parts[k]) for k in parts)
        width = 1 if classes else 2
        want_obs = (width, segment + frame_stack - 1) if frame_stack > 1 else (width, segment)
        checks = [("observations" if frame_stack == 1 else "frames", obs, want_obs, None),
                  ("actions", act, (width, segment), action_dim),
                  ("true_rewards", true, (width, segment), None)]
        for field, array, lead, last in checks:
            ok = array.shape[1:3] == lead and (last is None or array.shape[-1] == last)
            if field == "observations":
                ok = ok and int(np.prod(array.shape[3:])) == obs_dim
            if not ok:
                raise ValueError(f"{path}: {field} in the segment shards have shape "
                                 f"{array.shape[1:]}, but meta.json says segment={segment}, "
                                 f"obs_dim={obs_dim}, action_dim={action_dim}")
        for field, array in (("observations", obs), ("actions", act), ("true_rewards", true)):
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                row = int(np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(1))[0])
                raise ValueError(f"{path}: {field} of pair {row} hold NaN or infinite values; "
                                 "a reward model cannot learn from them")
        import pandas as pd

        try:
            labels = pd.read_csv(path / "labels.csv", dtype={"labeler": str, "answers": str},
                                 keep_default_na=False).iloc[:n]
        except ValueError as e:  # pandas' parser errors, bytes that are not text
            raise ValueError(f"{path / 'labels.csv'}: not a labels table "
                             f"({str(e).strip().splitlines()[0] if str(e).strip() else e!r})"
                             ) from None
        missing = [c for c in ("label", "labeler") if c not in labels.columns]
        if missing:
            raise ValueError(f"{path / 'labels.csv'}: column {missing[0]!r} is missing")
        if len(obs) < n or len(labels) < n:
            raise ValueError(f"{path}: meta.json promises {n} pairs, segments.npz has "
                             f"{len(obs)} and labels.csv {len(labels)}")
        data = cls(max(n, capacity or 0), segment, obs_dim, action_dim, obs_dtype=obs.dtype,
                   frame_stack=frame_stack, rating_classes=classes)
        values = pd.to_numeric(labels["label"], errors="coerce").to_numpy(np.float64)
        bad = ~np.isin(values, np.arange(classes) if classes else (0.0, 0.5, 1.0))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            shown = str(labels["label"].iloc[row])
            raise ValueError(f"{path / 'labels.csv'}: label {shown!r} in row {row + 1}; "
                             f"{data.label_kind()} are {data.label_kind(values=True)}")
        data.metadata = {k: v for k, v in meta.items() if k not in _STRUCTURAL_KEYS}
        if data.frame_stack > 1:
            data.frames[:n] = obs  # stored as frames
        else:
            data.observations[:n] = obs
        data.actions[:n], data.true_rewards[:n] = act, true
        data.labels[:n] = values.astype(np.float32)
        data.labelers[:n] = labels["labeler"].to_numpy(object)
        if "answers" in labels:
            answers = labels["answers"].astype(str)
            wrong = ~answers.str.fullmatch(r"(\d+(;\d+)*)?")
            if wrong.any():
                row = int(np.flatnonzero(wrong.to_numpy())[0])
                raise ValueError(f"{path / 'labels.csv'}: answers {answers.iloc[row]!r} in row "
                                 f"{row + 1}; answer IDs are integers separated by ';'")
            data.answers[:n] = answers.to_numpy(object)
        if "timestamp" in labels:
            data.timestamps[:n] = pd.to_numeric(labels["timestamp"], errors="coerce").to_numpy()
        data.size = n
        return data

    def extend(self, other: PreferenceDataset) -> None:
        """Append every pair of ``other`` (same segment length and feature sizes).

        Raises:
            ValueError: shapes differ.
        """
        mine = (self.segment, self.obs_dim, self.action_dim, self.rating_classes)
        theirs = (other.segment, other.obs_dim, other.action_dim, other.rating_classes)
        if mine != theirs:
            raise ValueError(f"cannot merge datasets with (segment, obs_dim, action_dim, "
                             f"rating_classes) {theirs} into {mine}")
        n = len(other)
        self.reserve(self.size + n)
        sl = slice(self.size, self.size + n)
        self.answers[sl] = other.answers[:n]
        self._set_observations(sl, other.observations[:n])
        self.actions[sl] = other.actions[:n]
        self.true_rewards[sl] = other.true_rewards[:n]
        self.labels[sl] = other.labels[:n]
        self.labelers[sl] = other.labelers[:n]
        self.timestamps[sl] = other.timestamps[:n]
        self.size += n
        self._tensors = None

    def state_dict(self) -> dict[str, Any]:
        n = self.size
        observations = {"frames": self.frames[:n].copy()} if self.frame_stack > 1 else \
            {"observations": self.observations[:n].copy()}
        return {**observations, "actions": self.actions[:n].copy(),
                "true_rewards": self.true_rewards[:n].copy(), "labels": self.labels[:n].copy()}
