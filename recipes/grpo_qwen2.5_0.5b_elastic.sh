#!/usr/bin/env bash
# Elastic GRPO: the separate_async GRPO run with +tensorhub=elastic, plus rollout nodes that attach
# mid-run from outside the Ray job. Each attached node is a vLLM engine that fetches the latest
# published version through ROS (mostly from peers), follows every newer version, and serves vLLM's
# OpenAI API: point extra agent/eval traffic at it, or stop it at any time (spot capacity).
#
#   ATTACH_HOSTS="node-a node-b" ATTACH_AFTER_S=300 bash recipes/grpo_qwen2.5_0.5b_elastic.sh
# Hardware: the separate_async recipe's 8-GPU node, plus one GPU per attached rollout node.
# Last run on: no GPU yet (checked line by line against verl 0.9.1's GPU defaults, docs/gpu.md).
# No GPU? `tensorhub demo` runs the CPU version: two replicas in the job and one elastic node joining midway.
set -euo pipefail
source "$(dirname "$0")/common.sh"
export TENSORHUB_PROFILE=elastic
export TENSORHUB_HUB_FILE=${TENSORHUB_HUB_FILE:-"${HOME}/.tensorhub_hub_url"}  # shared FS: read by attachers
ATTACH_HOSTS=${ATTACH_HOSTS:-}           # ssh-reachable hosts with this repo installed; empty: attach locally
ATTACH_COUNT=${ATTACH_COUNT:-1}
ATTACH_AFTER_S=${ATTACH_AFTER_S:-300}    # join mid-run, after a few versions were published
rm -f "${TENSORHUB_HUB_FILE}"
HUB_ARGS=()
if [[ -n "${ATTACH_HOSTS}" ]]; then
    # Remote attachers: the hub must bind where they reach it, not on a one-host Ray cluster's loopback.
    HUB_ARGS=("tensorhub.hub_host=${TENSORHUB_HUB_HOST:-$(hostname -I | awk '{print $1}')}")
fi

bash "$(dirname "$0")/grpo_qwen2.5_0.5b_separate_async.sh" tensorhub.hub_url_file="${TENSORHUB_HUB_FILE}" \
    "${HUB_ARGS[@]}" "$@" &
TRAIN_PID=$!

attach() {  # $1: host or "local", $2: index
    local hub
    hub=$(cat "${TENSORHUB_HUB_FILE}")
    local cmd="tensorhub attach-vllm --hub ${hub} --model-dir ${MODEL_PATH} --model policy --port $((8100 + $2)) \
--location dc=dc0,rack=elastic,node=${1}-${2}"
    if [[ "$1" == local ]]; then ${cmd} > "attach-$2.log" 2>&1 & else ssh "$1" "${cmd}" > "attach-$1.log" 2>&1 & fi
    echo "attached rollout node $1 #$2 to ${hub}"
}

for _ in $(seq 1 120); do [[ -s "${TENSORHUB_HUB_FILE}" ]] && break; sleep 5; done
[[ -s "${TENSORHUB_HUB_FILE}" ]] || { echo "hub URL never appeared in ${TENSORHUB_HUB_FILE}" >&2; exit 1; }
sleep "${ATTACH_AFTER_S}"
if [[ -z "${ATTACH_HOSTS}" ]]; then
    for i in $(seq 1 "${ATTACH_COUNT}"); do attach local "$i"; done
else
    i=0; for h in ${ATTACH_HOSTS}; do i=$((i + 1)); attach "$h" "$i"; done
fi
wait "${TRAIN_PID}"
