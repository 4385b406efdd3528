"""The loops wire the pieces together: each test here fails when one connection is cut.

They are short in-process runs (seconds each), not marked slow: the mutation run
(scripts/mutation.sh) uses them.

Every formula has its own unit test elsewhere; these check that the learned reward reaches the
agent, that pretraining is what PEBBLE says, that the samplers get the candidates and the
teacher the margin the config asks for, and that a resume restores every component exactly.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import TINY_PENDULUM
from themis.agents.intrinsic import knn_distance
from themis.builder import make_workspace
from themis.methods.mrn import MRN
from themis.methods.registry import find
from themis.methods.rime import RIME
from themis.methods.surf import SURF
from themis.run.closing import finish
from themis.run.snapshot import save_snapshot

PPO_TINY = [*TINY_PENDULUM, "domain=Box2d", "env=LunarLander-v3", "ppo.num_envs=2",
            "ppo.num_steps=32"]


def params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------- the learned reward
def test_after_a_feedback_round_sac_trains_on_the_reward_model(compose, tmp_path):
    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    ws.run(until=ws.cfg.pretrain_end + 1)  # the first feedback round and relabel happened
    assert ws.learner.rounds == 1
    ws.run(until=ws.cfg.pretrain_end + 40)  # new steps are labelled too (lazily, on sampling)
    batches: list[Any] = []
    update = ws.agent.update
    ws.agent.update = lambda batch, step, **kw: (batches.append(batch), update(batch, step))[1]
    ws.run(until=ws.cfg.pretrain_end + 45)
    n = len(ws.buffer) - ws.buffer._pending  # the newest are labelled when first sampled
    expected = ws.reward_model.predict(ws.buffer.obs[:n], ws.buffer.actions[:n])
    np.testing.assert_allclose(ws.buffer.rewards[:n], expected, rtol=1e-5, atol=1e-6)
    assert np.abs(expected).max() > 1e-3  # not a reward of zeros that happens to match
    assert len(batches) == 5
    for batch in batches:  # what the agent saw is the model's reward of those transitions
        want = ws.reward_model.predict(batch.observations.numpy(), batch.actions.numpy())
        np.testing.assert_allclose(batch.rewards.numpy(), want, rtol=1e-5, atol=1e-6)


def test_ppo_rollouts_carry_the_reward_models_prediction(compose, tmp_path):
    ws = make_workspace(compose([*PPO_TINY, "num_train_steps=1000"]), tmp_path)
    eye = np.eye(ws.facts.action_dim, dtype=np.float32)
    checked = []
    update = ws.agent.update

    def spy(rollout: Any) -> Any:
        if ws.pretraining_done:  # the rewards are the current model's r̂(s, a)
            horizon, n_envs = rollout.actions.shape
            want = ws.reward_model.predict(rollout.obs.reshape(horizon * n_envs, -1),
                                           eye[rollout.actions.reshape(-1)])
            want = want.reshape(horizon, n_envs)
            ok = rollout.dones == 0  # truncated steps add gamma V(final obs)
            np.testing.assert_allclose(rollout.rewards[ok], want[ok], rtol=1e-5, atol=1e-6)
            assert np.abs(want).max() > 1e-3
            checked.append(ws.learner.rounds)
        return update(rollout)

    ws.agent.update = spy
    ws.run()
    assert ws.learner.rounds >= 2 and len(set(checked)) >= 2  # after two different rounds


# ----------------------------------------------------------------------- pretraining
def test_pretraining_updates_see_the_state_entropy_reward(compose, tmp_path):
    ws = make_workspace(compose([*TINY_PENDULUM, "entropy_pool_size=100000"]), tmp_path)
    ws.run(until=ws.cfg.num_seed_steps + 20)
    batches: list[Any] = []
    update = ws.agent.update
    ws.agent.update = lambda batch, step, **kw: (batches.append((batch, len(ws.buffer))),
                                                 update(batch, step))[1]
    ws.run(until=ws.cfg.num_seed_steps + 30)
    assert len(batches) == 10 and not ws.pretraining_done
    for batch, stored in batches:
        rewards = batch.rewards.numpy()
        assert (rewards > 0).all(), "pretraining trained on the stored (zero) reward"
        # proportional to the k-NN distance of next_obs among the stored states (PEBBLE Eq. 3)
        pool = torch.as_tensor(ws.buffer.obs[:stored])
        dist = knn_distance(batch.next_observations, pool, ws.cfg.topK, exclude_self=True).numpy()
        ratio = rewards / dist
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-4)


def test_end_of_pretraining_resets_the_critic_but_not_the_actor(compose, tmp_path):
    ws = make_workspace(compose([*TINY_PENDULUM, "reset_update=0"]), tmp_path)
    ws.run(until=ws.cfg.pretrain_end)
    actor, critic = params(ws.agent.actor), params(ws.agent.critic)
    target = params(ws.agent.critic_target)
    ws.agent.update = lambda batch, step, **kw: {}  # only the reset may change weights now
    ws.run(until=ws.cfg.pretrain_end + 1)
    assert ws.pretraining_done
    assert same(actor, params(ws.agent.actor))
    assert not same(critic, params(ws.agent.critic))
    assert not same(target, params(ws.agent.critic_target))
    assert same(params(ws.agent.critic), params(ws.agent.critic_target))


# ------------------------------------------------------------------ query selection
@pytest.mark.parametrize("feed_type", [1, 2, 3, 4, 5])
def test_active_samplers_choose_among_reward_batch_times_large_batch(compose, tmp_path,
                                                                      monkeypatch, feed_type):
    import themis.feedback.selector as workspace

    seen: list[tuple[str, int, int]] = []
    samplers = dict(workspace.SAMPLERS)

    def spy(name: str) -> Any:
        def sampler(candidates: Any, model: Any, labelled: Any, k: int, rng: Any,
                    **kw: Any) -> np.ndarray:
            seen.append((name, len(candidates), k))
            return samplers[name](candidates, model, labelled, k, rng, **kw)
        return sampler

    monkeypatch.setattr(workspace, "SAMPLERS", {name: spy(name) for name in samplers})
    ws = make_workspace(compose([*TINY_PENDULUM, f"feed_type={feed_type}", "large_batch=7",
                                 "num_train_steps=800"]), tmp_path)
    ws.run()
    assert seen[0] == ("uniform", 10, 10)  # the first round is uniform (PEBBLE)
    assert seen[1] == (ws.learner.selector.sampler, 70, 10)


def test_the_teacher_margin_is_the_recent_return_scaled_to_a_segment(compose, tmp_path):
    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    margins: list[tuple[float, float]] = []
    label = ws.learner.teacher.label

    def spy(r1: np.ndarray, r2: np.ndarray) -> Any:
        expected = np.mean(ws.recent_returns) * ws.cfg.segment / 200  # Pendulum: 200 steps
        margins.append((ws.learner.teacher.margin, expected))
        return label(r1, r2)

    ws.learner.teacher.label = spy
    ws.run()
    assert len(margins) == 3
    for got, expected in margins:
        assert expected < 0 and got == pytest.approx(expected)


# ------------------------------------------------------------------------- resume
def _assert_same_state(a: Any, b: Any, path: str = "state") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for key in a:
            _assert_same_state(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_state(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, np.ndarray) and path.endswith("buffer.rewards"):
        # relabelled in one pass on resume, lazily in chunks before: float rounding differs
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=path)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b), path
    else:
        assert a == b, path


@pytest.mark.parametrize("agent", [["feed_type=3", "teacher=noisy"], PPO_TINY[-4:],
                                   ["method=[surf,rime]", "teacher=mistake"],
                                   ["method=mrn", "mrn.meta_steps=100"]],
                         ids=["sac", "ppo", "surf+rime", "mrn"])
def test_resume_restores_every_component_exactly(compose, tmp_path, agent):
    cfg = compose([*TINY_PENDULUM, *agent])
    ws = make_workspace(cfg, tmp_path)
    ws.run(until=ws.cfg.pretrain_end + 350)  # a feedback round, then stop mid-episode
    assert ws.learner.rounds >= 2
    ws.maybe_checkpoint(force=True)
    saved = ws.state_dict()
    ws.logger.close()
    resumed = make_workspace(compose([*TINY_PENDULUM, *agent, "resume=true"]), tmp_path)
    state = resumed.state_dict()
    if ws.driver.NAME == "sac":  # the interrupted episode is not continued
        assert state.pop("episode") == saved.pop("episode") + 1
    # the run's own time goes on from the checkpoint's (run_time.json holds it too)
    written = json.loads((tmp_path / "run_time.json").read_text())
    assert written["cpu_s"] > 0 and written["wall_s"] > 0
    assert resumed.clock.before == pytest.approx(written, abs=1e-3)
    assert state.pop("run_time")["wall_s"] >= written["wall_s"] - 1e-3
    assert saved.pop("run_time")["wall_s"] >= written["wall_s"] - 1e-3
    _assert_same_state(saved, state)
    assert resumed.learner.teacher.margin == ws.learner.teacher.margin != 0.0
    surf, resumed_surf = (find(w.learner.methods, SURF) for w in (ws, resumed))
    if surf is not None:  # SURF's unlabelled pairs and RIME's statistics
        assert len(resumed_surf.unlabelled) == len(surf.unlabelled) > 0
        epochs = find(ws.learner.methods, RIME).filter.epochs
        assert find(resumed.learner.methods, RIME).filter.epochs == epochs > 0
    mrn = find(ws.learner.methods, MRN)
    if mrn is not None:  # MRN's updates (steps 500, 600, 700)
        assert find(resumed.learner.methods, MRN).update.updates == mrn.update.updates == 3
    assert len(resumed.learner.dataset) == len(ws.learner.dataset)
    np.testing.assert_array_equal(resumed.learner.dataset.labels[: len(ws.learner.dataset)],
                                  ws.learner.dataset.labels[: len(ws.learner.dataset)])
    resumed.logger.close()


def test_reset_updates_count_their_own_index(compose, tmp_path):
    """With critic_target_update_frequency=2 the target is refreshed on every other reset
    update, whatever the step pretraining ends at (B-Pref ``update_after_reset``)."""
    ws = make_workspace(compose([*TINY_PENDULUM, "num_unsup_steps=201", "reset_update=6",
                                 "sac.critic_target_update_frequency=2"]), tmp_path)
    ws.run(until=ws.cfg.pretrain_end)  # an odd step: the old code refreshed the target never
    steps: list[int] = []
    update = ws.agent.update
    ws.agent.update = lambda batch, step, **kw: (steps.append(step), update(batch, step))[1]
    ws.run(until=ws.cfg.pretrain_end + 1)
    assert steps[:6] == [0, 1, 2, 3, 4, 5]  # then the regular update of this step
    assert steps[6] == ws.cfg.pretrain_end


# ------------------------------------------------------------ B-Pref margin and rounds
def test_margin_without_a_time_limit_uses_the_recent_episode_length(compose, tmp_path):
    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    ws.learner.max_episode_steps = None  # as an env without a time limit
    ws.learner.set_margin([-400.0, -800.0], [100, 300])
    assert ws.learner.teacher.margin == pytest.approx(-600.0 * ws.cfg.segment / 200)
    ws.logger.close()


def test_atari_time_limit_is_its_frame_limit_in_agent_steps():
    from themis.environments.domains import episode_limit, make_env

    env = make_env("ALE", "Breakout-v5")
    assert episode_limit(env) == 108_000 // 4  # frame skip 4 (AtariPreprocessing)
    env.close()


def test_a_snapshot_keeps_the_recent_returns_for_the_first_margin(compose, tmp_path):
    ws = make_workspace(compose([*TINY_PENDULUM, "num_train_steps=1200"]), tmp_path / "pre")
    ws.run(until=ws.cfg.pretrain_end - 1)
    assert len(ws.recent_returns) >= 1
    snapshot = save_snapshot(ws)
    ws.logger.close()
    resumed = make_workspace(compose([*TINY_PENDULUM, f"pretrained_snapshot={snapshot}"]),
                             tmp_path / "train")
    assert list(resumed.recent_returns) == list(ws.recent_returns)
    assert list(resumed.recent_lengths) == list(ws.recent_lengths)
    resumed.logger.close()


def test_training_from_a_snapshot_takes_its_pretraining_and_starts_where_it_ended(
        compose, tmp_path, capsys):
    import pandas as pd
    import torch

    ws = make_workspace(compose(TINY_PENDULUM), tmp_path / "pre")  # 200 seed + 200 unsup
    ws.run(until=ws.cfg.pretrain_end)
    snapshot = save_snapshot(ws)
    ws.logger.close()
    # no pretraining keys given: the defaults (1000 + 5000) would not even fit 1500 steps
    tiny = [o for o in TINY_PENDULUM if not o.startswith(("num_seed", "num_unsup"))]
    run = make_workspace(compose([*tiny, f"pretrained_snapshot={snapshot}",
                                  "num_train_steps=1500"]), tmp_path / "train")
    assert (run.step, run.cfg.pretrain_end) == (400, 400)
    assert "num_seed_steps=200, num_unsup_steps=200 (instead of 1000 and 5000)" in \
        capsys.readouterr().out
    run.run()
    assert pd.read_csv(tmp_path / "train" / "reward.csv")["step"].iloc[0] == 400
    assert set(pd.read_csv(tmp_path / "train" / "train.csv")["phase"]) == {"reward"}

    from themis.core.safe_loading import safe_load

    old = safe_load(snapshot)  # a snapshot of an earlier version
    del old["num_seed_steps"], old["num_unsup_steps"]
    torch.save(old, tmp_path / "old.pt")
    again = make_workspace(compose([*tiny, f"pretrained_snapshot={tmp_path / 'old.pt'}",
                                    "num_train_steps=1500"]), tmp_path / "again")
    assert again.cfg.pretrain_end == 400  # pretraining ended at its step: no random actions again
    assert "reward learning starts at once" in capsys.readouterr().out
    again.logger.close()


def test_a_round_without_long_enough_episodes_is_postponed_not_fatal(compose, tmp_path):
    """Hopper falls within tens of steps under a random policy: no episode holds a 100-step
    segment, so the rounds are postponed (one console line, a reward.csv row) and the run
    goes on."""
    import pandas as pd

    ws = make_workspace(compose([*TINY_PENDULUM, "domain=Control", "env=Hopper-v5",
                                 "segment=100", "num_train_steps=900"]), tmp_path)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert rounds["postponed"].sum() >= 1
    assert ws.learner.postponed_rounds == rounds["postponed"].sum()
    assert (rounds.loc[rounds["postponed"] == 1, "total_feedback"] == 0).all()
    assert (tmp_path / "eval.csv").is_file()


def test_a_checkpoint_of_the_previous_layout_still_resumes(compose, tmp_path):
    """Checkpoints written before the redesign (no episodes_started, recent_lengths or
    postponed_rounds) load into the new workspace and the run goes on."""
    from themis.run.checkpoint import load_checkpoint, save_checkpoint

    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    ws.run(until=ws.cfg.pretrain_end + 350)
    ws.maybe_checkpoint(force=True)
    ws.logger.close()
    state, _ = load_checkpoint(tmp_path / "checkpoints")
    for key in ("episodes_started", "recent_lengths", "postponed_rounds"):
        del state[key]
    save_checkpoint(state, tmp_path / "checkpoints")
    resumed = make_workspace(compose([*TINY_PENDULUM, "resume=true"]), tmp_path)
    assert resumed.step == ws.step and resumed.total_feedback == ws.total_feedback
    resumed.run()
    finish(resumed)
    assert resumed.step == 1200 and resumed.total_feedback == 30


@pytest.mark.parametrize("schedule,powers", [("themis", [1, 1, 1]), ("bpref", [1, 2, 2])])
def test_teacher_threshold_schedule(compose, tmp_path, schedule, powers):
    ws = make_workspace(compose([*TINY_PENDULUM, "teacher=equal",
                                 f"teacher_thres_schedule={schedule}"]), tmp_path)
    seen: list[int] = []
    label = ws.learner.teacher.label
    ws.learner.teacher.label = lambda r1, r2: (seen.append(ws.learner.teacher.threshold_power),
                                               label(r1, r2))[1]
    ws.run()
    assert seen == powers


# ---------------------------------- found by the sampled mutation run (docs/developing/mutation.md)
def test_before_the_first_label_the_buffer_holds_no_true_reward(compose, tmp_path):
    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    ws.run(until=ws.cfg.pretrain_end)  # seed steps and pretraining: no label yet
    n = len(ws.buffer)
    assert n == ws.cfg.pretrain_end and not ws.pretraining_done
    assert (ws.buffer.true_rewards[:n] != 0).all()  # Pendulum's reward is never exactly 0
    np.testing.assert_array_equal(ws.buffer.rewards[:n], 0.0)  # not r, not NaN
    plain = make_workspace(compose([*TINY_PENDULUM, "learn_reward=false"]), tmp_path / "sac")
    plain.run(until=50)  # SAC on the true reward stores it
    np.testing.assert_array_equal(plain.buffer.rewards[:50], plain.buffer.true_rewards[:50])


def test_reward_csv_rounds_report_held_out_quality_only_after_the_first(compose, tmp_path):
    import pandas as pd

    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    said: list[str] = []
    info = ws.learner.info
    ws.learner.info = lambda message, *a, **kw: (said.append(message), info(message, *a, **kw))
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert len(rounds) == 3
    # round 1's model was never trained: its "held-out" accuracy would measure nothing
    assert rounds["heldout_accuracy"].isna().tolist() == [True, False, False]
    assert rounds["heldout_accuracy"].iloc[1:].between(0, 1).all()
    assert (rounds["train_loss"] > 0).all() and np.isfinite(rounds["train_loss"]).all()
    assert not any("only ties" in m for m in said)  # Pendulum: strict preferences


def test_a_round_of_only_ties_says_so(compose, tmp_path):
    ws = make_workspace(compose([*TINY_PENDULUM, "num_train_steps=500"]), tmp_path)
    label = ws.learner.teacher.label

    def ties(r1: np.ndarray, r2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep, labels = label(r1, r2)  # a sparse reward: every segment return equal
        return keep, np.full_like(labels, 0.5)

    ws.learner.teacher.label = ties
    said: list[str] = []
    info = ws.learner.info
    ws.learner.info = lambda message, *a, **kw: (said.append(message), info(message, *a, **kw))
    ws.run()
    assert ws.learner.rounds == 1 and sum("only ties" in m for m in said) == 1


def test_ppo_evaluates_logs_and_checkpoints_on_schedule(compose, tmp_path):
    ws = make_workspace(compose([*PPO_TINY, "num_train_steps=1000", "eval_frequency=256",
                                 "log_frequency=128"]), tmp_path)
    evals: list[int] = []
    logs: list[int] = []
    forced: list[tuple[int, bool, int]] = []
    evaluate, console, checkpoint = ws.evaluate, ws.logger.console, ws.maybe_checkpoint
    ws.evaluate = lambda *a, **kw: (evals.append(ws.step), evaluate(*a, **kw))[1]
    ws.logger.console = lambda kind, row: (  # type: ignore[method-assign]
        logs.append(row["step"]) if kind == "train" else None, console(kind, row))[1]
    ws.maybe_checkpoint = lambda force=False: (
        forced.append((ws.step, bool(force), ws.learner.rounds)), checkpoint(force=force))[1]
    ws.run()
    # 64 steps per rollout (2 envs × 32): the first rollout past each multiple
    assert evals == [256, 512, 768, 1024]
    assert logs == [128, 256, 384, 512, 640, 768, 896, 1024]
    # a checkpoint right after the end of pretraining and after every feedback round
    rounds = [r for _, force, r in forced if force]
    assert rounds == list(range(1, ws.learner.rounds + 1)) and ws.learner.rounds >= 2


def test_progress_shows_steps_per_second(compose, tmp_path, monkeypatch):
    import types

    import themis.run.workspace as workspace

    ws = make_workspace(compose(TINY_PENDULUM), tmp_path)
    monkeypatch.setattr(workspace, "time", types.SimpleNamespace(  # checkpoints: no wall clock
        time=lambda: ws.step / 250, monotonic=lambda: 0.0))
    rates: list[float] = []
    ws.logger.console = lambda kind, row: (  # type: ignore[method-assign]
        rates.append(row["fps"]) if kind == "train" else None)
    ws.run(until=800)
    assert rates == [pytest.approx(250.0)] * 2  # the fake clock: 250 steps a second


def test_the_learner_is_built_from_a_frozen_spec_in_both_processes(compose, tmp_path):
    """Issue 62, step 3: make_learner(cfg, LearnerSpec) — the Workspace and the async learner
    process build the same typed, frozen spec, not a workspace-like object."""
    import dataclasses

    from themis.feedback.factory import LearnerSpec
    from themis.online.learner_process import EnvSpec, ProcessWorkspace

    ws = make_workspace(compose([*TINY_PENDULUM]), tmp_path / "run")
    spec = ws.learner_spec()
    assert isinstance(spec, LearnerSpec) and spec.store is ws.buffer and not spec.on_policy
    assert (spec.obs_dim, spec.action_dim, spec.obs_kind) == (3, 1, "vector")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.run_dir = tmp_path  # type: ignore[misc]
    ws.step = 123
    assert spec.clock() == 123  # a method's clock reads the run's step when it asks
    ws.logger.close()

    space = ProcessWorkspace(ws.cfg, EnvSpec("Pendulum-v1", (3,), "float32", 1, False, 200,
                                         capacity=1000), tmp_path / "learner", ws.logger)
    other = space.spec()
    assert isinstance(other, LearnerSpec) and other.store is space.buffer
    assert (other.obs_shape, other.frame_stack, other.agent, other.env) == ((3,), 1, None, None)
