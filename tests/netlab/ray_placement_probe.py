"""Run inside a lab host against a multi-node Ray cluster (``RAY_ADDRESS``): places the hub actor by each form of
``tensorhub.hub_placement`` and verl's resource pools by ``TENSORHUB_*_PLACEMENT``, and prints, as one JSON
line, the ``tensorhub/node`` label of the node each landed on. Used by test_ray_placement_netns.py."""

from __future__ import annotations

import json
import os
import sys

import ray

from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.hub_actor import ensure_hub, stop_hub


def _host_of(node_id: str) -> str | None:
    return next((n.get("Labels", {}).get("tensorhub/node") for n in ray.nodes() if n["NodeID"] == node_id), None)


def hub(placement: str) -> dict:
    """Where a hub actor placed by ``placement`` runs, its URL file (``auto``) while up, and after it stops."""
    cfg = TensorHubVerlConfig(hub_placement=placement, hub_url_file="auto", allow_plain_http=True,
                              hub_actor_name="probe_hub")
    url = ensure_hub(cfg)
    actor = ray.get_actor(cfg.hub_actor_name, namespace=cfg.hub_namespace)
    node = ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=60)
    url_file = ray.get(actor.url_file.remote(), timeout=60)
    with open(url_file) as f:
        written = f.read().strip()
    ray.get(actor.stop.remote(), timeout=60)
    stop_hub(cfg.hub_actor_name, cfg.hub_namespace)
    return {"host": _host_of(node), "url": url, "url_file": url_file, "written": written,
            "file_left": os.path.exists(url_file)}


def pool(name_prefix: str) -> list[str | None]:
    """The hosts of the bundles of verl's resource pool ``name_prefix`` (two bundles, packed where Ray can)."""
    from ray.util.placement_group import remove_placement_group

    from verl.single_controller.ray.base import RayResourcePool

    rp = RayResourcePool(process_on_nodes=[2], use_gpu=True, name_prefix=name_prefix, max_colocate_count=1)
    pgs = rp.get_placement_groups(strategy="PACK")
    try:
        table = ray.util.placement_group_table(pgs[0])
        return [_host_of(table["bundles_to_node_id"][i]) for i in range(2)]
    finally:
        for pg in pgs:
            remove_placement_group(pg)


def main() -> None:
    ray.init(log_to_driver=False)
    hubs = {placement: hub(placement) for placement in sys.argv[1:]}
    pools = {"trainer": pool("global_pool"), "rollout": pool("rollout_pool_0")}
    print(json.dumps({"hubs": hubs, "pools": pools}))


if __name__ == "__main__":
    main()
