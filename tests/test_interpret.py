"""Understanding a learned reward (themis/interpret): rollout files, SB3 zips, EPIC, reward
preprocessing, supervised reward nets, feature visualisation and their commands."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from fractions import Fraction

import numpy as np
import pytest
import torch

from tests.conftest import ROOT
from themis.environments.domains import make_env
from themis.interpret.epic import (
    canonicalize_tabular,
    epic_sampled,
    epic_state_action,
    epic_tabular,
    pearson_distance,
    shaped_tabular,
)
from themis.interpret.featvis import FourierImage, maximise_reward, random_transform
from themis.interpret.gridworld import enumerate_grid
from themis.interpret.preprocessing import preprocess_neural, preprocess_tabular
from themis.interpret.rollouts import (
    RolloutFormatError,
    Rollouts,
    collect_rollouts,
    load_rollouts,
    random_policy,
    save_imitation_npz,
    save_rollouts,
)
from themis.interpret.sb3 import SB3FormatError, load_sb3_policy
from themis.interpret.supervised import save_supervised, train_supervised
from themis.reward.ensemble import RewardEnsemble, load_reward_model, save_reward_model


def script(name: str):
    """``scripts/<name>.py`` as a module (its ``main`` runs in this process)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cartpole_rollouts(episodes: int = 3) -> Rollouts:
    env = make_env("Classic", "CartPole-v1", seed=0)
    r = collect_rollouts(env, random_policy(env, 0), episodes, seed=0,
                         source={"kind": "random"})
    r.meta.update(domain="Classic", env="CartPole-v1")
    return r


# ------------------------------------------------------------------------ rollout format
def test_rollouts_round_trip_through_the_npz_and_json_folder(tmp_path):
    r = cartpole_rollouts()
    save_rollouts(r, tmp_path / "ro")
    back = load_rollouts(tmp_path / "ro")
    for name in ("obs", "acts", "rews", "terminated", "truncated", "lengths", "seeds"):
        np.testing.assert_array_equal(getattr(back, name), getattr(r, name))
    assert back.meta["action_space"] == {"type": "Discrete", "n": 2}
    assert back.meta["domain"] == "Classic" and back.meta["format_version"] == 1
    obs, _, next_obs, rews, term = back.transitions()
    # the step's next observation is the following step's observation inside an episode
    first = back.lengths[0]
    np.testing.assert_array_equal(next_obs[: first - 1], obs[1:first])
    assert term[first - 1] and not term[: first - 1].any()
    assert back.action_vectors().shape == (back.num_steps, 2)
    assert np.all(rews == 1.0)


def test_an_imitation_npz_made_here_is_read_without_unpickling(tmp_path):
    rng = np.random.default_rng(0)
    lengths = [3, 5, 2]
    obs = rng.normal(size=(sum(lengths) + 3, 4)).astype(np.float32)
    acts = rng.integers(0, 2, sum(lengths))
    rews = rng.normal(size=sum(lengths)).astype(np.float32)
    infos = np.array([{"x": i} for i in range(sum(lengths))], dtype=object)  # pickled by numpy
    path = tmp_path / "traj.npz"
    np.savez_compressed(path, obs=obs, acts=acts, rews=rews, infos=infos,
                        terminal=np.array([True, False, True]),
                        indices=np.cumsum(lengths[:-1]))
    r = load_rollouts(path)
    assert list(r.lengths) == lengths
    np.testing.assert_array_equal(r.obs, obs)
    np.testing.assert_array_equal(r.rews, rews)
    assert list(np.flatnonzero(r.terminated)) == [2, 9] and list(np.flatnonzero(r.truncated)) \
        == [7]
    assert r.infos == {}  # pickled dicts are not read
    save_imitation_npz(r, tmp_path / "again.npz")
    again = load_rollouts(tmp_path / "again.npz")
    np.testing.assert_array_equal(again.obs, obs)
    np.testing.assert_array_equal(again.terminated, r.terminated)
    save_rollouts(r, tmp_path / "folder")  # and into the Themis format
    np.testing.assert_array_equal(load_rollouts(tmp_path / "folder").acts, acts)


