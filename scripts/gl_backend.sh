# Sourced by the launchers, scripts/test.sh and scripts/mutation.sh: MuJoCo's headless OpenGL
# backend, the rule of themis.environments.mujoco.choose_gl_backend. A MUJOCO_GL set by the
# user stays; else EGL on NVIDIA machines that have libEGL (GPU containers often lack it), else
# OSMesa (software) where libOSMesa is installed, else `disable`: no rendering, but training runs
# (with MUJOCO_GL=osmesa and no libOSMesa, `import dm_control` fails with a traceback).
if [ -z "${MUJOCO_GL:-}" ]; then
  _themis_libs="$(ldconfig -p 2>/dev/null || true)"
  if [ -e /dev/nvidia0 ] && grep -q 'libEGL\.so' <<<"$_themis_libs"; then
    export MUJOCO_GL=egl
  elif grep -q 'libOSMesa\.so' <<<"$_themis_libs"; then
    export MUJOCO_GL=osmesa
  else
    export MUJOCO_GL=disable
  fi
  unset _themis_libs
fi
