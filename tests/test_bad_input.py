"""Bad input ends before any training with one line, exit code 2 and no stack trace."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.conftest import launch
from themis.builder import make_workspace
from themis.utils import ConfigError


@pytest.mark.parametrize("override,message", [
    ("num_trian_steps=10", "num_trian_steps is not a Themis config key (did you mean "
                           "num_train_steps?)"),
    ("+num_train_step=10", "num_train_step is not a Themis config key (did you mean "
                           "num_train_steps?)"),
    ("sac.hiden_dim=8", "sac.hiden_dim is not a Themis config key (did you mean sac.hidden_dim?)"),
    ("core_turns=false", "core_turns was removed from Themis (runs no longer take turns"),
    ("+core_turns=true", "core_turns was removed from Themis"),
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
    ("method=sruf",
     "method=sruf is unknown (did you mean surf?); available: mrn, pebble, qpa, rime, rune, "
     "senior, surf"),
    ("method=[surf,rune", "an override Hydra cannot read; close every bracket and quote"),
    ("logger=wandbb", "logger=wandbb is unknown (did you mean wandb?)"),
    ("--hlep", "--hlep is not an option (did you mean --help?)"),
    ("domain=DMC env=walker_wlak", "close matches: walker-walk-v0"),
    ("domain=MetaWorld env=door-opne-v3", "close matches: door-open-v3"),
    ("seed=-1", "seed=-1 is outside [0, 2147483647]"),
    ("fragment_length=50", "fragment_length is imitation's name, not a Themis key: use segment"),
    ("total_comparisons=500", "use max_feedback"),
    ("xplain_action=true xplain_action_dim=99", "xplain_action_dim=99 is not an action "
                                                "dimension of HalfCheetah-v5"),
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
    (["agent=a2c"], "agent=a2c cannot act in the action space Box"),
    (["sac.hidden_dim=1000000000"], "sac.hidden_dim=1000000000 must be at most 16384"),
    (["labelers=100000"], "labelers=100000 must be at most 1000"),
    (["ppo.num_envs=5000"], "ppo.num_envs=5000 must be at most 1024"),
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
    (["feedback=rating", "rating_classes=1"], "rating_classes=1 is outside [2, 9]"),
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
    (["method=surf", "surf.threshold_u=2"], "surf.threshold_u=2.0 is outside [0.5, 1]"),
    (["method=surf", "surf.crop_range=30"], "surf.crop_range=30 must be >= 0 and leave"),
    (["method=qpa", "segment=10"], "segment=10 is too short"),
    (["method=rime", "rime.flip_tau=-1"], "rime.flip_tau=-1.0 is outside [0, 1]"),
    (["method=rime", "pretrained_snapshot=/nonexistent/snapshot.pt"],
     "a pretraining snapshot keeps no reward model"),
    (["method=qpa", "qpa.data_aug_ratio=-1"], "qpa.data_aug_ratio=-1 must be >= 0"),
    (["method=mrn", "domain=Box2d", "env=LunarLander-v3"], "PPO has no Q-function"),
    (["method=mrn", "mrn.meta_steps=0"], "mrn.meta_steps=0 must be positive"),
    (["method=mrn", "mrn.outer_weight=-1"], "mrn.outer_weight=-1.0 must be a number >= 0"),
    (["feedback=rating", "method=mrn", "feed_type=0"], "feedback=rating does not take method=mrn"),
])
def test_bad_values_raise_config_errors_before_training(compose, tmp_path, overrides, message):
    with pytest.raises(ConfigError) as info:
        make_workspace(compose(overrides), tmp_path)
    assert message in str(info.value)
    assert not (tmp_path / "train.csv").exists()


@pytest.mark.parametrize("overrides,message", [
    (["seed=-1"], "seed=-1 is outside [0, 2147483647]"),
    (["seed=99999999999999999999"], "seed=99999999999999999999 is outside [0, 2147483647]"),
    (["sac.actor_update_frequency=0"], "sac.actor_update_frequency=0 must be positive"),
    (["sac.critic_target_update_frequency=0"],
     "sac.critic_target_update_frequency=0 must be positive"),
    (["sac.init_temperature=-1"], "sac.init_temperature=-1.0 must be a positive number"),
    (["xplain_state=true", "human_frame_size=100000"], "human_frame_size=100000 is outside "
                                                        "[16, 4096]"),
    (["replay_buffer_capacity=1000000000000"], "replay_buffer_capacity=1000000000000: a "
                                               "ReplayBuffer of 1000000000000 steps needs"),
    (["num_train_steps=1000000000000", "replay_buffer_capacity=0"],
     "num_train_steps=1000000000000: a ReplayBuffer"),
    (["xplain_state=true", "human_frame_capacity=100000000"], "human_frame_size=128: a ring of "
                                                                "100000000 clip frames needs"),
    (["xplain_action=true", "xplain_action_dim=99"],
     "xplain_action_dim=99 is not an action dimension of HalfCheetah-v5 (0 … 5, or -1"),
])
def test_values_that_crashed_a_started_run_are_refused_before_training(compose, tmp_path,
                                                                       overrides, message):
    """Issue 33 item 11: each of these ended in a traceback (ValueError, ZeroDivisionError,
    MemoryError, IndexError at the first clip) once training had begun."""
    with pytest.raises(ConfigError) as info:
        make_workspace(compose(overrides), tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)
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

    from themis.agents import A2CConfig, PPOConfig, SACConfig
    from themis.run.config import TrainConfig

    proc = launch("themis_train.sh", "--help", "env=Hopper-v5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "  env = Hopper-v5\n" in out  # the overrides are applied to what is shown
    assert "  num_interact = 5000\n      Environment steps between feedback rounds." in out
    from themis.methods.registry import config_groups
    from themis.tracking import LoggerConfig

    groups = {"sac": SACConfig, "ppo": PPOConfig, "a2c": A2CConfig, **config_groups(),
              "logger": LoggerConfig}
    names = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in groups] + \
        [f"{group}.{f.name}" for group, cls in groups.items() for f in dataclasses.fields(cls)]
    lines = out.splitlines()
    for name in names:
        at = next(i for i, line in enumerate(lines) if line.startswith(f"  {name} = "))
        assert lines[at + 1].startswith("      "), f"{name} has no description"


@pytest.mark.parametrize("script,args,message", [
    ("label_server.py", ["RUN", "--port", "70000"], "--port 70000 is not a TCP port"),
    ("../benchmarks/bench_throughput.py", ["--steps", "4000"], "must exceed PEBBLE's pretraining"),
    ("inspect_reward.py", ["RUN", "--episodes", "-1"],
     "inspect_reward: error: argument --episodes: -1 must be >= 1"),
    ("inspect_reward.py", ["RUN", "--max-steps", "0"],
     "inspect_reward: error: argument --max-steps: 0 must be >= 1"),
    ("explain.py", ["RUN", "--clips", "-5"], "explain: error: argument --clips: -5 must be >= 1"),
    ("merge_prefs.py", ["FILE", "RUN"], "merge_prefs: error: FILE is a file; the merged "
                                        "dataset is a folder"),
    ("train_with_reward.py", ["RUN", "--device", "tpu"],
     "train_with_reward: error: --device: device='tpu' is not one of auto, cpu, cuda"),
])
def test_scripts_reject_bad_arguments_with_one_line(tmp_path, script, args, message):
    import subprocess
    import sys

    from tests.conftest import ROOT

    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    argv = [str(tmp_path) if a == "RUN" else str(a_file) if a == "FILE" else a for a in args]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *argv],
                          capture_output=True, text=True, timeout=120)
    message = message.replace("FILE", str(a_file))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("script,args,message", [
    ("inspect_reward.py", ["NOPE"], "NOPE is not found: give a run folder"),
    ("inspect_reward.py", ["FILE"], "FILE is a file: give a run folder"),
    ("label_server.py", ["--help"], ""),
    ("label_server.py", ["NOPE"], "NOPE/labels.sqlite not found"),
])
def test_scripts_refuse_before_they_load_pytorch_and_write_nothing(tmp_path, script, args,
                                                                   message):
    """A missing folder, a ``.pt`` file where a run folder goes, ``--help``: answered before
    PyTorch and the envs load (they took 18-35 s), with nothing left behind (issue 85 items
    9 and 13)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    a_file, nope = tmp_path / "reward_model.pt", tmp_path / "nope"
    a_file.write_bytes(b"PK")
    argv = [str(nope) if a == "NOPE" else str(a_file) if a == "FILE" else a for a in args]
    probe = ("import runpy, sys; sys.argv = [sys.argv[1], *sys.argv[2:]]\n"
             "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')\n"
             "sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe, str(ROOT / "scripts" / script), *argv],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.stdout.strip().splitlines()[-1] == "torch not loaded"
    if message:
        message = message.replace("NOPE", str(nope)).replace("FILE", str(a_file))
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    else:
        assert proc.returncode == 0 and "usage: label_server" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reward_model.pt"]


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
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("themis: error: ") and f"port {port} on 127.0.0.1 is taken" \
        in lines[-1] and "label_port=0 picks a free port" in lines[-1], proc.stderr
    assert "Errno" not in proc.stderr and "Traceback" not in proc.stderr  # not uvicorn's line


@pytest.mark.parametrize("overrides,message", [
    (["feedback=rating", "rating_k=nan"], "rating_k=nan must be a positive number"),
    (["sac.critic_tau=nan"], "sac.critic_tau=nan is outside (0, 1]"),
    (["method=rune", "rune.beta_init=nan"], "rune.beta_init=nan must be a number >= 0"),
    (["sac.discount=2"], "sac.discount=2.0 is outside [0, 1]"),
    (["reward_hidden_depth=-1"], "reward_hidden_depth=-1 must be >= 0"),
    (["reward_lr=inf"], "reward_lr=inf must be a finite positive number"),
    (["ppo.gamma=-0.5"], "ppo.gamma=-0.5 is outside [0, 1]"),
    (["sac.log_std_min=3"], "sac.log_std_min=3.0 must be smaller than sac.log_std_max=2.0"),
    (["PREFS_NAN"], "observations of pair 1 hold NaN or infinite values"),
])
def test_values_that_were_silently_accepted_are_refused(compose, tmp_path, overrides, message):
    """Issue 33 item 12: each of these ran (some to exit 0 with NaN results)."""
    if overrides == ["PREFS_NAN"]:  # a received dataset with a NaN observation
        from themis.agents.buffers import SegmentPairs
        from themis.reward.dataset import PreferenceDataset

        rng = np.random.default_rng(0)
        obs = rng.standard_normal((2, 2, 20, 3), dtype=np.float32)
        obs[1, 0, 5, 2] = np.nan
        data = PreferenceDataset(2, 20, 3, 1)
        data.add(SegmentPairs(obs, np.zeros((2, 2, 20, 1), np.float32),
                              np.zeros((2, 2, 20), np.float32), np.zeros((2, 2), np.int64)),
                 np.array([0.0, 1.0], np.float32))
        data.save(tmp_path / "prefs")
        overrides = ["domain=Classic", "env=Pendulum-v1", "segment=20", "max_feedback=0",
                     f"prefs_path={tmp_path / 'prefs'}"]
    with pytest.raises(ConfigError) as info:
        make_workspace(compose(overrides), tmp_path / "run")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "run" / "train.csv").exists()


