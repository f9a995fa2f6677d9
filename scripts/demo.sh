#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the main job: `tensorhub demo`, a hub, a trainer and
# several rollout processes on this machine, printing what moved, from where, how fast.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${TENSORHUB_VENV:-.venv}/bin/tensorhub" demo "$@"
