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
from themis.run.key_index import key_index
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


# ------------------------------------------------------------- env names (themis/core/env_names)
ENV_TYPOS = [("DMC", "walker_wlak"), ("Control", "walker_walk"), ("Control", "Ant-v5x"),
             ("Classic", "Pendulm-v1"), ("MetaWorld", "door-opne"), ("Control", "CartPole-v1"),
             ("Classic", "HalfCheetah-v5"), ("Box2d", "qqqq"), ("ALE", "Breakuot-v5"),
             ("DMC", "Pendulum-v1")]
"""(domain, env) the full check refuses; the quick check must give its line."""
ENVS_FOUND = [("DMC", "walker_walk", "dm_control/walker-walk-v0"),
              ("DMC", "walker-walk", "dm_control/walker-walk-v0"),
              ("DMC", "dm_control/walker-walk-v0", "dm_control/walker-walk-v0"),
              ("MetaWorld", "door-open", "door-open-v3"), ("Control", "Hopper-v5", "Hopper-v5"),
              ("ALE", "Pong-v5", "ALE/Pong-v5")]


@pytest.fixture(scope="module")
def saved_lists(tmp_path_factory):
    """Every domain listed by the full check (its suites imported), saved as a launch saves
    them, and read back."""
    from themis.core.env_names import DISTRIBUTIONS
    from themis.environments.domains import DOMAINS, LISTED

    for name in DISTRIBUTIONS:
        DOMAINS[name].env_ids()
    DOMAINS["Gym"].env_ids()  # whatever this process registered: never saved
    assert "Gym" not in LISTED
    path = tmp_path_factory.mktemp("cache") / "envs.json"
    key_check.save_env_lists(dict(LISTED), path)
    return json.loads(path.read_text())


def full_env_check(domain: str, env: str) -> str:
    from themis.environments.domains import get_domain

    with pytest.raises(ConfigError) as info:
        get_domain(domain).resolve(env)
    return str(info.value)


@pytest.mark.parametrize("domain,env", ENV_TYPOS, ids=lambda a: str(a))
def test_an_env_typo_is_refused_with_the_full_checks_line(saved_lists, domain, env):
    assert key_check.env_refusal(saved_lists, domain, env) == full_env_check(domain, env)


@pytest.mark.parametrize("domain,env,resolved", ENVS_FOUND, ids=lambda a: str(a))
def test_an_env_of_the_domain_passes_the_quick_check(saved_lists, domain, env, resolved):
    from themis.core.env_names import find_env
    from themis.environments.domains import get_domain

    assert key_check.env_refusal(saved_lists, domain, env) is None
    entry = saved_lists[domain]
    assert find_env(domain, env, entry["ids"], entry["prefix"]) == resolved
    assert get_domain(domain).resolve(env) == resolved


def test_without_a_list_it_needs_or_with_other_versions_the_quick_check_says_nothing(
        saved_lists):
    # walker_walk in Control: the line names DMC, so DMC's list is needed
    without_dmc = {k: v for k, v in saved_lists.items() if k != "DMC"}
    assert key_check.env_refusal(without_dmc, "Control", "walker_walk") is None
    # a typo of one of Control's own envs needs only the cheap domains' lists
    assert key_check.env_refusal(without_dmc, "Control", "Ant-v5x") == \
        full_env_check("Control", "Ant-v5x")
    assert key_check.env_refusal({}, "Control", "Ant-v5x") is None
    older = json.loads(json.dumps(saved_lists))
    older["DMC"]["versions"]["shimmy"] = "0.0.1"  # another shimmy may register other tasks
    assert key_check.env_refusal(older, "DMC", "walker_wlak") is None


def test_saving_the_lists_merges_and_rewrites_nothing_unchanged(saved_lists, tmp_path):
    path = tmp_path / "envs.json"
    classic = (saved_lists["Classic"]["ids"], saved_lists["Classic"]["prefix"])
    key_check.save_env_lists({"Classic": classic}, path)
    stamp = path.stat().st_mtime_ns
    key_check.save_env_lists({"Classic": classic}, path)
    assert path.stat().st_mtime_ns == stamp
    key_check.save_env_lists({"DMC": (saved_lists["DMC"]["ids"], "dm_control/")}, path)
    assert set(json.loads(path.read_text())) == {"Classic", "DMC"}


@pytest.mark.parametrize("argv,chosen", [
    (["env=walker_wlak"], ("Control", "walker_wlak")),
    (["domain=DMC", "env=walker_wlak", "seed=1"], ("DMC", "walker_wlak")),
    (["-m", "domain=DMC", "env=walker_wlak", "seed=0,1"], ("DMC", "walker_wlak")),
    (["domain=DMC"], None), (["env=a,b"], None), (["env=mypkg.envs:MyEnv-v0"], None),
    (["env=null"], None), (["env=true"], None), (["env=3"], None), (["env='x y'"], None),
    (["domain=DMC,Control", "env=walker_wlak"], None), (["domain=Gym", "env=x"], None),
    (["resume=runs/a", "env=walker_wlak"], None), (["+env=x"], None)])
def test_the_env_the_quick_check_looks_at(index, argv, chosen):
    assert index["default_domain"] == "Control"
    assert key_check.chosen_env(index, argv) == chosen


