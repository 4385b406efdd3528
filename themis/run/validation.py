"""Validation of a composed run config: values and combinations Hydra's type checks cannot see.

:data:`NUMERIC_KEYS` gives every number its range; :func:`validate` checks a whole config and
raises :class:`themis.utils.ConfigError` with one line naming the key, the problem and the fix
(the launchers print it and exit 2 before anything runs).
"""

from __future__ import annotations

import sys
from typing import Any

from themis.agents.intrinsic import SCALES
from themis.core.precision import PRECISIONS
from themis.core.ranges import (
    BATCH,
    DEPTH,
    ENVS,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_REAL,
    UNIT,
    WIDTH,
    Range,
)
from themis.core.run_keys import RANGES
from themis.crowd.aggregation import check_crowd
from themis.feedback.rating import check_rating
from themis.feedback.sampling import resolve_feed_type
from themis.feedback.selector import resolve_reward_batch
from themis.feedback.teachers import validate_teacher_params
from themis.feedback.vlm import check_vlm
from themis.methods.registry import check_methods, numeric_keys
from themis.reward.networks import REWARD_NETS
from themis.reward.schedule import REWARD_SCHEDULES
from themis.run.config import TrainConfig, frame_capacity, resume_target
from themis.run.threads import parse_threads
from themis.utils import ConfigError

AGENTS = ("auto", "sac", "ppo", "a2c")


# ---------------------------------------------------------------- numeric keys: one table
NUMERIC_KEYS: dict[str, Range] = {
    **RANGES,  # the flat keys' (themis.core.run_keys)
    "logger.clips": NON_NEGATIVE, "logger.finish_timeout": POSITIVE,
    # agents
    "sac.hidden_dim": WIDTH, "sac.hidden_depth": DEPTH, "sac.batch_size": BATCH,
    "sac.discount": UNIT, "sac.actor_lr": POSITIVE_REAL, "sac.critic_lr": POSITIVE_REAL,
    "sac.alpha_lr": POSITIVE_REAL, "sac.init_temperature": POSITIVE_REAL,
    "sac.critic_tau": Range(0, 1, lo_open=True), "sac.actor_update_frequency": POSITIVE,
    "sac.critic_target_update_frequency": POSITIVE, "sac.log_std_min": Range(),
    "sac.log_std_max": Range(),
    "ppo.hidden_dim": WIDTH, "ppo.hidden_depth": DEPTH, "ppo.num_envs": ENVS,
    "ppo.num_steps": POSITIVE, "ppo.learning_rate": POSITIVE_REAL, "ppo.gamma": UNIT,
    "ppo.gae_lambda": UNIT, "ppo.num_minibatches": POSITIVE, "ppo.update_epochs": POSITIVE,
    "ppo.clip_coef": POSITIVE_REAL, "ppo.ent_coef": NON_NEGATIVE, "ppo.vf_coef": NON_NEGATIVE,
    "ppo.max_grad_norm": POSITIVE_REAL,
    "a2c.hidden_dim": WIDTH, "a2c.hidden_depth": DEPTH, "a2c.num_envs": ENVS,
    "a2c.num_steps": POSITIVE, "a2c.learning_rate": POSITIVE_REAL, "a2c.gamma": UNIT,
    "a2c.gae_lambda": UNIT, "a2c.ent_coef": NON_NEGATIVE, "a2c.vf_coef": NON_NEGATIVE,
    "a2c.max_grad_norm": POSITIVE_REAL, "a2c.rms_alpha": Range(0, 1, hi_open=True),
    "a2c.rms_eps": POSITIVE_REAL, "a2c.num_minibatches": POSITIVE,
}
"""Every numeric key of the train/pretrain config and its method and agent groups, with the
values it takes (``reward_batch`` once ``auto`` is resolved; ``feed_type`` is a name or code,
checked by :func:`themis.feedback.sampling.resolve_feed_type`). A key of ``None`` (a default left to
Themis) is not checked."""
NUMERIC_KEYS.update(numeric_keys())  # each method's own keys (its RANGES)



