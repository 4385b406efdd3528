"""Rewrite every results table of the front pages from the records in ``results/``, draw the
figures, and regenerate ``docs/index.md``: one command from the files to the pages.

    python scripts/results_tables.py                 # rewrite the blocks, draw, docs/index.md
    python scripts/results_tables.py --no-figures    # the text only
    python scripts/results_tables.py --check         # exit 1 naming each block that differs

A generated block sits between two HTML comments, on lines of its own (a table) or inside a
line (a README cell; GitHub and MkDocs show neither comment)::

    <!-- results: ceiling -->
    | ... the table this script writes from results/ceiling.csv ... |
    <!-- /results -->

``NAME`` (lowercase letters, digits, underscores) picks the generator (:data:`BLOCKS`) and so
the CSV; the same name may appear on several pages (the README's cell and the results index
say the same). A block whose CSV does not
exist yet is left as it stands and reported as pending; its text must then say "not yet
re-recorded" (the check fails otherwise), so a number typed by hand is never presented as a
record's. Every number in a block comes from its CSV: mean ± standard error over seeds (sample
std, ddof 1, / √n), the number of seeds, and each table's recorded dates, commits, machines and
commands.

The tables are text and checked to the character; the figures (``scripts/docs_figures.py``)
are drawn but not checked (PNG bytes differ between matplotlib versions). Written by the records'
own commands: see ``benchmarks/records.py`` and each benchmark's ``--record``.
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import argparse
import functools
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- results: (?P<name>[a-z0-9_]+) -->(?P<body>.*?)<!-- /results -->", re.S)
PAGES = ("README.md", "docs/results/*.md", "docs/benchmarks/*.md")
"""The pages whose blocks are generated (``docs/index.md`` is the README's copy)."""
PENDING = "not yet re-recorded"
"""What a block without a record must say."""


class NoRecord(Exception):
    """The block's CSV does not exist (yet): the block is pending."""


@functools.cache
def load(relative: str) -> Any:
    """A script or benchmark of the repository as a module (they are files, not a package),
    run once per process however many blocks use it."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(results: Path, name: str) -> pd.DataFrame:
    """``results/NAME`` as a table.

    Raises:
        NoRecord: the file does not exist or holds no row.
    """
    path = results / name
    if not path.is_file():
        raise NoRecord(name)
    table = pd.read_csv(path, dtype={"commit": str, "command": str, "curve": str})
    if table.empty:
        raise NoRecord(name)
    return table


# ---- statistics ----------------------------------------------------------------------------

def standard_error(values: np.ndarray | pd.Series) -> float:
    """Standard error of the mean over seeds: sample std (ddof 1) / √n; NaN for one seed."""
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")


def mean_se(values: np.ndarray | pd.Series, digits: int = 0, unit: str = "") -> str:
    """``mean ± SE unit`` (:func:`standard_error`); ``value unit (1 seed)`` for one seed."""
    values = np.asarray(values, dtype=float)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}{unit} (1 seed)"
    return f"{values.mean():.{digits}f} ± {standard_error(values):.{digits}f}{unit}"


def once(table: pd.DataFrame, key: list[str], what: str) -> pd.DataFrame:
    """``table`` unchanged when each ``key`` occurs once.

    Raises:
        ValueError: a ``key`` recorded twice (a mean over it would count a seed twice), named.
    """
    twice = table[table.duplicated(key, keep=False)]
    if len(twice):
        pairs = sorted({tuple(str(v) for v in row) for row in twice[key].to_numpy()})
        raise ValueError(f"{what}: {', '.join(key)} recorded twice: {pairs}")
    return table


def seed_list(seeds: pd.Series | list[int]) -> str:
    """``0–4`` for consecutive seeds, ``0, 2, 5`` otherwise."""
    values = sorted(int(s) for s in seeds)
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}–{values[-1]}"
    return ", ".join(map(str, values))


def stouffer(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Combined one-sided evidence that the means lie below the published ones: each method's
    two-sided Welch p and its gap's sign become a one-sided z (Φ⁻¹ of p/2 for a gap below,
    of 1 − p/2 above), summed over the k methods and divided by √k (Stouffer's method; Whitlock
    2005, J. Evol. Biol. 18:1368). Returns (Z, one-sided p = Φ(Z)).

    Args:
        pairs: (gap, two-sided p) per method; NaN p's (one seed) are left out.
    """
    z = [stats.norm.ppf(p / 2 if gap < 0 else 1 - p / 2) for gap, p in pairs if np.isfinite(p)]
    combined = float(np.sum(z) / np.sqrt(len(z)))
    return combined, float(stats.norm.cdf(combined))


def provenance(table: pd.DataFrame, csv: str) -> str:
    """The line under a generated table: the file, and the recorded dates, commits, machines
    and commands of its rows."""
    date = "date" if "date" in table else "recorded"
    days = sorted({str(d)[:10] for d in table[date].dropna()}) if date in table else []
    parts = [f"recorded {days[0]}" + (f" to {days[-1]}" if len(days) > 1 else "")] if days \
        else []
    if "commit" in table:
        commits = sorted({str(c) for c in table["commit"].dropna()})
        parts.append(f"commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}")
    if "machine" in table:
        parts.append(" / ".join(sorted({str(m) for m in table["machine"].dropna()})))
    commands = sorted({str(c) for c in table["command"].dropna()}) if "command" in table else []
    if 0 < len(commands) <= 2:
        parts.append(" and ".join(f"`{c}`" for c in commands))
    elif commands:
        parts.append(f"{len(commands)} commands (each row's in the file)")
    return f"From `results/{csv}`: " + "; ".join(parts) + "."


# ---- the blocks ------------------------------------------------------------------------------

def main_job_today(results: Path) -> tuple[pd.DataFrame, pd.DataFrame, Any]:
    """The main job's record: today's default-path rows, the other commit run beside them, and
    ``bench_main_job``."""
    bench = load("benchmarks/bench_main_job.py")
    path = results / "main_job.csv"
    if not path.is_file():
        raise NoRecord("main_job.csv")
    record = bench.read_record(path)
    today = once(bench.default_record(record, bench.fixture_digest(ROOT)), ["seed"],
                 "main_job.csv")
    if today.empty:
        raise NoRecord("main_job.csv: no row of today's default path")
    beside = record[(record["command"] == today["command"].iloc[0])
                    & (record["commit"] != today["commit"].iloc[0])]
    return today, beside, bench


def main_job(results: Path) -> str:
    """The README's main-job cell: today's IQM [95 % CI] over its seeds, mean ± SE, the minutes
    a run, and the commit run beside it with Welch's p."""
    today, beside, bench = main_job_today(results)
    iqm_with_ci = bench.load_summarize().iqm_with_ci
    finals = today.sort_values("seed")["final"].to_numpy(float)
    iqm, lo, hi = iqm_with_ci(finals, 2000)
    text = (f"final true return IQM {iqm:.0f} [95 % CI {lo:.0f}, {hi:.0f}] over seeds "
            f"{seed_list(today['seed'])} (mean {mean_se(finals)} SE), "
            f"{today['wall_clock_s'].mean() / 60:.0f} minutes a run "
            f"({today['machine'].iloc[0]}; commit {today['commit'].iloc[0]})")
    for commit, rows in beside.groupby("commit"):
        other = once(rows, ["seed"], "main_job.csv")["final"].to_numpy(float)
        b_iqm, b_lo, b_hi = iqm_with_ci(other, 2000)
        p = stats.ttest_ind(finals, other, equal_var=False).pvalue
        text += (f"; commit {commit} run beside it: IQM {b_iqm:.0f} [{b_lo:.0f}, {b_hi:.0f}], "
                 f"Welch p {p:.2f}")
    return text


def main_job_table(results: Path) -> str:
    """The main-job page's table: ``bench_main_job.record_table`` of the whole record."""
    bench = load("benchmarks/bench_main_job.py")
    if not (results / "main_job.csv").is_file():
        raise NoRecord("main_job.csv")
    return "\n".join(bench.record_table(bench.read_record(results / "main_job.csv"), 2000))


def ppe_rows(results: Path, protocol: str) -> tuple[pd.DataFrame, dict, Any, Any]:
    """A PPE record's table rows (one per method and seed), its protocol, ``bench_methods``
    and ``summarize``."""
    bench = load("benchmarks/bench_methods.py")
    if protocol == "ppe":
        rows = load("scripts/docs_figures.py").table_rows(read(results, "ppe_walker_walk.csv"))
    else:
        rows = once(read(results, "ppe_window_open.csv"), ["method", "seed"],
                    "ppe_window_open.csv")
    return rows, bench.PROTOCOLS[protocol], bench, bench.load_summarize()


def combined(rows: pd.DataFrame, protocol: dict, summarize: Any) -> tuple[float, float]:
    """Stouffer's combined z of the methods' Welch tests against the paper (:func:`stouffer`)."""
    pairs = []
    for method, (mean, std) in protocol["published"].items():
        runs = rows[rows["method"] == method]["final"].to_numpy(float) * protocol.get("scale", 1)
        if len(runs):
            c = summarize.compare_with_published(runs, mean, std, protocol["published_seeds"],
                                                 protocol.get("published_ddof", 0))
            pairs.append((c.mean - mean, c.p))
    return stouffer(pairs)


def ppe_table(results: Path, protocol: str, csv: str) -> str:
    """A PPE page's table: ``bench_methods.published_lines``, the combined z, provenance."""
    rows, spec, bench, summarize = ppe_rows(results, protocol)
    z, p = combined(rows, spec, summarize)
    lines = bench.published_lines(rows, spec, summarize)
    lines[0] = lines[0][0].upper() + lines[0][1:]  # "beside ..." opens a sentence here
    lines[-1] = lines[-1][0].upper() + lines[-1][1:]  # "ordering, ..."
    return "\n".join([*lines, "",
                      f"All methods together (Stouffer's combined z of the one-sided Welch "
                      f"tests): z {z:.2f}, one-sided p {p:.3f}.", "", provenance(rows, csv)])


METHOD_NAMES = {"pebble": "PEBBLE", "surf": "SURF", "rune": "RUNE", "qpa": "QPA"}


def ppe_summary(results: Path, protocol: str) -> str:
    """A PPE front-page cell: each method's mean ± SE, seeds, Welch p and verdict against the
    paper's mean ± SE, the ordering, the combined z, and plain SAC."""
    rows, spec, _, summarize = ppe_rows(results, protocol)
    scale, unit = spec.get("scale", 1.0), " %" if spec.get("scale", 1.0) != 1.0 else ""
    digits = 1 if scale != 1.0 else 0
    parts, means = [], {}
    for method, (mean, std) in spec["published"].items():
        runs = rows[rows["method"] == method]["final"].to_numpy(float) * scale
        if not len(runs):
            continue
        c = summarize.compare_with_published(runs, mean, std, spec["published_seeds"],
                                             spec.get("published_ddof", 0))
        means[method] = c.mean
        test = "no test" if c.inside is None else \
            f"Welch p {c.p:.3f}, {'inside' if c.inside else 'outside'}"
        value = mean_se(runs, digits, unit) if c.n > 1 else f"{runs[0]:.{digits}f}{unit}"
        parts.append(f"{METHOD_NAMES[method]} {value} ({c.n} seed{'s' if c.n > 1 else ''}; "
                     f"{test})")
    z, p = combined(rows, spec, summarize)
    sac = rows[rows["method"] == "sac"]["final"].to_numpy(float) * scale
    ours = sorted(means, key=lambda m: -means[m])
    paper = [m for m in sorted(spec["published"], key=lambda m: -spec["published"][m][0])
             if m in means]
    order = "the paper's order" if ours == paper else \
        f"order {' > '.join(METHOD_NAMES[m] for m in ours)} (the paper's " \
        f"{' > '.join(METHOD_NAMES[m] for m in paper)})"
    return ("; ".join(parts) + f" (mean ± SE), against the paper's "
            f"{', '.join(str(spec['published'][m][0]) for m in spec['published'])}; {order}; "
            f"all together: combined z {z:.2f} (one-sided p {p:.3f}); SAC on the true "
            f"reward {mean_se(sac, digits, unit)}")


DOT_LABELS = {"random": "random policy", "ppo_true": "PPO on the true reward (`ppo_true`)",
              "drlhp": "DRLHP's recipe, mrahtz's dot network (`drlhp`)",
              "drlhp_onehot": "DRLHP's recipe, the action one-hot (`drlhp_onehot`)",
              "drlhp_passes10": "`drlhp` with 10× the label-passes (`drlhp_passes10`)"}
"""The MovingDot page's rows: the headline's variants (the others are single-seed studies)."""


def drlhp_dot_table(results: Path) -> str:
    """The MovingDot page's table: per variant, seeds and mean ± SE of the final distance, the
    true return, the last validation accuracy and the CPU minutes per run."""
    table = once(read(results, "drlhp_dot.csv"), ["variant", "seed", "steps"], "drlhp_dot.csv")
    lines = ["| variant | seeds | final distance (px) | true return | last val accuracy | "
             "CPU per run (min) |", "|---|---|---|---|---|---|"]
    shown = table[table["variant"].isin(DOT_LABELS)]
    for variant, label in DOT_LABELS.items():
        rows = shown[shown["variant"] == variant]
        if rows.empty:
            continue
        cells = [mean_se(rows["final_distance"], 1), mean_se(rows["true_return"], 1),
                 mean_se(rows["val_accuracy"], 2) if rows["val_accuracy"].notna().all()
                 else "-", mean_se(rows["cpu_s"] / 60, 1) if rows["cpu_s"].gt(0).all()
                 else "-"]
        lines.append(f"| {label} | {seed_list(rows['seed'])} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", provenance(shown, "drlhp_dot.csv")])


