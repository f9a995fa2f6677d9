"""Pure parts: config validation, the buffer ring, identities, metric aggregation."""

from __future__ import annotations

import pytest
import torch

from tensorhub_verl.errors import ConfigError, VersionNotFound
from tensorhub_verl.verl.config import TensorHubVerlConfig
from tensorhub_verl.verl.identity import is_trainer_worker, make_identity
from tensorhub_verl.verl.metrics import update_metrics
from tensorhub_verl.vllm.results import UpdateResult
from tensorhub_verl.verl.staging import BufferRing


@pytest.mark.parametrize("values, message", [
    ({"staging": "disk"}, "staging must be one of"),
    ({"keep_versions": 0}, "keep_versions must be >= 1"),
    ({"hub_address": "127.0.0.1:80"}, "http"),
    ({"hub_address": "http://h:1,http://h:2"}, "names several hub shards"),
    ({"location": {"zone": "a"}}, "unknown label"),
    ({"link_capacities": {"wan_gbps": 0}}, "wan_gbps must be > 0"),
    ({"min_replica_fraction": 0.0}, "min_replica_fraction"),
    ({"keep_version": 2}, "unknown tensorhub config key"),
    ({"chunk_mb": "big"}, "chunk_mb must be a number"),
    ({"keep_versions": 2.5}, "keep_versions must be an integer"),
    ({"seeds_per_dc": 0}, "seeds_per_dc must be >= 1"),
    ({"seeds_per_dc": "2"}, "seeds_per_dc must be >= 1"),
    ({"token": "s", "hub_address": "http://10.0.0.7:7777"}, "in clear.*allow_plain_http=true"),
    ({"allow_plain_http": "yes"}, "allow_plain_http must be true or false"),
    ({"window": 0}, "window must be in"),
    ({"hub_max_restarts": -2}, "hub_max_restarts must be an integer >= -1"),
    ({"hub_regions": "dc0/r0,dc0/r1", "hub_address": "http://h:1"}, "set one of them"),
    ({"hub_regions": "a/b/c/d"}, "not REGION=URL"),
    ({"hub_address": "dc0/r0=h:1,dc0/r1=http://h:2"}, "http"),
    ({"relay_fanout": -1}, "relay_fanout must be an integer >= 0"),
    ({"token": "s", "hub_address": "dc0/r0=http://127.0.0.1:1,dc0/r1=http://10.0.0.7:2"}, "in clear to http://10.0"),
])
def test_bad_config_names_the_field(values, message):
    with pytest.raises(ConfigError, match=message):
        TensorHubVerlConfig.from_mapping(values)


@pytest.mark.parametrize("values", [
    {"token": "s", "hub_address": "http://127.0.0.1:7777"},
    {"token": "s", "hub_address": "https://hub.example:7777"},
    {"token": "s", "hub_address": "http://10.0.0.7:7777", "allow_plain_http": True},
    {"hub_address": "http://10.0.0.7:7777"},
])
def test_a_token_may_go_to_loopback_tls_or_an_allowed_plain_hub(values):
    assert TensorHubVerlConfig.from_mapping(values).client_settings()["allow_plain_http"] == values.get(
        "allow_plain_http", False)


@pytest.mark.parametrize("values, seeds", [
    ({}, 1),
    ({"link_capacities": {"nic_gbps": 200, "wan_gbps": 100}}, 1),
    ({"link_capacities": {"nic_gbps": 200, "wan_gbps": 800}}, 4),
    ({"link_capacities": {"nic_gbps": 200, "wan_gbps": 800}, "seeds_per_dc": 2}, 2),
])
def test_wan_seeds_are_sized_from_link_capacities_unless_set(values, seeds):
    assert TensorHubVerlConfig.from_mapping(values).wan_seeds() == seeds


def test_a_hub_of_regions_reaches_every_workers_client():
    """``tensorhub.hub_regions`` (the job's hub actor serves regions) or a REGION=URL list in ``hub_address``:
    workers connect with the list (``connect`` gives a ``RegionalClient``), relays as configured."""
    from tensorhub_verl.ros.client.config import ClientConfig

    spec = "dc0/r0=http://127.0.0.1:1,dc0/r1=http://127.0.0.1:2"
    listed = TensorHubVerlConfig.from_mapping({"hub_address": spec, "relay_fanout": 2})
    assert listed.uses_regions() and ClientConfig.from_fields(**listed.client_settings()).fetch.relay_fanout == 2
    assert TensorHubVerlConfig.from_mapping({"hub_regions": 4}).uses_regions()
    assert not TensorHubVerlConfig.from_mapping({"hub_address": "http://127.0.0.1:1"}).uses_regions()


def test_config_from_omegaconf():
    from omegaconf import OmegaConf

    cfg = TensorHubVerlConfig.from_mapping(OmegaConf.create({"location": {"dc": "dc1"}, "keep_versions": 3}))
    assert cfg.location == {"dc": "dc1"} and isinstance(cfg.location, dict) and cfg.chunk_bytes == 8 << 20


def test_chunk_and_window_reach_every_workers_client():
    """``tensorhub.chunk_mb`` and ``tensorhub.window`` from verl's config are what trainer ranks and engines connect
    with (``client_settings`` feeds both), and the client accepts them."""
    from tensorhub_verl.ros.client.config import ClientConfig

    settings = TensorHubVerlConfig.from_mapping({"chunk_mb": 32, "window": 16}).client_settings()
    cfg = ClientConfig.from_fields(**settings)
    assert (cfg.publish.chunk_bytes, cfg.fetch.window) == (32 << 20, 16)