def check_numbers(cfg: TrainConfig, resolved: dict[str, Any] | None = None) -> None:
    """Every key of :data:`NUMERIC_KEYS`: finite (no NaN, no inf) and inside its range, and the
    numeric combinations that must hold (``sac.log_std_min < sac.log_std_max``, a PPO rollout
    that fills its minibatches). ``resolved``: values to check instead of ``cfg``'s (the
    ``reward_batch`` an ``auto`` stands for).

    Raises:
        ConfigError: ``KEY=VALUE`` and the rule it breaks, for the first key that breaks one.
    """
    for key, allowed in NUMERIC_KEYS.items():
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        value = (resolved or {}).get(key, value)
        if value is not None and not allowed.holds(value):
            raise ConfigError(f"{key}={value} {allowed.rule(value)}")
    if cfg.sac.log_std_min >= cfg.sac.log_std_max:
        raise ConfigError(f"sac.log_std_min={cfg.sac.log_std_min} must be smaller than "
                          f"sac.log_std_max={cfg.sac.log_std_max}")
    if cfg.ppo.num_minibatches > cfg.ppo.num_envs * cfg.ppo.num_steps:
        raise ConfigError(f"ppo.num_minibatches={cfg.ppo.num_minibatches} is more than the "
                          f"{cfg.ppo.num_envs * cfg.ppo.num_steps} transitions of a rollout "
                          "(ppo.num_envs * ppo.num_steps)")


QUERY_SCHEDULES = ("constant", "decay", "continuous")


def check_recipe(cfg: TrainConfig) -> None:
    """DRLHP's keys (``reward_val_fraction`` ... ``query_schedule``): combinations that do
    something.

    Raises:
        ConfigError: an unknown ``query_schedule``, an adaptive L2 without held-out labels, or
            a pairwise-only key with ``feedback=rating``.
    """
    if cfg.query_schedule not in QUERY_SCHEDULES:
        raise ConfigError(f"query_schedule={cfg.query_schedule} is unknown; use "
                          f"{', '.join(QUERY_SCHEDULES[:-1])} or {QUERY_SCHEDULES[-1]}")
    if cfg.reward_net not in REWARD_NETS:
        raise ConfigError(f"reward_net={cfg.reward_net} is unknown; use one of "
                          f"{', '.join(REWARD_NETS)}")
    if cfg.reward_schedule not in REWARD_SCHEDULES:
        raise ConfigError(f"reward_schedule={cfg.reward_schedule} is unknown; use "
                          f"{' or '.join(REWARD_SCHEDULES)}")
    if cfg.reward_schedule == "passes" and cfg.feedback == "rating":
        raise ConfigError("reward_schedule=passes trains Bradley–Terry minibatches of pairs; "
                          "feedback=rating trains per round: drop one of them")
    if cfg.reward_adaptive_l2 and not (cfg.reward_val_fraction or cfg.reward_bootstrap):
        raise ConfigError("reward_adaptive_l2=true adapts the L2 coefficient to the validation "
                          "loss: validate each member on its out-of-bag labels with "
                          "reward_bootstrap=true (DRLHP), or hold labels out with "
                          "reward_val_fraction")
    if cfg.feedback == "rating":
        pairwise = [key for key in ("reward_val_fraction", "reward_random_response",
                                    "reward_bootstrap", "reward_l2", "reward_adaptive_l2")
                    if getattr(cfg, key)]
        if pairwise:
            raise ConfigError(f"{pairwise[0]} is a key of pairwise preferences; "
                              "feedback=rating does not use it: drop it")


REWARD_TRAININGS = ("sync", "async")


