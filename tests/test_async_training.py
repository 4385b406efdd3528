"""``reward_training=async``: Themis's own SAC and PPO loops with the background learner.

The agent keeps stepping while the learner process asks and trains; each new reward-model
version is loaded into the loop's model, and the replay buffer is relabelled with it (SAC) or
the next rollout is rewarded by it (PPO). What async cannot do is refused with one line, and
no learner process outlives the run (its end, or a SIGTERM of the training process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import ROOT, TINY_PENDULUM
from themis.builder import make_workspace
from themis.loops import pebble, prefppo
from themis.reward import PreferenceDataset, load_reward_model
from themis.run.closing import finish, stop
from themis.run.snapshot import save_snapshot
from themis.utils import ConfigError

ASYNC = [*TINY_PENDULUM, "num_train_steps=2000", "reward_training=async", "torch_threads=1",
         "precision=fp32"]


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in model.state_dict().values()])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [[], ["reward_dropout=0.5", "reward_batchnorm=true"]],
                         ids=["plain", "dropout-batchnorm"])
def test_async_sac_trains_the_reward_model_and_relabels_with_the_newest_version(
        compose, tmp_path, monkeypatch, recipe):
    ws = make_workspace(compose([*ASYNC, "num_train_steps=3000", *recipe]), tmp_path)
    seen: list[tuple[int, torch.Tensor]] = []
    real_relabel = pebble.relabel

    def relabel(ws_: object) -> None:
        real_relabel(ws)
        buffer = pebble.replay(ws)
        buffer._label_pending()
        n = len(buffer)
        want = ws.learner.reward(buffer.obs[:n], buffer.actions[:n])
        np.testing.assert_allclose(buffer.rewards[:n].reshape(-1), want.reshape(-1),
                                   rtol=1e-5, atol=1e-6)  # r̂ of the version in use
        seen.append((ws.learner.version, flat(ws.learner.model)))

    monkeypatch.setattr(pebble, "relabel", relabel)
    ws.run()
    finish(ws)
    versions = [v for v, _ in seen]
    assert len(seen) >= 2 and versions == sorted(set(versions)) and versions[0] == 1
    assert not torch.equal(seen[0][1], seen[-1][1])  # the reward model was trained on
    rounds = pd.read_csv(tmp_path / "reward.csv")  # written by the learner process
    assert len(rounds) >= 2 and rounds["total_feedback"].is_monotonic_increasing
    # the loop ends with the learner's newest model
    mine = load_reward_model(str(tmp_path / "checkpoints" / "reward_model.pt"))
    newest = load_reward_model(str(tmp_path / "checkpoints" / "learner" / "reward_model.pt"))
    assert torch.equal(flat(mine), flat(newest))
    assert (tmp_path / "preferences" / "meta.json").is_file()
    assert len(pd.read_csv(tmp_path / "train.csv"))  # the loop's own rows, one writer
    assert not ws.learner.channel.process.is_alive()  # no learner process left
    assert (tmp_path / "checkpoints" / "state.pt").exists()  # resumable: the loop's checkpoint
    assert (tmp_path / "checkpoints" / "learner" / "state.pt").exists()  # and the learner's


@pytest.mark.slow
def test_async_ppo_rewards_the_next_rollout_with_the_newest_version(compose, tmp_path,
                                                                     monkeypatch):
    ws = make_workspace(compose([
        *ASYNC, "domain=Box2d", "env=LunarLander-v3", "ppo.num_envs=2", "ppo.num_steps=32",
        "num_train_steps=4000"]), tmp_path)
    used: list[int] = []
    real = prefppo.learned_rewards

    def learned_rewards(ws_: object, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        used.append(ws.learner.version)
        time.sleep(0.05)  # a slower agent: later versions come inside the run on a busy machine
        return real(ws, obs, actions)

    monkeypatch.setattr(prefppo, "learned_rewards", learned_rewards)
    ws.run()
    finish(ws)
    assert used[0] == 1 and max(used) >= 2 and used == sorted(used)
    assert len(pd.read_csv(tmp_path / "reward.csv")) >= 2
    assert not ws.learner.channel.process.is_alive()


@pytest.mark.parametrize("override, words", [
    ("reward_training=later", "reward_training=later is unknown"),
    ("method=qpa", "method=qpa"),
    ("method=mrn", "method=mrn"),
    ("method=rime", "RIME's warm start"),
    ("learn_reward=false", "learn_reward=false"),
    ("xplain_state=true", "explained clips"),
    ("reward_training=sync query_schedule=continuous", "use reward_training=async"),
])
def test_what_async_cannot_do_is_one_line(compose, tmp_path, override, words):
    with pytest.raises(ConfigError) as error:
        make_workspace(compose([*ASYNC, *override.split()]), tmp_path)
    text = str(error.value)
    assert words in text and "\n" not in text


def test_resume_of_an_async_run_with_people_is_refused_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("reward_training: async\nhuman_teacher: true\n")
    # in tmp_path: Hydra's default run dir (runs/...) is not made in the repository, where
    # parallel test workers would share it
    out = subprocess.run([sys.executable, "-m", "themis.cli.train", f"resume={run}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "resume of an async run with people is not supported" in out.stderr


DOT_ASYNC = [
    "domain=MovingDot", "agent=a2c", "a2c.num_envs=2", "+recipe=drlhp",
    "reward_net=drlhp_dot_onehot", "+env_kwargs.max_episode_steps=80", "num_seed_steps=160",
    "num_unsup_steps=0", "num_interact=320", "max_feedback=40", "first_round_queries=10",
    "segment=10", "reward_pretrain_epochs=2", "reward_train_batch=8", "query_decay_steps=512",
    "num_eval_episodes=1", "precision=fp32", "reward_training=async", "torch_threads=1",
]
"""A tiny async PrefA2C run on MovingDot with DRLHP's recipe (label-passes in the learner)."""