def drlhp_dot(results: Path) -> str:
    """The README's MovingDot cell."""
    table = once(read(results, "drlhp_dot.csv"), ["variant", "seed", "steps"], "drlhp_dot.csv")

    def of(variant: str, column: str = "final_distance") -> pd.Series:
        return table[table["variant"] == variant][column]

    onehot = of("drlhp_onehot")
    return (f"the dot ends {mean_se(onehot, 1)} px from the middle with the action one-hot "
            f"(`reward_net=drlhp_dot_onehot`; mrahtz's index / 4 input: {mean_se(of('drlhp'))}; "
            f"random {of('random').mean():.0f}, PPO on the true reward "
            f"{of('ppo_true').mean():.1f}), {of('drlhp_onehot', 'cpu_s').mean() / 60:.0f} CPU "
            f"minutes a run ({len(onehot)} seeds, mean ± SE)")


PONG_NAMES = {"ppo_oracle": "PPO, DRLHP's recipe, oracle teacher", "ppo_true": "PPO, true reward",
              "a2c_oracle": "A2C, DRLHP's recipe, oracle teacher", "a2c_true": "A2C, true reward"}
"""The Pong runs' variants (``benchmarks/bench_drlhp.py``'s ``PONG_LABELS``)."""


def _number(value: float, digits: int = 1) -> str:
    return "-" if not np.isfinite(value) else f"{value:.{digits}f}"


