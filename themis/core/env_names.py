"""Finding the user's ``env=`` among a domain's environment names, and the one line that refuses
a name that is not there, from lists of names alone.

The rule is shared by :meth:`themis.environments.domains.Domain.resolve`, which lists a
domain's names by importing its suite, and the launchers' quick check
(:mod:`themis.cli.key_check`), which reads the lists an earlier launch saved and imports only
the standard library: both refuse ``env=walker_wlak`` with the same line.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

HINT_ORDER = ("Classic", "Control", "Box2d", "DMC", "MetaWorld", "ALE", "Minigrid", "BabyAI",
              "MovingDot")
"""Domains asked, in this order, which one an env belongs to when it is not in the domain the
user chose (seals and Gym repeat the others' ids)."""

CHEAP_DOMAINS = ("Classic", "Control", "Box2d")
"""Domains whose ids are in gymnasium's registry already (nothing to import to list them)."""

DISTRIBUTIONS = {"Classic": ("gymnasium",), "Control": ("gymnasium",), "Box2d": ("gymnasium",),
                 "DMC": ("gymnasium", "shimmy", "dm-control"), "MetaWorld": ("metaworld",),
                 "ALE": ("gymnasium", "ale-py"), "Minigrid": ("gymnasium", "minigrid"),
                 "BabyAI": ("gymnasium", "minigrid"), "MovingDot": ("gymnasium",),
                 "seals": ("gymnasium", "seals")}
"""The installed packages whose versions decide a domain's list of names (a saved list is used
only with the same versions). The Gym domain is not here: its list is whatever was registered
in the process (``env=module:EnvId`` imports a module of the user's)."""

Listing = Callable[[str], "tuple[list[str], str] | None"]
"""A domain's name -> its names and id prefix, or ``None`` when its suite is not installed;
raises :class:`NotListed` when the caller cannot tell (the quick check without a saved list)."""


class NotListed(Exception):
    """A domain's list of names is not at hand: the refusal cannot be worded here."""


def _squash(name: str) -> str:
    return name.lower().removeprefix("dm_control/").removesuffix("-v0").replace("-", "") \
        .replace("_", "")


def spellings(domain: str, env: str, ids: list[str]) -> list[str]:
    """The user's ``env`` and the other spellings of it tried in ``domain`` (last: the one
    close matches are looked for): DeepMind Control's ``walker_walk``, ``walker-walk`` and
    ``dm_control/walker-walk-v0`` are one env; Meta-World's ``door-open`` is ``door-open-v3``."""
    if domain == "DMC":
        return [env, *(i for i in ids if _squash(i) == _squash(env))]
    if domain == "MetaWorld":
        return [env, env if env.endswith("-v3") else f"{env}-v3"]
    return [env]


def find_env(domain: str, env: str, ids: list[str], prefix: str) -> str | None:
    """The id among ``ids`` that the user's ``env`` names (tried as spelled and with the
    domain's id ``prefix``, e.g. ``ALE/``), or ``None``."""
    for spelling in spellings(domain, env, ids):
        for candidate in (spelling, prefix + spelling):
            if candidate in ids:
                return candidate
    return None


def home_domain(env: str, listing: Listing, skip: str = "", cheap_only: bool = False
                ) -> str | None:
    """The first domain of :data:`HINT_ORDER` (other than ``skip``; with ``cheap_only`` of
    :data:`CHEAP_DOMAINS` only) that has ``env``, or ``None``; a domain ``listing`` returns
    ``None`` for (not installed) is passed over.

    Raises:
        NotListed: from ``listing``.
    """
    for name in HINT_ORDER:
        if name == skip or (cheap_only and name not in CHEAP_DOMAINS):
            continue
        listed = listing(name)
        if listed is not None and find_env(name, env, *listed) is not None:
            return name
    return None


def unknown_env(domain: str, env: str, ids: list[str], prefix: str, listing: Listing) -> str:
    """The line that refuses ``env=`` not among ``domain``'s ``ids``: ``domain=Gym`` for a
    ``module:EnvId`` of the user's own package; the domain it belongs to when it is another's
    (``walker_walk`` with ``domain=Control``: add ``domain=DMC``), else up to five close
    matches, else the first twelve names.

    Raises:
        NotListed: from ``listing``, asked for other domains' names.
    """
    if ":" in env and domain != "Gym":  # module:EnvId, a user's own env (the README's way)
        return (f"env={env} names an env of your own package (module:EnvId); add domain=Gym, "
                "which imports the module and makes the env")
    short = [i.removeprefix(prefix) for i in ids]
    close = difflib.get_close_matches(spellings(domain, env, ids)[-1].removeprefix(prefix),
                                      short, n=5, cutoff=0.5)
    # the suites that import much (DMC, Meta-World, ...) only when the name is no typo of
    # this domain's
    home = home_domain(env, listing, skip=domain, cheap_only=bool(close))
    if home is not None:
        return (f"env={env} is not an environment of domain={domain}: it is "
                f"{'a' if home != 'ALE' else 'an'} {home} "
                f"{'task' if home in ('DMC', 'MetaWorld') else 'env'}; add domain={home}")
    hint = f"; close matches: {', '.join(close)}" if close else \
        f"; available: {', '.join(short[:12])}{', ...' if len(short) > 12 else ''}"
    return f"env={env} is not an environment of domain={domain}{hint}"
