"""Environments written in Themis, registered with gymnasium when this package is imported.

- :mod:`themis.environments.moving_dot`: MovingDot, the small pixel task of the DRLHP
  reproduction (a dot moved to the middle of a black frame), ``MovingDotNoFrameskip-v0``.
"""

from themis.environments import moving_dot

__all__ = ["moving_dot"]