def check_reward_training(cfg: TrainConfig, where: str = "loop") -> None:
    """``reward_training``: sync or async; what async cannot do is refused (``where``: as
    :func:`validate`'s; the wrapper's learner is always in the background).

    Raises:
        ConfigError: one line: an unknown value, or with async: no learned reward, a resume,
            a method or option that needs the agent inside the learner (a method's
            ``inside_agent`` or its own async rule, explanations).
    """
    if cfg.reward_training not in REWARD_TRAININGS:
        raise ConfigError(f"reward_training={cfg.reward_training} is unknown; use sync or async")
    if cfg.reward_training == "sync":
        if cfg.query_schedule == "continuous" and where == "loop":
            raise ConfigError("query_schedule=continuous asks as fast as the teacher answers "
                              "while the agent keeps stepping: use reward_training=async (or "
                              "the wrapper); sync rounds come every num_interact steps")
        return
    why = None
    if not cfg.learn_reward:
        why = "learn_reward=false has no reward to learn"
    elif resume_target(cfg.resume) is not None and cfg.human_teacher:
        why = ("resume of an async run with people is not supported (their answers since the "
               "learner's last checkpoint would be asked again); start a new run with "
               "prefs_path=RUN_DIR/preferences to keep its labels")
        if cfg.teacher_ui == "web":  # preferences/ lacks the last answers
            run = cfg.resume if cfg.resume not in ("true", "True", True) else "RUN_DIR"
            why = (f"resume of an async run is not supported; every answer people gave is in "
                   f"its labels.sqlite (preferences/ may lack those since the last round): "
                   f"python scripts/store_to_prefs.py {run} DIR writes them all, and a new run "
                   "with prefs_path=DIR keeps them")
    elif cfg.xplain_action or cfg.xplain_state:
        why = "explained clips need the agent inside the learner process"
    if why is not None:
        raise ConfigError(f"reward_training=async: {why}; use reward_training=sync")
    check_methods(cfg, where="async")  # a method inside the agent, or its own async rule


def check_idle_keys(cfg: TrainConfig) -> None:
    """Keys that do nothing without the key they serve, refused as ``prefs_path`` without
    ``learn_reward`` is: ``teacher_ui=web`` without ``human_teacher=true`` (the synthetic
    teacher answers; no page is served), ``xplain_action_dim`` without ``xplain_action=true``
    (no action is explained).

    Raises:
        ConfigError: one line naming the key, the key it needs and the fix.
    """
    if cfg.teacher_ui == "web" and not cfg.human_teacher:
        raise ConfigError("teacher_ui=web needs human_teacher=true (without it the synthetic "
                          "teacher answers and no labeling page is served); add "
                          "human_teacher=true or drop teacher_ui")
    if cfg.xplain_action_dim != -1 and not cfg.xplain_action:
        raise ConfigError(f"xplain_action_dim={cfg.xplain_action_dim} needs xplain_action=true "
                          "(it chooses the action dimension explained); add xplain_action=true "
                          "or drop xplain_action_dim")


