#!/usr/bin/env bash
# Elastic rollout node: a vLLM engine with dummy weights that fetches the newest version of a model through
# TensorHub (from peer engines when they hold it), follows newer versions, and serves the OpenAI API.
#
#   TENSORHUB_HUB=http://10.0.0.1:7070 TENSORHUB_DC=dc0 TENSORHUB_RACK=r1 TENSORHUB_NODE=n7 \
#       scripts/attach_vllm_node.sh --model-dir /models/qwen2-0.5b --port 8000
#
# Environment:
#   TENSORHUB_HUB, TENSORHUB_TOKEN        hub URL and token (read by attach-vllm wherever --hub/--token are absent)
#   TENSORHUB_DC, TENSORHUB_RACK, TENSORHUB_NODE
#                                         this node's location, passed as --location unless one is given;
#                                         TENSORHUB_NODE defaults to the host name when DC or RACK is set
#   PYTHON                                interpreter used when no `tensorhub` command is on PATH (python3)
# Every argument goes to `tensorhub attach-vllm` (see `--help`); arguments after `--` go to `vllm serve`.
# On a CPU-only host it sets the defaults vLLM's CPU build needs (float32 is chosen by attach-vllm itself).
# SIGTERM/SIGINT reach attach-vllm directly (exec): it unpublishes and leaves the hub before the engine stops.
set -euo pipefail

want_help=0
has_location=0
has_hub=0
for arg in "$@"; do
  case "$arg" in
    --) break ;;
    -h|--help) want_help=1 ;;
    --location|--location=*) has_location=1 ;;
    --hub|--hub=*) has_hub=1 ;;
  esac
done

if [[ $want_help == 0 && $has_hub == 0 && -z "${TENSORHUB_HUB:-}" ]]; then
  echo "attach_vllm_node.sh: set TENSORHUB_HUB (or pass --hub URL)" >&2
  exit 2
fi

location_args=()
if [[ $has_location == 0 && -n "${TENSORHUB_DC:-}${TENSORHUB_RACK:-}${TENSORHUB_NODE:-}" ]]; then
  loc=()
  [[ -n "${TENSORHUB_DC:-}" ]] && loc+=("dc=${TENSORHUB_DC}")
  [[ -n "${TENSORHUB_RACK:-}" ]] && loc+=("rack=${TENSORHUB_RACK}")
  loc+=("node=${TENSORHUB_NODE:-$(hostname -s)}")
  location_args=(--location "$(IFS=,; echo "${loc[*]}")")
fi

export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export VLLM_NO_USAGE_STATS="${VLLM_NO_USAGE_STATS:-1}"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
fi

# the location goes first, so that arguments after `--` stay last
if command -v tensorhub >/dev/null 2>&1; then
  exec tensorhub attach-vllm "${location_args[@]}" "$@"
fi
exec "${PYTHON:-python3}" -m tensorhub_verl.cli attach-vllm "${location_args[@]}" "$@"
