"""The configuration of the online wrapper: ``./themis_train.sh``'s keys, checked the same way.

:func:`online_config` turns the keyword arguments of
:class:`themis.online.PreferenceLearningWrapper` into a :class:`themis.run.config.TrainConfig`
(composed from ``config/train_themis.yaml`` like a command line: ``method=``, ``teacher=`` and
``domain=`` select their config groups; every other key is a schema key, nested keys dotted or
as dicts) plus the few keys of the wrapper itself (:class:`OnlineKeys`), resolves it once as
:func:`themis.run.resolve.resolve` does (what the wrapper derives in one ``dataclasses.replace``;
nothing assigns to it afterwards) and validates it once with
:func:`themis.run.validation.validate` (``where="wrapper"``: the methods' rules too). Bad input
is one :class:`themis.utils.ConfigError` line.

Keys of Themis's own training loop (the agent, its networks, pretraining, evaluation) have no
meaning around another library's agent and are refused, so that a key never silently does
nothing (:data:`LOOP_KEYS`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from themis.core.foreign_keys import foreign_key
from themis.core.ranges import NON_NEGATIVE, Range
from themis.feedback.selector import resolve_reward_batch
from themis.methods.registry import refuse_inside_agent
from themis.run.config import TrainConfig, compose, removed_key, schema_keys
from themis.run.validation import validate
from themis.utils import ConfigError

GROUP_KEYS = ("method", "teacher", "domain")
"""Config groups chosen by name (``method=NAME``, ``teacher=noisy``), as on the command line."""

LOOP_KEYS: dict[str, str] = {
    "env": "the wrapper wraps the env you pass it",
    "env_kwargs": "the wrapper wraps the env you pass it",
    "agent": "your library trains the agent",
    "sac": "your library trains the agent",
    "ppo": "your library trains the agent",
    "num_train_steps": "your library decides how long it trains",
    "num_unsup_steps": "unsupervised pretraining is Themis's own loop (PEBBLE)",
    "topK": "unsupervised pretraining is Themis's own loop (PEBBLE)",
    "entropy_pool_size": "unsupervised pretraining is Themis's own loop (PEBBLE)",
    "state_entropy_scale": "unsupervised pretraining is Themis's own loop (PEBBLE)",
    "reset_update": "the critic reset is Themis's own loop (PEBBLE)",
    "reset_critic": "the critic reset is Themis's own loop (PEBBLE)",
    "eval_frequency": "evaluate with your library's own tools",
    "num_eval_episodes": "evaluate with your library's own tools",
    "save_snapshot": "snapshots are Themis's own pretraining",
    "pretrained_snapshot": "warm-start your agent with your library (e.g. SB3's load)",
    "pretrained_policy": "warm-start your agent with your library (e.g. SB3's load)",
    "learn_reward": "without a learned reward, use the env itself (to collect labels "
                    "without training: train_reward=False)",
    "xplain_action": "explanations of the policy need Themis's own agent",
    "xplain_state": "explained clips are not in the wrapper yet",
    "checkpoint_frequency": "the learner checkpoints after every feedback round",
    "reward_training": "the wrapper's learner always runs in the background",
    "logger": "track the run with your library's own W&B or MLflow callback",
}
"""Keys of Themis's own training loop, refused by the wrapper, and why."""

WARMUP_REWARDS = ("zero", "true")

DRLHP_KEYS: dict[str, str] = {
    "log_dir": "the run dir is the wrapper's second argument (PreferenceLearningWrapper(env, "
               "RUN_DIR)); HumanPreferencesEnvWrapper takes log_dir",
    "prefs_dir": "prefs_path=FOLDER (a preferences/ folder); HumanPreferencesEnvWrapper takes "
                 "prefs_dir",
    "segment_length": "segment",
    "synthetic_prefs": "synthetic is the default; a person: human_teacher=True",
    "synthetic_preferences": "synthetic is the default; a person: human_teacher=True",
    "collect_prefs": "max_feedback=N queries (0: none)",
    "pretrained_reward_predictor_dir": "reward_model=RUN_DIR or reward_model.pt",
    "reward_predictor_ckpt_interval": "reward_checkpoint_interval",
    "obs_transform_func": "obs_transform",
    "max_prefs_in_db": "max_feedback",
    "n_initial_prefs": "first_round_queries",
}
"""DRLHP's keyword arguments (``HumanPreferencesEnvWrapper``) given to
:class:`themis.online.PreferenceLearningWrapper`: the Themis key that does the same."""


