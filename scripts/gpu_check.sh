#!/usr/bin/env bash
# The offline GPU check in one command (docs/gpu.md): installs the core's wheelhouse (.gpu_wheels/, built by
# scripts/gpu_wheels.sh on a connected machine) into a temporary folder and runs every GPU path of the core, each
# step under its own limit, the whole run within --budget-s (510 s by default); summary.json and one log per step
# go to --out (8 files at most). The host's own Python and torch run it: PYTHON=/path/to/python3 chooses another.
#   bash scripts/gpu_check.sh --out DIR                      # on the GPU host
#   bash scripts/gpu_check.sh --out DIR --device cpu --size-mb 64 --wheels DIR   # the same steps on a CPU machine
# Arguments: see `python3 scripts/gpu_check.py --help`.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
exec "$PYTHON" scripts/gpu_check.py --python "$PYTHON" "$@"
