#!/usr/bin/env bash
# GRPO, Qwen2.5-0.5B-Instruct, GSM8K, verl v1 separate_async trainer (trainer and rollout on separate GPUs)
# with TensorHub weight transfer: rollouts keep generating while each new version streams in.
# Hardware: one node with 8 NVIDIA GPUs (4 train, 4 rollout; N_GPUS_ROLLOUT and NGPUS_PER_NODE change it).
# Last run on: no GPU yet (checked line by line against verl 0.9.1's GPU defaults, docs/gpu.md).
# No GPU? recipes/grpo_tiny_cpu.sh runs the same trainer mode on CPU (VERL_PLATFORM=cpu, +tensorhub_cpu=tiny_grpo).
set -xeuo pipefail
source "$(dirname "$0")/common.sh"
tensorhub_preflight

PARAMETER_SYNC_STEP=${PARAMETER_SYNC_STEP:-2}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-32}
TRAIN_BATCH_SIZE=$((PARAMETER_SYNC_STEP * PPO_MINI_BATCH_SIZE))   # separate_async asserts this equality

python3 -m verl.trainer.main_ppo \
    "${TENSORHUB_ARGS[@]}" \
    trainer.use_v1=True \
    trainer.v1.trainer_mode=separate_async \
    trainer.v1.separate_async.num_warmup_batches=1 \
    trainer.v1.separate_async.parameter_sync_step=${PARAMETER_SYNC_STEP} \
    transfer_queue.enable=True \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="['${TRAIN_FILE}']" \
    data.val_files="['${TEST_FILE}']" \
    data.train_batch_size=${TRAIN_BATCH_SIZE} \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.hybrid_engine=False \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=${PPO_MINI_BATCH_SIZE} \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.nnodes=${ROLLOUT_NNODES} \
    actor_rollout_ref.rollout.n_gpus_per_node=${N_GPUS_ROLLOUT} \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    trainer.logger='["console"]' \
    trainer.project_name=tensorhub_verl \
    trainer.experiment_name=grpo_qwen2.5_0.5b_separate_async_tensorhub \
    trainer.nnodes=${TRAINER_NNODES} \
    trainer.n_gpus_per_node=${N_GPUS_TRAINING} \
    trainer.val_before_train=False \
    trainer.save_freq=-1 \
    trainer.test_freq=-1 \
    trainer.total_training_steps=${TOTAL_TRAINING_STEPS:-50} "$@"
