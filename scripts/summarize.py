#!/usr/bin/env python
"""Summarise a Hydra sweep: final true return per setting, as a table and learning curves.

    python scripts/summarize.py multirun/2026-11-22/16-30-00
    python scripts/summarize.py SWEEP_DIR --out results/ --reps 5000

Every run dir below SWEEP_DIR that holds ``eval.csv`` and ``.hydra/overrides.yaml`` is one run;
its *setting* is its command-line overrides minus ``seed``. For each setting the table gives the
number of runs (and how many are unfinished: their last evaluation comes before
``num_train_steps``), mean and std of the final eval return, and the interquartile mean (IQM) with a
95 % bootstrap confidence interval (Agarwal et al. 2021; SciPy's bootstrap); for envs that log a
``success_rate`` (Meta-World), the final success rate's IQM and CI too. Written
to ``--out`` (default SWEEP_DIR): ``summary.md``, ``summary.csv``, ``learning_curves.png`` (all
settings, mean ± std over seeds) and ``curves/<setting>.png`` (one plot per setting, every seed).
A hyper-parameter search (``hydra/sweeper=optuna``) leaves ``optuna_best.yaml`` in its sweep dir:
the best trial's setting is then marked in the table (``optuna_best``) and named below it.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import argparse
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import yaml
from scipy import stats

IGNORED_KEYS = {"seed"}


def find_runs(sweep_dir: Path) -> pd.DataFrame:
    """One row per run: its setting label, seed, run dir and the eval curve.

    A run's setting is made of the overrides that differ between runs of the sweep (``seed``
    excluded), so overrides shared by every job (``num_train_steps=...``) do not clutter labels.

    Raises:
        FileNotFoundError: no run with a non-empty ``eval.csv`` below ``sweep_dir``.
    """
    found = []
    for eval_csv in sorted(sweep_dir.rglob("eval.csv")):
        run_dir = eval_csv.parent
        overrides_file = run_dir / ".hydra" / "overrides.yaml"
        overrides = plain_yaml(overrides_file) if overrides_file.exists() else []
        if not isinstance(overrides, list | type(None)):
            raise ValueError(f"{overrides_file} is not a list of overrides")
        pairs = dict(str(o).split("=", 1) for o in overrides or [] if "=" in str(o))
        curve = pd.read_csv(eval_csv)
        if not curve.empty:
            found.append((run_dir, pairs, curve))
    if not found:
        raise FileNotFoundError(f"no run with an eval.csv below {sweep_dir}")
    keys = sorted({k for _, pairs, _ in found for k in pairs} - IGNORED_KEYS)
    varying = [k for k in keys if len({pairs.get(k) for _, pairs, _ in found}) > 1]
    rows = []
    for run_dir, pairs, curve in found:
        setting = ",".join(f"{k}={pairs[k]}" for k in varying if k in pairs)
        rows.append({"setting": setting or "(defaults)", "seed": pairs.get("seed", "0"),
                     "run_dir": str(run_dir),
                     "final_return": float(curve["episode_reward"].iloc[-1]),
                     "final_step": int(curve["step"].iloc[-1]),
                     "total_feedback": int(curve["total_feedback"].iloc[-1]),
                     "final_success": float(curve["success_rate"].iloc[-1])
                     if "success_rate" in curve else float("nan"),
                     "finished": int(curve["step"].iloc[-1]) >= target_steps(run_dir, pairs),
                     "curve": curve})
    return pd.DataFrame(rows)


def plain_yaml(path: Path) -> Any:
    """A run's YAML file as plain values (``yaml.safe_load``: a tag such as ``!!python/...``
    is refused, nothing is constructed; a special file, one over 1 MB or one with YAML aliases,
    which nested can expand to billions of nodes, is not read: as
    ``themis.core.safe_loading.check_yaml_file``, without importing PyTorch).

    Raises:
        ValueError: one line naming the file (a tag, aliases, broken YAML, not text).
    """
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:
            raise ValueError(f"{path} is not a regular file of at most 1 MB")
        text = path.read_text()
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text)):
            raise ValueError(f"{path} uses YAML aliases, which a config Themis wrote never does")
        return yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is not plain YAML ({first})") from None


def target_steps(run_dir: Path, overrides: dict[str, str]) -> int:
    """The ``num_train_steps`` a run was started with (its ``config.yaml``, else its
    overrides); 0 when neither says (the run then counts as finished)."""
    config = run_dir / "config.yaml"
    value = overrides.get("num_train_steps")
    if config.is_file():
        saved = plain_yaml(config) or {}
        value = saved.get("num_train_steps", value) if isinstance(saved, dict) else value
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def iqm_with_ci(scores: np.ndarray, reps: int, seed: int = 0) -> tuple[float, float, float]:
    """IQM of ``scores (n_runs,)`` and its 95 % percentile-bootstrap CI over runs.

    IQM = mean of the middle 50 % of the runs (25 % trimmed mean), the aggregate Agarwal et al.
    2021 ("Deep RL at the edge of the statistical precipice") recommend; with one task their
    stratified bootstrap is the plain bootstrap over runs computed here with SciPy. One run: the
    interval is the point.
    """
    point = float(stats.trim_mean(scores, 0.25))
    if len(scores) < 2 or np.all(scores == scores[0]):
        return point, point, point
    res = stats.bootstrap((scores,), lambda x, axis: stats.trim_mean(x, 0.25, axis=axis),
                          n_resamples=reps, confidence_level=0.95, method="percentile",
                          rng=np.random.default_rng(seed))
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


class PublishedComparison(NamedTuple):
    """Our seeds beside a published mean (:func:`compare_with_published`)."""

    mean: float
    se: float
    """Standard error of our mean: sample std (ddof 1) / √n; NaN for one seed."""
    n: int
    published_mean: float
    published_se: float
    published_n: int
    gap_se: float
    """(mean − published_mean) / √(se² + published_se²): the gap in standard errors of the
    difference (Welch's t statistic)."""
    p: float
    """Two-sided p of Welch's t-test (unequal variances); NaN for one seed."""
    inside: bool | None
    """``p >= alpha``: Welch's test does not reject equal means, so seed-to-seed variation
    can explain the gap; ``None`` where there is no p (one seed)."""


def compare_with_published(values: np.ndarray | list[float], published_mean: float,
                           published_std: float, published_n: int, published_ddof: int = 0,
                           alpha: float = 0.05) -> PublishedComparison:
    """Our per-seed values against a published mean ± std over ``published_n`` seeds.

    Both sides become mean ± standard error and go into Welch's t-test
    (``scipy.stats.ttest_ind_from_stats(..., equal_var=False)``, which takes sample standard
    deviations, ddof 1). A published population std σ (``published_ddof=0``: Σ(x − x̄)² / n,
    NumPy's default, what PPE's tables report) is first made the sample std
    s = σ · √(n / (n − 1)), so its standard error is s / √n = σ / √(n − 1) (σ / 2 over 5
    seeds); with ``published_ddof=1`` the std is s already and its SE is s / √n.

    Args:
        values: our final values, one per seed ``(n,)``.
        published_mean, published_std: the paper's mean ± std.
        published_n: the paper's seeds.
        published_ddof: 0 if the paper's std is the population std, 1 if the sample std.
        alpha: the test's level: ``inside`` is ``p >= alpha``.

    Returns:
        The comparison (:class:`PublishedComparison`).

    Raises:
        ValueError: no values, or fewer than 2 published seeds.
    """
    ours = np.asarray(values, dtype=float)
    if not len(ours) or published_n < 2:
        raise ValueError("compare_with_published needs values and at least 2 published seeds")
    # s² = Σ(x − x̄)² / (n − 1) = σ² · (n − ddof) / (n − 1)
    sample_std = published_std * np.sqrt((published_n - published_ddof) / (published_n - 1))
    published_se = float(sample_std / np.sqrt(published_n))
    if len(ours) < 2:
        return PublishedComparison(float(ours.mean()), float("nan"), 1, published_mean,
                                   published_se, published_n, float("nan"), float("nan"),
                                   None)
    std = float(ours.std(ddof=1))
    test = stats.ttest_ind_from_stats(ours.mean(), std, len(ours), published_mean,
                                      sample_std, published_n, equal_var=False)
    p = float(test.pvalue)
    return PublishedComparison(float(ours.mean()), float(std / np.sqrt(len(ours))), len(ours),
                               published_mean, published_se, published_n,
                               float(test.statistic), p, p >= alpha)


def summarize(runs: pd.DataFrame, reps: int) -> pd.DataFrame:
    """The results table: one row per setting."""
    table = []
    for setting, group in runs.groupby("setting", sort=True):
        scores = group["final_return"].to_numpy()
        iqm, lo, hi = iqm_with_ci(scores, reps)
        table.append({"setting": setting, "runs": len(scores),
                      "unfinished": int((~group["finished"].astype(bool)).sum()), "final_step":
                      int(group["final_step"].max()), "mean": scores.mean(),
                      "std": scores.std(ddof=1) if len(scores) > 1 else 0.0,
                      "iqm": iqm, "iqm_ci_low": lo, "iqm_ci_high": hi,
                      "total_feedback": int(group["total_feedback"].mean())})
        success = group["final_success"].to_numpy()
        if np.isfinite(success).any():  # Meta-World: final success rate, same estimator
            s_iqm, s_lo, s_hi = iqm_with_ci(success[np.isfinite(success)], reps)
            table[-1].update(success_iqm=s_iqm, success_ci_low=s_lo, success_ci_high=s_hi)
    return pd.DataFrame(table)


def plot_curves(runs: pd.DataFrame, out_png: Path) -> None:
    """Mean ± std eval return over seeds against steps, one line per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for setting, group in runs.groupby("setting", sort=True):
        curves = pd.concat([c.set_index("step")["episode_reward"] for c in group["curve"]], axis=1)
        mean, std = curves.mean(axis=1), curves.std(axis=1).fillna(0.0)
        ax.plot(mean.index, mean.values, label=f"{setting} (n={len(group)})")
        ax.fill_between(mean.index, mean - std, mean + std, alpha=0.15)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("true eval return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def plot_setting_curves(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One PNG per setting in ``out_dir``: every seed's eval curve and their mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for setting, group in runs.groupby("setting", sort=True):
        fig, ax = plt.subplots(figsize=(6, 4))
        for seed, curve in zip(group["seed"], group["curve"], strict=True):
            ax.plot(curve["step"], curve["episode_reward"], alpha=0.4, label=f"seed {seed}")
        curves = pd.concat([c.set_index("step")["episode_reward"] for c in group["curve"]], axis=1)
        ax.plot(curves.index, curves.mean(axis=1), color="black", linewidth=2, label="mean")
        ax.set_title(setting, fontsize=9)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("true eval return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / (re.sub(r"[^A-Za-z0-9_.=,-]+", "_", setting) + ".png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def optuna_best(sweep_dir: Path, runs: pd.DataFrame) -> dict | None:
    """The best trial of an Optuna search in ``sweep_dir`` (``optuna_best.yaml``, written by
    ``hydra/sweeper=optuna``) with its setting in ``runs``, or None (no search, no such run).
    The file is plain YAML, read without executing anything."""
    path = sweep_dir / "optuna_best.yaml"
    if not path.is_file():
        return None
    try:
        best = plain_yaml(path)
        trial_dir = (sweep_dir / str(int(best["trial"]))).resolve()
    except (yaml.YAMLError, KeyError, TypeError, ValueError):
        return None
    match = runs[[Path(d).resolve() == trial_dir for d in runs["run_dir"]]]
    if match.empty:
        return None
    return {"trial": int(best["trial"]), "value": best.get("value"),
            "setting": match["setting"].iloc[0], "finished": best.get("finished")}


def to_markdown(table: pd.DataFrame, best: dict | None = None) -> str:
    """The table as GitHub Markdown (no extra dependency); ``best``: the Optuna search's best
    trial (:func:`optuna_best`), marked with ★."""
    success = "success_iqm" in table
    header = ["setting", "runs", "final step", "mean", "std", "IQM [95% CI]", "feedback"] + \
        (["success rate IQM [95% CI]"] if success else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in table.itertuples():
        runs = f"{r.runs} ({r.unfinished} unfinished)" if r.unfinished else str(r.runs)
        star = " ★" if best is not None and r.setting == best["setting"] else ""
        line = (f"| {r.setting}{star} | {runs} | {r.final_step} | {r.mean:.1f} | {r.std:.1f} | "
                f"{r.iqm:.1f} [{r.iqm_ci_low:.1f}, {r.iqm_ci_high:.1f}] | {r.total_feedback} |")
        if success:
            line += (f" {r.success_iqm:.2f} [{r.success_ci_low:.2f}, {r.success_ci_high:.2f}] |"
                     if np.isfinite(r.success_iqm) else " - |")
        lines.append(line)
    if table["unfinished"].any():
        lines += ["", "Unfinished runs (still running or stopped) count with their last "
                  "evaluation, before `num_train_steps`."]
    if best is not None:
        lines += ["", f"★ Optuna's best trial: #{best['trial']} ({best['setting']}), final true "
                  f"return {float(best['value']):.1f} (of {best['finished']} finished trials; "
                  "study in optuna.db)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: sweep)")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap replications")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"summarize: {args.sweep_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        runs = find_runs(args.sweep_dir)
    except (FileNotFoundError, ValueError) as e:
        print(f"summarize: {e}", file=sys.stderr)
        return 2
    out = args.out or args.sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    table = summarize(runs, args.reps)
    best = optuna_best(args.sweep_dir, runs)
    if best is not None:
        table["optuna_best"] = table["setting"] == best["setting"]
    table.to_csv(out / "summary.csv", index=False)
    markdown = to_markdown(table, best)
    (out / "summary.md").write_text(markdown)
    plot_curves(runs, out / "learning_curves.png")
    plot_setting_curves(runs, out / "curves")
    print(markdown)
    print(f"written: {out / 'summary.md'}, {out / 'summary.csv'}, {out / 'learning_curves.png'}, "
          f"{out / 'curves'}/<setting>.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
