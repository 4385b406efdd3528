"""The one line that refuses a name outside a fixed set of choices (``domain=dmc``), shared by
the check that knows the set (:func:`themis.environments.domains.get_domain`) and the
launchers' quick check (:mod:`themis.cli.key_check`), which imports only the standard library."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def unknown_choice(key: str, name: str, choices: Iterable[str]) -> str:
    """``"{key}={name} is unknown (did you mean X?); available: A, B, ..."``: X is the choice
    that differs from ``name`` only in case, else the closest one (:mod:`difflib`, none when
    nothing is close); the choices are listed in their order."""
    known = list(choices)
    close = [c for c in known if c.lower() == name.lower()] or \
        difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{key}={name} is unknown{hint}; available: {', '.join(known)}"
