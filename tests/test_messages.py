"""Messages that point the right way (issue 67, items 3 and 4): each mistake a newcomer made
gets the one line that names the fix, and keys that would do nothing are refused."""

from __future__ import annotations

import pytest
import torch

from themis.builder import make_workspace
from themis.cli.train import check_overrides, preflight
from themis.environments.domains import get_domain
from themis.run.hints import resume_problem
from themis.utils import ConfigError

TINY = ["domain=Classic", "env=Pendulum-v1", "num_train_steps=1200", "num_seed_steps=200",
        "num_unsup_steps=200", "sac.hidden_dim=32", "reward_hidden_dim=32"]


def refused(capsys, call, *args) -> str:
    """The one line a launcher check ends with (exit code 2)."""
    with pytest.raises(SystemExit) as stop:
        call(*args)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("themis: error: "), err
    return err[0].removeprefix("themis: error: ")


def test_a_dmc_task_with_the_default_domain_says_domain_dmc():
    with pytest.raises(ConfigError) as info:
        get_domain("Control").resolve("walker_walk")
    assert str(info.value) == ("env=walker_walk is not an environment of domain=Control: it is "
                               "a DMC task; add domain=DMC")


def test_a_classic_control_env_in_control_says_domain_classic():
    with pytest.raises(ConfigError) as info:
        get_domain("Control").resolve("Pendulum-v1")
    assert "it is a Classic env; add domain=Classic" in str(info.value)
    assert "InvertedPendulum" not in str(info.value)
    with pytest.raises(ConfigError, match="close matches: HalfCheetah-v5"):  # a typo stays one
        get_domain("Control").resolve("HalfCheeta-v5")


def test_a_domain_in_the_wrong_case_gets_did_you_mean():
    with pytest.raises(ConfigError, match=r"domain=dmc is unknown \(did you mean DMC\?\)"):
        get_domain("dmc")


def test_the_key_typo_hint_names_the_launchers_help(capsys):
    line = refused(capsys, check_overrides, ["num_train_step=1"], "train_themis")
    assert line.endswith("(did you mean num_train_steps?); ./themis_train.sh --help lists them")
    line = refused(capsys, check_overrides, ["num_train_step=1"], "pretrain_themis")
    assert line.endswith("./themis_pretrain.sh --help lists them")
    assert "python -m" not in line


def test_a_run_checkpoint_as_pretrained_snapshot_names_resume_not_keys_never_set(compose,
                                                                                 tmp_path):
    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir(parents=True)
    torch.save({"version": 1, "env": "Pendulum-v1", "step": 80_000, "pretraining_done": True,
                "agent": {}, "buffer": {}, "interact_count": 0}, ckpt / "state.pt")
    with pytest.raises(ConfigError) as info:
        make_workspace(compose([*TINY, f"pretrained_snapshot={ckpt / 'state.pt'}"]),
                       tmp_path / "new")
    message = str(info.value)
    assert "num_seed_steps" not in message and "num_unsup_steps" not in message
    assert "is a training run's checkpoint" in message
    assert f"resume={tmp_path / 'run'}" in message
    assert f"pretrained_snapshot={ckpt / 'agent.pt'}" in message


def test_resume_of_a_pretraining_run_points_to_pretrained_snapshot(capsys, tmp_path):
    (tmp_path / "config.yaml").write_text("num_train_steps: 6000\n")
    (tmp_path / "snapshot.pt").write_bytes(b"")
    line = refused(capsys, preflight, "train_themis", [f"resume={tmp_path}"])
    assert line == (f"resume={tmp_path} is a pretraining run (snapshot.pt, no checkpoints/): "
                    f"start training from it with pretrained_snapshot={tmp_path / 'snapshot.pt'}")


