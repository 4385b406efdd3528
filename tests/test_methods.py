"""PEBBLE's successors (themis/methods): each mechanism against a hand-computed case, a tiny
run per method, a determinism check, and the combinations refused before training."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import TINY_PENDULUM
from themis.agents.buffers import ReplayBuffer, SegmentPairs
from themis.builder import make_workspace
from themis.methods.base import MethodContext, choose_augmentation
from themis.methods.crop import TemporalCrop
from themis.methods.mrn import MRN
from themis.methods.qpa import QPA, HybridReplay, QPAConfig
from themis.methods.registry import build_methods, find
from themis.methods.rime import RIME, RIMEConfig, RobustLabelFilter
from themis.methods.rune import RUNE, RUNEConfig, UncertaintyBonus
from themis.methods.surf import SURF, PseudoLabeler, SURFConfig
from themis.run.closing import finish


class SumModel(torch.nn.Module):
    """A one-member 'ensemble' whose segment return is the sum of the observations, so
    preference probabilities are set by hand."""

    ensemble_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.scale * obs.sum(-1)

    def segment_rewards(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        out = self.scale * obs.sum(-1)
        return out if out.dim() == 3 else out[None]

    def segment_returns(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.segment_rewards(obs, act).sum(-1)


# ------------------------------------------------------------------------------ crops
def test_crops_have_lengths_in_range_the_same_for_both_segments_and_start_anywhere():
    crop = TemporalCrop(3, 6)
    m1, m2, lengths = crop.masks((2, 500), 8, np.random.default_rng(0), torch.device("cpu"))
    assert set(np.unique(lengths)) == {3, 4, 5, 6}
    np.testing.assert_array_equal(m1.sum(-1).numpy(), lengths)  # one length per pair ...
    np.testing.assert_array_equal(m2.sum(-1).numpy(), lengths)  # ... for both segments
    starts = [m.argmax(-1).numpy() for m in (m1, m2)]
    assert (starts[0] != starts[1]).mean() > 0.5  # independent starts
    for m, s in zip((m1, m2), starts, strict=True):  # contiguous windows inside the segment
        idx = np.arange(8)
        want = (idx >= s[..., None]) & (idx < (s + lengths)[..., None])
        np.testing.assert_array_equal(m.numpy().astype(bool), want)


def test_qpa_crops_tile_each_pair_and_its_label():
    crop = TemporalCrop(2, 2, copies=3)  # fixed length 2: returns are sums of 2 steps
    rewards_1 = torch.ones(1, 2, 4)
    rewards_2 = torch.arange(8.0).reshape(1, 2, 4)
    labels = torch.tensor([[0.0, 1.0]])
    r1, r2, y = crop.returns(rewards_1, rewards_2, labels, np.random.default_rng(1))
    assert r1.shape == r2.shape == y.shape == (1, 6)
    assert y.tolist() == [[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]]
    assert (r1 == 2.0).all()
    sums = {0: {1.0, 3.0, 5.0}, 1: {9.0, 11.0, 13.0}}  # two consecutive steps of each pair
    for j, value in enumerate(r2[0].tolist()):
        assert value in sums[j // 3]


# ------------------------------------------------------------------------------- SURF
def test_surf_pseudo_labels_only_confident_pairs_with_weight_lambda_u():
    cfg = SURFConfig(enabled=True, threshold_u=0.9, lambda_u=2.0, mu=1)
    surf = PseudoLabeler(cfg, segment=1, obs_dim=1, action_dim=1)
    # returns R0 = 0, R1 = 5 (p = 0.993: confident, label 1) or R1 = 1 (p = 0.73: not)
    obs = np.array([[[[0.0]], [[5.0]]], [[[0.0]], [[1.0]]]], np.float32)
    true = np.array([[[0.0], [1.0]], [[1.0], [0.0]]], np.float32)
    surf.add(SegmentPairs(obs, np.zeros((2, 2, 1, 1), np.float32), true,
                          np.zeros((2, 2), np.int64)))
    model = SumModel()

    def returns(o, a, y, steps):  # the trainer's pair returns, from the loss's own pass
        return steps[0].sum(-1), steps[1].sum(-1), y

    surf.start_epoch()
    # a training batch of 4: min(mu × 4, 2 kept) = both pairs, each once (no replacement)
    loss = surf.loss(model, train_batch=4, rng=np.random.default_rng(0), returns=returns)
    expected = 2.0 * -math.log(torch.sigmoid(torch.tensor(5.0)).item()) / 2  # pair 0 only
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    surf.end_epoch()
    assert surf.used == 1 and surf.agreement == 1.0  # R1 > R0 truly


def test_surf_draws_mu_times_the_training_batch_size_whatever_the_number_of_labels():
    # official semi_train_reward: u_last_index = u_start_index + train_batch_size * mu
    from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer

    rng = np.random.default_rng(0)
    surf = PseudoLabeler(SURFConfig(enabled=True, threshold_u=0.5, mu=4), segment=2,
                         obs_dim=2, action_dim=1)
    def pairs(n):
        return SegmentPairs(rng.standard_normal((n, 2, 2, 2), dtype=np.float32),
                            np.zeros((n, 2, 2, 1), np.float32),
                            rng.standard_normal((n, 2, 2), dtype=np.float32),
                            np.zeros((n, 2), np.int64))
    surf.add(pairs(1000))
    data = PreferenceDataset(10, 2, 2, 1)
    data.add(pairs(10), rng.integers(0, 2, 10).astype(np.float32))  # 10 labels: one batch
    method = SURF(SURFConfig(enabled=True, threshold_u=0.5, mu=4, crop_range=0),
                  MethodContext(segment=2, obs_dim=2, action_dim=1))
    method.unlabelled = surf
    trainer = RewardTrainer(RewardEnsemble(2, 1, ensemble_size=3, hidden_dim=8), 1e-3, 128,
                            rng, methods=[method])
    trainer.train_epoch(data)
    assert surf.used == 3 * 4 * 128  # threshold 0.5: every drawn pair is confident


@pytest.mark.parametrize(("labels", "reward_update", "epochs"), [
    (10, 1000, 79), (100, 1000, 782), (1000, 1000, 977), (128, 50, 50), (10, 5, 1)])
def test_surf_trains_the_official_count_of_steps_a_round(labels, reward_update, epochs):
    # train_PEBBLE_semi_dataaug.py learn_reward: num_iters = ceil(reward_update ×
    # labeled_feedback / train_batch_size), no early stop; here in epochs of ceil(labels / 128)
    surf = SURF(SURFConfig(enabled=True), MethodContext(segment=50, obs_dim=2, action_dim=1))
    assert surf.round_epochs(labels, reward_update, 128) == epochs
    assert surf.stop_rule() == (math.inf, 0)
    early = SURF(SURFConfig(enabled=True, early_stop=True),
                 MethodContext(segment=50, obs_dim=2, action_dim=1))
    assert early.round_epochs(labels, reward_update, 128) is None and early.stop_rule() is None


def test_surf_reward_training_runs_every_planned_epoch_however_accurate():
    from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer

    rng = np.random.default_rng(0)
    obs = rng.standard_normal((10, 2, 3, 2), dtype=np.float32)
    pairs = SegmentPairs(obs, np.zeros((10, 2, 3, 1), np.float32), obs.sum(-1),
                         np.zeros((10, 2), np.int64))
    labels = (obs.sum((-1, -2))[:, 1] > obs.sum((-1, -2))[:, 0]).astype(np.float32)
    data = PreferenceDataset(10, 3, 2, 1)
    data.add(pairs, labels)

    def fit(cfg):
        method = SURF(cfg, MethodContext(segment=3, obs_dim=2, action_dim=1))
        method.unlabelled.add(pairs)
        model = RewardEnsemble(2, 1, ensemble_size=2, hidden_dim=16)
        trainer = RewardTrainer(model, 1e-2, 128, np.random.default_rng(1), methods=[method],
                                crop=None)
        return trainer.train(data, max_epochs=300)

    official = fit(SURFConfig(enabled=True, crop_range=0, threshold_u=0.6))
    assert official.epochs == 24  # ceil(300 × 10 / 128) steps, one batch an epoch
    assert official.accuracy == 1.0  # separable labels: B-Pref's rule would have stopped
    early = fit(SURFConfig(enabled=True, crop_range=0, threshold_u=0.6, early_stop=True))
    assert early.epochs < 24 and early.accuracy > 0.97


@pytest.mark.parametrize("overrides, mu, ratio, feed_type", [
    (["method=surf"], 4, 100, 1),  # alinlab/SURF README, walker_walk
    (["method=surf", "domain=DMC"], 4, 100, 1),
    (["method=surf", "domain=MetaWorld"], 4, 10, 1),  # README, hammer
    (["method=rune"], 1, 100, 1),  # rll-research/rune scripts: feed_type=1
])
def test_surf_and_rune_defaults_are_those_of_the_published_runs(compose, overrides, mu, ratio,
                                                                 feed_type):
    cfg = compose(overrides)
    if cfg.surf.enabled:
        assert (cfg.surf.mu, cfg.surf.inv_label_ratio) == (mu, ratio)
    assert str(cfg.feed_type) == str(feed_type)


def test_surf_on_meta_world_trains_20_reward_updates_as_its_hammer_run(compose):
    # alinlab/SURF README, MetaWorld-v2 hammer: train_PEBBLE_semi_dataaug.py reward_update=20
    assert compose(["method=surf", "domain=MetaWorld"]).reward_update == 20
    assert compose(["method=surf", "domain=DMC"]).reward_update == 50  # Themis's default


# ------------------------------------------------------------------------------- RUNE
def test_rune_reward_is_mean_plus_decaying_beta_times_std():
    step = [0]
    bonus = UncertaintyBonus(RUNEConfig(enabled=True, beta_init=0.5, beta_decay=0.1),
                             clock=lambda: step[0])
    members = np.array([[1.0, 0.0], [3.0, 0.0]], np.float32)  # (E=2, n=2): std 1 and 0
    np.testing.assert_allclose(bonus(members), [2.0 + 0.5, 0.0])
    step[0] = 2
    assert bonus.beta() == pytest.approx(0.5 * 0.9 ** 2)
    np.testing.assert_allclose(bonus(members), [2.0 + 0.405, 0.0], rtol=1e-6)
    assert bonus.last_std == pytest.approx(0.5)


# -------------------------------------------------------------------------------- QPA
def filled_buffer(episode_lengths: list[int]) -> ReplayBuffer:
    buf = ReplayBuffer((1,), 1, sum(episode_lengths) + 5, torch.device("cpu"))
    for ep, length in enumerate(episode_lengths):
        for t in range(length):
            buf.add(np.array([float(ep)]), np.zeros(1), 0.0, np.zeros(1), False, ep, t, 0.0)
    return buf


def test_qpa_half_of_each_batch_comes_from_the_last_episodes():
    buf = filled_buffer([30, 20, 10, 7])  # the last 3 episodes (one in progress): 37 steps
    active = [True]
    mixer = HybridReplay(buf, QPAConfig(enabled=True, recent_episodes=3, her_ratio=0.5),
                         active=lambda: active[0])
    assert mixer.recent_span() == 37
    batch = mixer.sample(400, np.random.default_rng(0))
    episodes = batch.observations[:, 0].numpy()
    assert (episodes[200:] >= 1).all()  # the recent half: episodes 1, 2, 3 only
    assert set(np.unique(episodes[200:])) == {1.0, 2.0, 3.0}
    assert (episodes[:200] == 0).mean() > 0.3  # the other half: the whole buffer
    active[0] = False  # feedback over: uniform batches (as the official code)
    episodes = mixer.sample(400, np.random.default_rng(1)).observations[:, 0].numpy()
    assert (episodes == 0).mean() > 0.3
    buf.add(np.array([3.0]), np.zeros(1), 0.0, np.zeros(1), False, 3, 7, 0.0)
    assert mixer.recent_span() == 38  # the episode in progress grows


def test_qpa_queries_come_from_the_last_episodes(compose):
    cfg = compose(["method=qpa"])
    assert cfg.query_pool_episodes == 10 and str(cfg.feed_type) == "0"
    assert cfg.ensemble_size == 1
    assert compose(["method=qpa", "qpa.recent_episodes=4"]).query_pool_episodes == 4


def test_qpa_on_meta_world_trains_without_crops_on_a_pool_of_30_episodes(compose):
    # huxiao09/QPA run_QPA.sh (max_reward_buffer_size=30, no data_aug_ratio) and train_QPA.py
    # (metaworld: train_reward, no cropping mask, reward_update=200 epochs, 97 % stop)
    def make_crop(cfg):
        return choose_augmentation(build_methods(cfg, MethodContext(segment=cfg.segment)))

    dmc, meta = compose(["method=qpa"]), compose(["method=qpa", "domain=MetaWorld"])
    assert make_crop(dmc).copies == 20 and dmc.query_pool_episodes == 10
    assert make_crop(meta) is None
    assert (meta.query_pool_episodes, meta.reward_update) == (30, 200)
    assert make_crop(compose(["method=[surf,qpa]", "domain=MetaWorld"])).copies == 1  # SURF's


class FlipModel(SumModel):
    """:class:`SumModel` with the attributes the reward trainer reads: segment returns
    ``scale × Σ obs``, so the sign of ``scale`` alone decides every predicted order."""

    obs_shape = (1,)
    device = torch.device("cpu")

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale.data.fill_(scale)


def qpa_trainer(model, batch_size, lr, qpa_cfg):
    from themis.reward import RewardTrainer

    qpa = QPA(qpa_cfg, MethodContext(segment=2, obs_dim=1, action_dim=1))
    trainer = RewardTrainer(model, lr, batch_size, np.random.default_rng(0), methods=[qpa],
                            crop=None)
    steps = []  # every gradient step, counted apart from the trainer's own count
    step = trainer.optimizer.step
    trainer.optimizer.step = lambda *a, **k: (steps.append(1), step(*a, **k))[1]  # type: ignore
    return trainer, steps


def ordered_pairs(n, wrong=0):
    """``n`` pairs whose second segment has the larger Σ obs; the first ``wrong`` labelled
    the other way."""
    from themis.reward import PreferenceDataset

    obs = np.zeros((n, 2, 2, 1), np.float32)
    obs[:, 1] = 1.0
    labels = np.ones(n, np.float32)
    labels[:wrong] = 0.0
    data = PreferenceDataset(n, 2, 1, 1)
    data.add(SegmentPairs(obs, np.zeros((n, 2, 2, 1), np.float32), obs.sum(-1),
                          np.zeros((n, 2), np.int64)), labels)
    return data


@pytest.mark.parametrize(("labels", "reward_update", "steps"), [
    (10, 2000, 157), (100, 2000, 1563), (1000, 2000, 15625), (3, 5, 1)])
def test_qpa_counts_the_official_iterations_from_the_labels(labels, reward_update, steps):
    # train_QPA.py learn_reward: num_iters = ceil(reward_update × labeled_feedback / 128)
    qpa = QPA(QPAConfig(enabled=True), MethodContext(segment=50, obs_dim=2, action_dim=1))
    assert qpa.round_steps(labels, reward_update, 128) == (steps, 0.98)
    assert QPA(QPAConfig(enabled=True, iterations=False),
               MethodContext(segment=50)).round_steps(labels, reward_update, 128) is None


def test_qpa_trains_its_iterations_in_passes_of_fresh_permutations():
    # 3 labels in batches of 2: ceil(5 × 3 / 2) = 8 steps = passes of 2 + 1 pairs, 4 passes;
    # one label in three wrong: the round's accuracy stays at most 2/3, under 0.98
    trainer, steps = qpa_trainer(FlipModel(1.0), batch_size=2, lr=1e-3,
                                 qpa_cfg=QPAConfig(enabled=True, data_aug_ratio=0))
    fit = trainer.train(ordered_pairs(3, wrong=1), max_epochs=5)
    assert (fit.steps, len(steps), fit.epochs) == (8, 8, 4)


def test_qpa_stops_once_the_accuracy_accumulated_over_the_round_reaches_098():
    # Every pair in one batch. Before the first step scale = -0.5 orders every pair wrongly;
    # Adam's first step (lr 1, |step| = lr) makes it +0.5 and every later prediction right:
    # after step k the round's accuracy is (k - 1) / k, first >= 0.98 at k = 50 (49/50), where
    # B-Pref's per-epoch rule (> 0.97) stops after step 2 and 157 steps were planned.
    trainer, steps = qpa_trainer(FlipModel(-0.5), batch_size=8, lr=1.0,
                                 qpa_cfg=QPAConfig(enabled=True, data_aug_ratio=0))
    fit = trainer.train(ordered_pairs(8), max_epochs=2500)  # ceil(2500 × 8 / 8) = 2500 steps
    assert fit.steps == len(steps) == fit.epochs == 50
    assert fit.accuracy == 1.0
    trainer, steps = qpa_trainer(FlipModel(-0.5), batch_size=8, lr=1.0, qpa_cfg=QPAConfig(
        enabled=True, data_aug_ratio=0, iterations=False))  # Meta-World's rule
    assert trainer.train(ordered_pairs(8), max_epochs=2500).steps == 2


@pytest.mark.parametrize(("overrides", "iterations", "reward_update"), [
    (["method=qpa"], True, 2000), (["method=qpa", "domain=DMC"], True, 2000),
    (["method=qpa", "domain=MetaWorld"], False, 200)])
def test_qpa_trains_as_train_qpa_py_on_each_domain(compose, overrides, iterations,
                                                   reward_update):
    # run_QPA.sh: reward_update=2000 on DMC, 200 on Meta-World; train_QPA.py: train_reward_iter
    # (iterations, 0.98 stop) unless 'metaworld' in env (epochs, 97 % stop)
    cfg = compose(overrides)
    assert (cfg.qpa.iterations, cfg.reward_update, cfg.qpa.stop_accuracy) == (
        iterations, reward_update, 0.98)


# ------------------------------------------------------------------------------- RIME
def test_rime_keeps_drops_and_flips_labels_by_their_loss():
    rime = RobustLabelFilter(RIMEConfig(enabled=True, threshold_alpha=0.5))
    rime.max_ema, rime.var = 1.0, 0.0  # τ_lower = −ln 1 + 0.5 · 1 + 0 = 0.5
    lower, upper = rime.thresholds()
    assert lower == pytest.approx(0.5) and upper == pytest.approx(-math.log(0.001))
    # p(segment 2 preferred) = sigmoid(R1 − R0) with R1 − R0 = logit(p), label 1 for all
    p = np.array([0.9, 0.3, 0.0005, 0.0005])
    logits = np.log(p / (1 - p)).astype(np.float32)
    obs = torch.zeros(4, 2, 1, 1)
    obs[:, 1, 0, 0] = torch.from_numpy(logits)
    labels = torch.tensor([1.0, 1.0, 1.0, 0.5])  # the last is a tie: never flipped
    oracle = np.array([1.0, 0.0, 0.0, 0.5], np.float32)  # rows 1 and 2 are corrupted labels
    index, used = rime.select(SumModel(), obs, torch.zeros(4, 2, 1, 1), labels, oracle)
    # ℓ = 0.105 (kept), 1.20 (dropped), 7.6 (flipped), 0.5·7.6 (tie: dropped, not flipped)
    assert index.tolist() == [0, 2] and used.tolist() == [1.0, 0.0]
    assert (rime.kept, rime.flipped, rime.dropped) == (1, 1, 2)
    assert (rime.caught, rime.discarded_clean) == (2, 1)
    assert rime.max_ema == pytest.approx(1.0 + 0.1 * (-math.log(0.9) - 1.0))


def test_rime_statistics_count_labels_both_trusted_and_flipped():
    # reward_model_RIME.py: KL_div.update(KL_div[trust_sample_bool_index]), before flipping
    rime = RobustLabelFilter(RIMEConfig(enabled=True))  # x = 0: τ_lower ≈ 18 > τ_upper ≈ 6.9
    p = np.array([0.9, 0.0005])
    obs = torch.zeros(2, 2, 1, 1)
    obs[:, 1, 0, 0] = torch.from_numpy(np.log(p / (1 - p)).astype(np.float32))
    index, used = rime.select(SumModel(), obs, torch.zeros(2, 2, 1, 1), torch.ones(2))
    assert index.tolist() == [0, 1] and used.tolist() == [1.0, 0.0]  # row 1 flipped once
    assert rime.max_ema == pytest.approx(0.1 * -math.log(0.0005), rel=1e-4)  # its loss counts
    assert rime.count == 2


def test_rime_trusts_every_label_first_and_beta_decays_linearly():
    rime = RobustLabelFilter(RIMEConfig(enabled=True, beta_init=3.0, beta_min=1.0,
                                        beta_decay_epochs=4))
    assert rime.thresholds()[0] > 18  # x = 0: −ln(1e-8), everything is trusted at first
    betas = []
    for _ in range(6):
        betas.append(rime.beta())
        rime.epochs += 1
    assert betas == pytest.approx([3.0, 2.5, 2.0, 1.5, 1.0, 1.0])


@pytest.mark.parametrize("rows", [None, np.array([0, 2, 3])])
def test_rime_in_the_trainer_judges_the_trained_rows_against_their_own_truth(rows):
    from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer
    from themis.reward.preference_models import true_preference

    rng = np.random.default_rng(0)
    true = rng.standard_normal((4, 2, 3)).astype(np.float32)
    data = PreferenceDataset(4, 3, 2, 1)
    data.add(SegmentPairs(rng.standard_normal((4, 2, 3, 2), dtype=np.float32),
                          np.zeros((4, 2, 3, 1), np.float32), true, np.zeros((4, 2), np.int64)),
             np.array([1.0, 0.0, 1.0, 0.5], np.float32))
    rime = RIME(RIMEConfig(enabled=True), MethodContext(segment=3, obs_dim=2))
    seen = []
    select = rime.filter.select
    rime.filter.select = lambda model, obs, act, labels, oracle: (
        seen.append((labels.numpy().copy(), oracle)), select(model, obs, act, labels, oracle))[1]
    trainer = RewardTrainer(RewardEnsemble(2, 1, ensemble_size=2, hidden_dim=8), 1e-3, 4, rng,
                            methods=[rime])
    trainer.train_epoch(data, rows)
    picked = np.arange(4) if rows is None else rows
    labels, oracle = seen[0]
    np.testing.assert_array_equal(labels, data.labels[picked])  # shape (n,), not (1, n)
    np.testing.assert_array_equal(oracle, true_preference(true[picked]))

def test_rime_trains_at_least_least_reward_update_epochs_then_stops_above_98_percent(
        compose, tmp_path):
    from themis.reward import PreferenceDataset, RewardEnsemble, RewardTrainer

    rng = np.random.default_rng(0)
    sign = rng.choice([-1.0, 1.0], size=(64, 2, 1, 1))  # good (+1) and bad (-1) segments
    obs = (sign + 0.1 * rng.standard_normal((64, 2, 3, 2))).astype(np.float32)
    true = obs.sum(-1)  # the reward is the sum of the observation: easy to fit
    data = PreferenceDataset(64, 3, 2, 1)
    data.add(SegmentPairs(obs, np.zeros((64, 2, 3, 1), np.float32), true,
                          np.zeros((64, 2), np.int64)),
             (true[:, 1].sum(-1) > true[:, 0].sum(-1)).astype(np.float32))

    def fit(**stop):
        torch.manual_seed(0)
        trainer = RewardTrainer(RewardEnsemble(2, 1, ensemble_size=2, hidden_dim=32), 3e-3,
                                16, np.random.default_rng(1), **stop)
        return trainer.train(data, max_epochs=40)

    bpref = fit()
    assert bpref.accuracy > 0.97 and bpref.epochs < 6  # the generic stop comes early
    rime = fit(target_accuracy=0.98, min_epochs=6)  # train_RIME.py: epoch > least (0-based)
    assert rime.epochs >= 8 and (rime.accuracy > 0.98 or rime.epochs == 40)
    ws = make_workspace(compose([*TINY_PENDULUM, "method=rime"]), tmp_path)
    trainer = ws.learner.trainer
    assert (trainer.min_epochs, trainer.target_accuracy) == (15, 0.98)  # DMC/MuJoCo default


@pytest.mark.parametrize("domain, k, least, epochs", [
    ("Control", 60, 15, 50), ("DMC", 60, 15, 50),
    ("MetaWorld", 600, 5, 10),  # train_RIME.py k = 600; run_parallel.sh 5 and 10 epochs
])
def test_rime_settings_per_domain_are_the_official_ones(compose, domain, k, least, epochs):
    cfg = compose(["method=rime", f"domain={domain}"])
    assert (cfg.rime.beta_decay_epochs, cfg.rime.least_reward_update, cfg.reward_update) == \
        (k, least, epochs)


@pytest.mark.parametrize("method", ["pebble", "surf"])
def test_queries_come_from_finished_episodes_only(compose, tmp_path, method):
    # BPref get_queries (and SURF's, QPA's): the trajectory in progress is left out
    ws = make_workspace(compose([*TINY_PENDULUM, f"method={method}"]),
                        tmp_path)
    seen, sample = [], ws.buffer.sample_segment_pairs

    def recording(*args, **kwargs):
        pairs = sample(*args, **kwargs)
        seen.append((ws.buffer.episode[pairs.starts], ws.episode, len(pairs)))
        return pairs

    ws.buffer.sample_segment_pairs = recording
    ws.run()
    assert len(seen) >= 3 and sum(n for *_, n in seen) >= 30
    for episodes, running, _ in seen:  # rounds at 400 (episode 2 just began), 700, 1000, ...
        assert (episodes < running).all()


# ------------------------------------------------------------------ runs per method
@pytest.mark.parametrize("method, columns", [
    ("surf", ["unlabelled", "pseudo_labels", "pseudo_agreement"]),
    ("rune", ["rune_beta", "rune_std"]),
    ("qpa", []),
    ("rime", ["rime_kept", "rime_flipped", "rime_caught", "rime_discarded_clean",
              "warm_start_loss"]),
    ("[surf,rune]", ["pseudo_labels", "rune_beta"]),
])
def test_a_tiny_run_per_method_logs_its_numbers(compose, tmp_path, method, columns):
    # a tiny model is rarely 99 % sure: a lower threshold lets pseudo-labels through
    ws = make_workspace(compose([*TINY_PENDULUM, f"method={method}", "surf.threshold_u=0.6"]),
                        tmp_path)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert len(rounds) == 3 and rounds["epochs"].min() > 0
    for column in columns:  # (the agent's reward is first computed after round 1)
        assert column in rounds and rounds[column].iloc[1:].notna().all(), column
    if "surf" in method:
        assert (rounds["unlabelled"] == [1000, 2000, 3000]).all()  # 100 per query asked
        assert rounds["pseudo_labels"].iloc[-1] > 0
    if method == "rune":
        assert (rounds["rune_beta"] < 0.05).all() and (rounds["rune_std"].iloc[1:] > 0).all()
    if method == "rime":
        assert (rounds["rime_kept"] + rounds["rime_flipped"] + rounds["rime_dropped"]
                == rounds["labeled_feedback"]).all()
    assert pd.read_csv(tmp_path / "eval.csv")["episode_reward"].notna().all()


def test_rime_warm_start_fits_the_intrinsic_reward_and_keeps_the_critic(compose, tmp_path):
    ws = make_workspace(compose([*TINY_PENDULUM, "method=rime", "reset_update=0"]), tmp_path)
    before = [p.detach().clone() for p in ws.reward_model.parameters()]
    rewards, update = [], ws.agent.update

    def recording(batch, step, **kw):
        rewards.append(batch.rewards)
        return update(batch, step, **kw)

    ws.agent.update = recording
    ws.run(until=ws.cfg.pretrain_end)
    assert any(not torch.equal(a, b) for a, b in zip(before, ws.reward_model.parameters(),
                                                      strict=True))  # trained in pretraining
    # fits the scaled intrinsic reward (chance: ~1)
    assert find(ws.learner.methods, RIME).warm.loss < 0.5
    # the agent's pretraining reward: clip((d - mean) / 3 std, -1, 1) (agent/sac_RIME.py),
    # not PEBBLE's d / std (mean ~3 here), so the kept critic's values stay near r̂'s
    r = torch.cat(rewards)
    assert r.abs().max() <= 1.0 and abs(float(r.mean())) < 0.3
    # the warm-started r̂ is centred (target z / max|z|, train_RIME.py), not in [0, 1]
    n = len(ws.buffer)
    r_hat = ws.learner.model.predict(ws.buffer.obs[:n], ws.buffer.actions[:n])
    assert 0.2 < (r_hat < 0).mean() < 0.8
    critic = [p.detach().clone() for p in ws.agent.critic.parameters()]
    ws.agent.update = lambda batch, step, **kw: {}
    ws.run(until=ws.cfg.pretrain_end + 1)
    assert all(torch.equal(a, b) for a, b in zip(critic, ws.agent.critic.parameters(),
                                                  strict=True))  # no critic reset


def test_rime_warm_start_takes_five_fresh_batches_of_states_with_their_novelty(
        compose, tmp_path):
    ws = make_workspace(compose([*TINY_PENDULUM, "method=rime"]), tmp_path)
    ws.run(until=ws.cfg.num_seed_steps + 50)
    rime = find(ws.learner.methods, RIME)
    draws, warm = [], rime.warm

    def spy(draw):
        def recorded():
            draws.append(draw())
            return draws[-1]
        warm(recorded)

    rime.warm = spy
    ws.run(until=ws.step + 1)  # one agent update
    assert len(draws) == 5  # train_RIME.py: for _ in range(5): a fresh sample_state_ent batch
    assert all(not torch.equal(draws[0].observations, d.observations) for d in draws[1:])
    z = torch.cat([d.novelty for d in draws])
    # z = (d(s) - mean) / std: centred; the target z / max|z| of the extremes seen
    assert (z < 0).any() and (z > 0).any()
    assert float((z / draws[0].bound).abs().max()) < 1.5
    mean, std = float(ws.state_entropy.stats.mean), float(ws.state_entropy.stats.std)
    assert draws[0].bound == pytest.approx(
        max(abs(ws.state_entropy.low - mean), abs(ws.state_entropy.high - mean)) / std)


def test_heldout_correlations_measure_r_hat_not_r_hat_plus_runes_bonus(compose, tmp_path):
    ws = make_workspace(compose([*TINY_PENDULUM, "method=rune", "rune.beta_init=1000"]),
                        tmp_path)
    ws.run(until=ws.cfg.pretrain_end + 1)  # one round: a trained reward model
    pairs = ws.buffer.sample_segment_pairs(30, ws.cfg.segment, np.random.default_rng(0))
    labels = np.ones(30)
    with_bonus = ws.learner.quality(pairs, labels)
    ws.learner.methods = []
    assert ws.learner.quality(pairs, labels) == with_bonus  # the bonus plays no part
    assert not np.isnan(with_bonus[2])
    # Pearson and Spearman (average ranks) as scipy.stats computes them, ties included
    from scipy import stats

    predicted = ws.reward_model.predict(pairs.observations.reshape(30 * 2 * ws.cfg.segment, -1),
                                        pairs.actions.reshape(30 * 2 * ws.cfg.segment, -1))
    predicted = predicted.reshape(60, ws.cfg.segment).sum(1)
    true = pairs.true_rewards.reshape(60, ws.cfg.segment).sum(1)
    assert with_bonus[2] == pytest.approx(stats.pearsonr(predicted, true).statistic, abs=1e-6)
    assert with_bonus[3] == pytest.approx(stats.spearmanr(predicted, true).statistic, abs=1e-6)
    pairs.true_rewards[:3] = 0.0  # ties among the true returns
    tied = pairs.true_rewards.reshape(60, ws.cfg.segment).sum(1)
    assert ws.learner.quality(pairs, labels)[3] == pytest.approx(
        stats.spearmanr(predicted, tied).statistic, abs=1e-6)


def test_rune_with_ppo_adds_the_bonus_to_rollout_rewards(compose, tmp_path):
    from tests.test_wiring import PPO_TINY

    ws = make_workspace(compose([*PPO_TINY, "num_train_steps=700", "method=rune",
                                 "rune.ppo_beta=1.0"]), tmp_path)
    # train_PrefPPO_explore.py: beta_init 0.01, beta_schedule constant (not SAC's decay)
    assert compose(["method=rune"]).rune.ppo_beta == 0.01
    ws.run()
    bonus = find(ws.learner.methods, RUNE).uncertainty
    assert bonus.beta(0) == bonus.beta(10**6) == 1.0
    obs = ws.buffer.obs[:50].reshape(50, -1)
    act = np.eye(ws.facts.action_dim, dtype=np.float32)[np.zeros(50, int)]
    members = ws.reward_model.predict_members(obs, act)
    np.testing.assert_allclose(ws.learner.reward(obs, act),
                               members.mean(0) + members.std(0), rtol=1e-5, atol=1e-6)


def test_a_method_run_is_deterministic(compose, tmp_path):
    outputs = []
    for name in ("a", "b"):
        ws = make_workspace(compose([*TINY_PENDULUM, "method=[surf,rime]"]), tmp_path / name)
        ws.run()
        finish(ws)
        outputs.append([pd.read_csv(tmp_path / name / f) for f in ("eval.csv", "reward.csv")])
    for a, b in zip(*outputs, strict=True):
        pd.testing.assert_frame_equal(a, b)


def test_reward_side_mechanisms_work_with_ppo(compose, tmp_path):
    from tests.test_wiring import PPO_TINY

    ws = make_workspace(compose([*PPO_TINY, "num_train_steps=900", "method=[surf,rime]",
                                 "surf.threshold_u=0.6"]), tmp_path)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    assert len(rounds) >= 2 and (rounds["unlabelled"] > 0).all()
    assert (rounds["rime_kept"] + rounds["rime_flipped"] + rounds["rime_dropped"]
            == rounds["labeled_feedback"]).all()
    # warm-started on the rollouts' state entropy
    assert np.isfinite(find(ws.learner.methods, RIME).warm.loss)


# -------------------------------------------------------------------------------- MRN
class LinearCritic(torch.nn.Module):
    """Two linear heads Q_h(x) = w_h · x + b_h over x = (s, a), whose one-step update has a
    closed form."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(2, dim, generator=gen))
        self.b = torch.nn.Parameter(torch.tensor([0.3, -0.2]))

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.w @ torch.cat([obs, act], -1).T + self.b[:, None]


