"""TensorHub for verl: scalable, elastic weight transfer from RL trainers to rollout engines.

    import tensorhub_verl as th
    hub = th.start_hub()                                   # embedded hub
    c = th.connect(hub.url, worker="trainer-0", location={"dc": "dc0", "rack": "r0", "node": "n0"})
    c.publish("policy", 7, tensors)                        # held live, not copied
    stats = c.fetch("policy", "latest", into=buffers)      # from the nearest holders

Names are imported on first use, so `tensorhub status` and verl's plugin loading stay light.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from tensorhub_verl import errors

__version__ = "0.1.0"

_EXPORTS = {
    "Client": "tensorhub_verl.ros.client.client",
    "ClientConfig": "tensorhub_verl.ros.client.config",
    "connect": "tensorhub_verl.ros.client.connect",
    "FetchStats": "tensorhub_verl.ros.client.fetcher",
    "HubServer": "tensorhub_verl.ros.hub.server",
    "start_hub": "tensorhub_verl.ros.hub.server",
    "HubConfig": "tensorhub_verl.ros.hub.config",
    "Manifest": "tensorhub_verl.ros.wire.manifest",
    "OwnerRule": "tensorhub_verl.ros.hub.ownership",
    "TensorSpec": "tensorhub_verl.ros.wire.manifest",
    "row_range": "tensorhub_verl.ros.wire.manifest",
    "shard_chunks": "tensorhub_verl.ros.wire.manifest",
    "PlannerConfig": "tensorhub_verl.ros.hub.planner",
    "LinkCapacities": "tensorhub_verl.ros.wire.topology",
    "Location": "tensorhub_verl.ros.wire.topology",
}

__all__ = ["errors", *_EXPORTS]

if TYPE_CHECKING:
    from tensorhub_verl.ros.client.client import Client
    from tensorhub_verl.ros.client.config import ClientConfig
    from tensorhub_verl.ros.client.connect import connect
    from tensorhub_verl.ros.client.fetcher import FetchStats
    from tensorhub_verl.ros.hub.server import HubServer, start_hub
    from tensorhub_verl.ros.hub.config import HubConfig
    from tensorhub_verl.ros.wire.manifest import Manifest, TensorSpec, row_range, shard_chunks
    from tensorhub_verl.ros.hub.ownership import OwnerRule
    from tensorhub_verl.ros.hub.planner import PlannerConfig
    from tensorhub_verl.ros.wire.topology import LinkCapacities, Location


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorhub_verl' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