def test_prefs_path_of_a_run_dir_points_to_its_preferences(compose, tmp_path):
    run = tmp_path / "run"
    (run / "preferences").mkdir(parents=True)
    (run / "preferences" / "meta.json").write_text("{}")
    with pytest.raises(ConfigError) as info:
        make_workspace(compose([*TINY, f"prefs_path={run}"]), tmp_path / "new")
    assert str(info.value) == (f"prefs_path={run} is a run dir; its labels are in "
                               f"{run / 'preferences'}: use prefs_path={run / 'preferences'}")


def test_resume_of_a_finished_run_says_it_had_finished(capsys, tmp_path):
    (tmp_path / "config.yaml").write_text("num_train_steps: 1200\n")
    (tmp_path / "checkpoints").mkdir()
    torch.save({"agent": {}, "step": 1200, "env": "Pendulum-v1"},
               tmp_path / "checkpoints" / "agent.pt")
    line = refused(capsys, preflight, "train_themis", [f"resume={tmp_path}"])
    assert line == (f"resume={tmp_path}: the run had finished (step 1200 of "
                    "num_train_steps=1200); to train on, resume it with a larger "
                    "num_train_steps=")
    assert resume_problem(tmp_path, ["num_train_steps=1800"]) is None  # a longer run goes on
    torch.save({"agent": {}, "step": 1200, "env": "Pendulum-v1", "finished": False},
               tmp_path / "checkpoints" / "agent.pt")
    assert resume_problem(tmp_path, []) is None  # the last evaluation's, before the run's end
    torch.save({"agent": {}, "step": 1200, "env": "Pendulum-v1", "finished": True},
               tmp_path / "checkpoints" / "agent.pt")
    assert resume_problem(tmp_path, []) is not None
    torch.save({"agent": {}, "step": 600, "env": "Pendulum-v1"},
               tmp_path / "checkpoints" / "agent.pt")
    assert resume_problem(tmp_path, []) is None  # a run stopped half-way goes on


def test_a_key_written_as_a_flag_gets_key_equals_value(capsys):
    line = refused(capsys, preflight, "train_themis", ["--num_train_steps", "1000"])
    assert line == ("--num_train_steps 1000: Themis keys are given as key=value (Hydra "
                    "overrides), e.g. num_train_steps=1000")


def test_an_integer_written_1e5_gets_the_integer(capsys):
    line = refused(capsys, check_overrides, ["num_train_steps=1e5"], "train_themis")
    assert line.startswith("num_train_steps=1e5 must be an integer: write "
                           "num_train_steps=100000")


@pytest.mark.parametrize("value", ["1e400", "-1e400"])
def test_an_integer_too_large_for_a_float_is_one_line(capsys, value):
    line = refused(capsys, check_overrides, [f"seed={value}"], "train_themis")
    assert line == f"seed={value} must be an integer, e.g. seed=1 ({value} is out of range)"


def test_a_new_env_kwargs_key_without_plus_gets_the_plus(capsys):
    line = refused(capsys, check_overrides, ["env_kwargs.continuous=false"], "train_themis")
    assert line == ("env_kwargs.continuous adds a key to env_kwargs: Hydra needs a + for a new "
                    "key, +env_kwargs.continuous=false")


# ---------------------------------------------------------------- keys that do nothing
def test_teacher_ui_web_without_a_human_teacher_is_refused(compose, tmp_path):
    with pytest.raises(ConfigError, match="teacher_ui=web needs human_teacher=true"):
        make_workspace(compose([*TINY, "teacher_ui=web"]), tmp_path)
    assert not (tmp_path / "train.csv").exists()


def test_xplain_action_dim_without_xplain_action_is_refused(compose, tmp_path):
    with pytest.raises(ConfigError, match="xplain_action_dim=0 needs xplain_action=true"):
        make_workspace(compose([*TINY, "xplain_action_dim=0"]), tmp_path)


def test_an_unknown_option_inside_a_list_names_the_options(capsys):
    line = refused(capsys, check_overrides, ["logger=[wandb,neptune]"], "train_themis")
    assert line == "logger=neptune is unknown; available: csv, mlflow, tensorboard, wandb"