@pytest.mark.slow
def test_the_launcher_refuses_an_env_typo_quickly_once_a_launch_listed_the_domain(tmp_path,
                                                                                  monkeypatch):
    """The first launch lists DMC's tasks (importing dm_control) and refuses the typo; the
    next is refused by the quick check with the same line, without PyTorch, Hydra or
    gymnasium; so is a value outside its range."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    args = ["domain=DMC", "env=walker_wlak", f"hydra.run.dir={tmp_path / 'run'}"]
    first = launch("themis_train.sh", *args)
    assert first.returncode == 2, first.stderr
    assert first.stderr.startswith("themis: error: env=walker_wlak is not an environment of "
                                   "domain=DMC; close matches: walker-walk-v0")
    second = launch("themis_train.sh", *args)
    assert second.returncode == 2 and second.stderr == first.stderr
    for argv in (["domain=DMC", "env=walker_wlak"], ["seed=-1"]):  # and a value, likewise
        probe = ("import json, runpy, sys\n"
                 f"sys.argv = ['x', 'themis.cli.train', *{argv!r}]\n"
                 "try:\n    runpy.run_module('themis.cli.key_check', run_name='__main__')\n"
                 "except SystemExit as e:\n    print(json.dumps([e.code, sorted(m for m in "
                 "sys.modules if m.split('.')[0] in ('torch', 'hydra', 'gymnasium', "
                 "'shimmy'))]))")
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        assert json.loads(done.stdout.splitlines()[-1]) == [2, []], done.stderr
    assert done.stderr == "themis: error: seed=-1 is outside [0, 2147483647]\n"


# ------------------------------------------------------------- values outside their ranges
VALUE_REFUSALS = [["seed=-1"], ["sac.discount=2"], ["sac.discount=1.5"], ["reward_lr=0"],
                  ["reward_lr=nan"], ["reward_lr=-inf"], ["reward_lr=1e400"],
                  ["label_port=70000"], ["teacher_gamma=0"], ["rating_classes=1"],
                  ["seed=3", "segment=0"], ["segment=0", "seed=-1"], ["surf.threshold_u=.2"],
                  ["method=rune", "rune.beta_decay=2."], ["sac.critic_tau=0e0"],
                  ["teacher_beta=-2"], ["num_train_steps=0"], ["reward_dropout=1"]]
"""Command lines whose first bad value (in NUMERIC_KEYS' order) the quick check refuses."""
VALUES_LEFT = [["seed=1.5"], ["seed=1e5"], ["seed=-1", "torch_threads=1"],
               ["seed=-1", "resume=runs/x"], ["seed=-1", "pretrained_snapshot=x/snapshot.pt"],
               ["reward_batch=0"], ["seed=0x10"], ["seed=1_000"], ["sac.discount=0.99"],
               ["-m", "seed=-1,0"], ["+seed=-1"], ["seed=${oc.env:X}"], ["seed=null"]]
"""Values it leaves to the full check: fine ones, other types, and command lines where the
full check looks at something else first."""


def full_value_check(argv: list[str]) -> str | None:
    from omegaconf import OmegaConf

    from themis.run.config import compose
    from themis.run.validation import validate

    try:
        validate(OmegaConf.to_object(compose(argv)))
    except ConfigError as e:
        return str(e)
    return None


@pytest.mark.parametrize("argv", VALUE_REFUSALS, ids=lambda a: " ".join(a))
def test_a_value_outside_its_range_is_refused_with_the_full_checks_line(index, argv):
    line = key_check.value_refusal(index, argv)
    assert line is not None and line == full_value_check(argv)


@pytest.mark.parametrize("argv", VALUES_LEFT, ids=lambda a: " ".join(a))
def test_values_the_quick_check_cannot_tell_are_left_to_the_full_check(index, argv):
    assert key_check.value_refusal(index, argv) is None


def test_the_index_holds_every_integer_and_float_range_in_the_tables_order(index):
    from themis.run.validation import NUMERIC_KEYS

    keys = [row[0] for row in index["ranges"]]
    assert keys == [k for k in NUMERIC_KEYS if k in keys]
    assert {"seed", "sac.discount", "surf.threshold_u", "label_port"} <= set(keys)
    assert dict((r[0], r[1]) for r in index["ranges"])["sac.discount"] == "float"
    assert json.loads(json.dumps(index))["ranges"] == index["ranges"]  # inf survives JSON


def test_a_cache_that_cannot_be_trusted_is_ignored_and_written_anew(tmp_path, monkeypatch, index):
    """Issue 85 item 5: a malformed index crashed every launch, a FIFO hung it, a file others
    may write (planted) refused valid keys and was never rewritten."""
    import os
    import threading

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = key_check.index_path()
    path.parent.mkdir(parents=True)
    planted = {**index, "keys": ["nothing"]}  # would refuse seed=1
    for make in ("[]", "{not json", "planted", "fifo", "huge"):
        if path.exists() or path.is_symlink():
            path.unlink()
        if make == "fifo":
            os.mkfifo(path)
        elif make == "planted":
            path.write_text(json.dumps(planted))
            os.chmod(path, 0o666)
        elif make == "huge":
            path.write_text(" " * (key_check.CACHE_LIMIT + 1) + "{}")
        else:
            path.write_text(make)
        result: list[int] = []
        worker = threading.Thread(target=lambda out=result: out.append(
            key_check.main(["themis.cli.train", "seed=1"])), daemon=True)
        worker.start()
        worker.join(10)
        assert result == [0], make  # no crash, no hang, no refusal: the full check decides
        key_check.save_index(lambda: index, path)
        assert key_check.read_cache(path, key_check.INDEX_KEYS) == json.loads(json.dumps(index))
    assert key_check.main(["themis.cli.train", "sac.hiden_dim=3"]) == 2  # rebuilt: it works
