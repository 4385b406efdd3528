#!/usr/bin/env bash
# Themis training launcher: every argument is a Hydra override, e.g.
#   ./themis_train.sh env=HalfCheetah-v5 seed=1
#   ./themis_train.sh -m seed=0,1,2        # a sweep
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/scripts/launch.sh" themis.cli.train "$@"
