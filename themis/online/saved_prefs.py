"""Preferences saved as a training and a validation dataset (DRLHP's ``save_prefs``), in
Themis's pickle-free format: :func:`split_prefs`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

VAL_FRACTION = 0.2
"""DRLHP's ``PREFS_VAL_FRACTION``: the share of labels saved as validation preferences when the
run holds none out itself (``reward_val_fraction``)."""


def split_prefs(dataset: Any, trainer: Any, log_dir: Path) -> dict[str, int]:
    """Write ``dataset``'s labels as ``log_dir/train_prefs/`` and ``log_dir/val_prefs/``:
    the run's own held-out labels as validation (``reward_val_fraction``), or else every fifth
    label (DRLHP's 20 %).

    Returns:
        ``{"train": n, "val": m}``.
    """
    from themis.reward import PreferenceDataset

    n = len(dataset)
    validation = getattr(trainer, "validation", None)
    held = validation.held_out(n)[:n] if validation is not None and n else \
        np.arange(n) % round(1 / VAL_FRACTION) == round(1 / VAL_FRACTION) - 1
    counts = {}
    for name, rows in (("train", np.flatnonzero(~held)), ("val", np.flatnonzero(held))):
        part = PreferenceDataset(max(1, len(rows)), dataset.segment, dataset.obs_dim,
                                 dataset.action_dim, metadata=dict(dataset.metadata),
                                 obs_dtype=dataset.observations.dtype,
                                 rating_classes=dataset.rating_classes)
        k = len(rows)
        part.observations[:k] = dataset.observations[rows]
        part.actions[:k] = dataset.actions[rows]
        part.true_rewards[:k] = dataset.true_rewards[rows]
        part.labels[:k] = dataset.labels[rows]
        part.labelers[:k] = dataset.labelers[rows]
        part.timestamps[:k] = dataset.timestamps[rows]
        part.answers[:k] = dataset.answers[rows]
        part.size = k
        part.save(log_dir / f"{name}_prefs")
        counts[name] = k
    return counts


__all__ = ["VAL_FRACTION", "split_prefs"]
