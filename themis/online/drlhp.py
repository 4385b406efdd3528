"""DRLHP's env wrapper API on Themis: :class:`HumanPreferencesEnvWrapper`.

A user of the DRLHP refactor (``from drlhp import HumanPreferencesEnvWrapper``;
HumanCompatibleAI/learning-from-human-preferences, ``drlhp/HumanPreferencesEnvWrapper.py`` and
its README's Workflows) keeps their code: the same class name, keyword arguments, attribute
``using_reward_from_predictor`` and methods (``save_prefs``, ``switch_to_true_reward``,
``switch_to_predicted_reward``), mapped onto :class:`themis.online.PreferenceLearningWrapper`
and its keys (:data:`DRLHP_TO_THEMIS`). Themis's own keys may be given beside them.

What differs, on purpose:

- ``n_initial_training_steps`` counts passes over the labels so far, as DRLHP's training steps
  (``RewardPredictorEnsemble.train``: one epoch over its training database; default 50, as
  DRLHP's): until the model has had that many, the learner trains one more pass whenever it is
  idle and publishes each, so r̂ is returned soon after the first preferences (Themis's
  rounds alone train up to ``reward_update`` epochs each, one round every ``num_interact``
  steps); ``reward_predictor_ckpt_interval`` counts published model versions;
- preferences are saved in Themis's pickle-free format, ``LOG_DIR/train_prefs/`` and
  ``LOG_DIR/val_prefs/`` (DRLHP: ``train.pkl.gz`` / ``val.pkl.gz``); DRLHP's own pickles are
  refused with one line, never unpickled (a pickle runs code of the sender's choosing);
- the reward checkpoint is ``LOG_DIR/reward_predictor_checkpoints/reward_model.pt`` (a
  PyTorch state dict loaded with ``weights_only``), not a TensorFlow checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym

from themis.online.saved_prefs import VAL_FRACTION, split_prefs
from themis.online.wrapper import PreferenceLearningWrapper
from themis.utils import ConfigError

DRLHP_TO_THEMIS = {
    "segment_length": "segment",
    "obs_transform_func": "obs_transform",
    "max_prefs_in_db": "max_feedback",
    "reward_predictor_ckpt_interval": "reward_checkpoint_interval",
    "n_initial_prefs": "first_round_queries",
}
"""DRLHP keyword arguments that are a Themis key under another name."""

REFUSED = {
    "reward_predictor_network": "Themis builds r̂ from its keys (reward_net: bpref, drlhp, "
                                "drlhp_dot, drlhp_dot_onehot; reward_hidden_dim, "
                                "reward_hidden_depth)",
    "mp_context": "Themis starts its learner process itself (forkserver, else spawn)",
    "reward_predictor_refresh_interval": "the wrapper takes every new model version at once",
    "reward_database_refresh_interval": "every label enters training as soon as it is "
                                        "gathered",
    "validation_interval": "validation numbers go to reward.csv every round "
                           "(reward_val_fraction)",
    "max_pref_interface_segs": "queries come from the last query_pool_episodes episodes",
    "zoom_ratio": "clips are rendered at human_frame_size",
    "channels": "clips are rendered from env.render(), not from observations",
    "env_wrapper_log_level": "Themis writes console lines and CSVs; no logging levels",
    "reward_predictor_log_level": "Themis writes console lines and CSVs; no logging levels",
    "pref_interface_log_level": "Themis writes console lines and CSVs; no logging levels",
}
"""DRLHP keyword arguments without a Themis equivalent, and what to do instead."""

def prefs_folder(prefs_dir: str | os.PathLike[str], log_dir: Path) -> str:
    """The Themis preferences folder that DRLHP's ``prefs_dir`` names: the folder itself (it
    holds ``meta.json``), a run or log dir's ``preferences/`` (every label), or the
    ``train_prefs/`` and ``val_prefs/`` of :meth:`HumanPreferencesEnvWrapper.save_prefs`
    (merged into ``LOG_DIR/loaded_prefs/``).

    Raises:
        ConfigError: one line: DRLHP's pickled ``train.pkl.gz`` / ``val.pkl.gz`` (refused, never
            unpickled), or no preferences there.
    """
    from themis.reward import PreferenceDataset

    folder = Path(prefs_dir)
    if (folder / "meta.json").is_file():
        return str(folder)
    if (folder / "preferences" / "meta.json").is_file():
        return str(folder / "preferences")
    train, val = folder / "train_prefs", folder / "val_prefs"
    if (train / "meta.json").is_file():
        try:
            data = PreferenceDataset.load(train)
            if (val / "meta.json").is_file():
                other = PreferenceDataset.load(val)
                data.reserve(len(data) + len(other))
                data.extend(other)
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"prefs_dir={prefs_dir}: {e}") from None
        merged = log_dir / "loaded_prefs"
        data.save(merged)
        return str(merged)
    pickles = [name for name in ("train.pkl.gz", "val.pkl.gz") if (folder / name).exists()]
    if pickles:
        raise ConfigError(f"prefs_dir={prefs_dir} holds DRLHP's {' and '.join(pickles)}: pickles, "
                          "which can run any code when read, so Themis never opens them; collect "
                          "the preferences again (save_prefs writes train_prefs/ and val_prefs/)")
    raise ConfigError(f"prefs_dir={prefs_dir}: no preferences there (expected a preferences "
                      "folder, a run dir, or the train_prefs/ and val_prefs/ of save_prefs)")


def reward_model_path(path: str | os.PathLike[str]) -> str:
    """DRLHP's ``pretrained_reward_predictor_dir``: a ``reward_predictor_checkpoints/`` folder
    (its ``reward_model.pt``), a run dir, or a ``reward_model.pt`` file."""
    folder = Path(path)
    if (folder / "reward_model.pt").is_file():
        return str(folder / "reward_model.pt")
    return str(path)


class HumanPreferencesEnvWrapper(PreferenceLearningWrapper):
    """DRLHP's ``HumanPreferencesEnvWrapper`` (Christiano et al. 2017; the refactor of
    mrahtz/learning-from-human-preferences by HumanCompatibleAI) on Themis's
    :class:`themis.online.PreferenceLearningWrapper`: the same keyword arguments and
    workflows (its README's Workflows run as written there).

    Args:
        env: the environment (a ``gymnasium.Env``: pixels of any layout, vectors, or a dict
            with ``obs_transform_func``).
        train_reward: train a reward model (``False``: labels are only collected; the agent
            gets the env's reward, or the pretrained model's r̂).
        collect_prefs: ask for preferences (``False``: ``max_feedback=0``, no queries).
        segment_length: steps per segment (Themis ``segment``; DRLHP: 40).
        prefs_dir: preferences to train from (:func:`prefs_folder`; DRLHP's pickles refused).
        log_dir: the run dir (``reward.csv``, ``preferences/``, ``train_prefs/``,
            ``val_prefs/``, ``reward_predictor_checkpoints/``; DRLHP: ``drlhp_logs/``).
        max_prefs_in_db: the query budget (Themis ``max_feedback``; default Themis's 1000).
        obs_transform_func: applied to each observation before it is stored and given to the
            reward model (Themis ``obs_transform``: a callable, a dict key or
            ``module:function``).
        n_initial_training_steps: passes over the labels (DRLHP's training steps) before the
            returned reward is r̂ (see the module docstring; a pretrained or a ``prefs_dir``
            model is used at once when no preferences are collected).
        pretrained_reward_predictor_dir: a ``reward_predictor_checkpoints/`` folder, a run dir
            or a ``reward_model.pt`` (Themis ``reward_model``).
        reward_predictor_ckpt_interval: write the model to
            ``log_dir/reward_predictor_checkpoints/reward_model.pt`` every this many trainings
            (and at the end).
        synthetic_prefs: a synthetic teacher (the env's reward; ``False``: a person, in the
            terminal or, with ``teacher_ui="web"``, on the labeling page);
            ``synthetic_preferences`` (the README's spelling) is the same key.
        **keys: Themis keys (:class:`themis.online.PreferenceLearningWrapper`), e.g.
            ``teacher_ui="web"``, ``num_seed_steps``, ``reward_batch``.

    Raises:
        ConfigError: one line: a DRLHP key with no Themis equivalent (what to use instead),
            an unknown key, DRLHP's pickled preferences, a bad value.
    """

    def __init__(self, env: gym.Env, train_reward: bool = True, collect_prefs: bool = True,
                 segment_length: int = 40, prefs_dir: str | None = None,
                 log_dir: str = "drlhp_logs/", n_initial_training_steps: int = 50,
                 pretrained_reward_predictor_dir: str | None = None,
                 reward_predictor_ckpt_interval: int = 10, synthetic_prefs: bool = True,
                 **keys: Any) -> None:
        for key in keys:
            if key in REFUSED:
                raise ConfigError(f"{key} (DRLHP) has no Themis equivalent: {REFUSED[key]}")
        if "synthetic_preferences" in keys:  # the README's spelling of synthetic_prefs
            synthetic_prefs = bool(keys.pop("synthetic_preferences"))
        for drlhp, themis in DRLHP_TO_THEMIS.items():
            if drlhp in keys:
                keys[themis] = keys.pop(drlhp)
        run_dir = Path(log_dir)
        collecting = bool(collect_prefs)
        mapped: dict[str, Any] = {"segment": segment_length,
                                  "n_initial_training_steps": n_initial_training_steps,
                                  "reward_checkpoint_interval": reward_predictor_ckpt_interval,
                                  "train_reward": bool(train_reward)}
        if not synthetic_prefs:
            mapped["human_teacher"] = True
        if pretrained_reward_predictor_dir is not None:
            mapped["reward_model"] = reward_model_path(pretrained_reward_predictor_dir)
        if prefs_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            mapped["prefs_path"] = prefs_folder(prefs_dir, run_dir)
        if not collecting:
            mapped["max_feedback"] = 0
            if not train_reward and pretrained_reward_predictor_dir is None:
                raise ConfigError("collect_prefs=False, train_reward=False without "
                                  "pretrained_reward_predictor_dir: nothing to learn and no "
                                  "reward model to use")
            if train_reward and prefs_dir is None and pretrained_reward_predictor_dir is None:
                raise ConfigError("collect_prefs=False, train_reward=True needs prefs_dir "
                                  "(the preferences to train from)")
            # the one model there is (saved preferences or pretrained) is used at once
            mapped["n_initial_training_steps"] = 1
        super().__init__(env, run_dir, **{**mapped, **keys})

    @property
    def using_reward_from_predictor(self) -> bool:
        """True while a step returns r̂ (DRLHP's flag), False for the env's or the warm-up
        reward."""
        self.core.refresh()
        return self.using_predicted_reward

    def save_prefs(self) -> dict[str, int]:
        """Write the preferences so far to ``log_dir/train_prefs/`` and
        ``log_dir/val_prefs/`` (DRLHP: ``train.pkl.gz`` and ``val.pkl.gz``; here Themis's
        pickle-free format, which ``prefs_dir=log_dir`` or ``prefs_path`` reads back), once
        the learner has them.

        Returns:
            ``{"train": n, "val": m}``: the preferences in each.
        """
        counts = self.core.save_prefs(self.online_keys.close_timeout)
        print(f"Saved {counts['train']} training preferences to "
              f"'{self.core.run_dir / 'train_prefs'}' and {counts['val']} validation "
              f"preferences to '{self.core.run_dir / 'val_prefs'}'", flush=True)
        return counts


__all__ = ["DRLHP_TO_THEMIS", "VAL_FRACTION", "HumanPreferencesEnvWrapper", "prefs_folder",
           "split_prefs"]