@pytest.mark.parametrize("key", ["acts", "obs", "rews"])
def test_an_imitation_npz_with_a_single_number_for_its_steps_is_one_error(tmp_path, key):
    """A 0-d ``acts`` gave ``TypeError: len() of unsized object`` (issue 85 item 4)."""
    arrays = {"obs": np.zeros((4, 2), np.float32), "acts": np.zeros(3), "rews": np.zeros(3),
              "terminal": np.array([True]), "indices": np.zeros(0, np.int64)}
    arrays[key] = np.array(1.0)
    np.savez(tmp_path / "traj.npz", **arrays)
    with pytest.raises(RolloutFormatError, match=f"'{key}' is a single number"):
        load_rollouts(tmp_path / "traj.npz")


@pytest.mark.parametrize("case,message", [
    ("object_obs", "'obs' holds Python objects"),
    ("no_rews", "without rewards"),
    ("bad_indices", "do not describe"),
    ("newer", "newer than this Themis reads"),
    ("no_meta", "has no meta.json"),
    ("garbage", "is not an npz file"),
])
def test_bad_rollout_files_are_refused_with_one_line(tmp_path, case, message):
    path = tmp_path / "x.npz"
    base = dict(obs=np.zeros((4, 2)), acts=np.zeros(3), rews=np.zeros(3),
                terminal=np.array([True]), indices=np.zeros(0, np.int64))
    if case == "object_obs":
        np.savez(path, **{**base, "obs": np.array([{}, {}, {}, {}], dtype=object)})
    elif case == "no_rews":
        np.savez(path, **{k: v for k, v in base.items() if k != "rews"})
    elif case == "bad_indices":
        np.savez(path, **{**base, "indices": np.array([1, 2])})
    elif case in ("newer", "no_meta"):
        save_rollouts(cartpole_rollouts(1), tmp_path / "ro")
        path = tmp_path / "ro"
        meta = json.loads((path / "meta.json").read_text())
        if case == "newer":
            (path / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
        else:
            (path / "meta.json").unlink()
    else:
        path.write_bytes(b"not a zip")
    with pytest.raises(RolloutFormatError, match=message):
        load_rollouts(path)


# ------------------------------------------------------------------------ SB3 zips
def test_sb3_zip_policies_act_as_sb3_does_without_unpickling(tmp_path):
    sb3 = pytest.importorskip("stable_baselines3")
    obs = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
    ppo = sb3.PPO("MlpPolicy", "CartPole-v1", seed=0, n_steps=32, batch_size=32,
                  policy_kwargs={"activation_fn": torch.nn.ReLU, "net_arch": [16, 16]})
    ppo.save(tmp_path / "ppo.zip")
    policy = load_sb3_policy(tmp_path / "ppo.zip")
    assert [policy.act(o) for o in obs] == [int(ppo.predict(o, deterministic=True)[0])
                                            for o in obs]
    sac = sb3.SAC("MlpPolicy", "Pendulum-v1", seed=0, policy_kwargs={"net_arch": [16]})
    sac.save(tmp_path / "sac.zip")
    policy = load_sb3_policy(tmp_path / "sac.zip")
    o3 = obs[:, :3]
    # SB3 scales [-1, 1] to Pendulum's [-2, 2]; Themis' env takes [-1, 1]
    np.testing.assert_allclose([policy.act(o) for o in o3],
                               [sac.predict(o, deterministic=True)[0] / 2.0 for o in o3],
                               atol=1e-5)


def test_an_sb3_zip_whose_weights_need_pickle_is_refused(tmp_path):
    path = tmp_path / "evil.zip"
    weights = tmp_path / "policy.pth"
    torch.save({"action_net.weight": Fraction(1, 2)}, weights)  # needs a class: unpickling
    with zipfile.ZipFile(path, "w") as z:
        z.write(weights, "policy.pth")
        z.writestr("data", "{}")
    with pytest.raises(SB3FormatError, match="needs more than plain tensors"):
        load_sb3_policy(path)
    (tmp_path / "plain.zip").write_bytes(b"PK no zip")
    with pytest.raises(SB3FormatError, match="not a zip"):
        load_sb3_policy(tmp_path / "plain.zip")


# ------------------------------------------------------------------------ EPIC
def test_pearson_distance_of_equal_and_opposite_rewards():
    r = np.arange(10.0)
    assert pearson_distance(r, 3 * r + 1) == pytest.approx(0.0, abs=1e-12)
    assert pearson_distance(r, -r) == pytest.approx(1.0)


def test_epic_is_invariant_to_potential_shaping_and_positive_scaling():
    rng = np.random.default_rng(0)
    s, a, gamma = 6, 3, 0.9
    r = rng.normal(size=(s, a, s))
    phi = rng.normal(size=s) * 5
    shaped = 2.5 * (r + gamma * phi[None, None, :] - phi[:, None, None]) + 7.0
    assert epic_tabular(r, shaped, gamma) == pytest.approx(0.0, abs=1e-7)
    other = rng.normal(size=(s, a, s))
    assert epic_tabular(r, other, gamma) > 0.3
    assert epic_tabular(r, -r, gamma) == pytest.approx(1.0, abs=1e-7)
    # canonicalisation removes the shaping itself, not only in the distance
    np.testing.assert_allclose(canonicalize_tabular(r + gamma * phi[None, None, :]
                                                    - phi[:, None, None], gamma),
                               canonicalize_tabular(r, gamma), atol=1e-9)


def test_the_closed_form_epic_of_state_action_rewards_equals_the_full_arrays():
    rng = np.random.default_rng(1)
    ra, rb = rng.normal(size=(7, 4)), rng.normal(size=(7, 4))
    phi = rng.normal(size=7)
    full = epic_tabular(shaped_tabular(ra, phi, 0.95), shaped_tabular(rb, None, 0.95), 0.95)
    assert epic_state_action(ra, rb, 0.95) == pytest.approx(full, abs=1e-9)


def test_sampled_epic_ignores_a_potential_of_the_observations():
    rng = np.random.default_rng(2)
    obs, nxt = rng.normal(size=(200, 3)), rng.normal(size=(200, 3))
    acts = rng.normal(size=(200, 1))
    w = rng.normal(size=3)

    def base(o, a, _n):
        return np.sin(o @ w) + a[:, 0] ** 2

    def shaped(o, a, n):
        return 3.0 * (base(o, a, n) + 0.9 * np.cos(n[:, 0]) - np.cos(o[:, 0]))

    def other(o, a, _n):
        return o[:, 1] * a[:, 0]

    d = epic_sampled({"base": base, "shaped": shaped, "other": other}, obs, acts, nxt,
                     acts[:50], nxt[:50], 0.9, "base")
    assert d["shaped"] == pytest.approx(0.0, abs=1e-9)
    assert d["other"] > 0.3


# ------------------------------------------------------------------------ preprocessing
def tiny_grid(n: int = 5):
    """An n×n grid, actions up/down/right/left/stay, goal in a corner (terminal, reward 1)."""
    goal = (n - 1, n - 1)
    cells = [(x, y) for x in range(n) for y in range(n) if (x, y) != goal]
    index = {c: i for i, c in enumerate(cells)}
    rows = []
    for c in cells:
        for a, (dx, dy) in enumerate([(0, 1), (0, -1), (1, 0), (-1, 0), (0, 0)]):
            x, y = min(max(c[0] + dx, 0), n - 1), min(max(c[1] + dy, 0), n - 1)
            rows.append((index[c], a, len(cells), 1.0, True) if (x, y) == goal else
                        (index[c], a, index[(x, y)], 0.0, False))
    s, a, nxt, r, term = map(np.asarray, zip(*rows, strict=True))
    return s, a, nxt, r, term, len(cells)


def test_known_answer_sparsity_preprocessing_recovers_a_randomly_shaped_true_reward():
    s, a, nxt, true, term, n_states = tiny_grid()
    gamma = 0.9
    rng = np.random.default_rng(0)
    phi = np.concatenate([rng.normal(size=n_states) * 2, [0.0]])  # 0 after a terminal step
    shaped = true + gamma * phi[nxt] - phi[s]
    assert np.count_nonzero(np.abs(shaped) > 1e-9) > 10 * np.count_nonzero(true)
    res = preprocess_tabular(shaped, s, nxt, term, n_states, gamma, "sparse_l1")
    np.testing.assert_allclose(res.rewards, true, atol=1e-7)
    assert np.count_nonzero(np.abs(res.rewards) > 1e-6) == np.count_nonzero(true)
    assert res.after < res.before
    # the result is the shaped reward plus a shaping: EPIC to the true reward stays 0
    r_sa = np.zeros((n_states, 5))
    r_sa[s, a] = true
    phi_total = phi[:-1] + res.potential
    assert epic_tabular(shaped_tabular(r_sa, phi_total, gamma), shaped_tabular(r_sa, None, gamma),
                        gamma) == pytest.approx(0.0, abs=1e-7)


def test_reference_preprocessing_finds_the_closest_shaped_reward():
    s, _, nxt, true, term, n_states = tiny_grid(4)
    rng = np.random.default_rng(3)
    phi = np.concatenate([rng.normal(size=n_states), [0.0]])
    shaped = true + 0.99 * phi[nxt] - phi[s]
    res = preprocess_tabular(shaped, s, nxt, term, n_states, 0.99, "reference_l2",
                             reference=true)
    np.testing.assert_allclose(res.rewards, true, atol=1e-6)
    with pytest.raises(ValueError, match="needs a reference"):
        preprocess_tabular(shaped, s, nxt, term, n_states, 0.99, "reference_l2")
    with pytest.raises(ValueError, match="is not one of"):
        preprocess_tabular(shaped, s, nxt, term, n_states, 0.99, "sparse")


def test_the_log_and_smoothness_objectives_do_not_get_worse():
    s, _, nxt, true, term, n_states = tiny_grid(4)
    phi = np.concatenate([np.linspace(-1, 1, n_states), [0.0]])
    shaped = true + 0.9 * phi[nxt] - phi[s]
    for objective in ("sparse_log", "smooth_l1"):
        res = preprocess_tabular(shaped, s, nxt, term, n_states, 0.9, objective,
                                 adam_steps=200)
        assert res.after <= res.before + 1e-12


def test_neural_preprocessing_makes_a_shaped_sparse_reward_sparser():
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(600, 2)).astype(np.float32)
    nxt = rng.normal(size=(600, 2)).astype(np.float32)
    true = (rng.random(600) < 0.05).astype(np.float64)
    phi = lambda x: 2.0 * x[:, 0] - x[:, 1]  # noqa: E731
    shaped = true + 0.9 * phi(nxt) - phi(obs)
    res = preprocess_neural(shaped, obs, nxt, np.zeros(600, bool), 0.9, "sparse_l1",
                            epochs=60, batch_size=100, lr=3e-3, hidden_dim=32)
    assert res.after < 0.5 * res.before
    assert np.corrcoef(res.rewards, true)[0, 1] > 0.8