def validate(cfg: TrainConfig, agent: str | None = None, where: str = "loop",
             frozen_model: bool = False) -> None:
    """Check values and combinations Hydra's type checks cannot see.

    Args:
        cfg: a :class:`TrainConfig` (a composed ``DictConfig`` reads the same).
        agent: ``sac``, ``ppo`` or ``a2c`` where known before the env is made (the wrapper:
            from its env's actions); ``None``: from ``cfg.agent`` unless ``auto``
            (:func:`check_start` checks the agent the env chose).
        where: ``loop`` (Themis's loops; ``reward_training=async`` is checked as such) or
            ``wrapper`` (:class:`themis.PreferenceLearningWrapper`, whose learner always runs
            in the background).
        frozen_model: the wrapper's pretrained ``reward_model`` with ``max_feedback=0``: r̂
            without queries, so no query budget is needed.

    It assigns nothing: what is derived from the keys is computed once by
    :func:`themis.run.resolve.resolve` (the wrapper's by
    :func:`themis.online.keys.online_config`).

    Raises:
        ConfigError: with one line naming the key, the problem and the fix.
    """
    try:
        reward_batch = resolve_reward_batch(cfg.reward_batch, cfg.max_feedback)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        parse_threads(cfg.torch_threads)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.precision not in PRECISIONS:
        raise ConfigError(f"precision={cfg.precision} is not one of {', '.join(PRECISIONS)}")
    check_numbers(cfg, {"reward_batch": reward_batch})
    if cfg.num_seed_steps + cfg.num_unsup_steps >= cfg.num_train_steps:
        raise ConfigError(
            f"num_seed_steps + num_unsup_steps ({cfg.num_seed_steps + cfg.num_unsup_steps}) "
            f"must be smaller than num_train_steps ({cfg.num_train_steps})"
        )
    if cfg.learn_reward and not cfg.prefs_path and not frozen_model \
            and cfg.max_feedback < reward_batch:
        raise ConfigError(f"max_feedback={cfg.max_feedback} is smaller than "
                          f"reward_batch={reward_batch}; raise max_feedback")
    if cfg.pretrained_policy and cfg.pretrained_snapshot:
        raise ConfigError("pretrained_policy and pretrained_snapshot are both set: a snapshot "
                          "holds its own agent; drop one of them")
    if cfg.prefs_path and not cfg.learn_reward:
        raise ConfigError("prefs_path is set but learn_reward=false; drop one of them")
    try:
        resolve_feed_type(cfg.feed_type)
        validate_teacher_params(cfg.teacher_beta, cfg.teacher_gamma, cfg.teacher_eps_mistake,
                                cfg.teacher_eps_skip, cfg.teacher_eps_equal)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_methods(cfg, agent, where)
    if cfg.state_entropy_scale not in SCALES:
        raise ConfigError(f"state_entropy_scale={cfg.state_entropy_scale} is unknown; use "
                          f"{' or '.join(SCALES)}")
    if cfg.teacher_thres_schedule not in ("themis", "bpref"):
        raise ConfigError(f"teacher_thres_schedule={cfg.teacher_thres_schedule} is unknown; use "
                          "themis or bpref")
    if cfg.teacher_ui not in ("terminal", "web"):
        raise ConfigError(f"teacher_ui={cfg.teacher_ui} is unknown; use terminal or web")
    check_crowd(cfg)
    check_vlm(cfg)
    check_rating(cfg)
    check_reward_training(cfg, where)
    check_recipe(cfg)
    if cfg.human_teacher and cfg.teacher_ui == "web":
        from ipaddress import ip_address

        try:
            loopback = cfg.label_host == "localhost" or ip_address(cfg.label_host).is_loopback
        except ValueError:
            loopback = False
        if not loopback and cfg.labelers == 0:
            raise ConfigError(f"label_host={cfg.label_host} exposes the labeling page beyond "
                              "this machine: create labeler tokens with labelers=N")
        if cfg.labels_per_query > max(1, cfg.labelers) + int(cfg.vlm_teacher):
            raise ConfigError(f"labels_per_query={cfg.labels_per_query} needs at least that "
                              f"many labelers (labelers={cfg.labelers}"
                              + (" and the VLM" if cfg.vlm_teacher else "") + ")")
    if cfg.human_viewer not in ("auto", "system", "none"):
        raise ConfigError(f"human_viewer={cfg.human_viewer} is unknown; use auto, system or none")
    if cfg.xplain_baseline not in ("zeros", "mean"):
        raise ConfigError(f"xplain_baseline={cfg.xplain_baseline} is unknown; use zeros or mean")
    for key in ("human_teacher", "collect_prefs_only", "xplain_action", "xplain_state"):
        if getattr(cfg, key) and not cfg.learn_reward:
            raise ConfigError(f"{key}=true needs learn_reward=true (preferences are only asked "
                              "for a learned reward)")
    if cfg.human_teacher or cfg.vlm_teacher or cfg.xplain_action or cfg.xplain_state:
        if frame_capacity(cfg) < cfg.segment:
            raise ConfigError(f"human_frame_capacity={frame_capacity(cfg)} is smaller than "
                              f"segment={cfg.segment}: no clip could be shown")
        if cfg.human_teacher and cfg.teacher_ui == "terminal" and not cfg.human_piped \
                and not sys.stdin.isatty():
            raise ConfigError("human_teacher=true needs a terminal, but stdin is not a TTY; run "
                              "it in a terminal, or pipe answers on purpose with "
                              "human_piped=true")
    if cfg.agent not in AGENTS:
        raise ConfigError(f"agent={cfg.agent} is unknown; use one of {', '.join(AGENTS)}")
    check_idle_keys(cfg)


def check_start(cfg: TrainConfig, agent: str | None = None) -> None:
    """What the switched-on methods cannot start with, where a run learns it outside
    :func:`validate` (:func:`themis.run.resolve.resolve`): a ``pretrained_snapshot``, said
    before the snapshot is read (a method that warm-starts its own reward model), and the
    agent the env's action space chose (``agent=auto``: ``agent``).

    Raises:
        ConfigError: one line: what a method refuses.
    """
    check_methods(cfg, agent=agent)
