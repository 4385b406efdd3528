"""Look inside a learned reward: reward curves, gridworld heatmaps and a one-page run report.

Reward curves (the reward-interpretability practice of comparing learned and true reward along
trajectories): the learned reward is only defined up to a positive affine map (Bradley–Terry is
invariant to shifts, and the ensemble's scale is arbitrary), so each curve is aligned to the true
reward by least squares, ``true ≈ a · r̂ + b`` (:func:`affine_alignment`), before plotting;
Pearson and Spearman correlations are unaffected by the alignment.

Gridworld heatmaps (MiniGrid/BabyAI): the learned reward of stepping into each cell — the agent
placed on a neighbouring cell, facing it, taking ``forward`` — per direction or averaged, next to
the true reward of the same step (:func:`grid_reward_maps`).

    from themis.interpret.inspection import inspect_run
    inspect_run("runs/2026-11-23/10-00-00_train_HalfCheetah-v5")   # writes report/report.md
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from themis.core.figures import pyplot, save_figure
from themis.crowd.audit_report import labels_section
from themis.run.logger import plot_learning_curve
from themis.utils import eval_mode


class RewardModel(Protocol):
    """What the inspection needs of a reward model (:class:`themis.reward.RewardEnsemble`)."""

    def predict_members(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray: ...


# ------------------------------------------------------------------------ curves
def affine_alignment(predicted: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    """Least-squares ``(a, b)`` minimising ``||a · predicted + b − true||²``.

    Shapes: ``predicted``, ``true`` ``(T,)``. A constant prediction gets ``a = 0`` and ``b`` the
    mean true reward.
    """
    p = np.asarray(predicted, dtype=np.float64)
    t = np.asarray(true, dtype=np.float64)
    var = p.var()
    if var < 1e-12:
        return 0.0, float(t.mean())
    a = float(((p - p.mean()) * (t - t.mean())).mean() / var)
    return a, float(t.mean() - a * p.mean())


def correlations(predicted: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    """Pearson and Spearman correlation (NaN when either input is constant)."""
    if len(true) < 3 or np.ptp(true) == 0 or np.ptp(predicted) == 0:
        return float("nan"), float("nan")
    return (float(scipy_stats.pearsonr(predicted, true).statistic),
            float(scipy_stats.spearmanr(predicted, true).statistic))


@dataclass
class RewardCurve:
    """One episode's true and learned rewards.

    Attributes:
        policy: ``"agent"`` or ``"random"``.
        true: ``(T,)`` true rewards.
        members: ``(E, T)`` learned rewards of each ensemble member.
        aligned: ``(T,)`` ensemble mean mapped by the affine alignment to the true reward.
        spread: ``(T,)`` member standard deviation, in the aligned scale.
        pearson, spearman: correlation of the ensemble mean with the true reward.
    """

    policy: str
    true: np.ndarray
    members: np.ndarray
    aligned: np.ndarray
    spread: np.ndarray
    pearson: float
    spearman: float


def reward_curve(policy: str, true: np.ndarray, members: np.ndarray) -> RewardCurve:
    """Align and score one episode (``true (T,)``, ``members (E, T)``)."""
    mean = members.mean(0)
    a, b = affine_alignment(mean, true)
    pearson, spearman = correlations(mean, true)
    return RewardCurve(policy, true, members, a * mean + b, abs(a) * members.std(0), pearson,
                       spearman)


def rollout(env: gym.Env, act: Callable[[np.ndarray], Any], action_vector: Callable[[Any],
            np.ndarray], seed: int, max_steps: int = 1000) -> tuple[np.ndarray, ...]:
    """One episode: ``(observations (T, ...), action vectors (T, A), true rewards (T,))``."""
    obs, _ = env.reset(seed=seed)
    observations, actions, rewards = [], [], []
    for _ in range(max_steps):
        action = act(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        actions.append(action_vector(action))
        rewards.append(float(reward))
        obs = next_obs
        if terminated or truncated:
            break
    return np.stack(observations), np.stack(actions).astype(np.float32), np.array(rewards)


def overall_correlations(curves: list[RewardCurve]) -> tuple[float, float]:
    """Pearson/Spearman of the ensemble mean against the true reward over all steps pooled."""
    if not curves:
        return float("nan"), float("nan")
    return correlations(np.concatenate([c.members.mean(0) for c in curves]),
                        np.concatenate([c.true for c in curves]))


def plot_reward_curves(curves: list[RewardCurve], path: str | Path, title: str = "") -> Path:
    """One panel per episode: true reward and aligned learned reward ± member spread."""
    plt = pyplot()

    fig, axes = plt.subplots(len(curves), 1, figsize=(9, 2.4 * len(curves)), squeeze=False)
    for ax, c in zip(axes[:, 0], curves, strict=True):
        t = np.arange(len(c.true))
        ax.plot(t, c.true, color="black", lw=1.2, label="true reward")
        ax.plot(t, c.aligned, color="tab:red", lw=1.0, label="learned (aligned)")
        ax.fill_between(t, c.aligned - c.spread, c.aligned + c.spread, color="tab:red",
                        alpha=0.25, lw=0, label="member spread")
        ax.set_title(f"{c.policy} policy: Pearson {c.pearson:.2f}, Spearman {c.spearman:.2f}",
                     fontsize=9)
        ax.set_ylabel("reward")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("episode step")
    return save_figure(fig, path, title, dpi=100)


# ---------------------------------------------------------------------- gridworlds
def encode_observation(env: gym.Env, raw: Any) -> np.ndarray:
    """Apply the env's observation wrappers (innermost first) to a raw observation of the
    unwrapped env: what the agent and reward model see for that state."""
    wrappers = []
    e: Any = env
    while isinstance(e, gym.Wrapper):
        if isinstance(e, gym.ObservationWrapper):
            wrappers.append(e)
        e = e.env
    for w in reversed(wrappers):
        raw = w.observation(raw)
    return np.asarray(raw)


def grid_reward_maps(env: gym.Env, reward_model: RewardModel,
                     n_actions: int) -> tuple[np.ndarray, np.ndarray]:
    """Learned and true reward of stepping into each cell of a MiniGrid/BabyAI grid.

    For every cell and direction ``d`` the agent is put on the neighbouring cell behind it,
    facing ``d`` (``agent_pos``/``agent_dir`` of a copy of the current grid, at step 0), and
    takes ``forward``: the learned map holds r̂(s, forward) (ensemble mean), the true map the
    env's reward for that step. Cells that cannot be entered that way (walls, or the neighbour
    is a wall) are NaN.

    Returns:
        ``(learned, true)``, each ``(4, width, height)`` indexed ``[direction, x, y]``.

    Raises:
        ValueError: ``env`` is not a MiniGrid env.
    """
    base: Any = env.unwrapped
    if not hasattr(base, "grid") or not hasattr(base, "agent_pos"):
        raise ValueError(f"{env.spec.id if env.spec else env}: not a MiniGrid env")
    from minigrid.core.constants import DIR_TO_VEC

    width, height = base.grid.width, base.grid.height
    learned = np.full((4, width, height), np.nan)
    true = np.full((4, width, height), np.nan)
    forward = int(base.actions.forward)
    one_hot = np.eye(n_actions, dtype=np.float32)[forward]
    states, cells = [], []
    for d, (dx, dy) in enumerate(DIR_TO_VEC):
        for x in range(width):
            for y in range(height):
                px, py = x - int(dx), y - int(dy)
                if not (0 <= px < width and 0 <= py < height):
                    continue
                here, there = base.grid.get(px, py), base.grid.get(x, y)
                if (here is not None and not here.can_overlap()) or \
                        (there is not None and not there.can_overlap()):
                    continue
                probe = copy.deepcopy(base)
                probe.agent_pos, probe.agent_dir, probe.step_count = (px, py), d, 0
                states.append(encode_observation(env, probe.gen_obs()))
                _, reward, *_ = probe.step(forward)
                true[d, x, y] = float(reward)
                cells.append((d, x, y))
    if cells:
        obs = np.stack(states).reshape(len(states), -1)
        acts = np.repeat(one_hot[None], len(states), axis=0)
        values = reward_model.predict_members(obs, acts).mean(0)
        for (d, x, y), v in zip(cells, values, strict=True):
            learned[d, x, y] = v
    return learned, true


def direction_mean(values: np.ndarray) -> np.ndarray:
    """Mean over the directions that can enter each cell: ``(4, W, H) -> (W, H)``, NaN where
    none can."""
    counts = np.isfinite(values).sum(0)
    total = np.nansum(values, axis=0)
    return np.where(counts > 0, total / np.maximum(counts, 1), np.nan)


def plot_grid_maps(env: gym.Env, learned: np.ndarray, true: np.ndarray,
                   path: str | Path) -> Path:
    """The grid's rendering with the direction-averaged learned (left) and true (right) maps
    drawn over it."""
    plt = pyplot()

    base: Any = env.unwrapped
    frame = base.get_frame(highlight=False, tile_size=32)
    width, height = base.grid.width, base.grid.height
    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    for ax, values, name in ((axes[0], learned, "learned reward"),
                             (axes[1], true, "true reward")):
        mean = direction_mean(values).T  # (height, width) for imshow
        ax.imshow(frame, extent=(0, width, height, 0))
        im = ax.imshow(np.ma.masked_invalid(mean), extent=(0, width, height, 0), cmap="viridis",
                       alpha=0.6)
        fig.colorbar(im, ax=ax, fraction=0.046)
        ax.set_title(f"{name} of stepping into each cell (mean over directions)", fontsize=9)
        ax.set_axis_off()
    return save_figure(fig, path)


# ---------------------------------------------------------------------- a run
def load_run(run_dir: str | Path, out_dir: str | Path | None = None,
             **overrides: Any) -> Any:
    """A Workspace rebuilt from a finished run (its ``config.yaml`` with ``overrides``), with
    the saved agent and reward model loaded, writing into ``out_dir`` (default
    ``RUN_DIR/inspection``) so the run's own files are untouched.

    Raises:
        FileNotFoundError: no ``config.yaml`` or ``checkpoints/agent.pt`` in ``run_dir``.
        themis.utils.ConfigError: the config names code to import (``obs_transform`` or
            ``env`` as ``module:name``) that ``overrides`` do not repeat
            (:func:`themis.run.received_config.check_named_code`).
        themis.core.safe_loading.UnsafeFileError: an ``agent.pt`` that is more than plain tensors
            (it could run code) or no PyTorch file.
        ValueError: an ``agent.pt`` or ``reward_model.pt`` that is not this run's (a crafted,
            truncated or replaced file).
    """
    from themis.builder import make_workspace
    from themis.core.safe_loading import MALFORMED, check_finite_tensors, describe, safe_load
    from themis.reward import load_reward_model
    from themis.run.received_config import check_named_code, load_received_config

    run = Path(run_dir)
    ckpt = run / "checkpoints"
    for needed in (run / "config.yaml", ckpt / "agent.pt"):
        if not needed.is_file():
            raise FileNotFoundError(f"{needed} not found; point at a Themis run dir")
    cfg = load_received_config(run / "config.yaml")  # values only: no ${oc.env:...}
    check_named_code(cfg, run / "config.yaml", given=overrides)  # no code of the run's own
    cfg.human_teacher, cfg.resume, cfg.pretrained_snapshot, cfg.prefs_path = False, None, None, None
    cfg.pretrained_policy = None  # the run's own agent.pt is loaded below
    # keys for people (refused without them): the rebuilt workspace asks nobody
    cfg.gold_fraction, cfg.gold_path, cfg.label_quality, cfg.label_instructions = 0.0, None, \
        "none", ""
    cfg.replay_buffer_capacity = max(1000, cfg.segment)  # no training here: a small buffer
    cfg.logger.wandb = cfg.logger.mlflow = False  # the rebuilt workspace reports to no tracker
    for key, value in overrides.items():
        setattr(cfg, key, value)
    ws = make_workspace(cfg, Path(out_dir) if out_dir else run / "inspection")
    state = safe_load(ckpt / "agent.pt", ws.device)
    check_finite_tensors(state, ckpt / "agent.pt")  # NaN weights would play NaN
    try:
        ws.agent.load_state_dict(state["agent"])
    except MALFORMED as e:
        raise ValueError(f"{ckpt / 'agent.pt'} is not the agent of this run ({describe(e)})"
                         ) from None
    if (ckpt / "reward_model.pt").is_file():
        ws.reward_model = load_reward_model(ckpt / "reward_model.pt", ws.device)
    return ws


def run_reward_curves(ws: Any, episodes: int = 2, max_steps: int = 1000,
                      seed: int = 0) -> list[RewardCurve]:
    """Fresh evaluation episodes of the saved agent (its mean/most probable action) and of a
    random policy, scored by the run's reward model."""
    assert ws.reward_model is not None
    env = ws.eval_env
    eye = np.eye(ws.facts.action_dim, dtype=np.float32)

    def vector(action: Any) -> np.ndarray:
        return eye[int(action)] if ws.facts.discrete else np.asarray(action, dtype=np.float32)

    def agent_act(obs: np.ndarray) -> Any:
        return ws.eval_action(obs)

    env.action_space.seed(seed)
    curves = []
    with eval_mode(ws.reward_model):
        for policy, act in (("agent", agent_act), ("random", lambda _: env.action_space.sample())):
            for e in range(episodes):
                obs, actions, rewards = rollout(env, act, vector, seed + 1000 * e, max_steps)
                members = ws.reward_model.predict_members(obs.reshape(len(obs), -1), actions)
                curves.append(reward_curve(policy, rewards, members))
    return curves


