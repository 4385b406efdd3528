"""Configuration: every key composes; typos, wrong types and bad values fail clearly."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from themis.run.config import TrainConfig
from themis.run.plan import log_banner
from themis.run.validation import validate
from themis.utils import ConfigError

BPREF_KEYS = {
    "env": "Hopper-v5", "seed": "3", "device": "cpu", "num_train_steps": "5000",
    "num_seed_steps": "100", "num_unsup_steps": "200", "topK": "3", "num_interact": "1000",
    "max_feedback": "200", "reward_batch": "20", "segment": "25", "ensemble_size": "5",
    "reward_lr": "0.001", "reward_update": "10", "large_batch": "4", "feed_type": "0",
    "teacher_beta": "1.0", "teacher_gamma": "0.9", "teacher_eps_mistake": "0.1",
    "teacher_eps_skip": "0.1", "teacher_eps_equal": "0.1", "learn_reward": "false",
    "human_teacher": "false", "xplain_action": "false", "xplain_state": "false",
    "eval_frequency": "500", "num_eval_episodes": "2",
}


def test_defaults_compose_and_validate(compose):
    cfg = compose()
    validate(cfg)
    assert cfg.domain == "Control" and cfg.env == "HalfCheetah-v5"
    assert cfg.agent == "auto" and cfg.sac.hidden_dim == 128 and cfg.ppo.num_envs == 8
    assert cfg.teacher_beta == -1 and cfg.teacher_eps_mistake == 0


@pytest.mark.parametrize("overrides,reward_batch", [
    ([], 100),  # the main job: 1000 queries in 10 rounds
    (["max_feedback=500"], 50),  # not 5 rounds of 100 (docs/guide/configuration.md)
    (["max_feedback=95"], 10),  # rounded up: the last round asks the remaining 5
    (["max_feedback=500", "reward_batch=30"], 30),  # B-Pref's key, as given
])
def test_reward_batch_auto_spreads_the_budget_over_ten_rounds(compose, overrides, reward_batch):
    from themis.run.resolve import resolve

    cfg = OmegaConf.to_object(compose(overrides))
    validate(cfg)
    assert cfg.reward_batch == (reward_batch if "reward_batch=30" in overrides else "auto")
    assert resolve(cfg).cfg.reward_batch == reward_batch  # validate assigns nothing

def test_clip_frames_are_larger_for_people_than_for_explained_synthetic_runs(compose):
    from themis.run.config import frame_capacity, frame_size

    person, synthetic = compose(["human_teacher=true"]), compose(["xplain_state=true"])
    assert (frame_size(person), frame_capacity(person)) == (256, 5_000)
    assert (frame_size(synthetic), frame_capacity(synthetic)) == (128, 10_000)
    chosen = compose(["human_teacher=true", "human_frame_size=64", "human_frame_capacity=300"])
    assert (frame_size(chosen), frame_capacity(chosen)) == (64, 300)


def test_every_bpref_key_composes_from_the_command_line(compose):
    cfg = compose([f"{k}={v}" for k, v in BPREF_KEYS.items()])
    for key, value in BPREF_KEYS.items():
        assert str(cfg[key]).lower() == value.lower(), key
    validate(cfg)


def test_schema_has_every_bpref_key():
    fields = set(OmegaConf.structured(TrainConfig).keys())
    assert set(BPREF_KEYS) <= fields


@pytest.mark.parametrize("preset,key,value", [
    ("oracle", "teacher_beta", -1.0), ("mistake", "teacher_eps_mistake", 0.1),
    ("noisy", "teacher_beta", 1.0), ("skip", "teacher_eps_skip", 0.1),
    ("myopic", "teacher_gamma", 0.9), ("equal", "teacher_eps_equal", 0.1),
])
def test_teacher_presets(compose, preset, key, value):
    cfg = compose([f"teacher={preset}"])
    assert cfg[key] == value
    # a preset's field stays overridable
    assert compose([f"teacher={preset}", f"{key}=0.5"])[key] == 0.5


def test_typo_fails_with_the_key_name(compose):
    with pytest.raises(ConfigCompositionException, match="num_trian_steps"):
        compose(["num_trian_steps=10"])


def test_wrong_type_fails(compose):
    with pytest.raises(ConfigCompositionException, match="num_train_steps"):
        compose(["num_train_steps=abc"])


@pytest.mark.parametrize("override,message", [
    ("feed_type=7", "feed_type=7 is unknown"),
    ("teacher_eps_mistake=1.5", "outside \\[0, 1\\]"),
    ("teacher_gamma=0", "outside \\(0, 1\\]"),
    ("teacher_beta=0", "teacher_beta"),
    ("ensemble_size=0", "ensemble_size=0 must be positive"),
    ("num_train_steps=-5", "must be positive"),
    ("human_teacher=true", "stdin is not a TTY"),
    ("xplain_baseline=ones", "xplain_baseline=ones is unknown"),
    ("teacher_ui=slack", "teacher_ui=slack is unknown"),
    ("num_unsup_steps=200000", "must be smaller than num_train_steps"),
])
def test_bad_values_are_rejected_before_training(compose, override, message):
    cfg = compose([override])
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


@pytest.mark.parametrize("feed_type,name", [
    ("0", "uniform"), ("1", "disagreement"), ("2", "entropy"), ("3", "kcenter"),
    ("4", "kcenter_disagreement"), ("5", "kcenter_entropy"), ("kcenter_entropy", "kcenter_entropy"),
])
def test_every_feed_type_validates_and_names_its_sampler(compose, feed_type, name):
    from themis.feedback.sampling import resolve_feed_type

    cfg = compose([f"feed_type={feed_type}"])
    validate(cfg)
    assert resolve_feed_type(cfg.feed_type) == name


def test_pretrain_config_composes(compose):
    cfg = compose(name="pretrain_themis")
    validate(cfg)
    assert cfg.num_unsup_steps > 0


@pytest.mark.parametrize("override,message", [
    ("agent=dqn", "agent=dqn is unknown"),
    ("ppo.num_envs=0", "ppo.num_envs=0 must be positive"),
    ("sac.batch_size=0", "sac.batch_size=0 must be positive"),
])
def test_agent_values_are_checked(compose, override, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose([override]))


@pytest.mark.parametrize("value,target", [
    (None, None), ("", None), ("false", None), ("No", None), ("0", None), ("null", None),
    ("true", "here"), ("1", "here"), ("yes", "here"), ("runs/a", "runs/a"),
])
def test_resume_is_read_one_way(value, target):
    from themis.run.config import resume_target

    assert resume_target(value) == target


def test_reward_batch_auto_fits_a_short_schedule_and_the_run_spends_its_budget(
        compose, tmp_path, capsys):
    import pandas as pd

    from tests.conftest import TINY_PENDULUM
    from themis.builder import make_workspace

    tiny = [o for o in TINY_PENDULUM if not o.startswith(("reward_batch", "max_feedback"))]
    ws = make_workspace(compose([*tiny, "max_feedback=20"]), tmp_path / "auto")
    assert ws.cfg.reward_batch == 7  # three rounds (steps 400, 700, 1000), not ten of 2
    ws.run()
    assert pd.read_csv(tmp_path / "auto" / "reward.csv")["total_feedback"].tolist() == [7, 14, 20]
    assert "queries: 20 of max_feedback=20, in 3 rounds of 7" in capsys.readouterr().out

    fixed = make_workspace(compose([*tiny, "max_feedback=20", "reward_batch=5"]), tmp_path / "b")
    log_banner(fixed)  # a number given is used as is, and the start says what it leaves unasked
    assert "queries: 15 of max_feedback=20" in capsys.readouterr().out


def test_resolve_fills_what_is_derived_in_a_new_config_and_leaves_its_input_alone(compose):
    """Issue 62, step 2: the derived keys are computed once, into a new object."""
    from themis.run.resolve import config_yaml, resolve

    cfg = OmegaConf.to_object(compose(["resume=false", "max_feedback=500", "agent=auto"]))
    resolved = resolve(cfg, torch_threads=3)
    assert (cfg.reward_batch, str(cfg.resume).lower(), cfg.torch_threads) \
        == ("auto", "false", "auto")
    assert (resolved.cfg.reward_batch, resolved.cfg.resume, resolved.cfg.torch_threads) \
        == (50, None, 3)
    assert resolved.agent == "sac" and resolved.cfg.agent == "auto" and resolved.note is None
    saved = OmegaConf.create(config_yaml(resolved.cfg))  # what config.yaml holds
    assert saved.reward_batch == 50 and saved.max_feedback == 500
