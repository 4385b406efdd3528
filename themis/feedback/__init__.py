"""Preference learning, one component: query selection, teacher channels, the learner.

- :class:`QuerySelector` (``selector.py``): query pool → candidates → sampler (``feed_type``);
- channels (``channels.py``): ``post(queries)`` / ``gather()`` for synthetic, terminal and web
  teachers;
- :class:`PreferenceLearner` (``learner.py``): dataset, Bradley–Terry trainer, teacher
  statistics; one call per feedback round, :meth:`~PreferenceLearner.round` →
  :class:`RoundReport` (the ``reward.csv`` row);
- ``factory.py``: builds them for a run (the one place the core imports ``lib/``).
"""

from themis.feedback.channels import (
    Channel,
    Gathered,
    SyntheticChannel,
    TerminalChannel,
    WebChannel,
)
from themis.feedback.learner import PreferenceLearner, RoundReport
from themis.feedback.selector import QuerySelector

__all__ = ["Channel", "Gathered", "PreferenceLearner", "QuerySelector", "RoundReport",
           "SyntheticChannel", "TerminalChannel", "WebChannel"]