def test_mrn_outer_loss_and_its_reward_gradient_match_the_hand_computed_bilevel_step():
    from themis.methods.mrn import meta_outer_loss

    gen = torch.Generator().manual_seed(1)
    obs, act = torch.randn(4, 2, generator=gen), torch.randn(4, 1, generator=gen)
    boot = torch.randn(4, generator=gen)
    pair_obs, pair_act = torch.randn(3, 2, 2, generator=gen), torch.randn(3, 2, 1, generator=gen)
    labels = torch.tensor([1.0, 0.0, 0.5])
    rewards = torch.randn(4, generator=gen).requires_grad_(True)
    critic, lr = LinearCritic(3), 0.1
    loss = meta_outer_loss(critic, rewards, obs, act, boot, lr, pair_obs, pair_act, labels)
    (grad,) = torch.autograd.grad(loss, rewards)

    # by hand: Q'_h(x) = Q_h(x) - lr (2/B) Σ_b (Q_h(x_b) - y_b)(x_b · x + 1)
    x = torch.cat([obs, act], -1).detach()
    x1, x2 = torch.cat([pair_obs, pair_act], -1).unbind(1)  # first steps of segments 1, 2
    w, b = critic.w.detach(), critic.b.detach()
    y = rewards.detach() + boot
    err = w @ x.T + b[:, None] - y  # (heads, B)

    def q_new(z: torch.Tensor) -> torch.Tensor:
        return w @ z.T + b[:, None] - lr * 2 / 4 * err @ (x @ z.T + 1)

    logit = q_new(x2) - q_new(x1)  # (heads, pairs)
    bce = -(labels * torch.nn.functional.logsigmoid(logit)
            + (1 - labels) * torch.nn.functional.logsigmoid(-logit))
    assert loss.item() == pytest.approx(bce.mean(1).sum().item(), rel=1e-5)
    # dL/dr_b = Σ_h Σ_i (σ(z_hi) - y_i) / n · lr (2/B) x_b · (x2_i - x1_i)
    want = ((torch.sigmoid(logit) - labels) / 3).sum(0) @ (x @ (x2 - x1).T).T * lr * 2 / 4
    np.testing.assert_allclose(grad.numpy(), want.numpy(), rtol=1e-4, atol=1e-7)
    assert critic.w.grad is None and critic.b.grad is None  # the critic is only read


