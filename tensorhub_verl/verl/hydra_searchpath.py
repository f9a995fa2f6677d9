"""A Hydra search-path plugin that puts the repository's ``conf/`` on every Hydra app's search path,
so that enabling TensorHub on verl's command line is one override: ``+tensorhub=standalone``.

Hydra discovers plugins only in the ``hydra_plugins`` namespace package; the shim there
(``hydra_plugins/tensorhub_verl_searchpath/__init__.py``) just re-exports ``TensorHubSearchPathPlugin``.
Without the shim, the same effect takes a second override: ``hydra.searchpath=[file://<repo>/conf]``.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "tensorhub_verl"


def conf_dir() -> Path | None:
    """The ``conf/`` directory next to the package (a source checkout or an editable install)."""
    candidate = Path(__file__).resolve().parents[2] / "conf"
    return candidate if (candidate / "tensorhub").is_dir() else None


class TensorHubSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        directory = conf_dir()
        if directory is not None:
            # Appended: verl's own configs and the user's --config-path keep precedence.
            search_path.append(provider=PROVIDER, path=f"file://{directory}")
