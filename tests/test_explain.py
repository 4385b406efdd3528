"""Captum explanations: shapes, completeness, a one-feature reward, panels under clips."""

from __future__ import annotations

import imageio_ffmpeg
import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from lib.explain import (
    CAPTION_HEIGHT,
    METHODS,
    Explainer,
    _fitted,
    action_forward,
    attribute,
    feature_names,
    reward_forward,
    vector_panel,
)
from lib.human_interface import BANNER, GAP, side_by_side, write_clip
from tests.conftest import TINY_PENDULUM, launch
from themis.agents.ppo import PPO, PPOConfig
from themis.agents.sac import SAC, SACConfig
from themis.environments.domains import make_env
from themis.reward import RewardEnsemble

CPU = torch.device("cpu")


class OneFeatureReward(nn.Module):
    """r̂(s, a) = tanh(2 s_3) for every member: depends on observation feature 3 only."""

    ensemble_size = 2

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        r = torch.tanh(2.0 * obs[:, 3]) + 0.0 * action.sum(-1)
        return torch.stack([r, r])


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_reward_of_one_feature_gets_nearly_all_the_attribution(method):
    rng = np.random.default_rng(0)
    obs = torch.as_tensor(rng.normal(size=(32, 6)), dtype=torch.float32)
    act = torch.as_tensor(rng.uniform(-1, 1, size=(32, 2)), dtype=torch.float32)
    baselines = (torch.as_tensor(rng.normal(size=(16, 6)), dtype=torch.float32),
                 torch.zeros(16, 2))
    attr_obs, attr_act = attribute(method, reward_forward(OneFeatureReward()), (obs, act),
                                   baselines)
    assert attr_obs.shape == (32, 6) and attr_act.shape == (32, 2)
    share = np.abs(attr_obs[:, 3]).sum() / (np.abs(attr_obs).sum() + np.abs(attr_act).sum())
    assert share > 0.99


def test_integrated_gradients_is_complete():
    torch.manual_seed(0)
    model = RewardEnsemble(5, 2, ensemble_size=2, hidden_dim=16, hidden_depth=2)
    forward = reward_forward(model)
    obs, act = torch.randn(8, 5), torch.rand(8, 2) * 2 - 1
    base = (torch.zeros(1, 5), torch.zeros(1, 2))
    attr_obs, attr_act = attribute("integrated_gradients", forward, (obs, act), base)
    with torch.no_grad():
        gap = (forward(obs, act) - forward(torch.zeros_like(obs), torch.zeros_like(act))).numpy()
    total = attr_obs.sum(1) + attr_act.sum(1)
    np.testing.assert_allclose(total, gap, atol=2e-2 * max(1.0, np.abs(gap).max()))
    from captum.attr import IntegratedGradients  # Captum's own convergence delta agrees

    _, delta = IntegratedGradients(forward).attribute(
        (obs, act), baselines=(torch.zeros_like(obs), torch.zeros_like(act)), n_steps=32,
        return_convergence_delta=True)
    assert delta.abs().max() < 2e-2 * max(1.0, np.abs(gap).max())


