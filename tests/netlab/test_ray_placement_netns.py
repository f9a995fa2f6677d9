"""Placement on a Ray cluster across two lab hosts (one node each, in two datacenters): the hub actor by
``tensorhub.hub_placement`` (``label:``, ``resource:``) with its ``auto`` URL file, and verl's trainer and rollout
resource pools by ``tensorhub.trainer_placement`` / ``rollout_placement`` (the settings as the job's runtime
environment carries them). Each host has room for everything, so only the placement decides where it goes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tensorhub_dev.netlab.lab import Lab
from tensorhub_dev.netlab.ray_cluster import LabRayCluster
from tensorhub_dev.netlab.verl_job import ROLLOUT_HOST, TRAINER_HOST, two_dc_spec
from tensorhub_verl.settings import PLATFORM_ENV, PLATFORM_NAME

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(900)]

PROBE = Path(__file__).with_name("ray_placement_probe.py")
HUB_PLACEMENTS = (f"label:tensorhub/node={ROLLOUT_HOST}", "resource:th_hub_host")
PLACEMENT_ENV = {"TENSORHUB_TRAINER_PLACEMENT": "resource:th_trainer_host",
                 "TENSORHUB_ROLLOUT_PLACEMENT": "label:tensorhub/dc=dc1"}


def test_hub_and_verl_pools_land_where_placed(no_leftovers, tmp_path):
    # The head host offers the trainer's resource, the other host the hub's: none of it is where Ray would
    # start (the driver's node) by default for the hub and the rollout pool.
    resources = {TRAINER_HOST: {"th_trainer_host": 1}, ROLLOUT_HOST: {"th_hub_host": 1}}
    env = {PLATFORM_ENV: PLATFORM_NAME, "RAY_AUTH_MODE": "disabled"}
    with Lab(two_dc_spec(nic_mbit=None, wan_mbit=None)) as lab, \
            LabRayCluster(lab, head=TRAINER_HOST, workers=[ROLLOUT_HOST], num_cpus=4, log_dir=tmp_path / "ray",
                          num_gpus={TRAINER_HOST: 2, ROLLOUT_HOST: 2}, resources=resources, env=env) as cluster:
        proc = lab.host(TRAINER_HOST).run([sys.executable, str(PROBE), *HUB_PLACEMENTS], timeout=600,
                                          env={**env, **PLACEMENT_ENV, "RAY_ADDRESS": cluster.address})
        rollout_ip = lab.host(ROLLOUT_HOST).ip
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(result))
    for placement in HUB_PLACEMENTS:
        hub = result["hubs"][placement]
        assert hub["host"] == ROLLOUT_HOST, (placement, hub)
        # Bound to its node's lab address (a multi-node cluster), URL in the session's file until it stops.
        assert hub["url"].startswith(f"http://{rollout_ip}:") and hub["written"] == hub["url"], hub
        assert "/tensorhub/tensorhub.probe_hub.url" in hub["url_file"] and not hub["file_left"], hub
    assert result["pools"] == {"trainer": [TRAINER_HOST] * 2, "rollout": [ROLLOUT_HOST] * 2}
