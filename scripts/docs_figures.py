"""Draw the documentation's pictures from the recorded results under ``results/``.

``python scripts/docs_figures.py`` writes three PNGs into ``docs/img/``.
``ppe_walker_walk.png``: the learning curves of ``results/ppe_walker_walk.csv``
(``benchmarks/bench_methods.py --protocol ppe --record ...``; PPE, Zhu et al., NeurIPS 2025,
Table 1: DeepMind Control walker_walk, 100 oracle queries, 500k steps),
each method's mean true return over its seeds with the range of the seeds shaded, beside plain
SAC on the true reward (the ceiling) and the paper's final means. ``main_job.png``: the main job's
curves per seed (``results/main_job.csv``, ``benchmarks/bench_main_job.py``) against its target.
``pong.png``: the Pong runs' curves (``results/drlhp_pong_curves.csv``, ``benchmarks/bench_drlhp.py
pong --record ...``): the true return of the last 10 episodes of each run, and r̂'s held-out
accuracy and correlation in the runs that learn it. It trains nothing.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import argparse
import importlib.util
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = {"pebble": 453, "surf": 661, "rune": 415, "qpa": 796}
"""PPE's Table 1, walker_walk, 100 queries: final return, mean over 5 seeds."""
NAMES = {"pebble": "PEBBLE", "surf": "SURF", "rune": "RUNE", "qpa": "QPA",
         "sac": "SAC on the true reward (ceiling)"}