def test_every_numeric_key_has_its_range_in_the_one_table():
    """Issue 33 item 12: a numeric key added to a config dataclass without a range in
    themis.run.validation.NUMERIC_KEYS fails here, so every number is checked for finiteness and
    range in one place."""
    import dataclasses
    import typing

    from themis.run.config import TrainConfig, compose
    from themis.run.validation import NUMERIC_KEYS

    def numeric(cls: type, prefix: str = "") -> list[str]:
        keys = []
        for f in dataclasses.fields(cls):
            kind = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(kind):
                keys += numeric(kind, f"{f.name}.")
            elif kind in (int, float, int | None, float | None):
                keys.append(prefix + f.name)
        return keys

    keys = numeric(TrainConfig)
    assert len(keys) > 80 and set(keys) <= set(NUMERIC_KEYS), set(keys) - set(NUMERIC_KEYS)
    assert set(NUMERIC_KEYS) - set(keys) == {"reward_batch"}  # typed Any: "auto" or a count
    for name in ("train_themis", "pretrain_themis"):  # the shipped configs are in range
        from themis.run.validation import validate

        validate(compose(name=name))


@pytest.fixture(scope="module")
def received_run(tmp_path_factory):
    """A run folder as a finished run leaves it (config.yaml, checkpoints/agent.pt,
    reward_model.pt, state.pt), made without training."""
    from omegaconf import OmegaConf

    from tests.conftest import TINY_PENDULUM
    from themis.run.config import compose

    run = tmp_path_factory.mktemp("received") / "run"
    cfg = compose(TINY_PENDULUM)
    ws = make_workspace(cfg, run)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    ws.save_checkpoints()
    ws.maybe_checkpoint(force=True)
    ws.logger.close()
    return run


