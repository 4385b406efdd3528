"""Preference learning, one component: query selection, teacher channels, the learner.

- :class:`QuerySelector` (``selector.py``): query pool → candidates → sampler (``feed_type``);
- channels (``channels.py``): ``post(queries)`` / ``gather()`` for synthetic, terminal and web
  teachers, and a vision-language model alone or in the web crowd (``vlm.py``: the endpoint
  and RL-VLM-F's two stages; ``vlm_prompt.py``: the prompt, the tasks' goals, the label of an
  answer; ``vlm_cache.py``: the answers kept by content);
- :class:`PreferenceLearner` (``learner.py``): dataset, Bradley–Terry trainer, teacher
  statistics; one call per feedback round, :meth:`~PreferenceLearner.round` →
  :class:`RoundReport` (the ``reward.csv`` row);
- ``factory.py``: builds them for a run (the one place the core imports ``lib/``).
"""

from themis.feedback.channels import (
    Channel,
    CrowdVLMChannel,
    Gathered,
    SyntheticChannel,
    TerminalChannel,
    VLMChannel,
    WebChannel,
)
from themis.feedback.learner import PreferenceLearner, QueryPool, RoundReport
from themis.feedback.selector import QuerySelector

__all__ = ["Channel", "CrowdVLMChannel", "Gathered", "PreferenceLearner", "QueryPool",
           "QuerySelector", "RoundReport", "SyntheticChannel", "TerminalChannel", "VLMChannel",
           "WebChannel"]