def test_with_reward_max_lag_the_agent_waits_for_the_learners_label_passes(compose, tmp_path):
    """The learner trains DRLHP's CNN on the frames, far slower than A2C steps: without a
    bound the agent runs ahead; with ``reward_max_lag`` the steps the passes were trained for
    are never more than the bound behind."""
    lags = {}
    for lag, steps in ((0, 800), (40, 480)):  # bounded, 160 steps of waiting show the bound
        ws = make_workspace(compose([*DOT_ASYNC, "reward_net=drlhp", f"num_train_steps={steps}",
                                     "reward_passes_per_step=0.5", f"eval_frequency={steps}",
                                     f"reward_max_lag={lag}"]), tmp_path / f"lag{lag}")
        seen: list[int] = []
        stepped = ws.learner.stepped

        def watch(n: int, stepped=stepped, ws=ws, seen=seen) -> None:
            stepped(n)
            if ws.learner.version > 0:  # after the first model
                channel = ws.learner.channel
                seen.append(channel.total_steps - channel.shared.trained_steps.value)

        ws.learner.stepped = watch
        ws.run()
        finish(ws)
        lags[lag] = max(seen)
    assert lags[40] <= 40
    assert lags[0] > 400  # unbounded, the learner falls far behind (700 measured)


def test_an_async_run_loads_published_versions_without_a_checkpoint_each(compose, tmp_path,
                                                                        monkeypatch):
    """Under DRLHP's passes the learner publishes r̂ four times per ``num_interact`` steps; the
    loop took a full checkpoint at each version it loaded, as after a sync round (840 MB every
    ~5k steps on Pong). Now the loop checkpoints at the end of pretraining, periodically
    (``checkpoint_frequency``, here beyond the run) and at the run's end."""
    import themis.run.workspace as workspace

    saved: list[int] = []
    write = workspace.save_checkpoint
    monkeypatch.setattr(workspace, "save_checkpoint",
                        lambda state, folder: saved.append(state["step"]) or write(state, folder))
    ws = make_workspace(compose([*DOT_ASYNC, "num_train_steps=1600", "eval_frequency=1600",
                                 "checkpoint_frequency=100000", "reward_passes_per_step=0.5"]),
                        tmp_path / "run")
    assert ws.learner is not None and not ws.learner.checkpoint_after_round
    loaded: list[int] = []
    round_ = ws.learner.feedback_round

    def counted(pool, first=False, ask=True, final=False):
        changed = round_(pool, first, ask=ask, final=final)
        loaded.extend([pool.step] if changed else [])
        return changed

    ws.learner.feedback_round = counted
    ws.run()
    finish(ws)
    assert len(loaded) >= 4, loaded  # versions loaded after the first model
    assert len(saved) <= 3, (saved, loaded)  # pretraining's end, the run's end (and its final)


