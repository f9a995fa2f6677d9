"""A Hydra search-path plugin that puts TensorHub's Hydra configs (``tensorhub_verl/conf/``, package data: a
wheel ships them; the repository's top-level ``conf`` links there) on every Hydra app's search path, so that
enabling TensorHub on verl's command line is one override: ``+tensorhub=standalone``.

Hydra discovers plugins only in the ``hydra_plugins`` namespace package; the shim there
(``hydra_plugins/tensorhub_verl_searchpath/__init__.py``) just re-exports ``TensorHubSearchPathPlugin``.
Without the shim, the same effect takes a second override: ``hydra.searchpath=[file://<conf_dir()>]``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "tensorhub_verl"


def conf_dir() -> Path | None:
    """The package's ``conf/`` directory, wherever the package is imported from (a source checkout, an
    editable or a wheel install); None when it is missing."""
    candidate = Path(str(resources.files("tensorhub_verl") / "conf"))
    return candidate if (candidate / "tensorhub").is_dir() else None


class TensorHubSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        directory = conf_dir()
        if directory is not None:
            # Appended: verl's own configs and the user's --config-path keep precedence.
            search_path.append(provider=PROVIDER, path=f"file://{directory}")