# ------------------------------------------------------------------------ gridworlds
def test_every_transition_of_an_empty_minigrid_is_enumerated():
    env = make_env("Minigrid", "Empty-5x5-v0", seed=0)
    mdp = enumerate_grid(env)
    assert mdp.n_states == 8 * 4  # 3×3 cells less the goal, 4 directions
    assert len(mdp.state) == mdp.n_states * 7
    assert mdp.terminal.sum() == 2  # from the left of and above the goal, facing it
    assert np.allclose(mdp.true_reward[mdp.terminal], 1 - 0.9 / env.unwrapped.max_steps)
    assert np.all(mdp.next_state[mdp.terminal] == mdp.n_states)
    assert mdp.obs.shape == (mdp.n_states, 4, 7, 7)


# ------------------------------------------------------------------------ supervised
def test_a_supervised_reward_net_fits_pendulum_and_saves_as_a_learned_one(tmp_path):
    env = make_env("Classic", "Pendulum-v1", seed=0)
    r = collect_rollouts(env, random_policy(env, 0), 10, seed=0)
    torch.manual_seed(0)
    model, report = train_supervised(r, ensemble_size=2, hidden_dim=64, hidden_depth=2,
                                     epochs=15, lr=1e-3)
    assert report.heldout_pearson > 0.95
    assert report.heldout_steps == 400  # 2 of 10 episodes of 200 steps
    path = save_supervised(model, report, tmp_path / "sup", {"domain": "Classic",
                                                             "env": "Pendulum-v1"})
    back = load_reward_model(tmp_path / "sup")
    assert back.env_id == "Pendulum-v1"
    o = r.obs[:50]
    a = r.action_vectors()[:50]
    np.testing.assert_allclose(back.predict(o, a), model.predict(o, a), atol=1e-6)
    assert torch.load(path, weights_only=True)["target_scale"] == report.target_scale