def children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (the forkserver and the learner it forked)."""
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        parent = frontier.pop()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and fields[0] not in ("Z", "X"):
                child = int(stat.parent.name)
                if child not in found:
                    found.add(child)
                    frontier.add(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.slow
def test_sigterm_of_an_async_run_leaves_no_learner_process(tmp_path):
    run = tmp_path / "run"
    args = [a for a in ASYNC if not a.startswith("num_train_steps")]
    proc = subprocess.Popen([sys.executable, "-m", "themis.cli.train", *args,
                             "num_train_steps=1000000", "eval_frequency=100000",
                             f"hydra.run.dir={run}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "THEMIS_THREADS": "1"})
    deadline = time.time() + 120
    while not (run / "reward.csv").is_file() and time.time() < deadline:
        assert proc.poll() is None
        time.sleep(0.2)
    learners = children(proc.pid)
    assert learners, "no learner process"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    deadline = time.time() + 45
    while any(alive(p) for p in learners) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in learners), "a learner process outlived the run"


@pytest.mark.slow
def test_async_run_from_a_pretraining_snapshot_asks_about_its_steps(compose, tmp_path):
    """The snapshot's buffer goes to the learner: its first round (due at once) is asked,
    instead of the loop waiting for steps the learner never got."""
    pre = make_workspace(compose([*TINY_PENDULUM, "torch_threads=1"]), tmp_path / "pre")
    pre.run(until=400)
    snapshot = save_snapshot(pre)
    ws = make_workspace(compose([*ASYNC, f"pretrained_snapshot={snapshot}"]), tmp_path / "run")
    assert ws.step == 400
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "run" / "reward.csv")
    assert rounds["step"].iloc[0] == 400 and len(rounds) >= 2


def test_a_crash_of_the_async_learner_is_one_error_in_the_loop(compose, tmp_path):
    """The learner cannot write preferences/ (a file is in the way): the loop stops with one
    PreferenceLearnerError line (exit code 1 through ./themis_train.sh), and no process stays."""
    from themis.online.online_reward import PreferenceLearnerError

    ws = make_workspace(compose(ASYNC), tmp_path)
    (tmp_path / "preferences").write_text("in the way")
    with pytest.raises(PreferenceLearnerError) as error:
        ws.run()
    assert "\n" not in str(error.value) and "learner_error.log" in str(error.value)
    assert "before the first checkpoint" in stop(ws, "./themis_train.sh")  # resumable
    assert not ws.learner.channel.process.is_alive()


@pytest.mark.slow
def test_an_async_run_killed_in_drlhps_pretraining_and_after_a_checkpoint_resumes_each_time(
        tmp_path):
    """DRLHP's pretraining (200 epochs on the first labels: two hours for Pong on a CPU) is
    checkpointed between its chunks of epochs: a run killed in it resumes with the epochs run
    so far and asks no first-round query twice (issue 83: a checkpoint at least every 30
    minutes of wall time). Killed again after the loop's first full checkpoint past
    pretraining, the run resumes the learner from its own checkpoint (no round asked twice,
    labels kept), the loop from its, and ends."""
    import threading

    import torch

    run = tmp_path / "run"
    overrides = [*DOT_ASYNC, "num_train_steps=2400", "checkpoint_frequency=400",
                 "eval_frequency=800", "reward_passes_per_step=0.5",
                 "reward_pretrain_epochs=3000", "checkpoint_minutes=0.002",
                 f"hydra.run.dir={run}"]
    env = {**os.environ, "THEMIS_THREADS": "1"}
    proc = subprocess.Popen([str(ROOT / "themis_train.sh"), *overrides], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    learner = run / "checkpoints" / "learner" / "state.pt"
    loop_state = run / "checkpoints" / "state.pt.sha256"
    deadline = time.time() + 300
    while True:  # the learner checkpointed inside its first round: pretraining under way
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.time() < deadline and not (run / "reward.csv").exists()
        if loop_state.exists() and learner.exists():
            state = torch.load(learner, weights_only=False)
            if state["reward_passes"]["pretrained_epochs"] >= 20:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not state["reward_passes"]["pretrained"] and state["first_done"]

    # the rest of pretraining, shortened on the command line (3000 epochs only keep the first
    # run inside pretraining until it is killed); killed again after a checkpoint past it
    began = loop_state.stat().st_mtime
    proc = subprocess.Popen([str(ROOT / "themis_train.sh"), f"resume={run}",
                             "reward_pretrain_epochs=40"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    deadline = time.time() + 300
    while not ((run / "reward.csv").exists() and (run / "eval.csv").exists()
               and loop_state.stat().st_mtime > began
               and torch.load(learner, weights_only=False)["reward_passes"]["pretrained"]):
        assert proc.poll() is None and time.time() < deadline, "".join(out)[-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join(timeout=30)
    assert "pretraining finished after the resume" in out[0]
    # the resumed pretraining has the loop's thread too, as the first one had (both cores)
    both = min(2, len(os.sched_getaffinity(0)))
    assert f"before the stop; {both} threads;" in out[0]
    assert pd.read_csv(run / "eval.csv")["step"].iloc[-1] < 2400, "it ended before the kill"

    resumed = subprocess.run([str(ROOT / "themis_train.sh"), f"resume={run}"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    assert "resumed the preference learner" in resumed.stdout
    rounds = pd.read_csv(run / "reward.csv")
    assert rounds["round"].is_unique and rounds["step"].is_monotonic_increasing
    # the first round's row, written when its pretraining ended after the resume
    first = rounds.iloc[0]
    assert (first["round"], first["total_feedback"], first["epochs"]) == (1, 10, 40)
    assert rounds["total_feedback"].iloc[-1] == 40  # the 10 first-round queries asked once
    assert len(PreferenceDataset.load(run / "preferences")) == 40
    assert pd.read_csv(run / "eval.csv")["step"].iloc[-1] >= 2400