def inspect_run(run_dir: str | Path, episodes: int = 2, max_steps: int = 1000,
                seed: int = 0) -> Path:
    """Write ``RUN_DIR/report/report.md`` with its PNGs: config, learning curve, reward-model
    accuracy over rounds, teacher statistics, the audit of people's labels (web teacher:
    :func:`themis.crowd.audit_report.labels_section`), reward curves (and gridworld maps for
    MiniGrid/BabyAI),
    links to the labelled clips.

    Returns:
        The report's path.
    """
    run = Path(run_dir)
    out = run / "report"
    out.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.TemporaryDirectory()  # the rebuilt workspace's own files go nowhere
    ws = load_run(run, Path(scratch.name))
    env_id = ws.facts.env_id
    from omegaconf import OmegaConf

    from themis.agents import agent_of
    from themis.feedback.factory import run_title
    from themis.run.config import TrainConfig
    from themis.run.received_config import load_received_config

    saved = OmegaConf.to_object(load_received_config(run / "config.yaml"))  # not the rebuild's
    assert isinstance(saved, TrainConfig)
    title = run_title(saved, agent_of(saved, ws.driver.NAME))
    lines = [f"# Themis run report: {env_id}", "", title, "",
             f"Run dir: `{run.resolve()}`", ""]

    evals = _read_csv(run / "eval.csv")
    rounds = _read_csv(run / "reward.csv")
    lines += ["## Learning curve", ""]
    if evals is not None and len(evals):
        plot_learning_curve(run / "eval.csv", out / "learning_curve.png",
                            title=f"{env_id}: {title}")
        last = evals.iloc[-1]
        lines += ["![learning curve](learning_curve.png)", "",
                  f"Final evaluation at step {int(last['step'])}: true return "
                  f"**{last['episode_reward']:.1f}** with {int(last['total_feedback'])} queries "
                  "asked.", ""]
    else:
        lines += ["No evaluation yet (`eval.csv` missing).", ""]

    lines += ["## Reward model", ""]
    if rounds is not None and len(rounds):
        _plot_rounds(rounds, out / "reward_model.png")
        lines += ["![reward-model accuracy](reward_model.png)", "",
                  "| round | step | queries | held-out accuracy | train accuracy | Pearson |",
                  "|---|---|---|---|---|---|"]
        for _, r in rounds.iterrows():
            lines.append(f"| {int(r['round'])} | {int(r['step'])} | {int(r['total_feedback'])} "
                         f"| {r.get('heldout_accuracy', np.nan):.3f} | "
                         f"{r.get('train_accuracy', np.nan):.3f} | "
                         f"{r.get('heldout_pearson', np.nan):.3f} |")
        lines.append("")
    if ws.reward_model is not None:
        curves = run_reward_curves(ws, episodes, max_steps, seed)
        plot_reward_curves(curves, out / "reward_curves.png", env_id)
        pearson, spearman = overall_correlations(curves)
        lines += ["### Learned vs true reward along episodes", "",
                  "![reward curves](reward_curves.png)", "",
                  "Learned reward = ensemble mean, aligned to the true reward by least squares "
                  "(a · r̂ + b); shaded: spread of the members.", "",
                  "| policy | episode | steps | Pearson | Spearman |", "|---|---|---|---|---|"]
        for i, c in enumerate(curves):
            lines.append(f"| {c.policy} | {i % episodes} | {len(c.true)} | {c.pearson:.3f} | "
                         f"{c.spearman:.3f} |")
        lines += ["", f"Over all steps: Pearson **{pearson:.3f}**, Spearman "
                      f"**{spearman:.3f}**.", ""]
        if ws.cfg.domain in ("Minigrid", "BabyAI"):
            ws.eval_env.reset(seed=seed)
            learned, true = grid_reward_maps(ws.eval_env, ws.reward_model, ws.facts.action_dim)
            plot_grid_maps(ws.eval_env, learned, true, out / "grid_reward.png")
            lines += ["### Reward of each cell", "", "![grid reward maps](grid_reward.png)", ""]

    lines += interpret_section(run)  # scripts/preprocess_reward.py, feature_vis.py
    lines += ["## Teacher", ""]
    if evals is not None and len(evals):
        last = evals.iloc[-1]
        stats = {k: last[k] for k in ("labeled_feedback", "skip_fraction", "equal_fraction",
                                      "oracle_agreement") if k in last}
        lines += ["| statistic | value |", "|---|---|"]
        lines += [f"| {k} | {_number(v)} |" for k, v in stats.items()]
        lines.append("")
    labels = _read_csv(run / "preferences" / "labels.csv")
    if labels is not None and len(labels):
        counts = labels.groupby("labeler")["label"].agg(["count", "mean"])
        lines += ["| labeler | labels | mean label (1 = segment 2 preferred) |", "|---|---|---|"]
        lines += [f"| {name} | {int(r['count'])} | {r['mean']:.2f} |"
                  for name, r in counts.iterrows()]
        lines.append("")
    lines += labels_section(run, out)  # people's labels (teacher_ui=web): audit
    lines += ["## Labelled clips", ""]
    shown = False
    for folder, pattern in (("queries", "query_*.mp4"), ("web/clips", "round*.mp4")):
        clips = sorted((run / folder).glob(pattern)) if (run / folder).is_dir() else []
        lines += [f"- [{c.name}](../{folder}/{c.name})" for c in clips[:50]]
        if len(clips) > 50:
            lines.append(f"- ... and {len(clips) - 50} more in `{folder}/`")
        shown = shown or bool(clips)
    if not shown:
        lines.append("No clips (clips are written with `human_teacher=true` or `xplain_*`).")
    lines += ["", "## Configuration", "", "```yaml", (run / "config.yaml").read_text().strip(),
              "```", ""]  # the run's own configuration, not the inspection's
    report = out / "report.md"
    report.write_text("\n".join(lines))
    ws.logger.close()
    scratch.cleanup()
    return report