def test_mrn_update_steps_the_reward_model_not_the_critic_and_lowers_the_outer_loss():
    from themis.agents import SAC
    from themis.agents.buffers import ReplayBufferSamples
    from themis.agents.sac import SACConfig
    from themis.methods.mrn import MetaRewardUpdate, MRNConfig
    from themis.reward import PreferenceDataset, RewardEnsemble

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    agent = SAC(3, 1, torch.device("cpu"), SACConfig(hidden_dim=16, critic_lr=1e-2))
    model = RewardEnsemble(3, 1, ensemble_size=2, hidden_dim=16, hidden_depth=2)
    data = PreferenceDataset(8, 4, 3, 1)
    pairs = SegmentPairs(rng.normal(size=(8, 2, 4, 3)).astype(np.float32),
                         rng.uniform(-1, 1, (8, 2, 4, 1)).astype(np.float32),
                         np.zeros((8, 2, 4), np.float32), np.zeros((8, 2), np.int64))
    data.add(pairs, rng.integers(0, 2, 8).astype(np.float32))
    t = torch.as_tensor
    batch = ReplayBufferSamples(t(rng.normal(size=(16, 3)), dtype=torch.float32),
                                t(rng.uniform(-1, 1, (16, 1)), dtype=torch.float32),
                                t(rng.normal(size=(16, 3)), dtype=torch.float32),
                                torch.zeros(16), torch.ones(16))
    meta = MetaRewardUpdate(model, torch.optim.Adam(model.parameters(), 1e-3),
                            MRNConfig(enabled=True, meta_steps=10, outer_weight=0.1))
    critic = [p.detach().clone() for p in agent.critic.parameters()]
    reward = [p.detach().clone() for p in model.parameters()]
    losses = []
    for _ in range(2):
        torch.manual_seed(1)  # the same next actions for the soft value both times
        losses.append(meta(agent, batch, data, pairs=5))
    assert meta.updates == 2 and losses[1] < losses[0]  # a descent step on the outer loss
    assert all(torch.equal(a, b) for a, b in zip(critic, agent.critic.parameters(),
                                                  strict=True))
    assert all(p.grad is None for p in agent.critic.parameters())
    assert not any(torch.equal(a, b) for a, b in zip(reward, model.parameters(), strict=True))
    assert meta.due(20) and not meta.due(25)


