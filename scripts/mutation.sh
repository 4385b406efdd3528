#!/usr/bin/env bash
# Mutation testing of Themis's core modules with mutmut (not part of CI; see README "Tests").
#
#   scripts/mutation.sh                       # every core module in pyproject's [tool.mutmut]
#   scripts/mutation.sh "themis.teachers*"    # mutants whose names match (mutmut globs)
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
if [ -z "${MUJOCO_GL:-}" ]; then
  if [ -e /dev/nvidia0 ]; then export MUJOCO_GL=egl; else export MUJOCO_GL=osmesa; fi
fi
mutmut run --max-children "${THEMIS_MUTATION_JOBS:-2}" "$@" || true  # survivors are not errors
python scripts/mutation_report.py
