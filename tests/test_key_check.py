"""The launchers' quick key check (themis/cli/key_check.py): a typo refused without PyTorch,
with the full check's line, and never a line the full check would not give."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, launch
from themis.cli import key_check
from themis.cli.train import RAISE_INSTEAD, check_overrides
from themis.run.config import key_index
from themis.utils import ConfigError

TYPOS = [["sac.hiden_dim=3"], ["num_train_step=1"], ["seed=1", "hiden=3"], ["core_turns=true"],
         ["surf.taux=1"], ["logger.tensorbord=true"], ["method=surf", "rune.bet=1"],
         ["method=surff"], ["teacher=nosy"], ["logger=neptune"], ["domain=dmc"],
         ["domain=Contrl"], ["domain=xyz"]]
"""Command lines the quick check refuses."""
LEFT_TO_THE_FULL_CHECK = [
    ["seed=1"], ["method=surf", "surf.inv_label_ratio=2"], ["domain=DMC", "env=walker_walk"],
    ["+env_kwargs.x=1"], ["env_kwargs.continuous=false"], ["teacher=noisy"], ["recipe=drlhp"],
    ["num_train_steps=1e5"], ["sac.hidden_dim.x=3"], ["hydra/launcher=joblib"],
    ["hydra.run.dir=/nowhere"], ["--num_train_steps", "1000"], ["-m", "seed=0,1"],
    ["logger=wandb"], ["+extra=1"], ["~seed"], ["env"], ["recipe=drlph"],
    ["logger=[wandb,neptune]"], ["-m", "method=surf,rune"], ["method=[surf,rune]"]]
"""Command lines it leaves alone (good ones, values, additions, Hydra's own)."""


def full_check(argv: list[str]) -> str | None:
    """The line :func:`check_overrides` refuses ``argv`` with, or None."""
    RAISE_INSTEAD.on = True
    try:
        check_overrides([a for a in argv if not a.startswith("-")], "train_themis")
    except ConfigError as e:
        return str(e)
    except Exception as e:
        return f"other: {type(e).__name__}"
    finally:
        RAISE_INSTEAD.on = False
    return None


@pytest.fixture(scope="module")
def index():
    return key_index()


@pytest.mark.parametrize("argv", TYPOS, ids=lambda a: " ".join(a))
def test_a_typo_is_refused_with_the_full_checks_line(index, argv, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    line = key_check.refusal(index, "train_themis", argv)
    assert line is not None and line == full_check(argv)


@pytest.mark.parametrize("argv", LEFT_TO_THE_FULL_CHECK, ids=lambda a: " ".join(a))
def test_what_the_quick_check_cannot_tell_is_left_to_the_full_check(index, argv):
    assert key_check.refusal(index, "train_themis", argv) is None


def test_the_index_names_every_group_and_removed_key(index):
    assert {"sac", "ppo", "logger", "surf"} <= set(index["groups"])
    assert "env_kwargs" not in index["groups"] and "env_kwargs" in index["keys"]
    assert {"method", "teacher", "recipe", "domain"} <= set(index["keys"])
    assert index["removed"]["core_turns"]
    assert set(index["options"]) == {"method", "teacher", "logger"}
    assert "surf" in index["options"]["method"] and "oracle" in index["options"]["teacher"]


def test_another_version_of_the_code_reads_another_index(tmp_path):
    (tmp_path / "themis").mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "themis" / "a.py").write_text("x = 1\n")
    (tmp_path / "config" / "t.yaml").write_text("seed: 0\n")
    before = key_check.source_digest(tmp_path)
    (tmp_path / "config" / "t.yaml").write_text("seed: 1\n")
    assert key_check.source_digest(tmp_path) != before


@pytest.mark.slow
def test_the_launcher_refuses_a_typo_quickly_once_any_launch_wrote_the_index(tmp_path,
                                                                              monkeypatch):
    """The first launch refuses the typo through the full check and writes the index; the
    next one is refused by the quick check alone, with the same line, and that check imports
    neither PyTorch nor Hydra."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    args = ["sac.hiden_dim=3", f"hydra.run.dir={tmp_path / 'run'}"]
    first = launch("themis_train.sh", *args)
    assert first.returncode == 2 and list((tmp_path / "cache" / "themis").iterdir())
    second = launch("themis_train.sh", *args)
    assert second.returncode == 2 and second.stderr == first.stderr
    assert second.stderr.startswith("themis: error: sac.hiden_dim is not a Themis config key")
    probe = ("import runpy, sys; sys.argv = ['x', 'themis.cli.train', 'sac.hiden_dim=3']\n"
             "try:\n    runpy.run_module('themis.cli.key_check', run_name='__main__')\n"
             "except SystemExit as e:\n    print(json.dumps([e.code, sorted(m for m in "
             "sys.modules if m.split('.')[0] in ('torch', 'hydra', 'omegaconf'))]))")
    done = subprocess.run([sys.executable, "-c", "import json\n" + probe], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) == [2, []]
