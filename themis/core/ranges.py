"""The values a numeric config key takes (:class:`Range`) and the common ranges, in one place
for the run's validation (:data:`themis.run.validation.NUMERIC_KEYS`), the methods' own keys
and the launchers' quick check (:mod:`themis.cli.key_check`, which imports only the standard
library)."""

from __future__ import annotations

import math
from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class Range:
    """The values a numeric config key takes: finite, in ``[lo, hi]`` (``(`` or ``)`` where
    ``lo_open`` / ``hi_open``); ``hi = inf`` means no upper bound (the value stays finite)."""

    lo: float = -INF
    hi: float = INF
    lo_open: bool = False
    hi_open: bool = False
    text: str = ""
    """A rule in words that replaces the generic one (e.g. a TCP port)."""
    cap: float = INF
    """A sanity bound above the range (sizes: a billion hidden units allocates until killed),
    told as ``must be at most CAP``; below the range the generic rule still speaks."""

    def holds(self, value: float) -> bool:
        """Whether ``value`` is finite and inside the range (and at most :attr:`cap`)."""
        if not math.isfinite(value) or value > self.cap:
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def rule(self, value: float) -> str:
        """What a wrong ``value`` is told, e.g. ``must be positive`` or ``is outside [0, 1]``."""
        if self.text:
            return self.text
        if math.isfinite(value) and value > self.cap:
            return f"must be at most {int(self.cap) if self.cap == int(self.cap) else self.cap}"
        def shown(bound: float) -> str:
            return str(int(bound)) if math.isfinite(bound) and bound == int(bound) else \
                f"{bound:g}"

        finite = "finite " if math.isinf(value) else ""  # NaN is no number at all
        if self.hi == INF:
            if self.lo == -INF:
                return "must be a finite number"
            if isinstance(value, int):
                return "must be positive" if self.lo == 1 else f"must be >= {shown(self.lo)}"
            if self.lo == 0 and self.lo_open:
                return f"must be a {finite}positive number"
            return f"must be a {finite}number {'>' if self.lo_open else '>='} {shown(self.lo)}"
        return f"is outside {'(' if self.lo_open else '['}{shown(self.lo)}, {shown(self.hi)}" \
               f"{')' if self.hi_open else ']'}"


POSITIVE = Range(1)
"""Counts, sizes and frequencies (integers >= 1)."""
NON_NEGATIVE = Range(0)
"""Counts that may be 0, and weights >= 0."""
POSITIVE_REAL = Range(0, lo_open=True)
"""Learning rates, temperatures, sharpness: > 0 and finite."""
UNIT = Range(0, 1)
"""Probabilities, fractions, discounts."""
WIDTH = Range(1, cap=16_384)
"""Hidden widths: a billion units would allocate until killed (issue 85 item 8)."""
DEPTH = Range(0, cap=64)
"""Hidden layers."""
BATCH = Range(1, cap=1_000_000)
"""Minibatch sizes."""
ENVS = Range(1, cap=1024)
"""Parallel environments."""
