#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the main job: `tensorhub demo`, a live GRPO run of verl's
# own trainer on this machine's CPU with TensorHub moving every version to two vLLM replicas and an elastic
# node that joins midway (a few minutes on 2 cores). `bash scripts/demo.sh ros` runs the ROS-only demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${TENSORHUB_VENV:-.venv}/bin/tensorhub" demo "$@"
