"""Kill rate of the last mutation run, per module (reads ``mutmut results --all true``).

    python scripts/mutation_report.py                         # after scripts/mutation.sh
    python scripts/mutation_report.py --pick 8 --seed 0       # 8 mutant names per module
    python scripts/mutation_report.py --only mutants/sample.txt   # the table of those only

Prints a Markdown table: mutants, tested, killed by a failing test, timed out, survived, not
covered by any fast test, and the kill rate = (failing + timed out) / tested, also without the
time-outs (a lower bound: on a loaded machine an equivalent mutant can time out).

``--pick N`` prints N mutant names per module, drawn uniformly without replacement with
``--seed`` (all of a module's mutants where it has fewer), for a sampled run
(``scripts/mutation.sh --sample N``): a uniform sample's kill rate estimates the module's, and
``--only FILE`` tables just the names in FILE with a 95 % Wilson score interval for the kill rate
(``scipy.stats.binomtest``), which says how far the estimate can be from the full run's. This is
the sampled mutation analysis of Gopinath et al., "How hard does mutation analysis have to be,
anyway?" (ISSRE 2015).
"""

from __future__ import annotations

import sys as _sys  # isort: skip
from pathlib import Path as _Path  # isort: skip

_sys.path.insert(0, str(_Path(__file__).resolve().parent))  # scripts/: venv_check
import venv_check  # noqa: F401  # isort: skip  (Themis's Python first)
import argparse
import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

KILLED = {"killed", "timeout", "segfault"}


def statuses() -> dict[str, str]:
    """Every mutant's name → mutmut's status of it (``killed``, ``survived``, ``not checked``, …).

    Raises:
        RuntimeError: ``mutmut results`` failed (no ``mutants/`` yet, or mutmut is missing).
    """
    try:
        out = subprocess.run(["mutmut", "results", "--all", "true"], capture_output=True,
                             text=True)
    except FileNotFoundError:
        raise RuntimeError("mutmut is not installed; scripts/mutation.sh installs it and makes "
                           "the mutants this script reports on") from None
    if out.returncode != 0:
        raise RuntimeError(f"mutmut results failed: {out.stderr.strip()}")
    found = {}
    for line in out.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            found[name] = status.strip()
    return found


def module_of(name: str) -> str:
    """``themis.feedback.teachers.x_f__mutmut_3`` or
    ``themis.feedback.teachers.xǁCǁm__mutmut_3`` → its module."""
    return name.split(".x")[0]


def pick(names: list[str], per_module: int, seed: int) -> list[str]:
    """``per_module`` names of each module, uniform without replacement (all where fewer)."""
    rng = np.random.default_rng(seed)
    by_module: dict[str, list[str]] = collections.defaultdict(list)
    for name in sorted(names):
        by_module[module_of(name)].append(name)
    chosen = []
    for module in sorted(by_module):
        pool = by_module[module]
        idx = rng.choice(len(pool), size=min(per_module, len(pool)), replace=False)
        chosen += [pool[i] for i in sorted(idx)]
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pick", type=int, metavar="N", help="print N mutant names per module")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", type=Path, metavar="FILE", help="table only these mutants")
    args = parser.parse_args()
    try:
        found = statuses()
    except RuntimeError as exc:
        print(f"mutation_report: error: {exc}", file=sys.stderr)
        return 2
    if args.pick is not None:
        print("\n".join(pick(list(found), args.pick, args.seed)))
        return 0
    if args.only is not None:
        wanted = set(args.only.read_text().split())
        missing = wanted - set(found)
        if missing:
            print(f"mutation_report: error: {len(missing)} names in {args.only} are not mutants "
                  f"of this tree (e.g. {sorted(missing)[0]}); draw the sample again",
                  file=sys.stderr)
            return 2
        found = {k: v for k, v in found.items() if k in wanted}
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for name, status in found.items():
        counts[module_of(name)][status] += 1
    ci = args.only is not None
    print("| module | mutants | tested | killed by a failing test | timed out | survived | "
          "no tests | kill rate | without time-outs |" + (" 95 % CI of kill rate |" if ci else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if ci else ""))
    total: collections.Counter[str] = collections.Counter()
    for module in sorted(counts):
        total.update(counts[module])
        print(_row(module, counts[module], ci))
    print(_row("**all**", total, ci))
    return 0


def _row(name: str, c: collections.Counter[str], ci: bool) -> str:
    killed = sum(c[s] for s in KILLED)
    failing = killed - c["timeout"]
    judged = killed + c["survived"] + c["no tests"]
    rate = f"{100 * killed / judged:.1f} %" if judged else "-"
    strict = f"{100 * failing / judged:.1f} %" if judged else "-"
    row = (f"| {name} | {sum(c.values())} | {judged} | {failing} | {c['timeout']} | "
           f"{c['survived']} | {c['no tests']} | {rate} | {strict} |")
    if ci:
        if judged:
            low, high = binomtest(killed, judged).proportion_ci(method="wilson")
            row += f" {100 * low:.0f}–{100 * high:.0f} % |"
        else:
            row += " - |"
    return row


if __name__ == "__main__":
    sys.exit(main())
