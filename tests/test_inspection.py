"""Reward inspection: aligned reward curves, gridworld heatmaps, the run report."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from tests.conftest import TINY_PENDULUM, launch
from themis.environments.domains import make_env
from themis.interpret.inspection import (
    affine_alignment,
    direction_mean,
    grid_reward_maps,
    inspect_run,
    plot_grid_maps,
    reward_curve,
    rollout,
)


class PendulumReward:
    """The true Pendulum-v1 reward as a 'reward model': −(θ² + 0.1 θ̇² + 0.001 u²), from the
    observation (cos θ, sin θ, θ̇) before the step and the action in [−1, 1] (torque 2u)."""

    def __init__(self, scale: float = 1.0, shift: float = 0.0, members: int = 3) -> None:
        self.scale, self.shift, self.members = scale, shift, members

    def predict_members(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        theta = np.arctan2(obs[:, 1], obs[:, 0])
        torque = np.clip(2.0 * action[:, 0], -2.0, 2.0)
        r = -(theta**2 + 0.1 * obs[:, 2] ** 2 + 0.001 * torque**2)
        return np.repeat((self.scale * r + self.shift)[None], self.members, axis=0)


@pytest.mark.parametrize("scale,shift", [(1.0, 0.0), (0.25, 3.0)])
def test_a_reward_model_equal_to_the_true_reward_correlates_perfectly(scale, shift):
    env = make_env("Classic", "Pendulum-v1", seed=0)
    env.action_space.seed(0)
    obs, actions, true = rollout(env, lambda _: env.action_space.sample(),
                                 lambda a: np.asarray(a, np.float32), seed=0, max_steps=200)
    model = PendulumReward(scale, shift)
    curve = reward_curve("random", true, model.predict_members(obs, actions))
    assert curve.pearson == pytest.approx(1.0, abs=1e-5)
    assert curve.spearman == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(curve.aligned, true, atol=1e-3)
    np.testing.assert_allclose(curve.spread, 0.0, atol=1e-6)


def test_report_numbers_are_whole_where_they_are_whole():
    from themis.interpret.inspection import _number

    assert [_number(1000.0), _number(np.float64(0.0)), _number(0.12345), _number(7)] == [
        "1000", "0", "0.123", "7"]  # not 1e+03


def test_affine_alignment_recovers_scale_and_shift():
    rng = np.random.default_rng(0)
    predicted = rng.normal(size=100)
    a, b = affine_alignment(predicted, 2.5 * predicted - 1.0)
    assert a == pytest.approx(2.5) and b == pytest.approx(-1.0)
    assert affine_alignment(np.ones(5), np.arange(5.0)) == (0.0, 2.0)


class GoalOnlyReward:
    """Pays 1 for moving forward into a goal cell: the cell in front of the agent in its 7×7
    view, (x=3, y=5), of the object plane, holds the goal (object index 8)."""

    def predict_members(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        grid = obs.reshape(len(obs), -1, 7, 7)
        pays = (grid[:, 0, 3, 5] == 8) & (action[:, 2] == 1)  # action 2 = forward
        return np.stack([pays.astype(np.float32)] * 2)


def test_gridworld_heatmap_peaks_at_the_goal(tmp_path):
    env = make_env("Minigrid", "Empty-6x6-v0", seed=0, render_mode="rgb_array")
    env.reset(seed=0)
    base = env.unwrapped
    goal = next((x, y) for x in range(base.grid.width) for y in range(base.grid.height)
                if base.grid.get(x, y) is not None and base.grid.get(x, y).type == "goal")
    learned, true = grid_reward_maps(env, GoalOnlyReward(), n_actions=int(env.action_space.n))
    assert learned.shape == (4, base.grid.width, base.grid.height)
    mean = direction_mean(learned)
    assert np.unravel_index(np.nanargmax(mean), mean.shape) == goal
    assert np.nanmax(mean) == 1.0 and np.nansum(mean) == 1.0  # nothing else pays
    true_mean = direction_mean(true)
    assert np.unravel_index(np.nanargmax(true_mean), true_mean.shape) == goal
    assert np.isnan(learned[:, 0, 0]).all()  # a wall cannot be entered
    assert plot_grid_maps(env, learned, true, tmp_path / "grid.png").stat().st_size > 0


@pytest.mark.slow
def test_report_is_written_for_a_tiny_run(tmp_path):
    run = tmp_path / "run"
    proc = launch("themis_train.sh", *TINY_PENDULUM, f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = inspect_run(run, episodes=1, max_steps=100)
    text = report.read_text()
    for section in ("# Themis run report: Pendulum-v1", "## Learning curve", "## Reward model",
                    "### Learned vs true reward along episodes", "## Teacher",
                    "## Labelled clips", "## Configuration", "Over all steps: Pearson"):
        assert section in text
    assert "PEBBLE · sampler uniform · teacher oracle" in text  # what ran
    for png in ("learning_curve.png", "reward_model.png", "reward_curves.png"):
        assert (report.parent / png).stat().st_size > 0
    # the tables hold this run's numbers
    rounds = pd.read_csv(run / "reward.csv")
    for _, r in rounds.iterrows():
        assert f"| {int(r['round'])} | {int(r['step'])} | {int(r['total_feedback'])} | " in text
    assert "| labeled_feedback | 30 |" in text
    assert "| synthetic(beta=-1.0,gamma=1.0,eps_mistake=0.0,eps_skip=0.0,eps_equal=0.0) | 30 |" \
        in text
    pearson = float(re.search(r"Over all steps: Pearson \*\*(-?[0-9.]+)\*\*", text).group(1))
    assert -1.0 <= pearson <= 1.0
    assert "env: Pendulum-v1" in text and "max_feedback: 30" in text
    assert "replay_buffer_capacity: 1000" not in text  # the run's config, not the inspection's
    assert not (report.parent / "workspace").exists()
    assert not (run / "inspection").exists() and (run / "eval.csv").is_file()
