# Shared settings of the TensorHub recipes (sourced, not run). Override any variable from the environment.
# Modelled on verl's own examples (examples/grpo_trainer, verl/experimental/fully_async_policy/shell).

REPO_ROOT=${REPO_ROOT:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"}
DATA_HOME=${DATA_HOME:-"${HOME}/data"}
MODEL_PATH=${MODEL_PATH:-"${HOME}/models/Qwen2.5-0.5B-Instruct"}
TRAIN_FILE=${TRAIN_FILE:-"${DATA_HOME}/gsm8k/train.parquet"}   # python -m verl.examples... gsm8k preprocess
TEST_FILE=${TEST_FILE:-"${DATA_HOME}/gsm8k/test.parquet"}

NGPUS_PER_NODE=${NGPUS_PER_NODE:-8}
N_GPUS_ROLLOUT=${N_GPUS_ROLLOUT:-4}                             # standalone rollout GPUs
N_GPUS_TRAINING=${N_GPUS_TRAINING:-$((NGPUS_PER_NODE - N_GPUS_ROLLOUT))}
TRAINER_NNODES=${TRAINER_NNODES:-1}
ROLLOUT_NNODES=${ROLLOUT_NNODES:-1}

# TensorHub on: the package's Hydra configs (tensorhub_verl/conf/; the repo's conf/ links there) on Hydra's search path, plus ONE group override;
# the CPU recipes' presets (+tensorhub_cpu=...) come from the CPU harness of the developer tools (dev/tensorhub_dev/verl_cpu/conf/).
# With the hydra_plugins search-path shims installed (the package's, and dev/'s), TENSORHUB_SEARCHPATH can be left empty.
TENSORHUB_PROFILE=${TENSORHUB_PROFILE:-standalone}               # standalone | elastic | cross_dc
TENSORHUB_SEARCHPATH=${TENSORHUB_SEARCHPATH-"hydra.searchpath=[pkg://verl.trainer.config,file://${REPO_ROOT}/tensorhub_verl/conf,file://${REPO_ROOT}/dev/tensorhub_dev/verl_cpu/conf]"}
TENSORHUB_ARGS=(${TENSORHUB_SEARCHPATH} "+tensorhub=${TENSORHUB_PROFILE}")

# Fail before Ray starts if the installed verl does not take our patches (prints one line per patch).
tensorhub_preflight() {
    python "${REPO_ROOT}/patches/verl/apply_patches.py" --check
}

export HYDRA_FULL_ERROR=1
export VLLM_USE_V1=1
