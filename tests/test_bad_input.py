"""Bad input ends before any training with one line, exit code 2 and no stack trace."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import launch
from themis.train import make_workspace
from themis.utils import ConfigError


@pytest.mark.parametrize("override,message", [
    ("num_trian_steps=10", "num_trian_steps is not a Themis config key (did you mean "
                           "num_train_steps?)"),
    ("+num_train_step=10", "num_train_step is not a Themis config key (did you mean "
                           "num_train_steps?)"),
    ("sac.hiden_dim=8", "sac.hiden_dim is not a Themis config key (did you mean sac.hidden_dim?)"),
    ("num_train_steps=abc", "num_train_steps: Value 'abc' of type 'str' could not be converted "
                            "to Integer"),
    ("domain=Atari", "domain=Atari is unknown; available: Control, ALE"),
    ("teacher=perfect", "teacher=perfect is unknown; available: equal, mistake, myopic, noisy, "
                        "oracle, skip"),
    ("feed_type=0,1", "add -m to sweep over the values"),
    ("feed_type=7", "feed_type=7 is unknown; use 0-5"),
    ("env=HalfCheeta-v5", "close matches: HalfCheetah-v5"),
    ("pretrained_snapshot=/nonexistent/snapshot.pt", "does not exist"),
    ("reward_lr=nan", "reward_lr=nan must be a positive number"),
    ("label_port=70000", "label_port=70000 is not a TCP port"),
    ("method=sruf", "method=sruf is unknown; available: mrn, pebble, qpa, rime, rune, surf"),
    ("domain=DMC env=walker_wlak", "close matches: walker-walk-v0"),
    ("domain=MetaWorld env=door-opne-v3", "close matches: door-open-v3"),
])
def test_bad_command_line_exits_2_with_one_line(tmp_path, override, message):
    proc = launch("themis_train.sh", *override.split(" "), f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("themis: error: ") and message in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr


def test_themis_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("THEMIS_DEBUG", "1")
    proc = launch("themis_train.sh", "num_train_steps=abc", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("themis: error: num_train_steps")


def test_unwritable_run_dir_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    for script in ("themis_train.sh", "themis_pretrain.sh"):
        proc = launch(script, f"hydra.run.dir={blocker / 'run'}")
        assert proc.returncode == 2, proc.stderr
        assert f"run dir {blocker / 'run'} cannot be created or written" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("overrides,message", [
    (["num_train_steps=0"], "num_train_steps=0 must be positive"),
    (["num_unsup_steps=-5"], "num_unsup_steps=-5 must be >= 0"),
    (["num_interact=0"], "num_interact=0 must be positive"),
    (["max_feedback=-1"], "max_feedback=-1 must be >= 0"),
    (["ensemble_size=0"], "ensemble_size=0 must be positive"),
    (["feed_type=7"], "feed_type=7 is unknown"),
    (["teacher_eps_mistake=1.5"], "teacher_eps_mistake=1.5 is outside [0, 1]"),
    (["teacher_eps_skip=-0.1"], "teacher_eps_skip=-0.1 is outside [0, 1]"),
    (["teacher_eps_equal=2"], "teacher_eps_equal=2.0 is outside [0, 1]"),
    (["teacher_gamma=0"], "teacher_gamma"),
    (["teacher_beta=0"], "teacher_beta"),
    (["max_feedback=50", "reward_batch=100"], "max_feedback=50 is smaller than reward_batch=100"),
    (["segment=1001"], "segment=1001 is longer than the episode limit (1000 steps)"),
    (["env=Ant-v5x"], "env=Ant-v5x is not an environment of domain=Control"),
    (["domain=ALE", "env=HalfCheetah-v5"], "not an environment of domain=ALE"),
    (["agent=ppo"], "agent=ppo cannot act in the action space Box"),
    (["human_teacher=true"], "human_teacher=true needs a terminal, but stdin is not a TTY"),
    (["human_teacher=true", "learn_reward=false"], "human_teacher=true needs learn_reward=true"),
    (["human_teacher=true", "human_piped=true", "human_frame_capacity=10"],
     "human_frame_capacity=10 is smaller than segment=50"),
    (["human_viewer=vlc"], "human_viewer=vlc is unknown"),
    (["human_teacher=true", "teacher_ui=web", "label_host=0.0.0.0"],
     "label_host=0.0.0.0 exposes the labeling page beyond this machine"),
    (["human_teacher=true", "teacher_ui=web", "labelers=2", "labels_per_query=3"],
     "labels_per_query=3 needs at least that many labelers"),
    (["human_teacher=true", "teacher_ui=web", "label_quality=model"],
     "label_quality=model learns how reliable each labeler is"),
    (["human_teacher=true", "teacher_ui=web", "label_quality=vote"],
     "label_quality=vote is unknown; use none, filter or model"),
    (["feedback=ratings"], "feedback=ratings is unknown; use pairwise or rating"),
    (["feedback=rating", "rating_classes=1"], "rating_classes=1 must be 2 … 9"),
    (["feedback=rating", "method=surf"], "feedback=rating does not take method=surf"),
    (["feedback=rating", "feed_type=1"], "feedback=rating does not take feed_type=1"),
    (["feedback=rating", "teacher=equal"], "does not take teacher_eps_equal=0.1"),
    (["feedback=rating", "human_teacher=true", "teacher_ui=web", "gold_fraction=0.1"],
     "feedback=rating does not take gold_fraction=0.1: gold queries are pairs"),
    (["xplain_state=true", "xplain_method=lime"], "xplain_method=lime is unknown"),
    (["pretrained_snapshot=/nonexistent/snapshot.pt"], "does not exist"),
    (["prefs_path=/nonexistent/prefs"], "prefs_path=/nonexistent/prefs"),
    (["method=rune", "ensemble_size=1"], "method=rune adds beta * the ensemble's std"),
    (["method=qpa", "domain=Box2d", "env=LunarLander-v3"], "use it with SAC (Box actions)"),
    (["reward_batch=lots"], "reward_batch=lots must be a positive integer or auto"),
    (["feed_type=1", "ensemble_size=1"], "needs ensemble_size >= 2 (got 1)"),
    (["method=surf", "surf.threshold_u=2"], "surf.threshold_u=2.0 must be in [0.5, 1.0]"),
    (["method=surf", "surf.crop_range=30"], "surf.crop_range=30 must be >= 0 and leave"),
    (["method=qpa", "segment=10"], "segment=10 is too short"),
    (["method=rime", "rime.flip_tau=-1"], "rime.flip_tau=-1.0 must be in [0.0, 1.0]"),
    (["method=rime", "pretrained_snapshot=/nonexistent/snapshot.pt"],
     "a pretraining snapshot keeps no reward model"),
    (["method=qpa", "qpa.data_aug_ratio=-1"], "qpa.data_aug_ratio=-1 must be >= 0"),
    (["method=mrn", "domain=Box2d", "env=LunarLander-v3"], "PPO has no Q-function"),
    (["method=mrn", "mrn.meta_steps=0"], "mrn.meta_steps=0 must be at least 1"),
    (["method=mrn", "mrn.outer_weight=-1"], "mrn.outer_weight=-1.0 must be in [0.0, inf]"),
    (["feedback=rating", "method=mrn", "feed_type=0"], "feedback=rating does not take method=mrn"),
])
def test_bad_values_raise_config_errors_before_training(compose, tmp_path, overrides, message):
    with pytest.raises(ConfigError) as info:
        make_workspace(compose(overrides), tmp_path)
    assert message in str(info.value)
    assert not (tmp_path / "train.csv").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_cuda_without_cuda_is_an_error_and_auto_falls_back(compose, tmp_path):
    with pytest.raises(ConfigError, match="device=cuda but CUDA is not available"):
        make_workspace(compose(["device=cuda"]), tmp_path)
    ws = make_workspace(compose(["device=auto", "num_train_steps=10000"]), tmp_path)
    assert ws.device.type == "cpu"


def test_a_new_run_in_the_run_dir_of_another_is_refused_and_leaves_it_alone(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval.csv").write_text("step,episode_reward\n10000,-120.5\n")
    proc = launch("themis_train.sh", "domain=Classic", "env=Pendulum-v1",
                  f"hydra.run.dir={run}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"run dir {run} already holds a run (eval.csv); continue it with resume={run}, "
        "or give this run another hydra.run.dir")
    assert (run / "eval.csv").read_text() == "step,episode_reward\n10000,-120.5\n"
    assert not (run / "train.csv").exists()


def test_a_rejected_run_leaves_no_run_dir_behind(tmp_path):
    run = tmp_path / "runs" / "day" / "rejected"
    proc = launch("themis_train.sh", "domain=Classic", "env=Pendulum-v1", "segment=500",
                  f"hydra.run.dir={run}")
    assert proc.returncode == 2 and "longer than the episode limit" in proc.stderr
    assert not run.exists() and not run.parent.exists()


def test_a_finished_run_dir_has_no_empty_train_log(tmp_path):
    from tests.conftest import TINY_PENDULUM

    run = tmp_path / "run"
    proc = launch("themis_train.sh", *TINY_PENDULUM, "num_train_steps=600",
                  "max_feedback=10", "eval_frequency=600", f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "eval.csv").is_file() and not (run / "train.log").exists()


def test_help_describes_every_key():
    import dataclasses

    from themis.agents import PPOConfig, SACConfig
    from themis.config import TrainConfig

    proc = launch("themis_train.sh", "--help", "env=Hopper-v5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "  env = Hopper-v5\n" in out  # the overrides are applied to what is shown
    assert "  num_interact = 5000\n      Environment steps between feedback rounds." in out
    from themis.methods.mrn import MRNConfig
    from themis.methods.qpa import QPAConfig
    from themis.methods.rime import RIMEConfig
    from themis.methods.rune import RUNEConfig
    from themis.methods.surf import SURFConfig

    groups = {"sac": SACConfig, "ppo": PPOConfig, "surf": SURFConfig, "rune": RUNEConfig,
              "qpa": QPAConfig, "rime": RIMEConfig, "mrn": MRNConfig}
    names = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in groups] + \
        [f"{group}.{f.name}" for group, cls in groups.items() for f in dataclasses.fields(cls)]
    lines = out.splitlines()
    for name in names:
        at = next(i for i, line in enumerate(lines) if line.startswith(f"  {name} = "))
        assert lines[at + 1].startswith("      "), f"{name} has no description"


@pytest.mark.parametrize("script,args,message", [
    ("label_server.py", ["RUN", "--port", "70000"], "--port 70000 is not a TCP port"),
    ("bench_throughput.py", ["--steps", "4000"], "must exceed PEBBLE's pretraining"),
])
def test_scripts_reject_bad_arguments_with_one_line(tmp_path, script, args, message):
    import subprocess
    import sys

    from tests.conftest import ROOT

    argv = [str(tmp_path) if a == "RUN" else a for a in args]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_taken_labeling_port_is_one_line(tmp_path):
    import socket

    from tests.conftest import TINY_PENDULUM

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = launch("themis_train.sh", *TINY_PENDULUM, "human_teacher=true", "teacher_ui=web",
                      f"label_port={port}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("themis: error: ")
    assert "port taken" in proc.stderr and "Traceback" not in proc.stderr
