"""Deltas end to end through a real hub and real data planes: a reader that holds version N-1 reads only the
delta, applies it in place and holds N exactly; one without N-1 reads N in full; the delta form is listed,
served onward by the readers that fetched it, and counted in the hub's metrics."""


import tensorhub_verl as th
from tensorhub_verl.ros.wire.delta_form import delta_layout

from tests.ros.delta_roles import CHUNK, digest, same_tensors as _same, versions


def test_a_reader_holding_the_base_reads_only_the_delta_and_holds_the_version_exactly(hub):
    v1, v2 = versions(2)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "r1") as r1:
        trainer.publish("policy", 1, v1)
        into = r1.manifest("policy", 1).allocate()
        r1.fetch("policy", 1, into=into)
        trainer.publish("policy", 2, v2)
        published = trainer.publish_delta("policy", 2, 1)
        assert published.published and published.layout == delta_layout("hf", 1) == "delta/hf@1"
        assert published.bytes < published.version_bytes / 3
        assert 0 < published.changed_fraction < 0.05

        stats = r1.fetch("policy", 2, into=into, have=1)
        assert _same(into, v2)
        assert stats.delta.used and stats.delta.fallback_chunks == 0 and not stats.delta.reasons
        assert stats.bytes == stats.delta.delta_bytes == published.bytes  # the delta form only
        assert stats.delta.changed_fraction == published.changed_fraction
        # each chunk's base digested once: ahead, while the delta was on the wire, or on landing
        chunks = len(r1.manifest("policy", 2).chunks())
        assert stats.delta.base_digests_ahead + stats.delta.landed_digests == chunks
        # r1 holds v2 (from the delta) and the delta form; it no longer serves v1 from these buffers.
        assert r1.versions("policy", "hf") == {1: ["trainer"], 2: ["r1", "trainer"]}
        assert r1.versions("policy", "delta/hf@1") == {2: ["r1", "trainer"]}
        layouts = {(v["version"], v["layout"]) for v in r1.status()["models"]["policy"]}
        assert (2, "delta/hf@1") in layouts
        assert hub.state.metrics_snapshot()["delta_bytes"] == {"policy": published.bytes}


def test_a_second_reader_reads_the_delta_from_a_nearer_reader_that_applied_it(hub):
    v1, v2 = versions(2)
    with th.connect(hub.url, "trainer", "dc=dc0,rack=r0,node=t", chunk_bytes=CHUNK) as trainer, \
            th.connect(hub.url, "r1", "dc=dc0,rack=r1,node=a") as r1, \
            th.connect(hub.url, "r2", "dc=dc0,rack=r1,node=a") as r2:
        trainer.publish("policy", 1, v1)
        trainer.publish("policy", 2, v2)
        trainer.publish_delta("policy", 2, 1)
        first = {n: t.clone() for n, t in v1.items()}
        r1.fetch("policy", 2, into=first, have=1)
        second = {n: t.clone() for n, t in v1.items()}
        stats = r2.fetch("policy", 2, into=second, have=1)
        assert _same(second, v2) and stats.delta.used
        assert stats.sources == {"r1": stats.bytes}  # same node as r2: the trainer's copy is farther


def test_a_reader_without_the_base_or_without_a_delta_reads_the_version_in_full(hub):
    v1, v2, v3 = versions(3)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "r1") as r1:
        for version, weights in enumerate((v1, v2, v3), start=1):
            trainer.publish("policy", version, weights)
        trainer.publish_delta("policy", 3, 2)
        joiner = r1.fetch("policy", 3)  # no base: in full, as before
        assert joiner.delta is None and digest(joiner.buffers) == digest(v3)
        r1.unpublish("policy", 3)
        into = {n: t.clone() for n, t in v1.items()}
        stats = r1.fetch("policy", 3, into=into, have=1)  # no delta from v1: no chains, in full
        assert _same(into, v3) and not stats.delta.used
        assert stats.delta.reasons == ["no delta from v1 to v3 is published"]
        assert stats.bytes == stats.delta.fallback_bytes == sum(t.nbytes for t in v3.values())


def test_auto_publishes_no_delta_larger_than_the_version_and_on_does(hub):
    v1 = versions(1)[0]
    v2 = {name: (t + 1 if t.is_floating_point() else t + 1) for name, t in v1.items()}  # every element changes
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer:
        trainer.publish("policy", 1, v1)
        trainer.publish("policy", 2, v2)
        auto = trainer.publish_delta("policy", 2, 1)
        assert not auto.published and "no smaller" in auto.reason
        assert trainer.versions("policy", "delta/hf@1") == {}
        forced = trainer.publish_delta("policy", 2, 1, mode="on")
        assert forced.published and forced.changed_fraction > 0.9
        assert trainer.versions("policy", "delta/hf@1") == {2: ["trainer"]}


def test_row_shards_each_publish_the_delta_of_their_rows_and_a_reader_applies_every_part(hub):
    v1, v2 = versions(2, rows=64)
    specs = {name: (t.shape, t.dtype) for name, t in v1.items()}

    def rows(weights, rank):
        return {n: (t if t.dim() == 0 else t[slice(*th.row_range(t.shape[0], rank, 2))]).clone()
                for n, t in weights.items()}

    ranks = [th.connect(hub.url, f"t{r}", chunk_bytes=CHUNK) for r in range(2)]
    try:
        pieces = [[rows(v, r) for r in range(2)] for v in (v1, v2)]
        for version in (1, 2):
            for r, client in enumerate(ranks):
                client.publish_shard("policy", version, pieces[version - 1][r], specs=specs, rank=r, ranks=2)
        parts = [client.publish_delta("policy", 2, 1) for client in ranks]
        assert [p.layout for p in parts] == ["delta/hf@1:0of2", "delta/hf@1:1of2"]
        assert all(p.published for p in parts)
        with th.connect(hub.url, "r1") as r1:
            into = {n: t.clone() for n, t in v1.items()}
            stats = r1.fetch("policy", 2, into=into, have=1)
            assert _same(into, v2) and stats.delta.used and stats.delta.fallback_chunks == 0
            assert stats.bytes == sum(p.bytes for p in parts)
            assert stats.delta.changed_elements == sum(p.changed_elements for p in parts) > 0
            assert r1.versions("policy", "delta/hf@1:1of2") == {2: ["r1", "t1"]}
    finally:
        for client in ranks:
            client.close()


def test_delta_off_reads_in_full_and_hold_false_serves_neither_form(hub):
    v1, v2 = versions(2)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "r1") as r1, \
            th.connect(hub.url, "r2") as r2:
        trainer.publish("policy", 1, v1)
        trainer.publish("policy", 2, v2)
        trainer.publish_delta("policy", 2, 1)
        into = {n: t.clone() for n, t in v1.items()}
        off = r1.fetch("policy", 2, into=into, have=1, delta="off")
        assert _same(into, v2) and not off.delta.used and off.bytes == sum(t.nbytes for t in v2.values())
        into = {n: t.clone() for n, t in v1.items()}
        quiet = r2.fetch("policy", 2, into=into, have=1, hold=False)
        assert _same(into, v2) and quiet.delta.used
        assert r2.versions("policy", "delta/hf@1") == {2: ["trainer"]}
        assert r2.versions("policy", "hf")[2] == ["r1", "trainer"]
