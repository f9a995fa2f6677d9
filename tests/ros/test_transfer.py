"""Publish and fetch across real processes with real NIXL/UCX transfers; bytes compared exactly."""

import contextlib
import threading

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.errors import TransferFailed
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig

from tests.ros.roles import GatedPlane, digest, holder, make_weights, reader, wait_until

CHUNK = 256 << 10


def test_fetch_returns_the_publishers_bytes(hub, roles):
    published = roles(holder, hub.url, "trainer", 3, 4.0, CHUNK).result(120)
    with th.connect(hub.url, "reader") as client:
        buffers = client.manifest("policy", "latest").allocate()
        stats = client.fetch("policy", "latest", into=buffers)
        expected = make_weights(3, 4.0)
        for name, tensor in expected.items():
            assert torch.equal(buffers[name], tensor), name
        assert digest(buffers) == published["digest"]
        assert stats.version == 1 and stats.bytes == sum(t.nbytes for t in expected.values())
        assert stats.sources == {"trainer": stats.bytes}
        assert client.versions("policy") == {1: ["reader", "trainer"]}  # the reader holds it now
    with th.connect(hub.url, "observer") as observer:  # a closed client leaves at once, not at its timeout
        assert "reader" not in observer.status()["workers"]


def test_concurrent_readers_get_the_bytes_and_serve_each_other(hub, roles):
    published = roles(holder, hub.url, "trainer", 5, 8.0, CHUNK).result(120)
    readers = [roles(reader, hub.url, f"reader-{i}") for i in range(4)]
    for r in readers:
        r.result(120)
    for r in readers:
        r.send("go")
    outcomes = [r.result(300) for r in readers]
    assert all(o["digest"] == published["digest"] for o in outcomes)
    from_peers = sum(b for o in outcomes for w, b in o["sources"].items() if w != "trainer")
    assert from_peers > 0
    assert sum(o["sources"].get("trainer", 0) for o in outcomes) < 4 * outcomes[0]["bytes"]


def test_a_late_reader_reads_from_a_reader_still_filling(hub, roles):
    roles(holder, hub.url, "trainer", 1, 4.0, CHUNK).result(120)
    gated = GatedPlane("early-agent", hold_after=3)
    early = Client(hub.url, "early", config=ClientConfig.from_fields(window=1, max_run_chunks=1), plane=gated)
    fetch = threading.Thread(target=early.fetch, args=("policy", 1), daemon=True)
    fetch.start()
    assert gated.holding.wait(60), "the early reader never reached its 4th read"
    late = roles(reader, hub.url, "late", "latest", True, 8, 1)  # a lease per chunk: each held chunk counts
    late.result(120)
    late.send("go")
    wait_until(lambda: _served(early, "early") > 0, 60, "the late reader read nothing from the early one")
    gated.start_gate.set()
    outcome = late.result(120)
    fetch.join(60)
    assert outcome["partial_source_bytes"] > 0
    assert outcome["sources"].get("early", 0) >= 3 * CHUNK
    early.close()


def _served(client, worker):
    return client.status()["workers"].get(worker, {}).get("bytes_served", 0)


def test_unpublish_waits_for_reads_in_flight(hub):
    weights = make_weights(2, 1.0)  # fewer chunks than the window: every chunk is in flight at once
    trainer = th.connect(hub.url, "trainer", chunk_bytes=CHUNK, preserve_on_unpublish=False)
    trainer.publish("policy", 1, weights)
    gated = GatedPlane("reader-agent")
    gated.finish_gate.clear()
    reader_client = Client(hub.url, "reader", config=ClientConfig.from_fields(window=16), plane=gated)
    buffers = reader_client.manifest("policy", 1).allocate()
    fetch = threading.Thread(target=reader_client.fetch, args=("policy", 1, buffers), daemon=True)
    fetch.start()
    wait_until(lambda: trainer.status()["leases_in_flight"] > 0, 30, "the reader's reads were not in flight")
    unpublish = threading.Thread(target=trainer.unpublish, args=("policy", 1), daemon=True)
    unpublish.start()
    unpublish.join(1.5)
    assert unpublish.is_alive(), "unpublish returned while reads of its bytes were in flight"
    gated.finish_gate.set()
    unpublish.join(30)
    fetch.join(30)
    assert not unpublish.is_alive() and not fetch.is_alive()
    assert digest(buffers) == digest(weights)
    reader_client.close()
    trainer.close()


