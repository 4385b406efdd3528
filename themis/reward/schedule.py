"""DRLHP's reward-training schedule, counted in label-passes (``reward_schedule=passes``).

Christiano et al. 2017 (App. A.2, Atari) and mrahtz/learning-from-human-preferences ``run.py``
(``start_reward_predictor_training``): the predictor is pretrained for 200 epochs on the first
500 labels (collected from the random policy), then trained "asynchronously" and continuously
over a buffer of "only the last 3,000 labels", at a rate that "typically processes 1 label per
10 RL timesteps". A label-pass is one labelled pair in one member's minibatch; the schedule
turns agent steps into minibatch steps at ``passes_per_step`` label-passes per agent step.

B-Pref's schedule (``reward_schedule=rounds``, the default) trains up to ``reward_update`` epochs
over every label after each feedback round instead: the state-based methods' papers use it; on
pixels it costs many times the paper's compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REWARD_SCHEDULES = ("rounds", "passes")
"""``reward_schedule`` values."""


@dataclass
class LabelPassSchedule:
    """How much the reward model trains, and on which labels.

    Args:
        pretrain_epochs: epochs over the labels of the first feedback round, run whole (no
            accuracy stop; ``reward_pretrain_epochs``, DRLHP: 200).
        passes_per_step: label-passes per agent step after pretraining
            (``reward_passes_per_step``, DRLHP: 0.1).
        buffer_labels: train on the newest this-many labels (``reward_label_buffer``, DRLHP:
            3000; 0: all).
        batch_size: pairs per minibatch (``reward_train_batch``, DRLHP: 32).

    Raises:
        ValueError: a negative count or rate, or a batch size below 1.
    """

    pretrain_epochs: int = 200
    passes_per_step: float = 0.1
    buffer_labels: int = 3000
    batch_size: int = 32
    credit: float = 0.0
    """Label-passes owed and not yet trained (less than one minibatch)."""
    label_passes: int = 0
    """Label-passes trained after pretraining (per member)."""
    pretrained: bool = False
    """The pretraining epochs have run."""
    pretrained_epochs: int = 0
    """Pretraining epochs run so far (a run stopped during pretraining continues from them)."""

    def __post_init__(self) -> None:
        if self.pretrain_epochs < 0 or self.passes_per_step < 0 or self.buffer_labels < 0:
            raise ValueError("reward_pretrain_epochs, reward_passes_per_step and "
                             "reward_label_buffer must be >= 0")
        if self.batch_size < 1:
            raise ValueError(f"the minibatch needs at least one pair, got {self.batch_size}")

    def rows(self, n_labels: int) -> np.ndarray:
        """The dataset rows trained on: the newest :attr:`buffer_labels` of ``n_labels``,
        ``(m,)`` int64."""
        first = max(0, n_labels - self.buffer_labels) if self.buffer_labels else 0
        return np.arange(first, n_labels, dtype=np.int64)

    def due(self, steps: int) -> int:
        """Minibatch steps owed after ``steps`` more agent steps (the rest carries over)."""
        self.credit += steps * self.passes_per_step
        batches = int(self.credit // self.batch_size)
        self.credit -= batches * self.batch_size
        self.label_passes += batches * self.batch_size
        return batches

    def state_dict(self) -> dict[str, object]:
        return {"credit": self.credit, "label_passes": self.label_passes,
                "pretrained": self.pretrained, "pretrained_epochs": self.pretrained_epochs}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.credit = float(state["credit"])  # type: ignore[arg-type]
        self.label_passes = int(state["label_passes"])  # type: ignore[call-overload]
        self.pretrained = bool(state["pretrained"])
        self.pretrained_epochs = int(state.get(  # type: ignore[call-overload]
            "pretrained_epochs", self.pretrain_epochs if self.pretrained else 0))
