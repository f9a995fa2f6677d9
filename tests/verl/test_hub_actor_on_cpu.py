"""The hub as a named, detached Ray actor: created once, found by name from outside, URL in a file."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
import ray

from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.hub_actor import ensure_hub, find_hub, stop_hub

pytestmark = pytest.mark.timeout(120)


def test_hub_actor_is_shared_discoverable_and_stoppable(ray_local, tmp_path):
    url_file = tmp_path / "hub_url"
    cfg = TensorHubVerlConfig(hub_actor_name="th-test-hub", hub_namespace="th-test", hub_host="127.0.0.1",
                              hub_url_file=str(url_file))
    url = ensure_hub(cfg)
    assert url.startswith("http://127.0.0.1:")
    assert ensure_hub(cfg) == url  # a second creator gets the same hub (get_if_exists)
    assert find_hub("th-test-hub", "th-test") == url  # what an attaching node does
    assert url_file.read_text().strip() == url
    assert httpx.get(f"{url}/v1/status", timeout=10).status_code == 200
    assert ensure_hub(TensorHubVerlConfig(hub_address="http://h:1")) == "http://h:1"  # configured: no actor
    assert stop_hub("th-test-hub", "th-test") is True
    with pytest.raises(Exception):
        ray.get_actor("th-test-hub", namespace="th-test")
    assert stop_hub("th-test-hub", "th-test") is False


def test_an_auto_url_file_is_named_for_the_hubs_namespace_and_removed_with_it(ray_local):
    """``hub_url_file: auto``: a file in the Ray session directory named ``<hub namespace>.<hub actor>.url`` (not
    the creating job's namespace, ``tensorhub-tests`` here), gone once the hub stops."""
    import os

    cfg = TensorHubVerlConfig(hub_actor_name="th-auto-hub", hub_namespace="th-test", hub_host="127.0.0.1",
                              hub_url_file="auto")
    url = ensure_hub(cfg)
    actor = ray.get_actor("th-auto-hub", namespace="th-test")
    path = ray.get(actor.url_file.remote(), timeout=30)
    try:
        assert path.endswith(os.path.join("tensorhub", "th-test.th-auto-hub.url"))
        with open(path) as f:
            assert f.read().strip() == url
        ray.get(actor.stop.remote(), timeout=30)
        assert not os.path.exists(path)
    finally:
        stop_hub("th-auto-hub", "th-test")


def test_a_hub_actor_off_loopback_makes_a_token_and_hands_it_and_a_job_key_through_ray(ray_local, monkeypatch):
    """Issue 22 point 13: a verl job's hub listening on the node address was open to anyone who reached it."""
    from tensorhub_verl.errors import ConfigError
    from tensorhub_verl.verl.hub_actor import job_credentials

    monkeypatch.delenv("TENSORHUB_TOKEN", raising=False)
    host = _outward_address()
    with pytest.raises(ConfigError, match="hub_tls_cert.*allow_plain_http=true"):
        ensure_hub(TensorHubVerlConfig(hub_actor_name="th-open-hub", hub_namespace="th-test", hub_host=host))
    cfg = TensorHubVerlConfig(hub_actor_name="th-open-hub", hub_namespace="th-test", hub_host=host,
                              allow_plain_http=True)
    url = ensure_hub(cfg)
    try:
        assert httpx.get(f"{url}/v1/status", timeout=10).status_code == 401  # no longer open
        token, job_key = job_credentials(cfg)
        assert token and job_key
        ok = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert ok.status_code == 200
        # The job's worker processes (Ray tasks here) get the same token and one job key, through Ray.
        assert ray.get([ray.remote(job_credentials).remote(cfg) for _ in range(2)], timeout=60) == \
            [(token, job_key)] * 2
    finally:
        stop_hub("th-open-hub", "th-test")


def _outward_address() -> str:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this picks the interface a route would use
        return s.getsockname()[0]


def test_a_killed_hub_actor_comes_back_on_its_url_and_token_and_its_holders_re_register(ray_local, monkeypatch):
    """Issue 25 item 6, the hub's host restarting: Ray restarts the hub actor's process where it was, on the same
    port (configured 0) and with the same token; a worker's holding is back at the new instance, and the restart
    count (the updater's ``tensorhub/hub_restarts``) says it happened."""
    import os
    import signal

    import torch

    from tensorhub_dev.netlab.verl_faults import HUB_PROCESS_TITLE, process_title
    from tensorhub_verl.ros.client.client import Client
    from tensorhub_verl.ros.client.config import ClientConfig
    from tensorhub_verl.verl.hub_actor import hub_restarts, job_credentials
    from tests.waits import wait_until

    monkeypatch.delenv("TENSORHUB_TOKEN", raising=False)
    cfg = TensorHubVerlConfig(hub_actor_name="th-restart-hub", hub_namespace="th-test",
                              hub_host=_outward_address(), allow_plain_http=True)
    url = ensure_hub(cfg)
    client = None
    try:
        token, job_key = job_credentials(cfg)
        client = Client(url, "trainer", token=token,
                        config=ClientConfig.from_fields(allow_plain_http=True, hub_retry_s=60, job_key=job_key))
        client.publish("policy", 1, {"w": torch.arange(1024, dtype=torch.float32)})
        assert hub_restarts(cfg) == 0
        actor = ray.get_actor("th-restart-hub", namespace="th-test")
        pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=30)
        assert process_title(pid).startswith(HUB_PROCESS_TITLE)  # how the lab's HubRestart finds it
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: hub_restarts(cfg) == 1, 90, "Ray did not restart the hub actor")
        assert find_hub("th-restart-hub", "th-test") == url  # where the job's workers know it to be
        assert job_credentials(cfg) == (token, job_key)
        ok = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert ok.status_code == 200
        # The new instance knew nothing; the trainer's client re-registered its holding on its next heartbeat.
        wait_until(lambda: client.versions("policy").get(1) == ["trainer"], 60,
                   "the holding was not re-registered with the restarted hub")
        # The job's owner rule came back with the actor's arguments: a token holder of another job publishes
        # neither the job's model nor any form of it (an adapter, a delta) on the restarted hub.
        from tensorhub_verl.errors import NotModelOwner
        from tests.ros.outsiders import Outsider

        published = client.publish("policy", 2, {"w": torch.arange(1024, dtype=torch.float32)})
        mallory = Outsider(url, token, "mallory", job_key="another-job", plane=None, allow_plain_http=True)
        try:
            for model in ("policy", "policy.lora", "policy.delta"):
                with pytest.raises(NotModelOwner):
                    mallory.publish_copy(dataclasses.replace(published, model=model, version=2**62))
        finally:
            mallory.close()
        assert client.latest("policy") == 2
    finally:
        if client is not None:
            client.close()
        stop_hub("th-restart-hub", "th-test")


def test_a_hub_actor_with_hub_regions_serves_a_hub_per_region_and_gives_the_list(ray_local):
    """``tensorhub.hub_regions``: the actor serves one hub per region and its URL is the REGION=URL list that
    ``connect`` takes (every worker then connects to its region); stopping it stops every region's hub."""
    from tensorhub_verl.ros.wire.regions import parse_regions

    cfg = TensorHubVerlConfig(hub_actor_name="th-regions-hub", hub_namespace="th-test", hub_host="127.0.0.1",
                              hub_regions="dc0/r0,dc0/r1")
    try:
        regions = parse_regions(ensure_hub(cfg))
        assert list(regions) == ["dc0/r0", "dc0/r1"] and len(set(regions.values())) == 2
        for url in regions.values():
            assert httpx.get(f"{url}/v1/status", timeout=10).status_code == 200
    finally:
        assert stop_hub("th-regions-hub", "th-test") is True
    for url in regions.values():
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/v1/status", timeout=5)
