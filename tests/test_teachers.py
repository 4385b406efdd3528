"""Synthetic teachers: the oracle, and the B-Pref knobs following their formulas."""

from __future__ import annotations

import numpy as np
import pytest

from themis.feedback.teachers import PRESETS, SyntheticTeacher


def test_oracle_prefers_higher_return_and_ties_are_equal():
    r1 = np.array([[1.0, 2.0], [0.0, 0.0], [5.0, -1.0]])
    r2 = np.array([[0.0, 0.0], [1.0, 0.5], [3.0, 1.0]])
    keep, labels = SyntheticTeacher().label(r1, r2)
    assert keep.all()
    np.testing.assert_array_equal(labels, [0.0, 1.0, 0.5])


def test_mistake_flips_about_eps_of_labels():
    rng = np.random.default_rng(0)
    r1, r2 = rng.normal(size=(20000, 10)), rng.normal(size=(20000, 10))
    _, oracle = SyntheticTeacher().label(r1, r2)
    _, noisy = SyntheticTeacher(eps_mistake=0.1, rng=rng).label(r1, r2)
    assert abs((oracle != noisy).mean() - 0.1) < 0.01


def test_equal_within_margin_and_skip_below_threshold():
    r1 = np.array([[1.0], [1.0], [-3.0]])
    r2 = np.array([[1.05], [3.0], [-2.0]])
    teacher = SyntheticTeacher(eps_equal=0.1, eps_skip=0.5)
    teacher.set_margin(2.0)  # equal below |diff| < 0.2, skip when max return <= 1.0
    keep, labels = teacher.label(r1, r2)
    np.testing.assert_array_equal(keep, [True, True, False])
    np.testing.assert_array_equal(labels, [0.5, 1.0])


def test_myopic_weighting_changes_the_order():
    # segment 1 earns early, segment 2 a little less but late
    r1 = np.array([[10.0, 0.0, 0.0, 0.0]])
    r2 = np.array([[0.0, 0.0, 0.0, 9.0]])
    assert SyntheticTeacher(gamma=1.0).label(r1, r2)[1][0] == 0.0  # 10 > 9
    # gamma^(H-1-t) weights [0.125, 0.25, 0.5, 1]: 1.25 < 9, the late segment wins
    assert SyntheticTeacher(gamma=0.5).label(r1, r2)[1][0] == 1.0
    assert SyntheticTeacher(gamma=0.9).label(r1, r2)[1][0] == 1.0  # 7.29 < 9


def test_bradley_terry_teacher_follows_the_sigmoid():
    rng = np.random.default_rng(3)
    n = 40000
    r1 = np.zeros((n, 1))
    r2 = np.full((n, 1), 0.5)
    _, labels = SyntheticTeacher(beta=2.0, rng=rng).label(r1, r2)
    assert labels.mean() == pytest.approx(1 / (1 + np.exp(-1.0)), abs=0.01)


@pytest.mark.parametrize("kwargs", [{"eps_mistake": 1.5}, {"eps_skip": -0.1}, {"gamma": 0.0},
                                    {"gamma": 1.1}, {"beta": 0.0}, {"beta": -2.0}])
def test_out_of_range_parameters_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SyntheticTeacher(**kwargs)


def test_presets():
    assert set(PRESETS) == {"oracle", "mistake", "noisy", "skip", "myopic", "equal"}
    rng = np.random.default_rng(0)
    for name, preset in PRESETS.items():  # every knob reaches the teacher, and the generator
        teacher = SyntheticTeacher.from_preset(name, rng=rng)
        assert (teacher.beta, teacher.gamma, teacher.eps_mistake, teacher.eps_skip,
                teacher.eps_equal) == (preset.beta, preset.gamma, preset.eps_mistake,
                                       preset.eps_skip, preset.eps_equal), name
        assert teacher.rng is rng
    assert SyntheticTeacher.from_preset("mistake").eps_mistake == 0.1
    # the config-group files hold the same values as PRESETS
    import yaml

    from tests.conftest import ROOT

    for name, preset in PRESETS.items():
        values = yaml.safe_load((ROOT / "config" / "teacher" / f"{name}.yaml").read_text())
        assert {k.removeprefix("teacher_"): v for k, v in values.items()} == \
            {k: getattr(preset, k) for k in ("beta", "gamma", "eps_mistake", "eps_skip",
                                             "eps_equal")}, name
    with pytest.raises(ValueError, match="unknown teacher preset"):
        SyntheticTeacher.from_preset("perfect")


def test_synthetic_channel_answers_posted_queries_at_once():
    from themis.agents.buffers import SegmentPairs
    from themis.feedback import SyntheticChannel
    from themis.feedback.teachers import SyntheticTeacher

    rewards = np.zeros((3, 2, 4), dtype=np.float32)
    rewards[0, 1] = 1.0  # segment 2 better
    rewards[1, 0] = 1.0  # segment 1 better
    pairs = SegmentPairs(np.zeros((3, 2, 4, 2), np.float32), np.zeros((3, 2, 4, 1), np.float32),
                         rewards, np.zeros((3, 2), np.int64))
    channel = SyntheticChannel(SyntheticTeacher(), "oracle")
    assert channel.post(pairs) == 3
    got = channel.gather(pairs.take(np.zeros(0, np.int64)))
    assert got.keep.tolist() == [True, True, True] and got.labels.tolist() == [1.0, 0.0, 0.5]
    assert got.labelers == ["oracle"] * 3 and not got.saved
    empty = channel.gather(pairs.take(np.zeros(0, np.int64)))  # nothing twice
    assert len(empty.pairs) == 0 and len(empty.labels) == 0


