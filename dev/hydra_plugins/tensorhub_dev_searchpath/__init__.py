"""Hydra discovers SearchPathPlugins under the `hydra_plugins` namespace: this one adds the CPU harness's presets
(`dev/tensorhub_dev/verl_cpu/conf/`) so that `+tensorhub_cpu=tiny_grpo` needs no hydra.searchpath override."""

from tensorhub_dev.verl_cpu.hydra_searchpath import CpuPresetsSearchPathPlugin

__all__ = ["CpuPresetsSearchPathPlugin"]