INTERPRET_BEGIN = "<!-- interpret: begin -->"
INTERPRET_END = "<!-- interpret: end -->"


def interpret_section(run: Path) -> list[str]:
    """The report's section written by the interpretability commands (:mod:`themis.interpret`:
    reward preprocessing, feature visualisation): the Markdown fragments in
    ``RUN_DIR/interpret/*.md`` in name order, between markers so that the commands can refresh
    it in place; empty when there are none."""
    folder = run / "interpret"
    fragments = sorted(folder.glob("*.md")) if folder.is_dir() else []
    if not fragments:
        return []
    lines = [INTERPRET_BEGIN, "## Understanding the reward", ""]
    for fragment in fragments:
        lines += [fragment.read_text().strip(), ""]
    return [*lines, INTERPRET_END, ""]


def _number(value: Any) -> str:
    """A table cell: whole numbers as integers (``1000``, not ``1e+03``), others to 3
    significant digits."""
    if isinstance(value, float | np.floating):
        return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
    return str(value)


def _read_csv(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else None


def _plot_rounds(rounds: pd.DataFrame, path: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for column, label in (("heldout_accuracy", "held-out accuracy (new queries)"),
                          ("train_accuracy", "train accuracy"),
                          ("heldout_pearson", "Pearson of segment returns")):
        if column in rounds:
            ax.plot(rounds["total_feedback"], rounds[column], marker="o", label=label)
    ax.set_xlabel("queries asked")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, path, dpi=100)
