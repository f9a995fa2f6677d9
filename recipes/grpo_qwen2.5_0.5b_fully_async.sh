#!/usr/bin/env bash
# GRPO, Qwen2.5-0.5B-Instruct, GSM8K, verl's fully async policy (rollouter and trainer decoupled,
# partial rollout) with TensorHub. Weight sync runs every trigger_parameter_sync_step trainer steps.
# Hardware: one node with 8 NVIDIA GPUs (rollouter and trainer split them; see the n_gpus settings below).
# Last run on: no GPU yet (checked line by line against verl 0.9.1's GPU defaults, docs/gpu.md).
# No GPU? recipes/grpo_tiny_cpu.sh runs verl's trainer on CPU with TensorHub (separate_async mode).
set -xeuo pipefail
source "$(dirname "$0")/common.sh"
tensorhub_preflight

python3 -m verl.experimental.fully_async_policy.fully_async_main \
    "${TENSORHUB_ARGS[@]}" \
    data.train_files="['${TRAIN_FILE}']" \
    data.val_files="['${TEST_FILE}']" \
    data.train_batch_size=0 \
    data.gen_batch_size=1 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.return_raw_chat=True \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.actor.fsdp_config.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    trainer.logger='["console"]' \
    trainer.project_name=tensorhub_verl \
    trainer.experiment_name=grpo_qwen2.5_0.5b_fully_async_tensorhub \
    trainer.val_before_train=False \
    trainer.save_freq=-1 \
    trainer.nnodes=${TRAINER_NNODES} \
    trainer.n_gpus_per_node=${N_GPUS_TRAINING} \
    rollout.nnodes=${ROLLOUT_NNODES} \
    rollout.n_gpus_per_node=${N_GPUS_ROLLOUT} \
    rollout.total_rollout_steps=$((512 * 20)) \
    async_training.staleness_threshold=0.1 \
    async_training.trigger_parameter_sync_step=4 \
    async_training.require_batches=1 \
    async_training.partial_rollout=True "$@"