def _craft(run, file: str, how: str) -> None:
    """Replace ``run/checkpoints/<file>`` with a truncated or crafted one (plain data: every
    crafted file here loads with weights_only=True)."""
    from themis.reward.ensemble import RewardEnsemble
    from themis.run.checkpoint import save_checkpoint

    path = run / "checkpoints" / file
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    elif how == "list":
        torch.save([1, 2, 3], path)
    elif how == "huge-config":  # would allocate 3 x 10^12 floats if built as it says
        torch.save({"model": {}, "config": {"obs_dim": 3, "action_dim": 1,
                                            "hidden_dim": 10**6}}, path)
    elif how == "unknown-argument":
        ckpt = torch.load(path, weights_only=True)
        torch.save({**ckpt, "config": {**ckpt["config"], "activation": "gelu"}}, path)
    elif how == "other-weights":
        ckpt = torch.load(path, weights_only=True)
        other = RewardEnsemble(3, 1, 3, hidden_dim=16, hidden_depth=3)
        torch.save({**ckpt, "model": other.state_dict()}, path)
    elif how == "empty-agent":
        torch.save({"agent": {"actor": 1}}, path)
    elif how == "not-a-state":  # checksummed: it passes the integrity check
        save_checkpoint({"step": 5, "env": "Pendulum-v1"}, path.parent)
    elif how == "state-list":
        save_checkpoint([1, 2, 3], path.parent)  # type: ignore[arg-type]


