"""vLLM general plugin (entry point ``vllm.general_plugins``): prepares every vLLM process of a CPU job.

vLLM calls the plugins of that group in each of its processes (API server, engine core, workers) before a
model loads. verl starts its rollout servers itself, so this is the only hook that reaches their worker
processes. On verl's CPU platform (``VERL_PLATFORM=cpu``, which the platform passes to rollout processes)
it keeps linear weights live (``compat.prepare_worker_process``: without it verl's ``load_weights`` finds
emptied oneDNN-packed weights at the first sync). Under ``tensorhub attach-vllm`` it makes vLLM's engine core and
workers exit with their parent (``process_group.exit_with_parent_if_asked``), so a node killed outright leaves no
orphans. In every process it installs the per-request weight-version record (``version_truth``), which
records nothing until TensorHub drives the engine.
"""

from __future__ import annotations


def register() -> None:
    from tensorhub_verl.process_group import exit_with_parent_if_asked
    from tensorhub_verl.settings import cpu_platform_selected

    exit_with_parent_if_asked()
    from tensorhub_verl.vllm import version_truth

    version_truth.install()
    if cpu_platform_selected():
        from tensorhub_verl.vllm.compat import prepare_worker_process

        prepare_worker_process()
