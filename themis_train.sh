#!/usr/bin/env bash
# Themis training launcher: every argument is a Hydra override, e.g.
#   ./themis_train.sh env=HalfCheetah-v5 seed=1
#   ./themis_train.sh -m seed=0,1,2        # a sweep
#   ./themis_train.sh mode=offline dataset=PATH  # offline: labels on a dataset, IQL (docs/guide/offline.md)
set -euo pipefail
for arg in "$@"; do
  # mode=offline, or resume= of an offline run's folder
  if [ "$arg" = "mode=offline" ] || { [ "${arg#resume=}" != "$arg" ] \
      && grep -qx "mode: offline" "${arg#resume=}/config.yaml" 2>/dev/null; }; then
    exec "$(dirname "${BASH_SOURCE[0]}")/scripts/launch.sh" themis.offline.main "$@"
  fi
done
exec "$(dirname "${BASH_SOURCE[0]}")/scripts/launch.sh" themis.cli.train "$@"