@contextlib.contextmanager
def _gated_fetch(hub_url: str, reader_config: ClientConfig):
    """A trainer holding policy v1 and a reader whose reads of it are posted but never finish (until the test
    opens ``gated.finish_gate``); the reader's fetch runs on a thread and leaves its stats or its error in
    ``outcome``. Opens the gate and closes both clients on the way out."""
    trainer = th.connect(hub_url, "trainer", chunk_bytes=CHUNK, preserve_on_unpublish=False,
                         unpublish_timeout_s=0.5)
    trainer.publish("policy", 1, make_weights(2, 1.0))
    gated = GatedPlane("reader-agent")
    gated.finish_gate.clear()
    reader_client = Client(hub_url, "reader", config=reader_config, plane=gated)
    outcome: dict = {}

    def run():
        try:
            outcome["stats"] = reader_client.fetch("policy", 1)
        except TransferFailed as e:
            outcome["error"] = e

    fetch = threading.Thread(target=run, daemon=True)
    fetch.start()
    try:
        wait_until(lambda: trainer.status()["leases_in_flight"] > 0, 30, "the reader's reads were not in flight")
        yield trainer, gated, fetch, outcome
    finally:
        gated.finish_gate.set()
        reader_client.close()
        trainer.close()


def test_a_fetch_whose_holder_never_answers_fails_at_its_fetch_timeout(hub):
    """ClientConfig.fetch_timeout_s bounds a fetch whose reads never finish (read timeout and straggler cut-off
    out of the way): TransferFailed, not a hang."""
    config = ClientConfig.from_fields(fetch_timeout_s=1.0, read_timeout_s=600, straggler_factor=0)
    with _gated_fetch(hub.url, config) as (_, _, fetch, outcome):
        fetch.join(60)
        assert not fetch.is_alive(), "the fetch did not give up at its fetch_timeout_s"
        assert "fetch timed out" in str(outcome.get("error")), outcome


def test_an_unpublish_with_reads_in_flight_fails_at_its_unpublish_timeout(hub):
    """ClientConfig.unpublish_timeout_s bounds the wait for in-flight reads: TransferFailed, not a hang. The reads
    in flight still complete (the bytes stayed put), and a later unpublish, with nothing in flight, returns."""
    weights = make_weights(2, 1.0)
    with _gated_fetch(hub.url, ClientConfig.from_fields(fetch_timeout_s=60)) as (trainer, gated, fetch, outcome):
        with pytest.raises(TransferFailed, match="timed out with"):
            trainer.unpublish("policy", 1)  # unpublish_timeout_s=0.5 from the trainer's config
        gated.finish_gate.set()
        fetch.join(60)
        assert not fetch.is_alive() and "stats" in outcome, outcome
        assert digest(outcome["stats"].buffers) == digest(weights)
        trainer.unpublish("policy", 1)


def test_a_lease_past_its_deadline_is_revoked():
    hub = th.start_hub(config=th.HubConfig(lease_ttl_s=1.5))
    try:
        trainer = th.connect(hub.url, "trainer", chunk_bytes=CHUNK, preserve_on_unpublish=False)
        trainer.publish("policy", 1, make_weights(2, 1.0))
        gated = GatedPlane("reader-agent")
        gated.finish_gate.clear()
        reader_client = Client(hub.url, "reader", config=ClientConfig.from_fields(fetch_timeout_s=30), plane=gated)
        errors = []

        def run():
            try:
                reader_client.fetch("policy", 1)
            except TransferFailed as e:
                errors.append(e)

        fetch = threading.Thread(target=run, daemon=True)
        fetch.start()
        wait_until(lambda: trainer.status()["leases_in_flight"] > 0, 30, "the reader's reads were not in flight")
        trainer.unpublish("policy", 1)  # returns once the overdue leases are revoked
        assert trainer.status()["leases_revoked"] >= 1, "unpublish returned before the overdue leases were revoked"
        gated.finish_gate.set()
        fetch.join(30)
        # Its reads were revoked, so they do not count; with no holder left the fetch fails cleanly.
        assert errors and "no holder" in str(errors[0])
        assert trainer.status()["leases_revoked"] >= 1
        assert reader_client.versions("policy") == {}
        reader_client.close()
        trainer.close()
    finally:
        hub.stop()


@pytest.mark.parametrize("progress", ["pump", "thread"])
def test_a_holder_serves_reads_in_either_progress_mode(hub, roles, progress):
    """Over TCP a holder's CPU must drive UCX: by our sleeping pump or by NIXL's own thread."""
    weights = make_weights(8, 1.0)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK, progress=progress) as trainer:
        trainer.publish("policy", 1, weights)
        late = roles(reader, hub.url, "reader")
        late.result(120)
        late.send("go")
        assert late.result(120)["digest"] == digest(weights)