@dataclass
class OnlineKeys:
    """The wrapper's own keys (beside the :class:`themis.run.config.TrainConfig` ones)."""

    warmup_reward: str = "zero"
    """What the agent gets before the first reward model is used: ``zero`` (0, as DRLHP's
    agent before its predictor is trained) or ``true`` (the env's reward, a warm-up on the
    true reward)."""
    n_initial_training_steps: int = 1
    """Passes over the labels (epochs; DRLHP's ``n_initial_training_steps``, its training
    steps) the reward model must have had before the returned reward switches from the
    warm-up reward to r̂; until then the learner trains one more pass whenever it is idle. A
    pretrained model counts as trained."""
    reward_model: str | None = None
    """A pretrained reward model (a run dir or ``reward_model.pt``): r̂ from the first step;
    with ``max_feedback=0`` it stays frozen, otherwise training continues from it."""
    normalize_reward: bool = True
    """Return r̂ normalised to zero mean and unit variance (running statistics, DRLHP)."""
    obs_transform: Any = None
    """Applied to each observation before it is stored and given to the reward model: a key
    of a dict observation, a ``module:function`` path or a callable (DRLHP's
    ``obs_transform_func``; :func:`themis.environments.observations.make_obs_transform`); images
    are then made channels-first. The agent still gets the env's observation."""
    train_reward: bool = True
    """``False``: the labels are collected (``preferences/``) and no reward model is trained;
    the agent gets the env's reward, or a pretrained ``reward_model``'s r̂ (DRLHP's
    ``train_reward=False``)."""
    reward_checkpoint_interval: int = 0
    """Every this many trainings (model versions), and at the end, the reward model is also
    written to ``RUN_DIR/reward_predictor_checkpoints/reward_model.pt`` (DRLHP's
    ``reward_predictor_ckpt_interval``); 0: only ``checkpoints/reward_model.pt``, after every
    round."""
    resume: bool = False
    """Continue the learner of ``run_dir`` (its labels, model and counters)."""
    close_timeout: float = 120.0
    """Seconds :meth:`close` waits for the learner's final gather and save."""


ONLINE_NUMERIC: dict[str, Range] = {
    "n_initial_training_steps": NON_NEGATIVE,
    "close_timeout": Range(0, lo_open=True),
    "reward_checkpoint_interval": NON_NEGATIVE,
}
ONLINE_KEYS = tuple(f.name for f in dataclasses.fields(OnlineKeys))


def _unknown(key: str) -> ConfigError:
    if (removed := removed_key(key) or foreign_key(key)) is not None:
        return ConfigError(removed)
    if key in DRLHP_KEYS:  # DRLHP's name: the Themis key, never a refused one
        return ConfigError(f"{key} is DRLHP's key, not the wrapper's: use {DRLHP_KEYS[key]} "
                           "(or themis.online.HumanPreferencesEnvWrapper, which takes DRLHP's "
                           "keys)")
    names = [name for name in schema_keys() + list(ONLINE_KEYS) + list(GROUP_KEYS)
             if name.split(".")[0] not in LOOP_KEYS]  # never suggest a key that is refused
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(f"{key} is not a Themis config key{hint}; ./themis_train.sh --help "
                       "lists them")


