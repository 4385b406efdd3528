"""Preference labels on a fixed dataset: pairs of segments cut inside its episodes, chosen by
the online runs' query samplers and answered by their teachers, or read from a label file.

Queries are built as in an online round: the run's
:class:`themis.feedback.selector.QuerySelector` draws candidate pairs from the dataset
(:meth:`themis.offline.datasets.OfflineDataset.sample_segment_pairs`: segments inside one
episode, never across an episode's end) and picks ``k`` of them by ``feed_type`` (0 uniform, 1
disagreement of the ensemble, ...); they are answered by a B-Pref teacher
(:class:`themis.feedback.teachers.SyntheticTeacher`: ``oracle``, ``noisy``, ``mistake``,
``skip``, ``myopic``, ``equal``) from the dataset's true rewards. The answers go into a
:class:`themis.reward.dataset.PreferenceDataset`, the format every run saves.

**Label files** (:func:`load_label_file`). Uni-RLHF (Yuan et al., ICLR 2024; its
Clean-Offline-RLHF ``rlhf/train_reward_model.py``) publishes crowd labels as three pickled
Python files per task: the answers (``0``: the first segment is better, ``1``: the second,
``-1``: equally good) and the two segments' start indices into the flat D4RL
``qlearning_dataset`` arrays, each segment ``len_query`` steps long inside one episode.
Preference Transformer's ``human_label/<task>/`` files (``indices_num…``, ``indices_2_num…``,
``label_human``; ``JaxPref/reward_transform.py``) hold the same content. Themis never unpickles a
received file, so it reads the same content written as plain arrays: an ``.npz``
(``allow_pickle=False``) or a ``.json`` object with ``indices_1``, ``indices_2`` and ``labels``
(same encoding) and optionally ``segment``. Indices count steps of the dataset as Themis reads
it (episodes concatenated in order): a D4RL file is read in ``qlearning_dataset``'s order
(:func:`themis.offline.datasets.load_d4rl_hdf5`), so Uni-RLHF's indices apply to it as they are.

``labels=`` may also name a Themis preference dataset (a run's ``preferences/``: people's answers
on the web page of an online run, a crowd's aggregated labels, ``scripts/merge_prefs.py``'s
output), whose segments carry their own observations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from themis.agents.buffers import SegmentPairs
from themis.feedback.teachers import SyntheticTeacher
from themis.offline.datasets import DatasetError, OfflineDataset
from themis.reward.dataset import PreferenceDataset
from themis.reward.preference_models import true_preference

UNI_RLHF_LABELS = {0: 0.0, 1: 1.0, -1: 0.5}
"""Uni-RLHF's answer codes -> Themis's labels (probability that segment 2 is preferred)."""


def teacher_labels(pairs: SegmentPairs, teacher: SyntheticTeacher,
                   ) -> tuple[SegmentPairs, np.ndarray]:
    """A teacher's answers: the pairs it did not skip and their labels ``(n_kept,)``."""
    keep, labels = teacher.label(pairs.true_rewards[:, 0], pairs.true_rewards[:, 1])
    return pairs.take(keep), labels


def oracle_labels(pairs: SegmentPairs) -> np.ndarray:
    """The true preference of each pair (larger true return; 0.5 on a tie): ``(n,)``."""
    return true_preference(pairs.true_rewards)


def margin(dataset: OfflineDataset, segment: int) -> float:
    """B-Pref's teacher margin on a dataset: the mean episode return scaled to one segment."""
    returns = dataset.episode_returns()
    return float(np.mean(returns) * segment / np.mean(dataset.lengths))


