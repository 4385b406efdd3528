"""Kill rate of the last mutation run, per module (reads ``mutmut results --all true``).

    python scripts/mutation_report.py            # after scripts/mutation.sh

Prints a Markdown table: mutants, tested, killed by a failing test, timed out, survived, not
covered by any fast test, and the kill rate = (failing + timed out) / tested, also without the
time-outs (a lower bound: on a loaded machine an equivalent mutant can time out).
"""

from __future__ import annotations

import collections
import subprocess
import sys

KILLED = {"killed", "timeout", "segfault"}


def main() -> int:
    out = subprocess.run(["mutmut", "results", "--all", "true"], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"mutation_report: error: mutmut results failed: {out.stderr.strip()}",
              file=sys.stderr)
        return 2
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in out.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if not sep or "__mutmut_" not in name:
            continue
        module = name.split(".x")[0]  # mutants are named MODULE.x_FUNC or MODULE.xǁCLASSǁMETHOD
        counts[module][status.strip()] += 1
    print("| module | mutants | tested | killed by a failing test | timed out | survived | "
          "no tests | kill rate | without time-outs |")
    print("|---|---|---|---|---|---|---|---|---|")
    total: collections.Counter[str] = collections.Counter()
    for module in sorted(counts):
        c = counts[module]
        total.update(c)
        print(_row(module, c))
    print(_row("**all**", total))
    return 0


def _row(name: str, c: collections.Counter[str]) -> str:
    killed = sum(c[s] for s in KILLED)
    failing = killed - c["timeout"]
    judged = killed + c["survived"] + c["no tests"]
    rate = f"{100 * killed / judged:.1f} %" if judged else "-"
    strict = f"{100 * failing / judged:.1f} %" if judged else "-"
    return (f"| {name} | {sum(c.values())} | {judged} | {failing} | {c['timeout']} | "
            f"{c['survived']} | {c['no tests']} | {rate} | {strict} |")


if __name__ == "__main__":
    sys.exit(main())