@pytest.mark.parametrize("entry,file,how,message", [
    ("load_reward_model", "reward_model.pt", "truncated", "is not a readable PyTorch file"),
    ("load_reward_model", "reward_model.pt", "list", "is not a Themis reward-model checkpoint"),
    ("load_reward_model", "reward_model.pt", "huge-config", "its weights do not fit its config"),
    ("load_reward_model", "reward_model.pt", "unknown-argument", "unexpected keyword argument"),
    ("load_reward_model", "reward_model.pt", "other-weights", "its weights do not fit"),
    ("inspect_reward.py", "reward_model.pt", "truncated", "is not a readable PyTorch file"),
    ("inspect_reward.py", "agent.pt", "empty-agent", "agent.pt is not the agent of this run"),
    ("explain.py", "reward_model.pt", "huge-config", "its weights do not fit its config"),
    ("train_with_reward.py", "reward_model.pt", "other-weights", "its weights do not fit"),
    ("resume", "state.pt", "not-a-state", "does not fit this run: 'episode' is missing"),
    ("resume", "state.pt", "state-list", "is not a Themis checkpoint"),
])
def test_crafted_or_truncated_files_of_a_received_run_end_with_one_line(
        compose, received_run, tmp_path, entry, file, how, message):
    """Issue 33 item 13: these were tracebacks (load_reward_model bypassed safe_load)."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT, TINY_PENDULUM

    run = tmp_path / "run"
    shutil.copytree(received_run, run)
    _craft(run, file, how)
    if entry == "load_reward_model":
        from themis.reward import load_reward_model

        with pytest.raises(ValueError) as info:
            load_reward_model(run)
        text = str(info.value)
    elif entry == "resume":
        with pytest.raises(ConfigError) as info:
            make_workspace(compose([*TINY_PENDULUM, "resume=true"]), run)
        text = str(info.value)
    else:
        short = {"inspect_reward.py": ["--episodes", "1"], "explain.py": ["--steps", "100"],
                 "train_with_reward.py": ["--steps", "1"]}[entry]
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / entry), str(run), *short],
                              capture_output=True, text=True, timeout=300, cwd=ROOT,
                              env={**os.environ, "THEMIS_THREADS": "1"})
        assert proc.returncode == 2, proc.stderr[-3000:]
        text = proc.stderr.strip()
        assert text.startswith(f"{entry.removesuffix('.py')}: error: "), text
    assert message in text and "\n" not in text, text


@pytest.mark.parametrize("entry", ["resume", "inspect_reward.py"])
def test_a_received_config_that_reads_the_environment_is_refused(received_run, tmp_path,
                                                                 monkeypatch, entry):
    """Issue 33 item 14: ${oc.env:SECRET} in a received config.yaml was resolved on resume and
    the secret written into the run's config.yaml."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT

    run = tmp_path / "run"
    shutil.copytree(received_run, run)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("human_labeler: ''",
                                                 "human_labeler: ${oc.env:THEMIS_TEST_SECRET}"))
    assert "oc.env" in config.read_text()
    monkeypatch.setenv("THEMIS_TEST_SECRET", "hunter2")
    if entry == "resume":
        proc = launch("themis_train.sh", f"resume={run}")
    else:
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / entry), str(run)],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert "\n" not in line and "human_labeler='${oc.env:THEMIS_TEST_SECRET}' calls the " \
        "resolver oc.env" in line, line
    assert "hunter2" not in config.read_text() + proc.stdout + proc.stderr
    assert "hunter2" not in "".join(p.read_text(errors="replace") for p in run.rglob("*.yaml"))


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_run_that_renders_with_pygame_stops_on_sigterm_and_ctrl_c(tmp_path, signal_name):
    """Issue 33 item 15: SDL (pygame rendering of classic control and Box2D envs) took over
    SIGTERM once it started, so `kill` and `timeout` did not stop a run that renders clips."""
    import signal
    import subprocess
    import time

    from tests.conftest import ROOT, TINY_PENDULUM

    run = tmp_path / "run"
    env = {**os.environ, "THEMIS_THREADS": "1"}
    env.pop("SDL_NO_SIGNAL_HANDLERS", None)
    proc = subprocess.Popen(  # Ctrl-C in a terminal: SIGINT with Python's handler in place
        [str(ROOT / "themis_train.sh"), *TINY_PENDULUM, "num_train_steps=50000",
         "max_feedback=5000", "xplain_state=true", f"hydra.run.dir={run}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 180
        while not any(run.rglob("*.mp4")):  # a clip was rendered: SDL has started
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            time.sleep(0.2)
        proc.send_signal(getattr(signal, signal_name))
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pytest.fail(f"the run ignored {signal_name}")


def test_a_key_given_twice_is_named_with_both_values(tmp_path):
    """Issue 85 item 17: Hydra keeps the last value silently; the launcher says so in one line
    (a warning: scripts that repeat a key on purpose keep working)."""
    from themis.cli.train import repeated_key

    assert repeated_key(["seed=1", "num_train_steps=10", "seed=2"]) == (
        "seed is given twice (seed=1, then seed=2); the last one, seed=2, is used")
    assert repeated_key(["seed=1", "+recipe=drlhp", "seed=1"]) is None  # the same value
    assert repeated_key(["+sac.hidden_dim=64", "sac.hidden_dim=32"]) is not None
    proc = launch("themis_train.sh", "seed=1", "seed=2", "seed=nope",
                  f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert "themis: warning: seed is given twice (seed=1, then seed=2)" in proc.stdout
    assert proc.stderr.strip().count("\n") == 0  # the error alone on stderr


def test_imitation_s_names_given_to_the_wrapper_name_the_themis_key(tmp_path):
    import gymnasium as gym

    from themis import PreferenceLearningWrapper

    with pytest.raises(ConfigError, match=r"comparisons_per_iteration is imitation's name, "
                                          r"not a Themis key: use reward_batch"):
        PreferenceLearningWrapper(gym.make("Pendulum-v1"), tmp_path / "run",
                                  comparisons_per_iteration=10)


def test_a_script_started_by_a_python_without_themis_runs_with_the_venv_or_says_so(tmp_path):
    """Issue 85 item 12: ``python scripts/summarize.py`` with the system's Python ended with
    ``No module named 'pandas'``."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import ROOT

    system = Path(sys.base_prefix) / "bin" / "python3"
    if not (ROOT / ".venv").is_dir() or subprocess.run(
            [system, "-c", "import pandas, themis"], capture_output=True).returncode == 0:
        pytest.skip("needs the repository's .venv and a base Python without Themis")
    env = {k: v for k, v in os.environ.items() if k != "THEMIS_SCRIPT_REEXEC"}
    ran = subprocess.run([system, str(ROOT / "scripts" / "merge_prefs.py"), "--help"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert ran.returncode == 0 and "usage: merge_prefs" in ran.stdout, ran.stderr
    env["THEMIS_SCRIPT_REEXEC"] = "1"  # as if .venv's Python lacked the packages too
    ran = subprocess.run([system, str(ROOT / "scripts" / "merge_prefs.py"), "--help"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert ran.returncode == 2 and ran.stderr.strip().count("\n") == 0
    assert "run bash scripts/setup.sh once, then source .venv/bin/activate" in ran.stderr