def load_label_file(path: str | Path, dataset: OfflineDataset, segment: int,
                    ) -> tuple[SegmentPairs, np.ndarray]:
    """Labelled pairs from a Uni-RLHF-style label file as plain arrays (module docstring), or
    from a Themis preference-dataset folder (:func:`load_preferences_folder`).

    Returns:
        ``(pairs, labels)``: the segments and Themis labels (0, 0.5 or 1).

    Raises:
        DatasetError: unreadable file, missing keys, lengths that differ, an answer code other
            than 0, 1, -1, or a segment outside the dataset or across an episode's end.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        return load_preferences_folder(path, dataset)
    arrays = _read_label_arrays(path)
    for key in ("indices_1", "indices_2", "labels"):
        if key not in arrays:
            raise DatasetError(f"labels={path}: no '{key}' (a label file holds indices_1, "
                               "indices_2 and labels)")
    try:
        first = np.asarray(arrays["indices_1"], dtype=np.int64).reshape(-1)
        second = np.asarray(arrays["indices_2"], dtype=np.int64).reshape(-1)
        codes = np.asarray(arrays["labels"], dtype=np.int64).reshape(-1)
        segment = int(np.asarray(arrays.get("segment", segment)).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        raise DatasetError(f"labels={path}: indices, labels and segment must be whole numbers"
                           ) from None
    if not len(first) == len(second) == len(codes) or len(codes) == 0:
        raise DatasetError(f"labels={path}: {len(first)} first indices, {len(second)} second "
                           f"and {len(codes)} labels (need as many of each, at least one)")
    if not np.all(np.isin(codes, list(UNI_RLHF_LABELS))):
        raise DatasetError(f"labels={path}: answers must be 0 (first better), 1 (second) or "
                           f"-1 (equal), got {sorted(set(codes.tolist()) - set(UNI_RLHF_LABELS))}")
    episode = np.repeat(np.arange(dataset.num_episodes), dataset.lengths)
    for name, starts in (("indices_1", first), ("indices_2", second)):
        ends = starts + segment - 1
        bad = (starts < 0) | (ends >= dataset.num_steps)
        if not bad.any():
            bad = episode[starts] != episode[ends]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DatasetError(f"labels={path}: {name}[{i}] = {int(starts[i])}: a {segment}-step "
                               "segment there leaves the dataset or crosses an episode's end")
    labels = np.vectorize(UNI_RLHF_LABELS.get)(codes).astype(np.float32)
    return dataset.pairs(np.stack([first, second], 1), segment), labels


def load_preferences_folder(path: Path, dataset: OfflineDataset,
                            ) -> tuple[SegmentPairs, np.ndarray]:
    """The labelled pairs of a Themis preference dataset (a run's ``preferences/``, people's
    answers on the web page included, or ``scripts/merge_prefs.py``'s output): its segments
    carry their own observations and actions, so they need not come from this dataset, only
    have its sizes.

    Raises:
        DatasetError: not a readable preference dataset, ratings instead of preferences, or
            observation / action sizes other than the dataset's.
    """
    try:
        prefs = PreferenceDataset.load(path)
    except (FileNotFoundError, ValueError) as e:
        raise DatasetError(f"labels={path}: {e}") from None
    if prefs.rating_classes or len(prefs) == 0:
        raise DatasetError(f"labels={path} holds {'ratings' if prefs.rating_classes else 'no'} "
                           "preference labels")
    if (prefs.obs_dim, prefs.action_dim) != (dataset.obs_dim, dataset.action_dim):
        raise DatasetError(f"labels={path}: segments of observations {prefs.obs_dim} and actions "
                           f"{prefs.action_dim}; the dataset's are {dataset.obs_dim} and "
                           f"{dataset.action_dim}")
    n = len(prefs)
    pairs = SegmentPairs(np.asarray(prefs.observations[:n], np.float32), prefs.actions[:n],
                         prefs.true_rewards[:n], np.full((n, 2), -1, np.int64))
    return pairs, prefs.labels[:n].copy()


def _read_label_arrays(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DatasetError(f"labels={path}: no such file")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as e:
            raise DatasetError(f"labels={path} is not readable JSON ({e})") from None
        if not isinstance(data, dict):
            raise DatasetError(f"labels={path}: a JSON object with indices_1, indices_2 and "
                               "labels is expected")
        return data
    from themis.core.safe_loading import UnsafeFileError, check_npz

    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise DatasetError(f"labels={path} is a single array, not an npz file of "
                                   "indices_1, indices_2 and labels")
            check_npz(npz, path)  # headers that announce more than the file holds
            return {k: npz[k] for k in npz.files}
    except UnsafeFileError as e:
        raise DatasetError(f"labels={path}: {e}") from None
    except (OSError, ValueError, EOFError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DatasetError(f"labels={path} is neither an npz file of plain arrays nor JSON "
                           f"({first}; pickled files are refused)") from None
