"""Turning several people's answers to one query into one training label.

The label store (:mod:`themis.label_store`) gathers each complete query's answers; this module
decides what they become (``label_aggregate`` and ``label_quality``):

- ``each``: every answer is its own training label;
- ``majority``: the most common non-skip answer (a left/right tie gives 0.5);
- ``model`` (``label_quality=model``): Dawid–Skene (Dawid & Skene 1979, "Maximum likelihood
  estimation of observer error-rates using the EM algorithm", Applied Statistics 28(1)) fitted
  by Toloka's ``crowd-kit`` (``crowdkit.aggregation.DawidSkene``) on every pairwise answer in the
  store, with the known answers of gold queries clamped (its ``true_labels``). Each labeler gets
  a full confusion matrix over {left, equal, right}, so a random clicker's answers count little
  and an adversary's are read flipped; the label is the class with the highest posterior.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

CLASSES = {0.0: "left", 0.5: "equal", 1.0: "right"}
"""crowd-kit works on label names; ours are B-Pref's 0 / 0.5 / 1."""
_VALUES = {name: value for value, name in CLASSES.items()}

Answer = tuple[int, str, float]
"""``(query ID, labeler, label)`` with label 0, 0.5 or 1 (skips left out)."""


def majority(labels: Sequence[float]) -> float:
    """The most common of ``labels`` (0, 0.5, 1): left or right by count, 0.5 on a tie."""
    values = np.asarray(labels, dtype=np.float64)
    left, right = (values == 0.0).sum(), (values == 1.0).sum()
    return 0.0 if left > right else 1.0 if right > left else 0.5


def dawid_skene(answers: Sequence[Answer], gold: dict[int, float] | None = None,
                n_iter: int = 100) -> dict[int, float]:
    """Dawid–Skene labels of every query in ``answers`` (crowd-kit's EM).

    Args:
        answers: every pairwise answer known (the more, the better the labelers' confusion
            matrices), skips left out.
        gold: known answers of gold queries, clamped during EM (``true_labels``).
        n_iter: EM iterations at most.

    Returns:
        ``{query ID: label}`` (0, 0.5 or 1) for each query with an answer; gold queries keep
        their known answer.

    Raises:
        ValueError: a label other than 0, 0.5 or 1.
    """
    from crowdkit.aggregation import DawidSkene  # imported on use: ~1 s

    if not answers:
        return {}
    bad = {label for _, _, label in answers if label not in CLASSES}
    if bad:
        raise ValueError(f"labels must be 0, 0.5 or 1, got {sorted(bad)}")
    data = pd.DataFrame([(q, w, CLASSES[float(lab)]) for q, w, lab in answers],
                        columns=["task", "worker", "label"])
    known = {q: CLASSES[float(lab)] for q, lab in (gold or {}).items()
             if q in set(data["task"])}
    model = DawidSkene(n_iter=n_iter)
    if known:  # crowd-kit needs every class it clamps to appear among the answers
        known = {q: lab for q, lab in known.items() if lab in set(data["label"])}
    with warnings.catch_warnings():  # crowd-kit 1.4 on pandas 3: deprecation notices only
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        predicted = model.fit_predict(data, true_labels=pd.Series(known) if known else None)
    out = {int(q): _VALUES[str(lab)] for q, lab in predicted.items()}
    out.update({q: _VALUES[lab] for q, lab in known.items()})
    return out
