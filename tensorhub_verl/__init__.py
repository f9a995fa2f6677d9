"""TensorHub for verl: scalable, elastic weight transfer from RL trainers to rollout engines.

    import tensorhub_verl as th
    hub = th.start_hub()                                   # embedded hub
    c = th.connect(hub.url, worker="trainer-0", location={"dc": "dc0", "rack": "r0", "node": "n0"})
    c.publish("policy", 7, tensors)                        # held live, not copied
    stats = c.fetch("policy", "latest", into=buffers)      # from the nearest holders
"""

from tensorhub_verl import errors
from tensorhub_verl.ros.client import Client, ClientConfig, connect
from tensorhub_verl.ros.fetcher import FetchStats
from tensorhub_verl.ros.hub_server import HubServer, start_hub
from tensorhub_verl.ros.hub_state import HubConfig
from tensorhub_verl.ros.manifest import Manifest, TensorSpec
from tensorhub_verl.ros.planner import PlannerConfig
from tensorhub_verl.ros.topology import LinkCapacities, Location

__version__ = "0.1.0"

__all__ = [
    "Client", "ClientConfig", "FetchStats", "HubConfig", "HubServer", "LinkCapacities", "Location", "Manifest",
    "PlannerConfig", "TensorSpec", "connect", "errors", "start_hub",
]