def test_teacher_stats_on_a_hand_made_round():
    from themis.feedback.teachers import TeacherStats

    stats = TeacherStats()
    keep = np.array([True, False, True, True, True, False])
    labels = np.array([1.0, 0.5, 0.0, 1.0], np.float32)  # the four kept pairs
    oracle = np.array([1.0, 1.0, 1.0, 0.0], np.float32)  # strict: 0, 2, 3 agree? 0 yes, 2/3 no
    stats.update(keep, labels, oracle)
    assert (stats.total, stats.skipped, stats.equal, stats.agree, stats.compared) == \
        (6, 2, 1, 1, 3)
    assert stats.as_dict() == pytest.approx({"skip_fraction": 2 / 6, "equal_fraction": 1 / 4,
                                             "oracle_agreement": 1 / 3})
    stats.update(np.array([True]), np.array([0.0], np.float32), np.array([0.5], np.float32))
    assert (stats.total, stats.agree, stats.compared) == (7, 1, 3)  # oracle tie: not compared
    assert np.isnan(TeacherStats().as_dict()["oracle_agreement"])


def test_equal_threshold_uses_undiscounted_returns_when_myopic():
    # undiscounted returns 10 and 10.05 differ by less than eps_equal * margin = 0.1: equal,
    # although the discounted ones (gamma 0.5: 5 and 10.05) differ a lot
    r1 = np.array([[10.0, 0.0]])
    r2 = np.array([[0.0, 10.05]])
    teacher = SyntheticTeacher(gamma=0.5, eps_equal=0.1)
    teacher.set_margin(1.0)
    _, labels = teacher.label(r1, r2)
    np.testing.assert_array_equal(labels, [0.5])
    teacher.set_margin(0.1)  # threshold 0.01: strict, decided by the discounted returns
    _, labels = teacher.label(r1, r2)
    np.testing.assert_array_equal(labels, [1.0])


def test_mistakes_never_turn_a_tie_into_a_preference():
    r = np.zeros((50, 4))
    keep, labels = SyntheticTeacher(eps_mistake=1.0, rng=np.random.default_rng(0)).label(r, r)
    assert keep.all() and (labels == 0.5).all()
    r2 = np.ones((50, 4))  # strict pairs: every one flips at eps_mistake = 1
    _, labels = SyntheticTeacher(eps_mistake=1.0, rng=np.random.default_rng(0)).label(r, r2)
    assert (labels == 0.0).all()


@pytest.mark.parametrize("margin", [-300.0, 0.0])
def test_skip_teacher_skips_nothing_while_its_threshold_is_not_positive(margin):
    """B-Pref applies the skip filter only when eps_skip * margin > 0: with negative returns
    (Pendulum, early HalfCheetah) the skip teacher would otherwise drop every pair."""
    rng = np.random.default_rng(0)
    r1, r2 = rng.normal(-5, 1, size=(40, 10)), rng.normal(-5, 1, size=(40, 10))
    teacher = SyntheticTeacher(eps_skip=0.1)
    teacher.set_margin(margin)
    keep, labels = teacher.label(r1, r2)
    assert keep.all() and len(labels) == 40
    teacher.set_margin(300.0)  # positive threshold 30: these segments (returns ~ -50) skipped
    keep, _ = teacher.label(r1, r2)
    assert not keep.any()


def test_bpref_threshold_schedule_squares_eps():
    """B-Pref's train_PEBBLE.py uses eps² * margin after the first round."""
    r1 = np.array([[1.0], [1.0]])
    r2 = np.array([[1.05], [1.4]])
    teacher = SyntheticTeacher(eps_equal=0.5)
    teacher.set_margin(1.0)  # eps * margin = 0.5: both pairs equal
    np.testing.assert_array_equal(teacher.label(r1, r2)[1], [0.5, 0.5])
    teacher.threshold_power = 2  # eps² * margin = 0.25: only the first
    np.testing.assert_array_equal(teacher.label(r1, r2)[1], [0.5, 1.0])


def test_a_run_says_once_when_negative_returns_turn_the_skip_and_equal_thresholds_off(
        compose, tmp_path, capsys):
    from tests.conftest import TINY_PENDULUM
    from themis.builder import make_workspace

    ws = make_workspace(compose([*TINY_PENDULUM, "teacher=skip", "teacher_eps_equal=0.1"]),
                        tmp_path)
    ws.run()  # Pendulum's returns are negative: three rounds with margin < 0
    out = capsys.readouterr().out
    assert out.count("thresholds ε × margin are ≤ 0") == 1
    assert "teacher_eps_skip skips nothing" in out
    assert "teacher_eps_equal makes no pair equal" in out
    ws.learner.teacher.set_margin(5.0)
    ws.learner.warn_thresholds_off()  # positive again: quiet, and warned anew next time
    ws.learner.teacher.set_margin(-5.0)
    ws.learner.warn_thresholds_off()
    assert capsys.readouterr().out.count("thresholds ε × margin are ≤ 0") == 1
