#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the test suite. Extra arguments go to pytest.
# Tests that need what this machine lacks (root for network namespaces, a GPU) skip and say why.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
VENV=${TENSORHUB_VENV:-.venv}
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled VLLM_CPU_KVCACHE_SPACE=1
# Everything was installed, so a missing or broken verl, vLLM, Ray or NIXL is a failure, not a run of silent
# skips: checked here first with one clear message, and the suite fails collection on its own too
# (tests/requires.py; only TENSORHUB_CORE_ONLY=1, a check of the core package alone, turns them into skips).
"$VENV/bin/python" -c "import verl, vllm, ray, tensorhub_verl.ros.planes.nixl_build as n; n.nixl_api()" || {
  echo "the install is incomplete: verl, vLLM, Ray and NIXL must import (see the error above)" >&2; exit 1; }
"$VENV/bin/python" -m pytest "$@"
status=$?
if [ "$status" = 5 ]; then
  echo "pytest collected no tests: that is a failure here, not a pass" >&2
  exit 1
fi
exit "$status"
