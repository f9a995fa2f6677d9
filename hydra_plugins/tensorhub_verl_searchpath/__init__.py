"""Hydra discovers SearchPathPlugins under the `hydra_plugins` namespace: this one adds TensorHub's
`tensorhub_verl/conf/` so that `+tensorhub=standalone` is the only override a verl command line needs."""

from tensorhub_verl.verl.hydra_searchpath import TensorHubSearchPathPlugin

__all__ = ["TensorHubSearchPathPlugin"]
