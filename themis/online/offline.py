"""A reward model from a preferences folder alone, without any RL run (DRLHP's
``--just_pretrain`` workflow).

    from themis.online import train_reward_model

    model = train_reward_model("runs/collect/preferences", "runs/reward", reward_update=200)
    env = PreferenceLearningWrapper(gym.make(...), "runs/agent", reward_model="runs/reward",
                                    max_feedback=0)   # the agent learns from it, frozen

The reward ensemble, trainer and method pieces (crops, pseudo-labels, label
filter) are those of a run (:func:`themis.feedback.factory.make_learner`); the command is
``scripts/train_reward.py PREFS_DIR OUT_DIR [key=value ...]``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from themis.reward.dataset import PreferenceDataset
from themis.reward.ensemble import RewardEnsemble
from themis.utils import ConfigError


class _Console:
    def info(self, message: str, color: str | None = None) -> None:
        print(message, flush=True)


def train_reward_model(prefs_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                       **keys: Any) -> RewardEnsemble:
    """Train a reward ensemble on the labels of a preferences folder and save it as
    ``OUT_DIR/checkpoints/reward_model.pt`` (:func:`themis.load_reward_model` reads
    ``OUT_DIR``), with ``OUT_DIR/config.yaml``.

    Args:
        prefs_dir: a preference dataset (a run's ``preferences/``, ``scripts/merge_prefs.py``).
        out_dir: where the model goes (created).
        **keys: ``./themis_train.sh`` keys of the reward model and its training
            (``ensemble_size``, ``reward_hidden_dim``, ``reward_update`` (epochs at most),
            ``reward_lr``, ``method=NAME``, ``seed``, ...).

    Returns:
        the trained model (eval mode, CPU or ``device``).

    Raises:
        ConfigError: one line: no dataset at ``prefs_dir``, an empty one, or a bad key.
    """
    from omegaconf import OmegaConf

    from themis.feedback.factory import make_learner
    from themis.online.keys import online_config
    from themis.online.learner_process import EnvSpec, ProcessWorkspace
    from themis.reward.ensemble import save_reward_model

    try:
        data = PreferenceDataset.load(Path(prefs_dir))
    except (FileNotFoundError, ValueError) as e:  # the message names the folder
        raise ConfigError(str(e)) from None
    if len(data) == 0:
        raise ConfigError(f"{prefs_dir} holds no labelled pair")
    cfg, _ = online_config({**keys, "prefs_path": str(prefs_dir), "max_feedback": 0,
                            "segment": data.segment}, discrete=False)
    shape = data.metadata.get("obs_shape") or [data.obs_dim]
    if not (isinstance(shape, list | tuple) and shape and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)
            and int(np.prod(shape)) == data.obs_dim):
        raise ConfigError(f"{prefs_dir}: meta.json obs_shape={shape!r} is not a list of sizes "
                          f"of obs_dim={data.obs_dim} features")
    shape = tuple(shape)
    if data.observations.dtype.kind not in "fiub":
        raise ConfigError(f"{prefs_dir}: observations are {data.observations.dtype}, not numbers")
    spec = EnvSpec(str(data.metadata.get("env", "unknown")), shape, data.observations.dtype.name,
                   data.action_dim, False, None, capacity=data.segment)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file there, or no permission
        raise ConfigError(f"{out} cannot be the output folder ({e.strerror or e})") from None
    space = ProcessWorkspace(cfg, spec, out, _Console())
    learner = make_learner(cfg, space.spec())
    learner.fit_saved_labels(str(prefs_dir))
    (out / "checkpoints").mkdir(exist_ok=True)
    path = save_reward_model(learner.model, out / "checkpoints" / "reward_model.pt",
                             env=spec.env_id, labels=len(learner.dataset),
                             train_accuracy=float(np.nan_to_num(learner.reward_accuracy)))
    (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    print(f"reward model written to {path}", flush=True)
    return learner.model.eval()


__all__ = ["train_reward_model"]