# ------------------------------------------------------------------------ feature vis
def pixel_model(seed: int = 0) -> RewardEnsemble:
    torch.manual_seed(seed)
    return RewardEnsemble(3 * 36 * 36, 2, ensemble_size=1, hidden_dim=16, hidden_depth=1,
                          obs_shape=(3, 36, 36)).eval()


def test_fourier_images_and_transforms_keep_shape_and_range():
    g = torch.Generator().manual_seed(0)
    image = FourierImage((3, 36, 36), generator=g)()
    assert image.shape == (3, 36, 36) and 0 <= image.min() and image.max() <= 1
    out = random_transform(image[None].repeat(2, 1, 1, 1), g)
    assert out.shape == (2, 3, 36, 36)


def test_activation_maximisation_finds_higher_reward_than_minimisation():
    model = pixel_model()
    action = np.array([1.0, 0.0], np.float32)
    best = maximise_reward(model, action, 1.0, steps=40, lr=0.1, batch=2)
    worst = maximise_reward(model, action, -1.0, steps=40, lr=0.1, batch=2)
    assert best.reward > worst.reward
    assert best.image.dtype == np.uint8 and best.image.shape == (3, 36, 36)
    assert best.history[-1] > best.history[0]


# ------------------------------------------------------------------------ commands
def test_the_rollouts_supervised_and_preprocessing_commands_end_to_end(tmp_path, capsys):
    ro, sup = tmp_path / "ro", tmp_path / "sup"
    assert script("rollouts").main([str(ro), "--source", "random", "--episodes", "6",
                                    "--domain", "Minigrid", "--env", "Empty-5x5-v0"]) == 0
    assert load_rollouts(ro).meta["env"] == "Empty-5x5-v0"
    assert script("supervised_reward").main([str(ro), str(sup), "--epochs", "1",
                                             "--hidden-dim", "16", "--ensemble-size",
                                             "1"]) == 0
    assert (sup / "supervised.json").is_file()
    assert script("preprocess_reward").main([str(sup)]) == 0
    metrics = json.loads((sup / "interpret" / "preprocessing.json").read_text())
    assert metrics["learned"]["epic_after"] == pytest.approx(
        metrics["learned"]["epic_before"], abs=1e-6)
    assert metrics["shaped_true"]["support_mass_after"] == pytest.approx(1.0, abs=1e-6)
    assert (sup / "interpret" / "preprocess_grid.png").stat().st_size > 0
    assert script("rollouts").main([str(tmp_path / "i.npz"), "--from", str(ro), "--format",
                                    "imitation"]) == 0
    assert load_rollouts(tmp_path / "i.npz").num_steps == load_rollouts(ro).num_steps


