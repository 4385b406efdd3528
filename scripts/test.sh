#!/usr/bin/env bash
# The Themis test suite (docs/developing/tests.md; .ci/run calls it too), one pytest-xdist
# worker per core; tests that start several busy processes or time something share the
# xdist group "busy" and run one after another (--dist loadgroup).
#   scripts/test.sh                 # everything, slow end-to-end runs included
#   scripts/test.sh -m "not slow"   # the quick unit tests only
#   scripts/test.sh -n 0 tests/test_threads.py   # one process, no workers (e.g. for pdb)
#   THEMIS_TEST_WORKERS=4 scripts/test.sh        # another worker count (default: the cores)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="python3"
[ -x .venv/bin/python ] && python=.venv/bin/python
# The workers share the cores: OpenMP threads sleep at once instead of spinning for a core
# another worker holds (a two-thread run beside a busy worker ran 4-10x slower; conftest.py)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# Every test that starts a run starts Python: its modules are compiled once, not in each process
# (with PYTHONDONTWRITEBYTECODE set, a launch compiled ~400 modules from source, 2.4 s of CPU;
# test_bad_input.py took 207 s of CPU with it and 160 s without). __pycache__ is git-ignored.
unset PYTHONDONTWRITEBYTECODE
"$python" -m compileall -q -j 0 themis lib tests scripts benchmarks >/dev/null || true
# Headless MuJoCo rendering: EGL on NVIDIA machines, OSMesa elsewhere, none without either.
source scripts/gl_backend.sh
workers=()
if "$python" -c "import xdist" 2>/dev/null; then  # pytest-xdist: the dev extras
  # nproc counts the cores this process may use, but reads OMP_NUM_THREADS too: not that
  cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)"
  workers=(-n "${THEMIS_TEST_WORKERS:-$cores}" --dist loadgroup)
fi
# a -n of the caller's comes later and wins
exec "$python" -m pytest -q ${workers[@]+"${workers[@]}"} "$@"