def drlhp_pong_cost_table(results: Path) -> str:
    """The Pong page's table of the pieces' cost: CPU seconds per 10k agent steps of each piece
    (one thread; two threads' wall seconds in parentheses), one column per measurement (date,
    commit, machine), oldest first."""
    table = read(results, "drlhp_pong_cost.csv")
    table["when"] = [f"{str(d)[:10]} · {c} · {m}" for d, c, m in
                     zip(table["date"], table["commit"], table["machine"], strict=True)]
    columns = list(dict.fromkeys(table["when"]))
    pieces = list(dict.fromkeys(table["piece"]))
    lines = ["| piece | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for piece in pieces:
        cells = []
        for when in columns:
            rows = table[(table["piece"] == piece) & (table["when"] == when)]
            one = rows[rows["threads"] == 1]["s_per_10k_steps"]
            two = rows[rows["threads"] == 2]["s_per_10k_steps"]
            cell = _number(float(one.iloc[0])) if len(one) else "-"
            cells.append(cell + (f" ({float(two.iloc[0]):.1f})" if len(two) else ""))
        lines.append(f"| {piece} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", provenance(table, "drlhp_pong_cost.csv")])


def drlhp_pong_curves_table(results: Path) -> str:
    """The Pong page's table of each run's curve so far (``drlhp_pong_curves.csv``, and the
    first runs that ended unfinished, ``drlhp_pong_curves_first_run.csv``): the last recorded
    step, the mean true return of the last 10 episodes there and the best such value by then,
    the policy entropy and r̂'s held-out accuracy and Pearson correlation (last 5 rounds)."""
    frames = [read(results, "drlhp_pong_curves.csv").assign(run="")]
    if (results / "drlhp_pong_curves_first_run.csv").is_file():
        frames.append(read(results, "drlhp_pong_curves_first_run.csv").assign(
            run=" (first run, ended)"))
    table = pd.concat(frames, ignore_index=True)
    lines = ["| run | seed | steps so far | return, last 10 episodes | best so far | "
             "policy entropy (uniform 1.792) | r̂ held-out accuracy | r̂ held-out Pearson |",
             "|---|---|---|---|---|---|---|---|"]
    for (run, variant, seed), rows in table.groupby(["run", "variant", "seed"], sort=False):
        last = rows.sort_values("step").iloc[-1]
        held = [float(last.get(c, np.nan)) for c in ("heldout_accuracy", "heldout_pearson")]
        lines.append(f"| {PONG_NAMES.get(variant, variant)}{run} | {seed} | "
                     f"{last['step'] / 1e6:.1f}M | {last['return_last10']:.1f} | "
                     f"{rows['return_last10'].max():.1f} | {last['entropy']:.3f} | "
                     f"{_number(held[0], 2)} | {_number(held[1], 2)} |")
    return "\n".join([*lines, "", provenance(table, "drlhp_pong_curves*.csv")])


