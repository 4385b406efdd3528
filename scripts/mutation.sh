#!/usr/bin/env bash
# Mutation testing of Themis's core modules with mutmut (not part of CI; see docs/developing/mutation.md).
#
#   scripts/mutation.sh                       # every core module in pyproject's [tool.mutmut]
#   scripts/mutation.sh "themis.feedback.teachers*"    # mutants whose names match (mutmut globs)
#   scripts/mutation.sh --sample 8 [SEED]     # 8 uniformly drawn mutants per module (seeded)
#
# mutmut copies the tree to mutants/, runs the fast tests ("not slow") once to learn which tests
# reach which function, then runs only those tests against each mutant, two at a time. It keeps
# its results in mutants/: an interrupted run continues where it stopped. The kill rate per
# module is printed last (scripts/mutation_report.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || { echo "mutation.sh: run scripts/setup.sh first" >&2; exit 2; }
.venv/bin/python -c "import mutmut" 2>/dev/null || .venv/bin/python -m pip install -q "mutmut==3.8.1"
export PATH="$root/.venv/bin:$PATH"  # the launchers inside mutants/ find this Python
source scripts/gl_backend.sh  # headless MuJoCo rendering
jobs="${THEMIS_MUTATION_JOBS:-2}"
# mutmut runs the tests in its own process, then forks one child per mutant: a child that
# inherits PyTorch's OpenMP thread pool hangs at its first parallel op (a futex, forever).
# One thread per process means no pool to inherit.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 THEMIS_THREADS=1
if [ "${1:-}" = "--sample" ]; then
  # A sample estimates each module's kill rate with a 95 % interval (scripts/mutation_report.py).
  # First bring mutants/ up to date with the tree: a pattern that matches no mutant generates
  # them (and the test statistics) and then stops, so the names drawn below exist.
  per_module="${2:?--sample needs a number of mutants per module}"; seed="${3:-0}"
  echo "mutation.sh: generating mutants and tracing which tests reach which function" \
       "(over an hour on 2 cores for a fresh mutants/; kept for later runs)"
  mutmut run --max-children "$jobs" "themis.no_such_module_*" 2>/dev/null || true  # stops at
  # "nothing matches" (a traceback on stderr) once mutants/ and its statistics are up to date
  python scripts/mutation_report.py --pick "$per_module" --seed "$seed" > mutants/sample.txt
  # shellcheck disable=SC2046  # one argument per mutant name
  mutmut run --max-children "$jobs" $(cat mutants/sample.txt) || true
  python scripts/mutation_report.py --only mutants/sample.txt
  exit 0
fi
mutmut run --max-children "$jobs" "$@" || true  # survivors are not errors
python scripts/mutation_report.py
