#!/usr/bin/env bash
# The body of ./themis_train.sh and ./themis_pretrain.sh: run a Themis entry point with the
# repository's .venv (when it exists), headless MuJoCo rendering, and every argument passed to
# Hydra as an override.
#   scripts/launch.sh themis.cli.train env=HalfCheetah-v5 seed=1
set -euo pipefail
module="$1"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${THEMIS_PYTHON:-python3}"  # THEMIS_PYTHON: another environment's interpreter
if [ -z "${THEMIS_PYTHON:-}" ] && [ -x "$root/.venv/bin/python" ]; then
  python="$root/.venv/bin/python"
fi
# Headless MuJoCo rendering (EGL, OSMesa or none): the rule of
# themis.environments.mujoco.choose_gl_backend, which scripts run without a launcher get from
# make_env.
source "$root/scripts/gl_backend.sh"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
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
# a key typo: one line in a fraction of a second, before PyTorch and Hydra load (key_check.py)
"$python" -m themis.cli.key_check "$module" ${args[@]+"${args[@]}"} || exit $?
exec "$python" -m "$module" ${args[@]+"${args[@]}"}
