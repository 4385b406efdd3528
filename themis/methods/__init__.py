"""PEBBLE's successors as mechanisms on the one preference-learning component.

Each mechanism is one small object the learner, the reward trainer or the SAC loop calls; a
method switches its mechanisms on (``config/method/*.yaml``, a Hydra config group that can
select several: ``method=[surf,rune]``):

============  =========================================  ======================================
method        mechanism (module)                         acts in
============  =========================================  ======================================
``surf``      :class:`~themis.methods.surf.PseudoLabeler`   reward training: pseudo-labelled
              + :class:`~themis.methods.crop.TemporalCrop`  unlabelled pairs, cropped segments
``rune``      :class:`~themis.methods.rune.UncertaintyBonus` the agent's reward: r̂ + β_t·std
``qpa``       query pool of the last episodes (selector),   queries, SAC batches, reward
              :class:`~themis.methods.qpa.HybridReplay`,    training
              :class:`~themis.methods.crop.TemporalCrop`
``rime``      :class:`~themis.methods.rime.RobustLabelFilter` reward training: keep / drop / flip
              + :class:`~themis.methods.rime.WarmStart`      each label; pretraining warm start
``mrn``       :class:`~themis.methods.mrn.MetaRewardUpdate`  the reward model, every
                                                            ``meta_steps``: a bilevel step
                                                            through the critic (SAC loop)
``pebble``    none (the default)
============  =========================================  ======================================

:func:`active_methods` names what a config switches on; :func:`check_methods` rejects
combinations that cannot run, before training.
"""

from __future__ import annotations

from typing import Any

from themis.utils import ConfigError

METHODS = ("surf", "rune", "qpa", "rime", "mrn")


def active_methods(cfg: Any) -> list[str]:
    """The methods a config switches on (``surf.enabled`` ...), or ``["pebble"]``."""
    return [m for m in METHODS if getattr(cfg, m).enabled] or ["pebble"]


def method_title(cfg: Any) -> str:
    """``PEBBLE``, ``SURF``, ``SURF+RUNE`` ... for banners and plot titles."""
    return "+".join(m.upper() for m in active_methods(cfg))


def check_methods(cfg: Any, discrete: bool | None = None) -> None:
    """Combinations that cannot run, as one line.

    Args:
        cfg: the composed config.
        discrete: the env's action space is discrete (PPO), when known.

    Raises:
        ConfigError: RUNE with one ensemble member (no std), an uncertainty sampler with one
            member, QPA or MRN with PPO (QPA's hybrid replay mixes SAC batches, MRN steps
            through SAC's critic), RIME from a ``pretrained_snapshot`` (which has no
            warm-started reward model), or crops longer than the segments. (Each
            hyperparameter's own range is checked by :func:`themis.config.check_numbers`.)
    """
    methods = active_methods(cfg)
    uncertainty = str(cfg.feed_type) not in ("0", "uniform")
    if "rune" in methods and cfg.ensemble_size < 2:
        raise ConfigError("method=rune adds beta * the ensemble's std of r̂: it needs "
                          f"ensemble_size >= 2 (got {cfg.ensemble_size})")
    if cfg.ensemble_size < 2 and uncertainty:
        raise ConfigError(f"feed_type={cfg.feed_type} ranks queries by ensemble disagreement, "
                          f"which needs ensemble_size >= 2 (got {cfg.ensemble_size})")
    if "qpa" in methods and (discrete or cfg.agent == "ppo"):
        raise ConfigError("method=qpa mixes recent episodes into SAC's replay batches; PPO "
                          "trains on fresh rollouts only: use it with SAC (Box actions)")
    if "rime" in methods and cfg.pretrained_snapshot and cfg.rime.warm_start_steps:
        raise ConfigError("method=rime warm-starts the reward model during pretraining, and "
                          "a pretraining snapshot keeps no reward model: drop "
                          "pretrained_snapshot (RIME pretrains itself), or set "
                          "rime.warm_start_steps=0 to start from it without the warm start")
    if "mrn" in methods and (discrete or cfg.agent == "ppo"):
        raise ConfigError("method=mrn trains the reward model through one step of SAC's "
                          "critic; PPO has no Q-function: use it with SAC (Box actions)")
    if "surf" in methods and (cfg.surf.crop_range < 0 or 2 * cfg.surf.crop_range >= cfg.segment):
        raise ConfigError(f"surf.crop_range={cfg.surf.crop_range} must be >= 0 and leave "
                          f"segments of at least one step (segment={cfg.segment})")
    if cfg.qpa.data_aug_ratio < 0:
        raise ConfigError(f"qpa.data_aug_ratio={cfg.qpa.data_aug_ratio} must be >= 0 "
                          "(0: no crops)")
    if "qpa" in methods and cfg.qpa.data_aug_ratio and cfg.segment <= 15:
        raise ConfigError(f"method=qpa crops segments to segment-15..segment-5 steps: "
                          f"segment={cfg.segment} is too short (at least 16)")


__all__ = ["METHODS", "active_methods", "check_methods", "method_title"]