def curves(frame: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per method: the evaluation steps ``(n,)`` and the returns ``(seeds, n)`` of its runs."""
    out = {}
    for method, rows in frame.groupby("method", sort=False):
        points = [dict(p.split(":") for p in str(c).split()) for c in rows["curve"]]
        steps = sorted({int(s) for p in points for s in p}, key=int)
        returns = np.array([[float(p[str(s)]) for s in steps] for p in points])
        out[str(method)] = (np.array(steps), returns)
    return out


def table_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the README's PPE table: the runs of the table's own command, one per method
    and seed — QPA's with the official reward-training rule (``qpa.iterations=true``), and no
    run made to measure something else beside it (``precision=fp32`` seeds).

    Raises:
        ValueError: a method's seed still has two runs (the figure would count it twice).
    """
    command = table["command"].astype(str)
    old_qpa = (table["method"] == "qpa") & ~command.str.contains("qpa.iterations=true",
                                                                  regex=False)
    fp32 = command.str.contains("precision=fp32", regex=False)
    kept = table[~old_qpa & ~fp32]
    twice = kept[kept.duplicated(["method", "seed"], keep=False)]
    if len(twice):
        pairs = sorted({(str(m), int(s)) for m, s in zip(twice["method"], twice["seed"],
                                                         strict=True)})
        raise ValueError(f"two runs of the same method and seed: {pairs}")
    return kept


def ppe_walker_walk(csv: Path, out: Path) -> None:
    """Draw the curves of ``csv``'s table rows (:func:`table_rows`) into ``out`` (a PNG)."""
    data = curves(table_rows(pd.read_csv(csv)))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for method in ("pebble", "surf", "rune", "qpa", "sac"):
        if method not in data:
            continue
        steps, returns = data[method]
        k = steps / 1000
        if method == "sac":
            ax.plot(k, returns.mean(0), "k--", label=NAMES[method])
            continue
        line, = ax.plot(k, returns.mean(0), label=f"{NAMES[method]} ({len(returns)} seeds)")
        ax.fill_between(k, returns.min(0), returns.max(0), color=line.get_color(), alpha=0.15)
        ax.plot([k[-1]], [PUBLISHED[method]], marker="*", markersize=11, color=line.get_color(),
                linestyle="none")
    ax.plot([], [], "k*", linestyle="none", label="paper's final mean (PPE, Table 1)")
    ax.set_xlabel("environment steps (thousands)")
    ax.set_ylabel("true return (10 episodes)")
    ax.set_title("walker_walk from 100 oracle preferences (Themis, CPU)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def load_bench_main_job():
    """``benchmarks/bench_main_job.py`` as a module (its record readers)."""
    spec = importlib.util.spec_from_file_location("bench_main_job",
                                                  ROOT / "benchmarks" / "bench_main_job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main_job(csv: Path, out: Path) -> None:
    """Draw the main job's true eval return per seed into ``out`` (a PNG): the record of today's
    default path (``bench_main_job.default_record``) and, dashed, the commit run side by side
    with it in the same command."""
    bench = load_bench_main_job()
    record = bench.read_record(csv)
    today = bench.default_record(record, bench.fixture_digest(ROOT))
    if today.empty:
        raise ValueError(f"{csv} holds no record of today's default path")
    beside = record[(record["command"] == today["command"].iloc[0])
                     & (record["commit"] != today["commit"].iloc[0])]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for commit, rows, style in ((today["commit"].iloc[0], today, "-"),
                                *((c, r, "--") for c, r in beside.groupby("commit"))):
        steps, returns = curves(rows.sort_values("seed"))["pebble"]
        for seed, curve in zip(sorted(rows["seed"]), returns, strict=True):
            ax.plot(steps / 1000, curve, style, marker="o", markersize=2.5,
                    color=colours[int(seed) % len(colours)], label=f"{commit} seed {seed}")
    ax.axhline(1500, color="k", linestyle=":", label="target: 1500 within 20 minutes")
    ax.axhline(-300, color="grey", linestyle="-.", label="random policy (about -300)")
    ax.set_xlabel("environment steps (thousands)")
    ax.set_ylabel("true return (5 episodes)")
    ax.set_title("Main job: HalfCheetah-v5, 1000 oracle preferences (dashed: earlier commit)",
                 fontsize=10)
    ax.legend(fontsize=6, loc="upper left", ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


PONG_NAMES = {"ppo_oracle": "PPO, DRLHP recipe, oracle", "a2c_oracle": "A2C, DRLHP recipe, oracle",
              "ppo_true": "PPO, true reward", "a2c_true": "A2C, true reward"}
"""The Pong runs' variants (``benchmarks/bench_drlhp.py``'s ``PONG_LABELS``)."""


def pong(csv: Path, out: Path, first: Path | None = None) -> None:
    """The Pong curves: per variant and seed, the mean true return of the last 10 episodes
    against agent steps; beside it, r̂'s held-out accuracy and Pearson correlation (mean of the
    last 5 rounds) of the runs that learn their reward. ``first``: the record of earlier runs
    that ended unfinished (``results/drlhp_pong_curves_first_run.csv``), drawn thin and grey."""
    table = pd.read_csv(csv)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    if first is not None and first.is_file():
        for (variant, _), rows in pd.read_csv(first).groupby(["variant", "seed"]):
            name = PONG_NAMES.get(str(variant), str(variant))
            left.plot(rows["step"] / 1e6, rows["return_last10"],
                      "--" if str(variant).endswith("_true") else "-", color="grey",
                      linewidth=0.8, alpha=0.6,
                      label=f"{name}: first run, to {rows['step'].max() / 1e6:.1f}M")
    for (variant, seed), rows in table.groupby(["variant", "seed"]):
        label = PONG_NAMES.get(str(variant), str(variant))
        label += f", seed {seed}" if table["seed"].nunique() > 1 else ""
        dashed = "--" if str(variant).endswith("_true") else "-"
        line, = left.plot(rows["step"] / 1e6, rows["return_last10"], dashed, marker="o",
                          markersize=3, label=label)
        if "heldout_pearson" in rows and rows["heldout_pearson"].notna().any():
            right.plot(rows["step"] / 1e6, rows["heldout_pearson"], marker="o", markersize=3,
                       color=line.get_color(), label=f"{label}: Pearson r̂ / true return")
            right.plot(rows["step"] / 1e6, rows["heldout_accuracy"], ":", marker="s",
                       markersize=3, color=line.get_color(),
                       label=f"{label}: accuracy on new labels")
    left.axhline(0, color="grey", linewidth=0.8)
    left.set(xlabel="agent steps (millions)", ylabel="true return, last 10 episodes",
             title="PongNoFrameskip-v4", ylim=(-21.5, 21.5))
    left.legend(fontsize=7, loc="upper left")
    right.set(xlabel="agent steps (millions)", ylabel="held out, mean of 5 rounds",
              title="the learned reward", ylim=(0, 1.05))
    right.legend(fontsize=7, loc="lower right")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    ppe_walker_walk(ROOT / "results" / "ppe_walker_walk.csv", args.out / "ppe_walker_walk.png")
    main_job(ROOT / "results" / "main_job.csv", args.out / "main_job.png")
    pong(ROOT / "results" / "drlhp_pong_curves.csv", args.out / "pong.png",
         ROOT / "results" / "drlhp_pong_curves_first_run.csv")
    print(f"wrote {args.out / 'ppe_walker_walk.png'}, {args.out / 'main_job.png'} and "
          f"{args.out / 'pong.png'}")


if __name__ == "__main__":
    main()
