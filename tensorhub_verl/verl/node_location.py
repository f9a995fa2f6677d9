"""Where a worker runs: location labels given once per Ray node, where the node is started.

A job spans nodes in different racks and datacenters; only the node knows where it is. Each Ray node carries
its labels, read by every worker on it:

- Ray node labels ``tensorhub/dc``, ``tensorhub/rack``, ``tensorhub/node``, ``tensorhub/gpu``:
  ``ray start --labels tensorhub/dc=dc1,tensorhub/rack=r4`` (or ``ray.init(labels=...)`` for a local cluster);
- else the node's environment, ``TENSORHUB_DC`` / ``TENSORHUB_RACK`` / ``TENSORHUB_NODE`` / ``TENSORHUB_GPU``
  set where ``ray start`` runs (Ray's workers inherit the raylet's environment; these variables are not
  forwarded from the driver, see ``runtime_env``).

A worker's location is its node's labels, then the job's ``tensorhub.location`` for the labels its node does not
give (a job-wide default), then ``node`` = the Ray node's IP address.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensorhub_verl.ros.wire.topology import LABEL_KEYS, Location, env_labels
from tensorhub_verl.verl.identity import with_default_node

RAY_LABEL_PREFIX = "tensorhub/"
"""Prefix of the Ray node labels that carry a node's location (``tensorhub/dc`` ...)."""


def from_ray_labels(labels: Mapping[str, Any] | None) -> dict[str, str]:
    """The location labels among a Ray node's labels (``tensorhub/<key>``); others are ignored."""
    found = {}
    for key in LABEL_KEYS:
        value = (labels or {}).get(RAY_LABEL_PREFIX + key)
        if isinstance(value, (list, tuple)):  # some Ray versions report a label as a list of values
            value = value[0] if value else None
        if value:
            found[key] = str(value)
    Location.parse(found)  # raises ConfigError naming a malformed label
    return found


def from_node_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The location labels in a node's environment (``TENSORHUB_DC`` ...), only those set."""
    found = env_labels(environ)
    Location.parse(found)  # raises ConfigError naming a malformed label
    return found


def node_labels(ray_labels: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A node's own labels: its Ray node labels, and for the keys they lack, its environment's."""
    return {**from_node_env(environ), **from_ray_labels(ray_labels)}


def worker_location(job_location: Mapping[str, str], node: Mapping[str, str], node_ip: str | None) -> dict[str, str]:
    """A worker's labels: its node's, then the job's defaults, then ``node`` = the node's IP."""
    return with_default_node({**job_location, **node}, node_ip)


def this_node() -> tuple[dict[str, str], str | None]:
    """(labels, IP address) of the Ray node the calling process runs on; outside Ray, its environment's labels
    and no address."""
    try:
        import ray
    except ImportError:
        return node_labels(None), None
    if not ray.is_initialized():
        return node_labels(None), None
    ip = None
    try:
        ip = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - the address is only the default of the node label
        pass
    return node_labels(ray.get_runtime_context().get_node_labels()), ip


def _actor_node(_actor: Any) -> tuple[dict[str, str], str | None]:
    """Runs inside an actor through ``__ray_call__``: that actor's node."""
    return this_node()


def actor_node(actor: Any):
    """An ObjectRef to (labels, IP address) of the node an actor runs on (Ray's ``__ray_call__``, which every
    actor has: verl's server actors need no method of ours)."""
    return actor.__ray_call__.remote(_actor_node)


__all__ = ["RAY_LABEL_PREFIX", "actor_node", "from_node_env", "from_ray_labels", "node_labels", "this_node",
           "worker_location"]