def drlhp_pong_table(results: Path) -> str:
    """The Pong page's result: per finished run, the final true score (mean of its last 10
    episodes), its last evaluation, r̂'s last held-out accuracy and correlation, and its cost:
    the run's own wall-clock and CPU hours over its resumes (``run_wall_s``, ``run_cpu_s``) and
    the background learner's CPU hours."""
    table = once(read(results, "drlhp_pong.csv"), ["variant", "seed", "steps"],
                 "drlhp_pong.csv")
    lines = ["| run | seed | steps | final score (last 10 episodes) | last evaluation | "
             "r̂ held-out accuracy | r̂ held-out Pearson | wall (h) | CPU, agent process (h) | "
             "CPU, reward learner (h) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        lines.append(
            f"| {PONG_NAMES.get(row.variant, row.variant)} | {row.seed} | "
            f"{row.steps / 1e6:.1f}M | {row.final_score:.1f} | {row.last_eval:.1f} | "
            f"{_number(row.heldout_accuracy, 2)} | {_number(row.heldout_pearson, 2)} | "
            f"{_number(row.run_wall_s / 3600)} | {_number(row.run_cpu_s / 3600)} | "
            f"{_number(row.learner_cpu_s / 3600) if row.learner_cpu_s > 0 else '-'} |")
    return "\n".join([*lines, "", provenance(table, "drlhp_pong.csv")])


