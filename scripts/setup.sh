#!/usr/bin/env bash
# One set-up command for Themis on a fresh Debian/Ubuntu machine.
#
#   scripts/setup.sh            # CPU build of PyTorch (default)
#   THEMIS_TORCH=cuda scripts/setup.sh   # or: scripts/setup.sh --cuda
#
# Creates .venv in the repository root, installs PyTorch (pip), then Themis with its dev extras
# (uv, or pip where uv is unavailable).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

torch_flavour="${THEMIS_TORCH:-cpu}"
for arg in "$@"; do
  case "$arg" in
    --cuda) torch_flavour=cuda ;;
    --cpu) torch_flavour=cpu ;;
    -h|--help)
      cat <<'USAGE'
Usage: scripts/setup.sh [--cpu | --cuda]
One set-up command for Themis on a fresh Debian/Ubuntu machine: apt-installs what headless
MuJoCo rendering needs (as root, when missing), creates .venv in the repository root, installs
PyTorch, then Themis with its dev extras.
  --cpu    the CPU build of PyTorch (default)
  --cuda   the CUDA build (or: THEMIS_TORCH=cuda scripts/setup.sh)
USAGE
      exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (use --cpu or --cuda)" >&2; exit 2 ;;
  esac
done

# Headless MuJoCo rendering needs OSMesa or EGL; ffmpeg comes with imageio-ffmpeg.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  missing=()
  for pkg in libosmesa6 libegl1 libgl1; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "[setup] apt-get install ${missing[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") \
      || echo "[setup] warning: could not apt-get install ${missing[*]}; rendering may not work" >&2
  fi
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip setuptools wheel

if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  if [ "$torch_flavour" = cuda ]; then
    echo "[setup] installing PyTorch (CUDA build)"
    "${pip[@]}" install torch
  else
    echo "[setup] installing PyTorch (CPU build)"
    # A local CPU wheel is used when the machine provides one; otherwise PyTorch's CPU index.
    "${pip[@]}" install "torch==2.13.0" 2>/dev/null \
      || "${pip[@]}" install torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi

# MuJoCo 4 ships as mujoco + mujoco-core + mujoco-studio; going back to the pinned 3.3.0 (the
# version Meta-World needs, see pyproject.toml) must remove all three, or 4.0's plugins stay
if .venv/bin/python -m pip show mujoco-core >/dev/null 2>&1; then
  echo "[setup] replacing MuJoCo 4 with the pinned MuJoCo 3.3.0"
  "${pip[@]}" uninstall -y mujoco mujoco-core mujoco-studio
fi
echo "[setup] installing themis with dev extras"
# uv installs the extras' ~220 packages in parallel (pip took minutes); the PyTorch installed
# above satisfies themis's range, so uv keeps it. pip where uv cannot be had or reach PyPI.
# --compile-bytecode: pip writes .pyc files when it installs, uv only when asked; without them a
# Python that may not write bytecode (PYTHONDONTWRITEBYTECODE) compiles some 400 modules (NumPy,
# Hydra, gymnasium, ...) from source in every process it starts: 2.4 s of each run's start.
uv=(.venv/bin/python -m uv pip install --python .venv/bin/python -q --compile-bytecode)
if ! { "${pip[@]}" install uv && "${uv[@]}" -e ".[dev]"; }; then
  echo "[setup] uv failed; installing with pip"
  "${pip[@]}" install -e ".[dev]"
fi
.venv/bin/python -c "import themis, torch, gymnasium, mujoco; print(f'[setup] ok: themis {themis.__version__}, torch {torch.__version__}, gymnasium {gymnasium.__version__}, mujoco {mujoco.__version__}')"
