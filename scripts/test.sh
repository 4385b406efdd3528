#!/usr/bin/env bash
# The Themis test suite (the README's test command; .ci/run calls it too).
#   scripts/test.sh                 # everything, slow end-to-end runs included
#   scripts/test.sh -m "not slow"   # the quick unit tests only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="python3"
[ -x .venv/bin/python ] && python=.venv/bin/python
# Headless MuJoCo rendering: EGL on NVIDIA machines, OSMesa elsewhere, none without either.
source scripts/gl_backend.sh
exec "$python" -m pytest -q "$@"
