"""HubWatch (the elastic follower's long poll) on a real hub: no engine, no vLLM."""

import time

import httpx

import tensorhub_verl as th
from tensorhub_verl.ros.wire.messages import CREDENTIAL_HEADER
from tensorhub_verl.vllm.follow import HubWatch


def _publish(http, version, layout):
    manifest = {"model": "m", "version": version, "layout": layout, "chunk_bytes": 4096,
                "tensors": [{"name": "w", "shape": [1024], "dtype": "float32", "nbytes": 4096}],
                "chunk_digests": ["0" * 16]}
    reply = http.post("/v1/publish", json={"worker": "w", "holder": "w", "manifest": manifest,
                                           "regions": [{"addr": 4096}]})
    assert reply.status_code == 200, reply.text


def test_watch_sees_hf_versions_and_versions_only_in_engine_layouts():
    server = th.start_hub()
    http = httpx.Client(base_url=server.url, timeout=10)
    watch = HubWatch(server.url, "m", poll_s=0.2)
    try:
        joined = http.post("/v1/workers/register", json={"worker": "w", "location": {}, "agent_name": "w-agent",
                                                         "agent_metadata_b64": "AAAA"})
        http.headers[CREDENTIAL_HEADER] = joined.json()["credential"]
        assert watch.newest() is None
        polls = []
        hub_wait = watch._hub.wait
        watch._hub.wait = lambda *args: polls.append(args[-1]) or hub_wait(*args)
        assert watch.wait_newer(None, 5.0) is None
        assert polls == [0.2]  # one long poll of poll_s, never the whole timeout
        assert watch.wait_newer(None, 0.05) is None and polls[-1] == 0.1  # never a busy loop of tiny polls
        _publish(http, 1, "hf")
        assert watch.wait_newer(None, 5.0) == 1 and watch.wait_newer(0, 5.0) == 1
        assert watch.wait_newer(1, 0.1) is None
        _publish(http, 2, "vllm-tp1")  # no newer 'hf' version: the newest in any layout counts
        assert watch.newest() == 2 and watch.wait_newer(1, 0.1) == 2
    finally:
        watch.close()
        http.close()
        server.stop()


class _NoEngine:
    """The follower's engine side; a lost hub must never reach it (no version is ever offered here)."""

    def begin(self, version):
        raise AssertionError(f"the follower tried to update to v{version} without a hub")

    finish = update = begin


def test_a_hub_gone_for_longer_than_the_limit_is_reported_once_and_not_before():
    from tensorhub_verl.vllm.follow import Follower, FollowerState

    server = th.start_hub()
    lost = []
    follower = Follower(_NoEngine(), HubWatch(server.url, "m", poll_s=0.2, retry_s=0.5), FollowerState("n", "m"),
                        fetch_timeout_s=10, hub_lost_s=1.0, on_hub_lost=lambda: lost.append(time.monotonic()))
    follower.start()
    try:
        time.sleep(1.5)  # the hub answers: silence is measured from the last answer, so nothing is reported
        assert lost == []
        stopped = time.monotonic()
        server.stop()
        deadline = time.monotonic() + 30
        while not lost and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(lost) == 1 and lost[0] - stopped >= 1.0, lost
        time.sleep(3)  # further failed polls report nothing more
        assert len(lost) == 1
        assert follower.state.as_dict()["hub_lost"] and "HubUnavailable" in follower.state.last_error
    finally:
        follower.close(10)
