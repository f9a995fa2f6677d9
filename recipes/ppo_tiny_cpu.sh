#!/usr/bin/env bash
# Hardware: any Linux x86_64 machine, no GPU (2 cores are enough); ~2-3 min start-up, then a few s per step.
# PPO with a critic (GAE) with verl's own trainer (v1 separate_async: one FSDP2 trainer rank over gloo holding
# the actor and the critic, two vLLM CPU replicas) on the tiny model and toy task of grpo_tiny_cpu.sh, weights
# moved by TensorHub. The preset +tensorhub_cpu=tiny_ppo is the GRPO preset plus the critic's settings.
#
#   bash recipes/ppo_tiny_cpu.sh                       # 20 steps
#   bash recipes/ppo_tiny_cpu.sh trainer.total_training_steps=5 tensorhub.verify_digests=true
set -euo pipefail
source "$(dirname "$0")/common.sh"
export VERL_PLATFORM=cpu                        # the CPU harness of dev/ (pip install -e dev/): the one setting
tensorhub_preflight                             # lists the CPU platform's patches too (the critic's among them)

WORK_DIR=${WORK_DIR:-"$(mktemp -d -t tensorhub-tiny-ppo-XXXX)"}
eval "$(tensorhub demo prepare --out "${WORK_DIR}/task")"    # MODEL_PATH, TRAIN_FILE, VAL_FILE, REWARD_FILE

export VERL_FILE_LOGGER_PATH="${WORK_DIR}/metrics.jsonl"
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}

set -x
python3 -m verl.trainer.main_ppo \
    "${TENSORHUB_ARGS[@]}" \
    +tensorhub_cpu=tiny_ppo \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    data.train_files="['${TRAIN_FILE}']" \
    data.val_files="['${VAL_FILE}']" \
    reward.custom_reward_function.path="${REWARD_FILE}" \
    trainer.default_local_dir="${WORK_DIR}/checkpoints" "$@"