def test_the_nixl_plane_declares_what_it_needs():
    from tensorhub_verl.ros.planes.base import Copy, DataPlane, Grant
    from tensorhub_verl.ros.planes.nixl import NixlPlane

    for plane in (NixlPlane("protocol-check"), GatedPlane("protocol-check-gated")):
        try:
            assert isinstance(plane, DataPlane) and plane.name == "nixl"
            assert not plane.needs_grant and plane.grant_key is None and not plane.lands_on_own_threads
            with pytest.raises(ValueError, match="takes no grant"):
                plane.start_read("nobody", [Copy(0, 0, "DRAM", 0, 0, "DRAM", 1)], Grant("1.2.ab"))
            with pytest.raises(ValueError, match="lands no reads"):
                plane.start_read("nobody", [Copy(0, 0, "DRAM", 0, 0, "DRAM", 1)], wake=threading.Event())
        finally:
            plane.close()


def test_a_seed_reads_across_the_wan_one_chunk_at_a_time_with_the_next_ones_queued(hub):
    """The hub leases a seed three WAN reads (PlannerConfig.wan_reads_per_seed); the client posts one and
    queues the others, so WAN chunks land one after another instead of together: at most the one in flight and
    the next, posted shortly before it lands (FetchSettings.wan_lead), are ever posted at once. Two queued: the
    exchange that reports a landing and brings the next WAN lease has two chunks' time to come back."""
    weights = make_weights(2, 2.0)
    with th.connect(hub.url, "trainer", "dc=dc0,rack=r0,node=t", chunk_bytes=CHUNK) as trainer:
        trainer.publish("policy", 1, weights)
        gated = GatedPlane("seed-agent")
        gated.finish_gate.clear()
        seed = Client(hub.url, "seed", "dc=dc1,rack=r0,node=s",
                      config=ClientConfig.from_fields(window=8, max_run_chunks=1),
                      plane=gated)
        outcome = {}
        fetch = threading.Thread(target=lambda: outcome.update(stats=seed.fetch("policy", 1)), daemon=True)
        fetch.start()
        wait_until(lambda: trainer.status()["leases_in_flight"] >= 3, 30, "the seed was not leased three WAN reads",
                   poll_s=0.02)
        # Counted, not timed: the fetch loop polled its read in flight 20 more times with the second lease in
        # hand, each a turn at which a wrongly posted second read would have been posted.
        polled = gated.polls
        wait_until(lambda: gated.polls >= polled + 20, 30, "the seed's fetch loop stopped polling", poll_s=0.01)
        assert trainer.status()["leases_in_flight"] == 3 and gated.reads == 1 and gated.most_in_flight == 1
        gated.finish_gate.set()
        fetch.join(60)
        stats = outcome["stats"]
        assert stats.chunks > 2 and stats.sources == {"trainer": stats.bytes}
        for name, tensor in weights.items():
            assert torch.equal(stats.buffers[name], tensor), name
        assert gated.most_in_flight <= 2, gated.most_in_flight
        seed.close()


def test_a_seed_posts_its_queued_wan_read_before_the_one_in_flight_lands(hub):
    """Once a WAN read has landed (a duration to go by), the queued one is posted shortly before the one in flight
    is due (FetchSettings.wan_lead): the WAN goes from chunk to chunk without a round trip's pause between them."""
    weights = make_weights(2, 2.0)
    with th.connect(hub.url, "trainer", "dc=dc0,rack=r0,node=t", chunk_bytes=CHUNK) as trainer:
        trainer.publish("policy", 1, weights)
        gated = GatedPlane("seed-ahead", on_read=lambda n: n == 2 and gated.finish_gate.clear())
        gated.finish_gate.clear()
        seed = Client(hub.url, "seed", "dc=dc1,rack=r0,node=s",
                      config=ClientConfig.from_fields(window=8, max_run_chunks=1),
                      plane=gated)
        outcome = {}
        fetch = threading.Thread(target=lambda: outcome.update(stats=seed.fetch("policy", 1)), daemon=True)
        fetch.start()
        wait_until(lambda: gated.reads == 1, 30, "the seed posted no WAN read", poll_s=0.02)
        # The first WAN read stays in flight for 20 polls (a duration to go by): the second is timed by it.
        wait_until(lambda: gated.polls >= 20, 30, "the seed's fetch loop stopped polling", poll_s=0.01)
        gated.finish_gate.set()  # the first lands; the second is posted and held in flight (on_read)
        wait_until(lambda: gated.reads >= 3, 30, "the queued WAN read waited for the one in flight to land",
                   poll_s=0.02)
        assert not gated.finish_gate.is_set()  # the second read is still in flight
        gated.finish_gate.set()
        fetch.join(60)
        stats = outcome["stats"]
        assert stats.sources == {"trainer": stats.bytes}
        for name, tensor in weights.items():
            assert torch.equal(stats.buffers[name], tensor), name
        seed.close()