def test_the_neural_preprocessing_command_on_rollouts(tmp_path):
    save_rollouts(cartpole_rollouts(4), tmp_path / "ro")
    model = RewardEnsemble(4, 2, ensemble_size=2, hidden_dim=16, hidden_depth=1)
    (tmp_path / "m").mkdir()
    save_reward_model(model, tmp_path / "m" / "reward_model.pt", env="CartPole-v1",
                      domain="Classic")
    assert script("preprocess_reward").main([
        str(tmp_path / "m" / "reward_model.pt"), "--rollouts", str(tmp_path / "ro"),
        "--epochs", "2", "--epic-batch", "50", "--epic-samples", "16", "--reference",
        str(tmp_path / "m" / "reward_model.pt"), "--out", str(tmp_path / "n")]) == 0
    m = json.loads((tmp_path / "n" / "preprocessing.json").read_text())
    assert m["epic_raw_vs_preprocessed"] == pytest.approx(0.0, abs=1e-6)
    assert m["epic_to_reference_before"] == pytest.approx(0.0, abs=1e-6)
    assert m["objective_after"] < m["objective_before"]
    assert (tmp_path / "n" / "preprocess_curves.png").stat().st_size > 0
    # the fields the gridworld analysis has (docs/guide/reward-understanding.md), vector envs too
    grid_learned = {"support_mass_before", "support_mass_after", "epic_before", "epic_after",
                    "direct_pearson_distance_before", "direct_pearson_distance_after"}
    assert set(m["learned"]) == grid_learned
    assert set(m["shaped_true"]) == grid_learned | {"objective_before", "objective_after"}
    assert {"true_support_mass", "support_transitions", "epic_method"} <= set(m)
    assert m["learned"]["epic_before"] == pytest.approx(m["epic_to_reference_before"])
    assert 0 <= m["shaped_true"]["direct_pearson_distance_before"] <= 1
    assert m["shaped_true"]["objective_after"] <= m["shaped_true"]["objective_before"]