@pytest.mark.parametrize("obs_shape,discrete", [((17,), False), ((4, 84, 84), True),
                                                ((4, 7, 7), True)],
                         ids=["vector-SAC", "pixels-PPO", "grid-PPO"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_attributions_have_the_inputs_shapes(obs_shape, discrete, method):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n_actions = 4
    if discrete:
        agent = PPO(obs_shape, n_actions, CPU, PPOConfig(hidden_dim=16))
        obs = rng.integers(0, 255 if obs_shape[-1] > 16 else 10, size=(6, *obs_shape))
        actions = np.eye(n_actions, dtype=np.float32)[rng.integers(0, n_actions, 6)]
    else:
        agent = SAC(obs_shape[0], n_actions, CPU, SACConfig(hidden_dim=16))
        obs = rng.normal(size=(6, *obs_shape))
        actions = rng.uniform(-1, 1, size=(6, n_actions)).astype(np.float32)
    model = RewardEnsemble(int(np.prod(obs_shape)), n_actions, 2, 16, 2, obs_shape=obs_shape)
    explainer = Explainer(method, obs_shape, obs[:4], actions[:4],
                          action_forward_fn=action_forward(agent, discrete),
                          reward_forward_fn=reward_forward(model), discrete=discrete)
    attr = explainer.explain(obs, actions)
    assert attr["action"].shape == obs.shape and attr["reward"].shape == obs.shape
    assert attr["reward_action"].shape == actions.shape
    assert all(np.isfinite(a).all() for a in attr.values())
    panel = explainer.panel(obs, attr, width=40, height=30)
    assert panel.shape == (6, 60, 40, 3) and panel.dtype == np.uint8


def test_halfcheetah_features_are_named_after_its_joints():
    names = feature_names(make_env("Control", "HalfCheetah-v5"), 17)
    assert names[:3] == ["qpos:rootz", "qpos:rooty", "qpos:bthigh"]
    assert names[8] == "qvel:rootx" and names[-1] == "qvel:ffoot"
    assert feature_names(make_env("Classic", "Pendulum-v1"), 3) == ["obs[0]", "obs[1]", "obs[2]"]


def test_bar_panel_names_and_caption_stay_clear_of_the_bars():
    """In a 128-px panel (a 264-px-wide web clip) long joint names are cut to the left half
    and the caption has its own strip: no text over a bar, no bar under the caption."""
    names = ["bthigh (hinge)", "a_very_long_feature_name_indeed", "vel rootx", "fthigh (hinge)",
             "bfoot (hinge)", "x"]
    attributions = np.random.default_rng(0).normal(size=(3, 6))
    panels = vector_panel(attributions, names, 128, 128, top_k=5, caption="learned reward")
    text = (panels.max(axis=3) < 120)  # black text (bars are red or blue, caption grey)
    bars = (panels.max(axis=3) - panels.min(axis=3)) > 100
    assert text[:, :, :64].any() and not text[:, :, 64:].any()
    assert bars[:, :, 64:].any() and not bars[:, 128 - CAPTION_HEIGHT:].any()
    grey = (np.abs(panels.astype(int) - 90).max(axis=3) < 40)
    assert grey[:, 128 - CAPTION_HEIGHT:].any()  # the caption is drawn, in its strip
    assert _fitted("bthigh (hinge)", 40, 0.4) == "bthigh"


def test_clip_with_panels_has_the_expected_size(tmp_path):
    steps, h, w = 10, 40, 50
    frames = np.zeros((steps, h, w, 3), dtype=np.uint8)
    panel = np.full((steps, 30, w, 3), 128, dtype=np.uint8)
    clip = side_by_side(frames, frames, panel, panel)
    assert clip.shape == (steps, BANNER + h + 30, 2 * w + GAP, 3)
    assert (clip[:, BANNER + h + 5, 5] == 128).all()
    path = write_clip(clip, tmp_path / "clip.mp4", fps=10)
    assert imageio_ffmpeg.count_frames_and_secs(str(path))[0] == steps
    reader = imageio_ffmpeg.read_frames(str(path))
    assert next(reader)["size"] == (2 * w + GAP, BANNER + h + 30)
    reader.close()
    with pytest.raises(ValueError, match="panels"):
        side_by_side(frames, frames, panel, None)


@pytest.mark.slow
def test_synthetic_teacher_runs_save_explained_clips(tmp_path):
    proc = launch("themis_train.sh", *TINY_PENDULUM, "xplain_action=true", "xplain_state=true",
                  "xplain_method=saliency", "xplain_clips_per_round=2", "human_frame_size=48",
                  f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rounds = len(pd.read_csv(tmp_path / "reward.csv"))
    clips = sorted((tmp_path / "queries").glob("query_*.mp4"))
    assert len(clips) == 2 * rounds
    assert (tmp_path / "queries" / "query_000000_action.png").is_file()
    assert (tmp_path / "queries" / "query_000000_reward.png").is_file()
    reader = imageio_ffmpeg.read_frames(str(clips[0]))
    width, height = next(reader)["size"]
    reader.close()
    assert (width, height) == (2 * 48 + GAP, BANNER + 3 * 48)  # frame + action + reward panel

    # and from the finished run, with the saved agent and reward model
    import subprocess
    import sys

    from tests.conftest import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "explain.py"), str(tmp_path),
                           "--clips", "2", "--steps", "250", "--method", "gradient_shap"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp_path / "explanations" / "queries"
    assert len(list(out.glob("query_*.mp4"))) == 2
    assert (out / "query_000001_reward.png").is_file()


def test_unknown_explanation_method_fails_before_training(tmp_path):
    proc = launch("themis_train.sh", *TINY_PENDULUM, "xplain_state=true", "xplain_method=lime",
                  f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert "xplain_method=lime is unknown; use one of integrated_gradients" in proc.stderr


def test_explain_renders_mujoco_clips_with_no_gl_variable_set(compose, tmp_path):
    import os
    import subprocess
    import sys

    from omegaconf import OmegaConf

    from tests.conftest import ROOT
    from themis.builder import make_workspace

    cfg = compose(["domain=Control", "env=HalfCheetah-v5", "segment=10", "sac.hidden_dim=32",
                   "reward_hidden_dim=32", "ensemble_size=1", "max_feedback=10"])
    ws = make_workspace(cfg, tmp_path)
    ws.save_checkpoints()  # a "finished run": config, agent and reward model
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "explain.py"), str(tmp_path),
                           "--clips", "1", "--steps", "40", "--method", "saliency"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len(list((tmp_path / "explanations" / "queries").glob("query_*.mp4"))) == 1
