"""A Hydra search-path plugin that puts the CPU harness's presets (``conf/tensorhub_cpu/*.yaml``: ``tiny_grpo``,
``tiny_ppo``, ``tiny_grpo_fully_async``) on every Hydra app's search path, so that a CPU job on verl's command line
takes ``+tensorhub_cpu=tiny_grpo`` beside ``+tensorhub=standalone`` and no ``hydra.searchpath`` override.

The presets are developer tools (verl on a machine with no GPU), so they live here, not in the product's wheel;
the product's own plugin (``tensorhub_verl.verl.hydra_searchpath``) adds the ``+tensorhub=...`` modes. Hydra
discovers plugins only in the ``hydra_plugins`` namespace package: dev/'s shim there
(``dev/hydra_plugins/tensorhub_dev_searchpath/__init__.py``) re-exports ``CpuPresetsSearchPathPlugin``. Without
it (dev/ only on the path, not installed), the same effect takes ``hydra.searchpath=[file://<conf_dir()>]``.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "tensorhub_dev"
PRESET_GROUP = "tensorhub_cpu"
"""The Hydra group of the CPU presets: ``+tensorhub_cpu=<name>``."""


def conf_dir() -> Path:
    """The harness's ``conf/`` directory (it holds the ``tensorhub_cpu`` group), beside this module in a checkout,
    an editable or a plain install of dev/."""
    return Path(__file__).resolve().parent / "conf"


class CpuPresetsSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        # Appended: verl's own configs and the user's --config-path keep precedence.
        search_path.append(provider=PROVIDER, path=f"file://{conf_dir()}")


__all__ = ["PRESET_GROUP", "CpuPresetsSearchPathPlugin", "conf_dir"]