def test_the_feature_vis_command_end_to_end(tmp_path):
    model = pixel_model()
    (tmp_path / "m").mkdir()
    save_reward_model(model, tmp_path / "m" / "reward_model.pt", env="Fake-v0")
    rng = np.random.default_rng(0)
    r = Rollouts(rng.integers(0, 255, (12, 3, 36, 36), dtype=np.uint8),
                 rng.integers(0, 2, 10), rng.random(10).astype(np.float32),
                 np.zeros(10, bool), np.zeros(10, bool), np.array([4, 6]),
                 np.zeros(2, np.int64), np.zeros(2, np.int64),
                 meta={"action_space": {"type": "Discrete", "n": 2}})
    save_rollouts(r, tmp_path / "ro")
    assert script("feature_vis").main([str(tmp_path / "m" / "reward_model.pt"), "--rollouts",
                                       str(tmp_path / "ro"), "--steps", "3", "--top", "2",
                                       "--out", str(tmp_path / "fv")]) == 0
    summary = json.loads((tmp_path / "fv" / "featvis.json").read_text())
    assert summary["dataset_reward_max"] >= summary["dataset_reward_min"]
    assert (tmp_path / "fv" / "featvis.png").stat().st_size > 0


def test_the_report_gets_and_refreshes_the_interpretability_section(tmp_path):
    from themis.interpret.inspection import INTERPRET_BEGIN, interpret_section
    from themis.interpret.report import update_report

    run = tmp_path / "run"
    (run / "interpret").mkdir(parents=True)
    (run / "report").mkdir()
    (run / "report" / "report.md").write_text("# report\n\n## Teacher\n\nrows\n")
    (run / "interpret" / "a.md").write_text("### first\n")
    update_report(run)
    text = (run / "report" / "report.md").read_text()
    assert text.index("### first") < text.index("## Teacher")
    (run / "interpret" / "a.md").write_text("### second\n")
    update_report(run)
    text = (run / "report" / "report.md").read_text()
    assert "### second" in text and "### first" not in text and text.count(INTERPRET_BEGIN) == 1
    assert interpret_section(tmp_path) == []


