#!/usr/bin/env bash
# Themis pretraining launcher: every argument is a Hydra override, e.g.
#   ./themis_pretrain.sh env=HalfCheetah-v5 seed=1
#   ./themis_pretrain.sh -m seed=0,1,2        # a sweep
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="python3"
if [ -x "$here/.venv/bin/python" ]; then
  python="$here/.venv/bin/python"
fi
# Headless MuJoCo rendering: EGL on NVIDIA machines, OSMesa (software) elsewhere.
if [ -z "${MUJOCO_GL:-}" ]; then
  if [ -e /dev/nvidia0 ]; then export MUJOCO_GL=egl; else export MUJOCO_GL=osmesa; fi
fi
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
# logger=csv,tensorboard means a list, never a sweep: pass it to Hydra as logger=[csv,tensorboard]
args=()
for arg in "$@"; do
  case "$arg" in
    logger=\[*) args+=("$arg") ;;
    logger=*,*) args+=("logger=[${arg#logger=}]") ;;
    # resume=RUN_DIR: continue in that dir; the first run's .hydra/ record is kept
    resume=true|resume=false|resume=True|resume=False|resume=) args+=("$arg") ;;
    resume=*) args+=("$arg" "hydra.run.dir=${arg#resume=}" "hydra.output_subdir=null") ;;
    *) args+=("$arg") ;;
  esac
done
exec "$python" -m themis.pretrain ${args[@]+"${args[@]}"}