@pytest.mark.parametrize("overrides, meta_steps", [
    (["method=mrn"], 1000),  # RyanLiu112/MRN README, walker_walk: num_meta_steps=1000
    (["method=mrn", "domain=DMC"], 1000),
    (["method=mrn", "domain=MetaWorld"], 10000),  # README, door-open: num_meta_steps=10000
    (["method=[surf,mrn]", "domain=MetaWorld"], 10000),
    (["method=mrn", "domain=MetaWorld", "mrn.meta_steps=300"], 300),  # the command line wins
])
def test_mrn_meta_steps_follow_the_official_runs_per_domain(compose, overrides, meta_steps):
    assert compose(overrides).mrn.meta_steps == meta_steps


def test_mrn_runs_every_meta_steps_while_feedback_is_open_and_relabels(compose, tmp_path):
    # pretraining ends at 400; rounds at 400, 700, 1000 (the budget is spent at 1000)
    ws = make_workspace(compose([*TINY_PENDULUM, "method=mrn", "mrn.meta_steps=100"]),
                        tmp_path)
    ws.run(until=505)  # the bilevel update of step 500 changed r̂: the buffer follows it
    assert find(ws.learner.methods, MRN).update.updates == 1
    n = len(ws.buffer) - ws.buffer._pending
    expected = ws.learner.reward(ws.buffer.obs[:n], ws.buffer.actions[:n])
    np.testing.assert_allclose(ws.buffer.rewards[:n], expected, rtol=1e-5, atol=1e-6)
    ws.run()
    finish(ws)
    rounds = pd.read_csv(tmp_path / "reward.csv")
    # steps 500, 600 before round 2; 700 (after the round), 800, 900; none once spent
    assert rounds["mrn_updates"].tolist() == [0, 2, 5]
    assert find(ws.learner.methods, MRN).update.updates == 5
    assert np.isfinite(rounds["mrn_outer_loss"].iloc[-1])
    assert pd.read_csv(tmp_path / "eval.csv")["episode_reward"].notna().all()


def test_the_banner_and_the_learning_curve_name_method_sampler_and_teacher(
        compose, tmp_path, capsys, monkeypatch):
    import themis.run.closing

    titles: list[str] = []
    monkeypatch.setattr(themis.run.closing, "plot_learning_curve",
                        lambda csv, png, title="": titles.append(title))
    ws = make_workspace(compose([*TINY_PENDULUM, "num_train_steps=600", "method=[surf,rune]",
                                 "feed_type=1", "teacher=skip"]), tmp_path)
    ws.run()
    finish(ws)
    what = "SURF+RUNE · sampler disagreement · teacher skip"
    assert what in capsys.readouterr().out.splitlines()[0]  # the banner, the first line
    assert titles == [f"Pendulum-v1: {what}"]  # not "(PEBBLE)"