def _flat(keys: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"group": {"key": 4}}`` and ``{"group.key": 4}`` alike as dotted keys."""
    out: dict[str, Any] = {}
    for key, value in keys.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name != "env_kwargs":
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def _group_override(key: str, value: Any) -> str:
    if isinstance(value, list | tuple):
        return f"{key}=[{','.join(map(str, value))}]"
    return f"{key}={value}"


def online_config(keys: Mapping[str, Any], discrete: bool,
                  pretrained: Mapping[str, Any] | None = None,
                  saved: Path | None = None) -> tuple[TrainConfig, OnlineKeys]:
    """The run's config from the wrapper's keyword arguments, validated.

    Args:
        keys: the keyword arguments (``max_feedback=200``, ``method="NAME"``,
            ``NAME={"key": 4}`` or ``**{"NAME.key": 4}``, ``warmup_reward="true"``, ...).
        discrete: the env's actions are ``Discrete`` (methods that need SAC are refused).
        pretrained: the config of the ``reward_model`` file (its architecture is taken).
        saved: a resumed run's ``config.yaml``: its values, with ``keys`` on top.

    Returns:
        the Themis config and the wrapper's own keys.

    Raises:
        ConfigError: one line: an unknown key (with the closest one), a wrong type or value,
            a key of Themis's own loop, a method that works inside the agent.
    """
    flat = _flat(keys)
    groups = {k: flat.pop(k) for k in GROUP_KEYS if k in flat}
    own = {k: flat.pop(k) for k in ONLINE_KEYS if k in flat}
    for key in flat:
        top = key.split(".")[0]
        if top in LOOP_KEYS:
            raise ConfigError(f"{key} configures Themis's own training loop, not the wrapper "
                              f"({LOOP_KEYS[top]}); drop it")
    if "method" in groups:  # a method inside the agent: said before composing
        methods = groups["method"] if isinstance(groups["method"], list | tuple) \
            else [groups["method"]]
        refuse_inside_agent(list(map(str, methods)), "wrapper")
    try:
        cfg = compose([_group_override(k, v) for k, v in groups.items()])
        if saved is not None:
            from themis.run.received_config import check_received_settings, load_received_config

            received = load_received_config(saved)  # no address, path or tracker of its own
            check_received_settings(received, saved, given={*flat, *groups})
            cfg = OmegaConf.merge(cfg, received)  # type: ignore[assignment]
        OmegaConf.set_struct(cfg, True)
        for key, value in flat.items():
            if OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
                raise _unknown(key)
            OmegaConf.update(cfg, key, value, merge=False)
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "a value"
        raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # Hydra's composition errors (an unknown method or teacher name)
        text = str(e)
        if "Could not find '" in text:
            group, option = text.split("Could not find '")[1].split("'")[0].split("/", 1)
            raise ConfigError(f"{group}={option} is unknown") from None
        raise ConfigError(text.splitlines()[0]) from None
    assert isinstance(obj, TrainConfig)
    online = online_keys(own)
    # resolved once, as themis.run.resolve does: what the wrapper derives, in one replace
    frozen = online.reward_model is not None and obj.max_feedback == 0  # r̂ without queries
    try:  # the queries per round of reward_batch=auto (a pretrained model alone: none)
        batch = 1 if frozen else resolve_reward_batch(obj.reward_batch, obj.max_feedback)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    changes: dict[str, Any] = {
        # the wrapper has no pretraining and no end: the schedule keys it refuses are neutral
        "num_unsup_steps": 0, "num_train_steps": max(obj.num_train_steps,
                                                     obj.num_seed_steps + 1),
        "resume": None, "reward_batch": batch}
    if pretrained is not None:  # the pretrained model's architecture
        changes.update(ensemble_size=int(pretrained["ensemble_size"]),
                       reward_hidden_dim=int(pretrained["hidden_dim"]),
                       reward_hidden_depth=int(pretrained["hidden_depth"]))
    run_cfg = dataclasses.replace(obj, **changes)
    validate(run_cfg, agent="ppo" if discrete else None, where="wrapper", frozen_model=frozen)
    if run_cfg.vlm_teacher:  # its frames are the workspace's ring (themis/feedback/vlm.py)
        raise ConfigError("teacher=vlm runs in Themis's own loops (./themis_train.sh "
                          "teacher=vlm ...); the wrapper's background learner has no frames "
                          "for it yet")
    return run_cfg, online


def online_keys(own: Mapping[str, Any]) -> OnlineKeys:
    """The wrapper's own keys, checked.

    Raises:
        ConfigError: a value of the wrong type or outside its range.
    """
    out = OnlineKeys(**own)
    if out.warmup_reward not in WARMUP_REWARDS:
        raise ConfigError(f"warmup_reward={out.warmup_reward} is unknown; use zero (0 until the "
                          "first reward model) or true (the env's reward until then)")
    for key, allowed in ONLINE_NUMERIC.items():
        value = getattr(out, key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}={value!r} must be a number")
        if not allowed.holds(value):
            raise ConfigError(f"{key}={value} {allowed.rule(value)}")
    if not isinstance(out.n_initial_training_steps, int):
        raise ConfigError(f"n_initial_training_steps={out.n_initial_training_steps} must be an "
                          "integer")
    if not isinstance(out.reward_checkpoint_interval, int):
        raise ConfigError(f"reward_checkpoint_interval={out.reward_checkpoint_interval} must be "
                          "an integer")
    for key in ("normalize_reward", "resume", "train_reward"):
        if not isinstance(getattr(out, key), bool):
            raise ConfigError(f"{key}={getattr(out, key)!r} must be true or false")
    if out.obs_transform is not None and not (isinstance(out.obs_transform, str)
                                              or callable(out.obs_transform)):
        raise ConfigError(f"obs_transform={out.obs_transform!r} must be a key of the dict "
                          "observation, a module:function or a callable")
    if out.reward_model is not None:
        out.reward_model = str(out.reward_model)
    return out


def saved_keys(online: OnlineKeys) -> dict[str, Any]:
    """The wrapper's keys as written to ``online.yaml`` (a callable transform by name)."""
    values = dataclasses.asdict(online)
    transform: Callable[..., Any] | str | None = online.obs_transform
    if callable(transform):
        values["obs_transform"] = getattr(transform, "__qualname__", repr(transform))
    values.pop("resume")
    return values


__all__ = ["DRLHP_KEYS", "LOOP_KEYS", "OnlineKeys", "online_config", "online_keys", "saved_keys"]