def test_ring_unpublishes_oldest_before_reuse_and_tolerates_retention_drops():
    dropped = []

    def unpublish(v):
        dropped.append(v)
        if v == 2:
            raise VersionNotFound("already released by the hub")

    ring = BufferRing(2, unpublish)
    for v in (1, 2, 3, 4):
        slot = ring.acquire()
        slot.buffers = {"w": torch.full((2,), float(v))}
        ring.commit(slot, v)
    assert dropped == [1, 2] and sorted(ring.held()) == [3, 4]
    assert ring.get(3).buffers["w"][0].item() == 3.0
    with pytest.raises(ConfigError, match="already held"):
        ring.commit(ring.acquire(), 4)


def test_identities_and_trainer_sources():
    a = make_identity(role="actor", rank=0, job="ray:01", location={"dc": "d"})
    r = make_identity(role="rollout", rank=1, replica=3, job="ray:01")
    assert (a.worker, r.worker) == ("ray-01-actor-0", "ray-01-rollout-3-1")
    assert is_trainer_worker(a.worker) and is_trainer_worker(a.worker + "~cpu") and not is_trainer_worker(r.worker)
    # the whole id decides, not a substring: a rollout of a job whose tag holds "-actor-" is a peer
    peer = make_identity(role="rollout", rank=0, replica=0, job="my-actor-job").worker
    assert not is_trainer_worker(peer) and not is_trainer_worker(a.worker + "/rank1")
    with pytest.raises(ConfigError):
        make_identity(role="rollout", rank=0, job="j")


def test_metrics_split_peer_bytes_and_lag():
    updates = [UpdateResult(version=5, applied=True, bytes=100, pull_s=1.0, sources={"j-actor-0": 100}),
               UpdateResult(version=5, applied=True, bytes=100, pull_s=2.0,
                            sources={"j-actor-0": 25, "j-rollout-0-0": 75}, preserved_bytes=64)]
    m = update_metrics(version=5, publish=[{"tensorhub/publish_s": 0.5}, {}], updates=updates,
                       stalls={0: 0.1, 1: 0.3}, served={0: 5, 1: 5, 2: 3})
    assert m["tensorhub/bytes"] == 200 and m["tensorhub/sources_peer_fraction"] == 0.375
    assert m["tensorhub/pull_s"] == 2.0 and m["tensorhub/stall_s"] == 0.3
    assert m["tensorhub/version_lag"] == 2 and m["tensorhub/replicas_updated"] == 2
    assert m["tensorhub/publish_s"] == 0.5
    assert m["tensorhub/preserved_bytes"] == 64  # one replica copied the old version to CPU in its pause


def test_metrics_report_deltas_their_fallbacks_and_the_bytes_that_crossed_each_wan():
    from tensorhub_verl.vllm.results import ApplyResult, DeltaOutcome

    def rank(worker, dc, delta, sources):
        return ApplyResult(worker=worker, version=7, applied=True, bytes=sum(sources.values()), sources=sources,
                           delta=delta, dc=dc, wan_bytes=sources.get("j-actor-0", 0) if dc == "dc1" else 0)

    clean = DeltaOutcome(base_version=6, used=True, delta_bytes=40, changed_fraction=0.02, full_chunks=1,
                         full_bytes=8)  # a TP rank: one chunk its slices cannot check, read in full by design
    fell_back = DeltaOutcome(base_version=6, used=True, delta_bytes=40, changed_fraction=0.03, fallback_chunks=2,
                             fallback_bytes=16, reasons=["chunk 3: base digest differs"])
    unused = DeltaOutcome(base_version=6, used=False, fallback_chunks=8, fallback_bytes=100,
                          reasons=["no delta from v6 to v7 is published"])
    replicas = [UpdateResult.of_ranks([rank("j-rollout-0-0", "dc0", clean, {"j-actor-0": 40})], 1.0),
                UpdateResult.of_ranks([rank("j-rollout-1-0", "dc1", fell_back, {"j-actor-0": 40, "j-rollout-2-0": 16})],
                                      1.0),
                UpdateResult.of_ranks([rank("j-rollout-2-0", "dc1", None, {"j-rollout-1-0": 100})], 1.0),
                UpdateResult.of_ranks([rank("j-rollout-3-0", "dc0", unused, {"j-actor-0": 100})], 1.0)]
    m = update_metrics(version=7, publish=[{"tensorhub/publish_delta_bytes": 40.0}], updates=replicas,
                       stalls={0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1}, served={0: 7, 1: 7, 2: 7, 3: 7})
    assert m["tensorhub/delta_bytes"] == 80 and m["tensorhub/delta_replicas"] == 2
    assert m["tensorhub/changed_fraction"] == 0.03 and m["tensorhub/delta_fallbacks"] == 10
    # read in full by design (8), re-read after a failed check (16), read in full because no delta could be used
    # (100); replica 2 held no base and tried no delta
    assert m["tensorhub/delta_full_bytes"] == 124
    # Only dc1's read from the trainer in dc0 crossed a WAN.
    assert m["tensorhub/wan_bytes"] == 40 and m["tensorhub/wan_bytes/dc1"] == 40 and "tensorhub/wan_bytes/dc0" not in m
    assert m["tensorhub/publish_delta_bytes"] == 40


def test_delta_setting_is_checked():
    from tensorhub_verl.verl.config import TensorHubVerlConfig

    assert TensorHubVerlConfig().delta == "auto"
    with pytest.raises(ConfigError, match="tensorhub.delta must be one of"):
        TensorHubVerlConfig(delta="always")
