#!/usr/bin/env bash
# Apply one mutant of a mutmut run (mutants/) to the working tree, run the given tests, restore.
#
#   scripts/mutant_try.sh themis.loops.pebble.x_run__mutmut_97 tests/test_wiring.py -k buffer
#
# Prints "killed NAME" (a test failed) or "SURVIVED NAME"; the mutated file is restored from git
# in every case (also on Ctrl-C). How a test written for a survivor is checked without mutmut
# tracing the whole suite again (docs/developing/mutation.md). Exit 2: bad use.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
name="${1:-}"
[ -n "$name" ] && [ $# -ge 2 ] || { echo "usage: mutant_try.sh MUTANT PYTEST_ARGS..." >&2; exit 2; }
shift
[ -d mutants ] || { echo "mutant_try.sh: no mutants/ here; run scripts/mutation.sh first" >&2; exit 2; }
module="$(printf '%s' "$name" | sed -E 's/\.x(_|ǁ).*//')"
file="${module//.//}.py"
[ -f "$file" ] || file="${module//.//}/__init__.py"
[ -f "$file" ] || { echo "mutant_try.sh: no source file for $name" >&2; exit 2; }
git diff --quiet -- "$file" || { echo "mutant_try.sh: $file has uncommitted changes" >&2; exit 2; }
trap 'git checkout -q -- "$file"' EXIT
.venv/bin/mutmut apply "$name" >/dev/null
git diff --quiet -- "$file" && { echo "mutant_try.sh: $name changed nothing in $file" >&2; exit 2; }
rc=0
.venv/bin/python -m pytest -q -x -p no:cacheprovider "$@" >/dev/null 2>&1 || rc=$?
case $rc in
  0) echo "SURVIVED $name" ;;
  1) echo "killed $name" ;;
  *) echo "mutant_try.sh: pytest exit $rc (5: no test matched) for $name" >&2; exit 2 ;;
esac
