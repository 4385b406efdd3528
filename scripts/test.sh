#!/usr/bin/env bash
# The Themis test suite (the README's test command; .ci/run calls it too).
#   scripts/test.sh                 # everything, slow end-to-end runs included
#   scripts/test.sh -m "not slow"   # the quick unit tests only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="python3"
[ -x .venv/bin/python ] && python=.venv/bin/python
# Headless MuJoCo rendering: EGL on NVIDIA machines, OSMesa (software) elsewhere.
if [ -z "${MUJOCO_GL:-}" ]; then
  # EGL on NVIDIA machines that have libEGL (GPU containers often lack it), else OSMesa
  if [ -e /dev/nvidia0 ] && ldconfig -p 2>/dev/null | grep -q 'libEGL\.so\.1'; then
    export MUJOCO_GL=egl
  else
    export MUJOCO_GL=osmesa
  fi
fi
exec "$python" -m pytest -q "$@"