@pytest.mark.parametrize("name,args,message", [
    ("rollouts", ["OUT", "--source", "random"], "--domain and --env are needed"),
    ("rollouts", ["OUT"], "give --source (one or more) or --from"),
    ("rollouts", ["OUT", "--source", "nothing", "--domain", "Classic", "--env",
                  "CartPole-v1"], "neither 'random', a run dir nor an SB3 .zip"),
    ("rollouts", ["OUT", "--source", "random", "--domain", "Classic", "--env", "CartPol-v1"],
     "close matches: CartPole-v1"),
    ("rollouts", ["OUT", "--source", "random", "--episodes", "0", "--domain", "Classic",
                  "--env", "CartPole-v1"], "0 must be >= 1"),
    ("supervised_reward", ["MISSING", "OUT"], "no rollouts at MISSING"),
    ("supervised_reward", ["RO", "OUT", "--heldout", "1.5"], "1.5 must be in (0, 1)"),
    ("preprocess_reward", ["MISSING"], "no reward-model checkpoint at MISSING"),
    ("preprocess_reward", ["MODEL"], "give --domain and --env"),
    ("preprocess_reward", ["MODEL", "--domain", "Classic", "--env", "CartPole-v1"],
     "give --rollouts"),
    ("preprocess_reward", ["MODEL", "--gamma", "2"], "2.0 must be in [0, 1]"),
    ("feature_vis", ["MODEL", "--rollouts", "RO"], "feature visualisation needs pixels"),
])
def test_bad_input_to_the_commands_exits_2_with_one_line(tmp_path, capsys, name, args,
                                                          message):
    model = RewardEnsemble(4, 2, ensemble_size=1, hidden_dim=8, hidden_depth=1)
    save_reward_model(model, tmp_path / "model.pt")  # no env recorded
    save_rollouts(cartpole_rollouts(1), tmp_path / "ro")
    subst = {"MODEL": str(tmp_path / "model.pt"), "RO": str(tmp_path / "ro"),
             "OUT": str(tmp_path / "out"), "MISSING": str(tmp_path / "missing")}
    argv = [subst.get(a, a) for a in args]
    try:
        code = script(name).main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err and message.replace("MISSING", str(tmp_path / "missing")) in err[-1]
    assert not any("Traceback" in line for line in err)


@pytest.mark.slow
def test_a_runs_saved_agent_plays_rollouts_and_its_report_gets_the_preprocessing(tmp_path):
    from tests.conftest import TINY_PENDULUM, launch
    from themis.interpret.inspection import inspect_run

    run = tmp_path / "run"
    result = launch("themis_train.sh", *TINY_PENDULUM, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert script("rollouts").main([str(tmp_path / "ro"), "--source", str(run), "--source",
                                    "random", "--episodes", "1", "--max-steps", "50"]) == 0
    r = load_rollouts(tmp_path / "ro")
    assert [s["kind"] for s in r.meta["sources"]] == ["agent", "random"]
    assert list(r.lengths) == [50, 50] and r.meta["env"] == "Pendulum-v1"
    assert script("preprocess_reward").main([str(run), "--rollouts", str(tmp_path / "ro"),
                                             "--epochs", "1", "--epic-batch", "40",
                                             "--epic-samples", "8"]) == 0
    report = inspect_run(run, episodes=1, max_steps=50)
    text = report.read_text()
    assert "## Understanding the reward" in text
    assert "(../interpret/preprocess_curves.png)" in text
