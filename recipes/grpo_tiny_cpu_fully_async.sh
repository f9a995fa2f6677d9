#!/usr/bin/env bash
# Hardware: any Linux x86_64 machine, no GPU (2 cores are enough); ~2-3 min start-up, then a few s per step.
# GRPO under verl's fully async policy (its own entry point: rollouter and trainer as separate Ray actors, one
# FSDP2 trainer rank over gloo, two vLLM CPU replicas) on the tiny model and toy task of grpo_tiny_cpu.sh,
# weights moved by TensorHub after every trainer step. The preset +tensorhub_cpu=tiny_grpo_fully_async is the
# GRPO preset plus fully_async's settings; the run length is counted in prompts (8 per trainer step).
#
#   bash recipes/grpo_tiny_cpu_fully_async.sh                         # 20 trainer steps (160 prompts)
#   bash recipes/grpo_tiny_cpu_fully_async.sh rollout.total_rollout_steps=24 tensorhub.verify_digests=true
set -euo pipefail
source "$(dirname "$0")/common.sh"
export VERL_PLATFORM=cpu                        # the CPU harness of dev/ (pip install -e dev/): the one setting
tensorhub_preflight                             # lists the CPU platform's patches too

WORK_DIR=${WORK_DIR:-"$(mktemp -d -t tensorhub-tiny-async-XXXX)"}
eval "$(tensorhub demo prepare --out "${WORK_DIR}/task")"    # MODEL_PATH, TRAIN_FILE, VAL_FILE, REWARD_FILE

# The rollouter and the trainer both log to this file (verl's file logger, patched to append).
export VERL_FILE_LOGGER_PATH="${WORK_DIR}/metrics.jsonl"
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}

set -x
python3 -m verl.experimental.fully_async_policy.fully_async_main \
    "${TENSORHUB_ARGS[@]}" \
    +tensorhub_cpu=tiny_grpo_fully_async \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    data.train_files="['${TRAIN_FILE}']" \
    data.val_files="['${VAL_FILE}']" \
    reward.custom_reward_function.path="${REWARD_FILE}" \
    trainer.default_local_dir="${WORK_DIR}/checkpoints" "$@"
