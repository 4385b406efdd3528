"""Observations of any layout made into what Themis's encoders take, in one place.

Themis's agents and reward models take one array per step: a vector ``(D,)``, or a
channels-first image or grid ``(C, H, W)`` (:mod:`themis.agents.encoders`). Environments give
more: dict observations, channels-last images ``(H, W, C)``, 2-D grayscale frames ``(H, W)``.
:func:`prepare_observations` turns an env's observations into that form, and
:func:`themis.environments.domains.make_env` applies it to every env it makes (after the
domain's own wrappers), so the loops, the stores and the reward model see one layout:

1. ``obs_transform`` (DRLHP's ``obs_transform_func``): a dict observation becomes one of its
   entries (``obs_transform=image``) or what a function makes of it
   (``obs_transform=mypkg.obs:to_array``, called with each observation) —
   :func:`make_obs_transform`;
2. images are made channels-first, once: ``(H, W, C) -> (C, H, W)`` when the last axis is the
   smallest (the rule of SB3's ``is_image_space_channels_first``), ``(H, W)`` uint8 frames get
   a channel axis ``(1, H, W)`` — :func:`to_channels_first`.

The online wrapper (:mod:`themis.online`) reuses :func:`make_obs_transform` and
:func:`channels_first_fn` on the observations it stores for the reward model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["channels_first_fn", "image_layout", "make_obs_transform", "prepare_observations",
           "to_channels_first", "unsupported"]

ObsTransform = Callable[[Any], np.ndarray]
"""A function of one observation (as the env returns it) to one array."""


# ---------------------------------------------------------------- image layouts
def image_layout(space: gym.Space) -> str | None:
    """``"channels_last"``, ``"channels_first"``, ``"frame"`` (2-D uint8 ``(H, W)``) or None
    (not an image: a vector, a dict, a 3-D space of floats, ...).

    A 3-D ``Box`` is channels-last when its last axis is strictly the smallest of the three
    (``(64, 64, 3)``, ``(84, 84, 4)``, MiniGrid's ``(7, 7, 3)``) and channels-first otherwise
    (``(3, 32, 32)``; a cube ``(4, 4, 4)`` is read as channels-first).
    """
    if not isinstance(space, gym.spaces.Box) or space.shape is None:
        return None
    shape = space.shape
    if len(shape) == 2 and space.dtype == np.uint8:
        return "frame"
    if len(shape) != 3:
        return None
    return "channels_last" if shape[2] < min(shape[0], shape[1]) else "channels_first"


def channels_first_fn(space: gym.Space) -> tuple[ObsTransform | None, gym.Space]:
    """The function that makes observations of ``space`` channels-first, and the new space;
    ``(None, space)`` when they already are (or are no image).

    Shapes: ``(H, W, C) -> (C, H, W)`` and ``(H, W) -> (1, H, W)``, same dtype, contiguous.
    """
    layout = image_layout(space)
    if layout not in ("channels_last", "frame"):
        return None, space
    assert isinstance(space, gym.spaces.Box)
    if layout == "frame":
        new = gym.spaces.Box(space.low[None], space.high[None], dtype=space.dtype)
        return (lambda obs: np.asarray(obs)[None]), new
    new = gym.spaces.Box(np.transpose(space.low, (2, 0, 1)), np.transpose(space.high, (2, 0, 1)),
                         dtype=space.dtype)
    return (lambda obs: np.ascontiguousarray(np.transpose(obs, (2, 0, 1)))), new


def to_channels_first(env: gym.Env) -> gym.Env:
    """``env`` with channels-first image observations (:func:`channels_first_fn`); an env
    whose observations already are (or are no image) is returned as it is."""
    fn, space = channels_first_fn(env.observation_space)
    if fn is None:
        return env
    return gym.wrappers.TransformObservation(env, fn, space)


# ---------------------------------------------------------------- dict observations
def _import_callable(spec: str) -> Callable[[Any], Any]:
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"obs_transform={spec}: cannot import {module_name} ({e})") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"obs_transform={spec}: {module_name} has no {attr}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"obs_transform={spec}: {attr} is not a function")
    return target  # type: ignore[no-any-return]


def _keys(space: gym.Space) -> str:
    return ", ".join(map(str, space.spaces)) if isinstance(space, gym.spaces.Dict) else ""


def make_obs_transform(spec: str | Callable[[Any], Any],
                       space: gym.Space) -> tuple[ObsTransform, gym.spaces.Box]:
    """An observation transform and the space of what it returns.

    Args:
        spec: a key of a ``Dict`` observation space (``"image"``: the transform picks that
            entry), a ``"module:function"`` path, or a callable. A function is called with one
            observation as the env returns it and must return an array (its space is read from
            its output for ``space.sample()``: shape and dtype; uint8 -> bounds [0, 255],
            otherwise unbounded).
        space: the env's observation space.

    Returns:
        ``(transform, transformed_space)``; the transform returns ``np.ndarray``.

    Raises:
        ValueError: one line: a key the space does not have (its keys listed), a module or
            function that cannot be found, a function whose output is no numeric array, or a
            key whose entry is no ``Box``.
    """
    if isinstance(spec, str) and ":" not in spec:
        if not isinstance(space, gym.spaces.Dict):
            raise ValueError(f"obs_transform={spec} names a key of dict observations, but "
                             f"this env's observations are {space}")
        if spec not in space.spaces:
            raise ValueError(f"obs_transform={spec}: the observations have no key {spec!r}; "
                             f"their keys: {_keys(space)}")
        entry = space.spaces[spec]
        if not isinstance(entry, gym.spaces.Box):
            raise ValueError(f"obs_transform={spec}: that entry is {entry}, not an array "
                             "(Box); pick another key or give a module:function")
        key = spec
        return (lambda obs: np.asarray(obs[key])), entry
    fn = _import_callable(spec) if isinstance(spec, str) else spec
    name = spec if isinstance(spec, str) else getattr(fn, "__name__", repr(fn))
    try:
        sample = np.asarray(fn(space.sample()))
    except Exception as e:  # the user's function: any error is a bad transform
        raise ValueError(f"obs_transform={name} failed on a sample observation: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                         ) from None
    if sample.dtype.kind not in "biuf" or sample.ndim == 0:
        raise ValueError(f"obs_transform={name} returned {sample.dtype} of shape "
                         f"{sample.shape}; it must return a numeric array (a vector or an "
                         "image)")
    out: gym.spaces.Box
    if sample.dtype == np.uint8:
        out = gym.spaces.Box(0, 255, sample.shape, np.uint8)
    else:
        dtype = np.float32 if sample.dtype.kind in "biu" else sample.dtype
        out = gym.spaces.Box(-np.inf, np.inf, sample.shape, dtype)
    return (lambda obs: np.asarray(fn(obs), dtype=out.dtype)), out


def prepare_observations(env: gym.Env, obs_transform: str | Callable[[Any], Any] | None = None
                         ) -> gym.Env:
    """``env`` with observations Themis's encoders take: ``obs_transform`` applied (if any),
    then images channels-first (:func:`to_channels_first`). Other observations (a dict without
    ``obs_transform``, a ``Discrete`` space) pass unchanged: :func:`unsupported` says why the
    loops cannot take them.

    Raises:
        ValueError: one line: a bad ``obs_transform`` (:func:`make_obs_transform`).
    """
    if obs_transform:
        fn, new = make_obs_transform(obs_transform, env.observation_space)
        env = gym.wrappers.TransformObservation(env, fn, new)
    return to_channels_first(env)


def unsupported(space: gym.Space) -> str | None:
    """Why Themis's loops cannot take observations of ``space`` (after
    :func:`prepare_observations`), in one line with the fix, or None when they can: a dict
    (choose an entry or a function with ``obs_transform``), a space that is no array, an image
    of floats (the CNN encoders and the stores take uint8 images in [0, 255])."""
    if isinstance(space, gym.spaces.Dict):
        return (f"the observations are a dict (keys {_keys(space)}): choose one entry with "
                "obs_transform=KEY, or make one array of them with "
                "obs_transform=module:function")
    if not isinstance(space, gym.spaces.Box):
        return (f"observations of type {type(space).__name__} are not supported; make an "
                "array of them with obs_transform=module:function")
    if len(space.shape) == 3 and space.dtype != np.uint8:
        return (f"image observations {space.shape} of {space.dtype}: Themis's CNNs and stores "
                "take uint8 images in [0, 255]; convert them with obs_transform=module:function")
    return None
