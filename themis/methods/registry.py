"""The registry of methods: every :class:`~themis.methods.base.Method` of this package, found
by name, and what the rest of Themis asks of them as a group.

A method is one module in ``themis/methods/`` that defines a :class:`Method` subclass with a
``name``, plus ``config/method/<name>.yaml`` (``<name>.enabled: true`` and the run keys it
sets, e.g. ``feed_type``). Nothing else names it: the config schema gets a ``<name>.*`` group
from its :attr:`Method.Config`, ``--help`` reads that dataclass's field docstrings, the numeric
checks take its :attr:`Method.RANGES`, and the learner, the trainer and the loops call its
hooks (``docs/adding_a_method.md``). PEBBLE, the base every method changes, is no entry.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import field
from typing import Any

import themis.methods as package
from themis.core.ranges import Range
from themis.core.run_keys import RunKeys
from themis.methods.base import WHERE, Method, MethodContext
from themis.utils import ConfigError

BASE = "pebble"
"""The name of the base method (``method=pebble``: no successor switched on)."""

NOT_METHODS = frozenset({"base", "crop", "registry"})
"""Modules of the package that hold shared pieces, not methods."""


def _discover() -> dict[str, type[Method]]:
    found: list[type[Method]] = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in NOT_METHODS:
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found += [obj for obj in vars(module).values()
                  if isinstance(obj, type) and issubclass(obj, Method) and obj is not Method
                  and obj.__module__ == module.__name__ and obj.name]
    names = [cls.name for cls in found]
    duplicate = {n for n in names if names.count(n) > 1} | ({BASE} & set(names))
    if duplicate:
        raise RuntimeError(f"two methods are named {sorted(duplicate)[0]!r}")
    return {cls.name: cls for cls in sorted(found, key=lambda c: (c.published, c.name))}


REGISTRY: dict[str, type[Method]] = _discover()
"""Every method by name, in order of first publication (the order hooks run in)."""


def method_names() -> list[str]:
    """The registered names (without ``pebble``)."""
    return list(REGISTRY)


def active(cfg: RunKeys) -> list[type[Method]]:
    """The method classes a config switches on (``<name>.enabled``)."""
    return [cls for name, cls in REGISTRY.items() if cls.own_keys(cfg).enabled]


def active_methods(cfg: RunKeys) -> list[str]:
    """The names of the methods a config switches on, or ``["pebble"]``."""
    return [cls.name for cls in active(cfg)] or [BASE]


def method_title(cfg: RunKeys) -> str:
    """``PEBBLE``, ``SURF``, ``SURF+RUNE`` ... for banners and plot titles."""
    return "+".join(cls.title for cls in active(cfg)) or BASE.upper()


def config_fields() -> list[tuple[str, type, Any]]:
    """One config-schema field per method, ``(name, Config, field)``, for
    :func:`dataclasses.make_dataclass` (keys ``<name>.*``)."""
    return [(name, cls.Config, field(default_factory=cls.Config))
            for name, cls in REGISTRY.items()]


def config_groups() -> dict[str, type]:
    """Each method's key group and its dataclass (``--help``)."""
    return {name: cls.Config for name, cls in REGISTRY.items()}


def numeric_keys() -> dict[str, Range]:
    """Every method's numeric keys with their ranges, ``<name>.<key>``."""
    return {f"{name}.{key}": rng for name, cls in REGISTRY.items()
            for key, rng in cls.RANGES.items()}


def refuse_inside_agent(names: list[str], where: str) -> None:
    """Where the learner cannot reach the agent (the online wrapper, async training): refuse a
    method that works inside it, as one line.

    Raises:
        ConfigError: a method with :attr:`Method.inside_agent` outside the sync loops.
    """
    if where == "loop":
        return
    for name in names:
        cls = REGISTRY.get(name)
        if cls is None or not cls.inside_agent:
            continue
        if where == "wrapper":
            usable = ", ".join(n for n, c in REGISTRY.items() if not c.inside_agent)
            raise ConfigError(f"method={name} {cls.inside_agent}, inside the agent: the "
                              f"wrapper cannot reach it; use {usable}")
        raise ConfigError(f"reward_training=async: method={name} {cls.inside_agent}, inside "
                          "the agent; use reward_training=sync")


def check_methods(cfg: RunKeys, agent: str | None = None, where: str = "loop") -> None:
    """What the switched-on methods cannot run with, as one line: the rules every method
    shares, then each method's own :meth:`Method.check`.

    Args:
        cfg: the composed config.
        agent: ``sac`` or ``ppo`` when known (``None``: from ``cfg.agent`` unless ``auto``).
        where: one of :data:`themis.methods.base.WHERE`.

    Raises:
        ConfigError: an uncertainty sampler with one ensemble member, rating feedback with a
            method for pairs, a method inside the agent where the learner cannot reach it, or
            what a method refuses.
    """
    if where not in WHERE:
        raise ValueError(f"where={where!r} is not one of {WHERE}")
    agent = agent or (cfg.agent if cfg.agent in ("sac", "ppo", "a2c") else None)
    classes = active(cfg)
    refuse_inside_agent([cls.name for cls in classes], where)
    for cls in classes:
        cls.check(cfg, agent, where)
    if cfg.ensemble_size < 2 and str(cfg.feed_type) not in ("0", "uniform"):
        raise ConfigError(f"feed_type={cfg.feed_type} ranks queries by ensemble disagreement, "
                          f"which needs ensemble_size >= 2 (got {cfg.ensemble_size})")


def check_ratings(cfg: RunKeys) -> None:
    """``feedback=rating``: only methods that take ratings.

    Raises:
        ConfigError: a switched-on method that works on pairwise labels.
    """
    pairs = [cls for cls in active(cfg) if not cls.ratings]
    if pairs:
        takes = [cls.title for cls in REGISTRY.values() if cls.ratings]
        raise ConfigError(
            f"feedback=rating does not take method={','.join(c.name for c in pairs)}: "
            f"{', '.join(c.title for c in pairs)} work on pairwise labels"
            + (f"; {' and '.join(takes)} work with ratings" if takes else ""))


def rating_method_on(cfg: RunKeys) -> bool:
    """Whether a switched-on method takes ratings (its config file may set ``feed_type``,
    which ratings ignore)."""
    return any(cls.ratings for cls in active(cfg))


def build_methods(cfg: RunKeys, context: MethodContext, only: tuple[str, ...] = ()) -> list[Method]:
    """The switched-on methods of a run, built (in :data:`REGISTRY` order); with ``only``, just
    those with one of these hooks of their own (e.g. ``("reward_bonus",)`` where only the
    agent's reward is computed)."""
    return [cls(cls.own_keys(cfg), context) for cls in active(cfg)
            if not only or any(getattr(cls, h) is not getattr(Method, h) for h in only)]


def find(methods: list[Method], kind: type[Method] | Callable[[Method], bool]) -> Any:
    """The first of ``methods`` of class ``kind`` (or for which ``kind(m)`` holds), or
    ``None`` (tests and tools that look inside one method)."""
    test = (lambda m: isinstance(m, kind)) if isinstance(kind, type) else kind
    return next((m for m in methods if test(m)), None)


__all__ = ["BASE", "REGISTRY", "active", "active_methods", "build_methods", "check_methods",
           "check_ratings", "config_fields", "config_groups", "find", "method_names",
           "method_title", "numeric_keys", "rating_method_on", "refuse_inside_agent"]