def drlhp_pong(results: Path) -> str:
    """The README's Pong cell: the recipe's final score beside the true-reward agent's."""
    table = read(results, "drlhp_pong.csv")
    recipe = table[table["variant"] == "ppo_oracle"]
    true = table[table["variant"] == "ppo_true"]
    if recipe.empty:
        raise NoRecord("drlhp_pong.csv: ppo_oracle")
    row = recipe.iloc[-1]
    beside = (f"; PPO on the true reward {true.iloc[-1]['final_score']:.1f}" if len(true)
              else "")
    return (f"{row['final_score']:.1f} (mean of the last 10 episodes after "
            f"{row['steps'] / 1e6:.0f}M steps, 1 seed{beside}; {row['run_wall_s'] / 3600:.1f} h "
            f"on 2 cores)")


NAMES = {"sb3_cpu": "SB3 SAC", "sb3_cuda": "SB3 SAC (CUDA)", "themis": "Themis plain SAC"}


def ceiling_rows(results: Path) -> pd.DataFrame:
    table = once(read(results, "ceiling.csv"), ["kind", "env", "steps", "seed"], "ceiling.csv")
    return table[table["env"] == "HalfCheetah-v5"]


def ceiling_table(results: Path) -> str:
    """The ceiling page's table: each run's curve, then each library's final mean ± SE."""
    table = ceiling_rows(results)
    curves = {(k, int(s)): {int(a): float(b) for a, b in (p.split(":") for p in c.split())}
              for k, s, c in zip(table["kind"], table["seed"], table["curve"], strict=True)}
    steps = sorted({s for c in curves.values() for s in c})
    lines = ["| method | seed | " + " | ".join(f"{s // 1000}k" for s in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for (kind, seed), curve in sorted(curves.items()):
        lines.append(f"| {NAMES.get(kind, kind)} | {seed} | " + " | ".join(
            f"{curve[s]:.0f}" if s in curve else "-" for s in steps) + " |")
    lines += ["", "| method | seeds | final true return (mean ± SE) | wall clock (mean) |",
              "|---|---|---|---|"]
    for kind, rows in table.groupby("kind"):
        lines.append(f"| {NAMES.get(str(kind), kind)} | {seed_list(rows['seed'])} | "
                     f"{mean_se(rows['final'])} | {rows['wall_s'].mean() / 60:.0f} min |")
    return "\n".join([*lines, "", provenance(table, "ceiling.csv")])


def ceiling(results: Path) -> str:
    """The README's ceiling cell: Themis against SB3 on the seeds both finished."""
    table = ceiling_rows(results)
    seeds = set(table[table["kind"] == "themis"]["seed"]) & set(
        table[table["kind"] == "sb3_cpu"]["seed"])
    both = table[table["seed"].isin(seeds)]
    return (f"Themis {mean_se(both[both['kind'] == 'themis']['final'])} against SB3 "
            f"{mean_se(both[both['kind'] == 'sb3_cpu']['final'])} at "
            f"{int(both['steps'].iloc[0]) // 1000}k steps (seeds {seed_list(sorted(seeds))}, "
            f"mean ± SE)")


def throughput_sessions(results: Path) -> list[tuple[str, pd.DataFrame, dict[str, float]]]:
    """Per recorded session of ``bench_throughput.py``: its rows and each kind's best median
    steps/s (medians over the session's rotations, the best setting of each kind)."""
    table = once(read(results, "throughput.csv"),
                 ["session", "kind", "threads", "precision", "device", "repeat"],
                 "throughput.csv")
    out = []
    for session, rows in table.groupby("session", sort=True):
        medians = rows.groupby(["kind", "threads", "precision"])["steps_per_s"].median()
        best = {str(k): float(v) for k, v in medians.groupby(level="kind").max().items()}
        out.append((str(session), rows, best))
    return out


def throughput_table(results: Path) -> str:
    """The throughput page's table: one row per session, medians and the ratios to SB3."""
    sessions = throughput_sessions(results)
    lines = ["| session (UTC) | machine | rotations | (a) SB3 SAC | (b) Themis SAC | "
             "(c) Themis PEBBLE | b / a | c / a |", "|---|---|---|---|---|---|---|---|"]
    for session, rows, best in sessions:
        a = best.get("sb3", float("nan"))
        cells = [f"{best[k]:.1f}" if k in best else "-" for k in ("sb3", "sac", "pebble")]
        ratios = [f"{best[k] / a:.2f}" if k in best else "-" for k in ("sac", "pebble")]
        lines.append(f"| {session} | {rows['machine'].iloc[0]} | {rows['repeat'].nunique()} | "
                     + " | ".join(cells + ratios) + " |")
    table = pd.concat([rows for _, rows, _ in sessions])
    return "\n".join([*lines, "", "steps/s: the median over a session's rotations of each "
                      "kind's best setting.", "", provenance(table, "throughput.csv")])


def throughput(results: Path) -> str:
    """The README's speed cell: the range of the ratios over the recorded sessions."""
    ratios: dict[str, list[float]] = {"sac": [], "pebble": []}
    machines = set()
    for _, rows, best in throughput_sessions(results):
        machines.add(rows["machine"].iloc[0])
        for kind in ratios:
            if kind in best and "sb3" in best:
                ratios[kind].append(best[kind] / best["sb3"])

    def span(values: list[float]) -> str:
        return "-" if not values else f"{min(values):.2f}×" if len(values) == 1 else \
            f"{min(values):.2f}–{max(values):.2f}×"

    return (f"SAC {span(ratios['sac'])}, the whole PEBBLE loop {span(ratios['pebble'])} "
            f"({len(ratios['sac'])} sessions on {len(machines)} machine"
            f"{'s' if len(machines) != 1 else ''})")


def crowd_table(results: Path) -> str:
    """The people page's crowd table: one row per recorded mode and seed."""
    table = once(read(results, "crowd.csv"), ["mode", "seed", "crowd"], "crowd.csv")
    lines = ["| `label_quality` | seed | flagged at the end | gold answers it took | "
             "training labels | agreement with the true returns | held-out accuracy | "
             "final true return |", "|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples(index=False):
        gold = row.gold_answers_when_flagged
        lines.append(f"| `{row.mode}` | {row.seed} | {row.flagged} | "
                     f"{gold if isinstance(gold, str) else '-'} | {row.training_labels} | "
                     f"{row.agreement:.3f} | {row.heldout_accuracy:.3f} | "
                     f"{row.final_return:.0f} |")
    return "\n".join([*lines, "", provenance(table, "crowd.csv")])


def crowd(results: Path) -> str:
    """The README's crowd cell: when the adversary was flagged, Dawid–Skene's agreement."""
    table = read(results, "crowd.csv")
    model = table[table["mode"] == "model"]["agreement"]
    adversary = []
    for flagged, gold in zip(table["flagged"], table["gold_answers_when_flagged"], strict=True):
        names = [n.split(" (")[0] for n in str(flagged).split(", ") if "(adversary)" in n]
        counts = dict(p.split(": ") for p in str(gold).split(", ") if ": " in p)
        adversary += [int(counts[n]) for n in names if n in counts]
    said = f"adversary flagged after {min(adversary)}–{max(adversary)} gold answers" \
        if adversary and min(adversary) != max(adversary) else \
        f"adversary flagged after {adversary[0]} gold answers" if adversary else \
        "adversary never flagged"
    return (f"{said}; Dawid–Skene labels agree {100 * model.mean():.0f} % with the true returns "
            f"({len(model)} run{'s' if len(model) != 1 else ''})")


WRAPPER_JOBS = {"sac": "SB3 SAC through `PreferenceLearningWrapper`",
                "sac-relabel": "SB3 SAC through the wrapper + `RelabelCallback`",
                "sac-true": "SB3 SAC on the true reward, no wrapper (the ceiling)",
                "pebble": "Themis PEBBLE, `./themis_train.sh` (same budget)",
                "ppo": "SB3 PPO, `SubprocVecEnv(8)` through `PreferenceLearningVecEnv`",
                "ppo-true": "SB3 PPO, `SubprocVecEnv(8)`, true reward"}


def wrapper_table(results: Path) -> str:
    """The wrapper page's table: per job, seeds, per-seed finals, mean ± SE, wall clock."""
    table = once(read(results, "wrapper.csv"), ["job", "seed", "steps", "queries"],
                 "wrapper.csv")
    lines = ["| run | steps | queries | seeds | final true return (per seed) | mean ± SE | "
             "wall clock (mean) |", "|---|---|---|---|---|---|---|"]
    for job, label in WRAPPER_JOBS.items():
        for (steps, queries), rows in table[table["job"] == job].groupby(["steps", "queries"]):
            rows = rows.sort_values("seed")
            lines.append(f"| {label} | {steps} | {queries} | {seed_list(rows['seed'])} | "
                         f"{' / '.join(f'{v:.0f}' for v in rows['final'])} | "
                         f"{mean_se(rows['final'])} | {rows['wall_s'].mean() / 60:.0f} min |")
    return "\n".join([*lines, "", provenance(table, "wrapper.csv")])


def wrapper(results: Path) -> str:
    """The README's wrapper cell: SB3 SAC through the wrapper beside its ceiling (``sac-true``)
    on the seeds both finished."""
    table = once(read(results, "wrapper.csv"), ["job", "seed", "steps", "queries"],
                 "wrapper.csv")
    wrapped, true = table[table["job"] == "sac"], table[table["job"] == "sac-true"]
    seeds = sorted(set(wrapped["seed"]) & set(true["seed"]))
    if not seeds:
        raise NoRecord("wrapper.csv: no seed with both sac and sac-true")
    w = wrapped[wrapped["seed"].isin(seeds)]["final"].to_numpy(float)
    t = true[true["seed"].isin(seeds)]["final"].to_numpy(float)
    return (f"SB3 SAC through the wrapper {mean_se(w)} against {mean_se(t)} on the true reward "
            f"({100 * w.mean() / t.mean():.0f} % of its ceiling; seeds {seed_list(seeds)}, "
            f"mean ± SE)")


def wrapper_cost(results: Path) -> str:
    """The README's wrapper-cost cell: µs a step through the wrapper (``bench_wrapper.py``), the
    range over the recorded measurements on HalfCheetah-v5, and SB3 SAC's speed through it."""
    table = read(results, "wrapper_cost.csv")
    table = table[table["env"] == "HalfCheetah-v5"]
    if table.empty:
        raise NoRecord("wrapper_cost.csv: no HalfCheetah-v5 measurement")
    cost, ratio = table["wrapper_us"], table["sac_wrapped_steps_per_s"] / table[
        "sac_bare_steps_per_s"]

    def span(values: pd.Series, fmt: str) -> str:
        return f"{values.min():{fmt}}" if values.min() == values.max() else \
            f"{values.min():{fmt}}–{values.max():{fmt}}"

    return (f"{span(cost, '.0f')} µs a step, SB3 SAC at {span(ratio.dropna(), '.2f')}× its "
            f"steps/s on the bare env ({len(table)} measurement{'s' if len(table) > 1 else ''})")


BLOCKS: dict[str, Callable[[Path], str]] = {
    "main_job": main_job, "main_job_table": main_job_table,
    "ppe_walker_walk": lambda r: ppe_table(r, "ppe", "ppe_walker_walk.csv"),
    "ppe_walker_walk_summary": lambda r: ppe_summary(r, "ppe"),
    "ppe_window_open": lambda r: ppe_table(r, "ppe_window_open", "ppe_window_open.csv"),
    "ppe_window_open_summary": lambda r: ppe_summary(r, "ppe_window_open"),
    "drlhp_dot": drlhp_dot, "drlhp_dot_table": drlhp_dot_table,
    "ceiling": ceiling, "ceiling_table": ceiling_table,
    "throughput": throughput, "throughput_table": throughput_table,
    "crowd": crowd, "crowd_table": crowd_table,
    "wrapper": wrapper, "wrapper_table": wrapper_table, "wrapper_cost": wrapper_cost,
    "drlhp_pong": drlhp_pong, "drlhp_pong_table": drlhp_pong_table,
    "drlhp_pong_curves": drlhp_pong_curves_table, "drlhp_pong_cost": drlhp_pong_cost_table,
}
"""Block name → its generator: the block's text from the records under ``results/``."""


# ---- the pages -------------------------------------------------------------------------------

def render(text: str, results: Path, page: str = "") -> tuple[str, list[str], list[str]]:
    """``text`` with each block rewritten from ``results``.

    Returns:
        The new text, the blocks that changed and the pending ones (``page: NAME``).

    Raises:
        ValueError: an unknown block name, a pending block that does not say
            :data:`PENDING`, or a record that would count a seed twice.
    """
    changed: list[str] = []
    pending: list[str] = []

    def one(match: re.Match) -> str:
        name, body = match["name"], match["body"]
        if name not in BLOCKS:
            raise ValueError(f"{page}: unknown results block {name!r} (known: "
                             f"{', '.join(BLOCKS)})")
        try:
            new = BLOCKS[name](results)
        except NoRecord:
            if PENDING not in body.lower():
                raise ValueError(f"{page}: block {name!r} has no record and does not say "
                                 f"{PENDING!r}") from None
            pending.append(f"{page}: {name}")
            return match[0]
        if "\n" in body:
            new = f"\n{new}\n"
        if new != body:
            changed.append(f"{page}: {name}")
        return f"<!-- results: {name} -->{new}<!-- /results -->"

    return BLOCK.sub(one, text), changed, pending


def pages(root: Path = ROOT) -> list[Path]:
    """The pages with generated blocks (:data:`PAGES`)."""
    return sorted({p for pattern in PAGES for p in root.glob(pattern)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only check that every block equals what the records give")
    parser.add_argument("--no-figures", action="store_true", help="do not draw the figures")
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    args = parser.parse_args(argv)
    docs_index = load("scripts/docs_index.py")
    differ, waiting = [], []
    for page in pages():
        name = str(page.relative_to(ROOT))
        text = page.read_text()
        try:
            new, changed, pending = render(text, args.results, name)
        except ValueError as e:
            print(f"results_tables: error: {e}", file=sys.stderr)
            return 1
        differ += changed
        waiting += pending
        if changed and not args.check:
            page.write_text(new)
    for block in waiting:
        print(f"results_tables: pending (no record yet): {block}")
    if args.check:
        if docs_index.main(["--check"]) != 0:
            differ.append("docs/index.md")
        for block in differ:
            print(f"results_tables: differs from its record: {block}", file=sys.stderr)
        if differ:
            print("results_tables: run python scripts/results_tables.py", file=sys.stderr)
        return 1 if differ else 0
    for block in differ:
        print(f"rewrote {block}")
    docs_index.main([])
    if not args.no_figures:
        load("scripts/docs_figures.py").main([])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
