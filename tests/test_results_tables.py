"""``scripts/results_tables.py``: the front pages' numbers are what the records in ``results/``
give, and the generator computes them right (issue 84 item 2)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tests.conftest import ROOT, load_file

tables = load_file("scripts/results_tables.py")

PROVENANCE = {"date": "2026-12-07T10:00:00Z", "commit": "abc1234", "machine": "a CPU, 2 cores",
              "command": "python benchmarks/bench_ceiling.py --record", "wall_s": 600.0}


def ceiling_csv(folder, themis=(10.0, 20.0, 60.0), sb3=(5.0, 7.0, 9.0)) -> None:
    rows = [{"kind": kind, "env": "HalfCheetah-v5", "steps": 100_000, "seed": seed,
             "final": final, "curve": f"50000:1 100000:{final}", "library": "-", **PROVENANCE}
            for kind, finals in (("themis", themis), ("sb3_cpu", sb3))
            for seed, final in enumerate(finals)]
    pd.DataFrame(rows).to_csv(folder / "ceiling.csv", index=False)


def test_the_front_pages_equal_what_the_records_give(capsys):
    assert tables.main(["--check"]) == 0, capsys.readouterr().err
    readme = (ROOT / "README.md").read_text()
    for name in ("main_job", "ppe_walker_walk_summary", "drlhp_dot"):
        assert f"<!-- results: {name} -->" in readme  # the recorded rows are generated


def test_mean_and_standard_error_over_seeds_are_computed_right(tmp_path):
    ceiling_csv(tmp_path)
    # themis 10, 20, 60: mean 30, sample std √700 = 26.46, SE 26.46 / √3 = 15.28;
    # SB3 5, 7, 9: mean 7, std 2, SE 2 / √3 = 1.15
    assert tables.standard_error([10.0, 20.0, 60.0]) == pytest.approx(math.sqrt(700 / 3))
    assert math.isnan(tables.standard_error([4.0]))
    cell = tables.BLOCKS["ceiling"](tmp_path)
    assert cell == "Themis 30 ± 15 against SB3 7 ± 1 at 100k steps (seeds 0–2, mean ± SE)"
    page = tables.BLOCKS["ceiling_table"](tmp_path)
    assert "| Themis plain SAC | 0–2 | 30 ± 15 | 10 min |" in page
    assert "abc1234" in page and "a CPU, 2 cores" in page and "2026-12-07" in page


def test_a_changed_number_is_caught_and_rewritten(tmp_path):
    ceiling_csv(tmp_path)
    text = "| x | <!-- results: ceiling -->old text<!-- /results --> |\n"
    new, changed, pending = tables.render(text, tmp_path, "page.md")
    assert changed == ["page.md: ceiling"] and not pending
    assert tables.render(new, tmp_path, "page.md")[1] == []  # written: nothing differs
    ceiling_csv(tmp_path, themis=(10.0, 20.0, 63.0))  # one run recorded again, another final
    again, changed, _ = tables.render(new, tmp_path, "page.md")
    assert changed == ["page.md: ceiling"] and "Themis 31 ± 16" in again


def test_a_seed_recorded_twice_is_refused(tmp_path):
    ceiling_csv(tmp_path, themis=(10.0, 20.0, 60.0))
    table = pd.read_csv(tmp_path / "ceiling.csv")
    pd.concat([table, table.iloc[[0]]]).to_csv(tmp_path / "ceiling.csv", index=False)
    with pytest.raises(ValueError, match=r"recorded twice: \[\('themis', 'HalfCheetah-v5', "
                                         r"'100000', '0'\)\]"):
        tables.render("<!-- results: ceiling -->x<!-- /results -->", tmp_path)


def test_a_block_without_a_record_must_say_so(tmp_path):
    honest = "<!-- results: crowd -->97 % (not yet re-recorded)<!-- /results -->"
    assert tables.render(honest, tmp_path, "p.md") == (honest, [], ["p.md: crowd"])
    with pytest.raises(ValueError, match="does not say 'not yet re-recorded'"):
        tables.render("<!-- results: crowd -->97 %<!-- /results -->", tmp_path, "p.md")
    with pytest.raises(ValueError, match="unknown results block 'nope'"):
        tables.render("<!-- results: nope --><!-- /results -->", tmp_path, "p.md")


def test_speed_ratios_span_every_recorded_session(tmp_path):
    rows = []
    for session, (sb3, sac, pebble) in {"2026-12-07T10:00:00Z": (100.0, 200.0, 150.0),
                                        "2026-12-08T10:00:00Z": (100.0, 144.0, 110.0)}.items():
        for repeat in range(3):
            for kind, threads, rate in (("sb3", "2", sb3), ("sac", "auto", sac + repeat),
                                        ("pebble", "auto", pebble)):
                rows.append({"session": session, "kind": kind, "threads": threads,
                             "precision": "auto", "device": "cpu", "repeat": repeat,
                             "steps_per_s": rate, **PROVENANCE})
    pd.DataFrame(rows).to_csv(tmp_path / "throughput.csv", index=False)
    # medians over the rotations: SAC 201 and 145, so 2.01× and 1.45× SB3's 100
    assert tables.BLOCKS["throughput"](tmp_path) == (
        "SAC 1.45–2.01×, the whole PEBBLE loop 1.10–1.50× (2 sessions on 1 machine)")


def test_the_wrapper_cell_sets_the_wrapped_sac_beside_its_ceiling_on_the_same_seeds(tmp_path):
    rows = [{"job": job, "seed": seed, "steps": 100_000, "queries": q, "final": final,
             **PROVENANCE}
            for job, q, finals in (("sac", 500, (700.0, 900.0, 1100.0, 5000.0)),
                                   ("sac-true", 0, (1000.0, 1200.0, 1400.0)))
            for seed, final in enumerate(finals)]
    pd.DataFrame(rows).to_csv(tmp_path / "wrapper.csv", index=False)
    assert tables.BLOCKS["wrapper"](tmp_path) == (  # seed 3 has no ceiling: left out
        "SB3 SAC through the wrapper 900 ± 115 against 1200 ± 115 on the true reward "
        "(75 % of its ceiling; seeds 0–2, mean ± SE)")


def test_stouffer_combines_the_one_sided_welch_tests():
    # docs/results/ppe-walker-walk.md, 2026-12-04, by hand: (−1.29 − 2.20 − 0.88 − 0.93)/√4
    z, p = tables.stouffer([(-1, 0.196), (-1, 0.028), (-1, 0.378), (-1, 0.351),
                            (-1, float("nan"))])
    assert z == pytest.approx(-2.65, abs=0.01) and p == pytest.approx(0.004, abs=0.001)
    assert tables.stouffer([(1, 0.2)])[0] == pytest.approx(1.28, abs=0.01)  # above: positive


def test_the_wrapper_cost_cell_gives_the_range_of_the_measurements(tmp_path):
    rows = [{"env": "HalfCheetah-v5", "wrapper_us": us, "sac_bare_steps_per_s": 100.0,
             "sac_wrapped_steps_per_s": rate, **PROVENANCE, "date": date}
            for us, rate, date in ((59.0, 95.0, "2026-12-07T10:00:00Z"),
                                   (130.4, 86.0, "2026-12-08T10:00:00Z"))]
    pd.DataFrame(rows).to_csv(tmp_path / "wrapper_cost.csv", index=False)
    assert tables.BLOCKS["wrapper_cost"](tmp_path) == (
        "59–130 µs a step, SB3 SAC at 0.86–0.95× its steps/s on the bare env (2 measurements)")


def test_the_crowd_cell_reads_the_rows_simulate_crowd_records(tmp_path):
    crowd = load_file("scripts/simulate_crowd.py")
    args = crowd.main.__globals__["argparse"].Namespace(
        careful=6, random=2, adversaries=1, careful_mistakes=0.1, labels_per_query=3,
        gold_fraction=0.1, min_gold_answers=5, extra=[])
    printed = {  # simulate_crowd's report rows of 2026-11-24 (docs/results/people.md)
        "none": ("labeler7 (random), labeler9 (adversary)", "labeler7: 18, labeler9: 5", 540,
                 0.683),
        "filter": ("labeler7 (random), labeler9 (adversary)", "labeler7: 5, labeler9: 6", 415,
                   0.834),
        "model": ("labeler9 (adversary)", "labeler9: 5", 180, 0.972)}
    rows = [crowd.record_row(tmp_path, {"mode": mode, "flagged": flagged,
                                        "gold answers when flagged": gold,
                                        "training labels": labels,
                                        "agreement with true returns": agreement,
                                        "held-out accuracy": 0.8, "final true return": -120.0},
                             args, 500.0, "python scripts/simulate_crowd.py --record")
            for mode, (flagged, gold, labels, agreement) in printed.items()]
    pd.DataFrame(rows).to_csv(tmp_path / "crowd.csv", index=False)
    assert tables.BLOCKS["crowd"](tmp_path) == (
        "adversary flagged after 5–6 gold answers; Dawid–Skene labels agree 97 % with the true "
        "returns (1 run)")
    table = tables.BLOCKS["crowd_table"](tmp_path)
    assert "| `filter` | 0 | labeler7 (random), labeler9 (adversary) | labeler7: 5, labeler9: 6 " \
           "| 415 | 0.834 | 0.800 | -120 |" in table


def test_the_pong_blocks_read_the_records_bench_drlhp_writes(tmp_path):
    """The result (pending until a run finished), each run's curve so far with the first runs
    that ended, and the pieces' cost per measurement."""
    text = "<!-- results: drlhp_pong_table -->\nNot yet re-recorded.\n<!-- /results -->\n"
    assert tables.render(text, tmp_path, "drlhp.md")[2] == ["drlhp.md: drlhp_pong_table"]
    pd.DataFrame([{"variant": "ppo_oracle", "seed": 0, "steps": 2_000_000, "step": 2_000_128,
                   "final_score": 3.25, "last_eval": 5.0, "heldout_accuracy": 0.8,
                   "heldout_pearson": 0.71, "wall_s": float("nan"), "agent_cpu_s": 1.0,
                   "learner_cpu_s": 7200.0, "run_wall_s": 9 * 3600.0, "run_cpu_s": 8 * 3600.0,
                   **PROVENANCE}]).to_csv(tmp_path / "drlhp_pong.csv", index=False)
    page = tables.BLOCKS["drlhp_pong_table"](tmp_path)
    assert "| PPO, DRLHP's recipe, oracle teacher | 0 | 2.0M | 3.2 | 5.0 | 0.80 | 0.71 | 9.0 " \
           "| 8.0 | 2.0 |" in page
    assert tables.BLOCKS["drlhp_pong"](tmp_path).startswith("3.2 (mean of the last 10 episodes")
    curve = {"variant": "ppo_oracle", "seed": 0, "entropy": 1.5, "heldout_accuracy": 0.9,
             "heldout_pearson": 0.6, **PROVENANCE}
    pd.DataFrame([{**curve, "step": 100_000, "return_last10": -20.0},
                  {**curve, "step": 200_000, "return_last10": -12.0},
                  {**curve, "step": 300_000, "return_last10": -15.0}]).to_csv(
        tmp_path / "drlhp_pong_curves.csv", index=False)
    pd.DataFrame([{**curve, "step": 100_000, "return_last10": -19.0}]).to_csv(
        tmp_path / "drlhp_pong_curves_first_run.csv", index=False)
    page = tables.BLOCKS["drlhp_pong_curves"](tmp_path)
    assert "| PPO, DRLHP's recipe, oracle teacher | 0 | 0.3M | -15.0 | -12.0 | 1.500 | 0.90 " \
           "| 0.60 |" in page  # the last row, and the best so far
    assert "| PPO, DRLHP's recipe, oracle teacher (first run, ended) | 0 | 0.1M | -19.0 |" in page
    cost = [{"piece": "reward training", "threads": t, "s_per_10k_steps": s, **PROVENANCE}
            for t, s in ((1, 100.04), (2, 60.0))]
    cost.append({"piece": "ppo agent", "threads": 1, "s_per_10k_steps": 40.0,
                 **PROVENANCE, "commit": "def5678"})
    pd.DataFrame(cost).to_csv(tmp_path / "drlhp_pong_cost.csv", index=False)
    page = tables.BLOCKS["drlhp_pong_cost"](tmp_path)
    assert "| reward training | 100.0 (60.0) | - |" in page  # one column per measurement
    assert "| ppo agent | - | 40.0 |" in page
