"""An offline run, top to bottom: dataset -> preference labels -> reward model -> relabelled
dataset -> IQL -> evaluation on the true reward.

The run folder is an online run's: ``config.yaml``, ``preferences/`` (the labels, saved the
moment they exist), ``reward.csv`` (one row per labelling round: labels, the reward model's
training and held-out accuracy), ``train.csv`` (IQL's losses every ``log_frequency`` steps),
``eval.csv`` (true returns every ``eval_frequency`` steps, and the normalised return when the
reference scores are known), ``checkpoints/`` (``reward_model.pt``: the Markovian ensemble, or
``preference_transformer.pt``: its config and weights, read back with
:func:`themis.reward.preference_transformer.model_from_state` after ``safe_load``;
``rewards.npy``: the relabelled rewards; ``state.pt``: IQL and the generators, written
atomically; ``agent.pt``: IQL's weights as :func:`themis.load_run` reads them).
A resumed run reads its labels, its relabelled rewards and IQL's last checkpoint, and continues
from that step; rows written after the checkpoint are dropped and written again.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from omegaconf import OmegaConf

from themis.agents.buffers import ReplayBufferSamples
from themis.agents.iql import IQL, IQLConfig, return_range_scale
from themis.core.precision import resolve_precision
from themis.feedback.sampling import resolve_feed_type
from themis.feedback.selector import QuerySelector
from themis.feedback.teachers import SyntheticTeacher
from themis.offline.config import OfflineConfig
from themis.offline.datasets import DatasetError, load_offline_dataset
from themis.offline.labels import load_label_file, margin, oracle_labels, teacher_labels
from themis.reward.dataset import PreferenceDataset
from themis.reward.ensemble import RewardEnsemble, save_reward_model
from themis.reward.preference_transformer import (
    PreferenceTransformer,
    PreferenceTransformerTrainer,
    state_dict_of,
)
from themis.reward.trainer import RewardTrainer
from themis.run.checkpoint import (
    load_checkpoint,
    rng_states,
    save_checkpoint,
    set_rng_states,
    truncate_csv,
)
from themis.run.evaluation import evaluation_row
from themis.run.logger import CSVLog
from themis.utils import ConfigError, get_device, save_durably, set_seed_everywhere

Console = Callable[[str], None]


class OfflineRun:
    """One offline run in ``run_dir`` (see the module docstring).

    Args:
        cfg: the run's keys (validated).
        run_dir: the run folder (created).
        console: where progress lines go.

    Raises:
        ConfigError: an unreadable or unusable dataset or label file, an env that cannot be
            made or does not fit the dataset (one line each), before any training.
    """

    def __init__(self, cfg: OfflineConfig, run_dir: Path, console: Console = print) -> None:
        self.cfg, self.run_dir, self.console = cfg, Path(run_dir), console
        self.ckpt_dir = self.run_dir / "checkpoints"
        torch.set_num_threads(cfg.torch_threads)
        set_seed_everywhere(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.device = get_device(cfg.device)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.data = load_offline_dataset(cfg.dataset, cfg.env or None)
        if not self.data.has_rewards and (cfg.reward == "true" or not cfg.labels):
            raise DatasetError(f"dataset={cfg.dataset} has no true rewards: give labels=FILE "
                               "(a teacher and reward=true need them)")
        self.imported: tuple[Any, np.ndarray] | None = None
        self.segment = cfg.segment  # a label file's own segment length, when it gives one
        if cfg.reward == "learned":  # what labelling needs, checked before any training
            if cfg.labels:
                self.imported = load_label_file(cfg.labels, self.data, cfg.segment)
                self.segment = int(self.imported[0].observations.shape[2])
            self.data.sample_segment_pairs(1, self.segment, np.random.default_rng(0))
        self.eval_env = self._eval_env()
        ref_min, ref_max = cfg.ref_min_score, cfg.ref_max_score
        self.ref = (ref_min if not math.isnan(ref_min) else self.data.meta.get("ref_min_score"),
                    ref_max if not math.isnan(ref_max) else self.data.meta.get("ref_max_score"))
        self.total_feedback = 0
        self.heldout_accuracy = math.nan

    def _eval_env(self) -> Any:
        """The evaluation env (``env=``, else the dataset's own id when it names no module to
        import), or ``None`` (no evaluation)."""
        from themis.environments.domains import make_env

        env_id = self.cfg.env or (self.data.env_id if self.data.env_id and ":" not in
                                  self.data.env_id else "")
        if not env_id:
            self.console("themis: no env= and the dataset names none: no evaluation episodes")
            return None
        try:
            env = make_env(self.cfg.domain, env_id, seed=self.cfg.seed + 10_000)
        except ConfigError:
            raise
        except Exception as e:  # gymnasium raises several types for an id it cannot make
            raise ConfigError(f"env={env_id} cannot be made ({str(e).splitlines()[0]})"
                              ) from None
        obs_dim = int(np.prod(env.observation_space.shape or (0,)))
        act_dim = int(np.prod(env.action_space.shape or (0,)))
        if (obs_dim, act_dim) != (self.data.obs_dim, self.data.action_dim):
            env.close()
            raise ConfigError(f"env={env_id} has observations of {obs_dim} and actions of "
                              f"{act_dim}; the dataset's are {self.data.obs_dim} and "
                              f"{self.data.action_dim}")
        return env

    # ------------------------------------------------------------------ reward
    def rewards(self) -> np.ndarray:
        """The per-step rewards IQL learns from ``(N,)``: the true ones, or r̂ (learned once,
        saved as ``checkpoints/rewards.npy`` and read back on resume)."""
        if self.cfg.reward == "true":
            return self.data.rewards
        saved = self.ckpt_dir / "rewards.npy"
        if saved.is_file():
            rewards = np.load(saved, allow_pickle=False)
            if rewards.shape == (self.data.num_steps,) and np.all(np.isfinite(rewards)):
                self.total_feedback = len(PreferenceDataset.load(self.run_dir / "preferences"))
                self.console(f"themis: relabelled rewards read from {saved}")
                return rewards
        rewards = self.learn_reward()
        tmp = saved.with_name("rewards.tmp.npy")
        np.save(tmp, rewards.astype(np.float32), allow_pickle=False)
        os.replace(tmp, saved)
        return rewards

    def learn_reward(self) -> np.ndarray:
        """Label, train the reward model, measure it on held-out pairs, relabel the dataset."""
        cfg, data = self.cfg, self.data
        log = CSVLog(self.run_dir / "reward.csv")
        heldout = data.sample_segment_pairs(cfg.heldout_queries, self.segment,
                                            np.random.default_rng(cfg.seed + 1)) \
            if cfg.heldout_queries and data.has_rewards else None
        prefs_dir = self.run_dir / "preferences"
        prefs = PreferenceDataset.load(prefs_dir) if (prefs_dir / "labels.csv").is_file() else \
            PreferenceDataset(cfg.max_feedback, self.segment, data.obs_dim, data.action_dim,
                              metadata={"dataset": cfg.dataset, "teacher": cfg.teacher})
        if cfg.reward_net == "pt":
            model = PreferenceTransformer(
                data.obs_dim, data.action_dim, prefs.segment, cfg.pt_embed_dim, cfg.pt_layers,
                cfg.pt_heads, cfg.pt_pref_attn_dim, cfg.pt_dropout).to(self.device)
            self._label(prefs, None, cfg.max_feedback)
            steps = cfg.pt_epochs * math.ceil(len(prefs) / cfg.pt_batch_size)
            pt = PreferenceTransformerTrainer(model, cfg.pt_lr, cfg.pt_weight_decay,
                                              cfg.pt_batch_size, steps, self.rng)
            self._round(log, prefs, lambda: pt.train(prefs, cfg.pt_epochs), pt.accuracy,
                        heldout)
            save_durably(state_dict_of(model), self.ckpt_dir / "preference_transformer.pt")
            return model.step_rewards(data.observations, data.actions, data.starts,
                                      data.lengths, prefs.segment)
        ensemble = RewardEnsemble(data.obs_dim, data.action_dim, cfg.ensemble_size,
                                  cfg.reward_hidden_dim, cfg.reward_hidden_depth).to(self.device)
        trainer = RewardTrainer(ensemble, cfg.reward_lr, cfg.reward_batch_size, self.rng)
        while True:  # rounds: pick with the current ensemble, label, train on every label
            asked = self._label(prefs, ensemble, cfg.reward_batch)
            self._round(log, prefs, lambda: trainer.train(prefs, cfg.reward_epochs),
                        trainer.accuracy, heldout)
            if not asked or self.total_feedback >= cfg.max_feedback:
                break
        save_reward_model(ensemble, self.ckpt_dir / "reward_model.pt")
        return ensemble.predict(data.observations, data.actions)

    def _label(self, prefs: PreferenceDataset, ensemble: RewardEnsemble | None,
               most: int) -> int:
        """Add up to ``most`` labelled queries (a label file's all at once); the number asked.
        Labels already in ``prefs`` (a resumed run) count towards ``max_feedback``."""
        cfg = self.cfg
        if self.total_feedback == 0 and len(prefs):  # a resumed run's labels
            self.total_feedback = len(prefs)
        if self.imported is not None:
            if len(prefs):
                return 0
            pairs, labels = self.imported
            prefs.add(pairs, labels, labeler=Path(cfg.labels).name)
            self.total_feedback = len(prefs)
            prefs.save(self.run_dir / "preferences")
            return 0
        k = min(most, cfg.max_feedback - self.total_feedback)
        if k <= 0:
            return 0
        teacher = SyntheticTeacher.from_preset(cfg.teacher, self.rng)
        teacher.set_margin(margin(self.data, self.segment))
        selector = QuerySelector(resolve_feed_type(cfg.feed_type), self.segment,
                                 cfg.large_batch, self.rng, obs_shape=(self.data.obs_dim,))
        pairs = selector.select(  # the first round (and Preference Transformer's) uniform
            self.data, k, cast(RewardEnsemble, ensemble), prefs.observations[:len(prefs)],
            first=ensemble is None or not len(prefs), min_episode=0)
        kept, labels = teacher_labels(pairs, teacher)
        if len(kept):
            prefs.add(kept, labels, labeler=cfg.teacher)
            prefs.save(self.run_dir / "preferences")
        self.total_feedback += k
        return k

    def _round(self, log: CSVLog, prefs: PreferenceDataset, train: Callable[[], Any],
               accuracy: Callable[..., float], heldout: Any) -> None:
        """Train the reward model on every label and write its ``reward.csv`` row."""
        start = time.perf_counter()
        stats = train() if len(prefs) else None
        if heldout is not None and stats is not None:
            self.heldout_accuracy = accuracy(heldout.observations, heldout.actions,
                                             oracle_labels(heldout))
        row = {"step": 0, "total_feedback": self.total_feedback, "labels": len(prefs),
               "train_accuracy": stats.accuracy if stats else math.nan,
               "loss": stats.loss if stats else math.nan, "epochs": stats.epochs if stats else 0,
               "heldout_accuracy": self.heldout_accuracy,
               "train_seconds": time.perf_counter() - start}
        log.write(row)
        self.console(f"themis: reward model ({self.cfg.reward_net}) on {len(prefs)} labels: "
                     f"train accuracy {row['train_accuracy']:.3f}, held-out "
                     f"{self.heldout_accuracy:.3f}")

    # -------------------------------------------------------------------- agent
    def run(self, until: int | None = None) -> dict[str, Any]:
        """Train IQL to ``num_train_steps`` (from the last checkpoint on resume), or stop after
        step ``until`` with a checkpoint there (as a stopped run would); returns the last
        ``eval.csv`` row (empty without an evaluation env or evaluation so far)."""
        cfg, data = self.cfg, self.data
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        rewards = self.rewards().astype(np.float32)
        scale = return_range_scale(data.episode_returns(rewards)) \
            if cfg.reward_scale == "return_range" else 1.0
        iql_cfg = cfg.iql if isinstance(cfg.iql, IQLConfig) else \
            IQLConfig(**OmegaConf.to_container(cfg.iql))  # type: ignore[arg-type]
        agent = IQL(data.obs_dim, data.action_dim, self.device, iql_cfg, cfg.num_train_steps,
                    self.precision)
        step = 0
        if (self.ckpt_dir / "state.pt").is_file():
            state, _ = load_checkpoint(self.ckpt_dir)
            agent.load_state_dict(state["agent"])
            step = int(state["step"])
            self.rng.bit_generator.state = state["generator"]
            set_rng_states(state["rng"])
            self.console(f"themis: resuming IQL at step {step}")
        for name in ("train.csv", "eval.csv"):
            truncate_csv(self.run_dir / name, step)
        train_log, eval_log = CSVLog(self.run_dir / "train.csv"), CSVLog(self.run_dir / "eval.csv")
        dev = self.device
        arrays = [torch.as_tensor(a, device=dev) for a in (
            data.observations, data.actions, data.next_observations, rewards * scale,
            1.0 - data.terminals.astype(np.float32))]
        last: dict[str, Any] = {}
        start = time.perf_counter()
        stop = cfg.num_train_steps if until is None else min(until, cfg.num_train_steps)
        while step < stop:
            idx = torch.as_tensor(self.rng.integers(0, data.num_steps, iql_cfg.batch_size),
                                  device=dev)
            metrics = agent.update(ReplayBufferSamples(*(a[idx] for a in arrays)), step)
            step += 1
            if step % cfg.log_frequency == 0:
                train_log.write({"step": step, **{k: float(v) for k, v in metrics.items()},
                                 "wall_seconds": time.perf_counter() - start})
            if step % cfg.eval_frequency == 0 or step == cfg.num_train_steps:
                last = self.evaluate(agent, step, eval_log) or last
            if step % cfg.checkpoint_frequency == 0 or step == stop:
                save_checkpoint({"agent": agent.state_dict(), "step": step,
                                 "generator": self.rng.bit_generator.state, "rng": rng_states()},
                                self.ckpt_dir)
        save_durably({"agent": agent.state_dict(), "step": step, "agent_kind": "iql",
                      "env": self.data.env_id or "", "finished": step == cfg.num_train_steps},
                     self.ckpt_dir / "agent.pt")  # the layout themis.load_run reads
        train_log.close()
        eval_log.close()
        if self.eval_env is not None:
            self.eval_env.close()
        return last

    def evaluate(self, agent: IQL, step: int, log: CSVLog) -> dict[str, Any]:
        """An ``eval.csv`` row: the true return of IQL's mean action, and the normalised return
        ``100 (R − ref_min) / (ref_max − ref_min)`` when both references are known."""
        if self.eval_env is None or self.cfg.num_eval_episodes == 0:
            return {}
        agent.train(False)
        row = evaluation_row(self.eval_env, lambda o: agent.act(np.asarray(o, np.float32)),
                             self.cfg.num_eval_episodes, self.cfg.seed + 10_000, step, 0,
                             {"total_feedback": self.total_feedback,
                              "heldout_accuracy": self.heldout_accuracy})
        agent.train(True)
        low, high = self.ref
        if low is not None and high is not None and high != low:
            row["normalised_return"] = 100.0 * (row["episode_reward"] - low) / (high - low)
        log.write(row)
        self.console(f"themis: step {step}: true return {row['episode_reward']:.1f}")
        return row
