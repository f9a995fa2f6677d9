"""The hub as a named, detached Ray actor: created once, found by name from outside, URL in a file."""

from __future__ import annotations

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
