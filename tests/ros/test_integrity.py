"""Per-chunk digests: a reader verifies every chunk before it reports or serves it, re-reads a bad one
elsewhere, and the bad copy is quarantined once two readers found it bad."""

import dataclasses
import time

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.errors import DigestMismatch, ManifestMismatch, TransferFailed, UnverifiedVersion
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.wire.integrity import chunk_digests
from tensorhub_verl.ros.wire.manifest import build_manifest

from tests.ros.roles import digest, holder, make_weights, tampering_holder

CHUNK = 64 << 10


def test_publishers_put_a_digest_per_chunk_in_the_manifest(hub):
    weights = make_weights(1, 0.5)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer:
        published = trainer.publish("policy", 1, weights)
        fetched = trainer.manifest("policy", 1)
    assert len(published.chunk_digests) == len(published.chunks()) > 4
    assert fetched.chunk_digests == published.chunk_digests
    flipped = {n: t.clone() for n, t in weights.items()}
    flipped["lm_head.weight"].view(-1)[-1] += 1  # one value: only the last chunk's digest changes
    again = chunk_digests(published.chunks(), [flipped[s.name] for s in published.tensors])
    assert [i for i, (a, b) in enumerate(zip(again, published.chunk_digests)) if a != b] == [len(again) - 1]


def test_a_second_publish_whose_bytes_differ_anywhere_is_refused(hub):
    weights = make_weights(2, 0.5)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, \
            th.connect(hub.url, "other", chunk_bytes=CHUNK, fingerprint="sample") as other:
        trainer.publish("policy", 1, weights)
        changed = {n: t.clone() for n, t in weights.items()}
        changed["embed.weight"].view(-1)[5] += 1  # outside every sampled fingerprint window
        with pytest.raises(ManifestMismatch, match="chunk 0, tensor 'embed.weight'"):
            other.publish("policy", 1, changed)
        assert trainer.versions("policy") == {1: ["trainer"]}


@pytest.mark.parametrize("plane", ["auto", "tcp"])  # auto: NIXL here; tcp: the chunk is hashed as it lands
def test_a_changed_copy_is_caught_read_around_and_quarantined_on_its_own_jobs_report(hub, roles, plane):
    good = roles(holder, hub.url, "good", 9, 2.0, CHUNK, 1, None, plane).result(120)
    roles(tampering_holder, hub.url, "tamperer", 9, 2.0, CHUNK, 1, plane).result(120)
    config = ClientConfig.from_fields(window=8, transport=plane)
    with Client(hub.url, "reader", config=config) as reader, \
            Client(hub.url, "second", config=config) as second:
        assert sorted(reader.versions("policy")[1]) == ["good", "tamperer"]
        stats = reader.fetch("policy", 1, hold=False)
        assert digest(stats.buffers) == good["digest"]  # never a mix of both holders' bytes
        assert stats.corrupt_reads >= 1
        assert set(stats.sources) == {"good"}
        # A reader of the copy's own job (here every worker's: no job keys) quarantines it: not the last copy.
        assert _quarantined(reader) == {"good": False, "tamperer": True}
        time.sleep(hub.state.config.suspect_s + 0.5)  # the failed reads' suspicion passes; evidence stays
        again = reader.fetch("policy", 1, hold=False)
        assert again.corrupt_reads == 0 and set(again.sources) == {"good"}
        other = second.fetch("policy", 1, hold=False)  # nobody is planned on a quarantined copy
        assert digest(other.buffers) == good["digest"] and other.corrupt_reads == 0


def test_a_fetch_whose_only_source_serves_bytes_that_fail_their_digests_raises_digest_mismatch(hub, roles):
    """The version's check failed (bytes were read and differ), which a caller tells apart from a version nobody
    could serve: ``DigestMismatch`` is the ``TransferFailed`` that says so."""
    roles(tampering_holder, hub.url, "tamperer", 9, 1.0, CHUNK, 1).result(120)
    with Client(hub.url, "reader", config=ClientConfig.from_fields(window=8)) as reader:
        with pytest.raises(DigestMismatch, match="fail the chunk digests") as caught:
            reader.fetch("policy", 1, hold=False, timeout=60)
    assert isinstance(caught.value, TransferFailed)


def _quarantined(client) -> dict[str, bool]:
    return {h["holder"]: h["quarantined"] for h in client.status()["models"]["policy"][0]["holders"]}


def test_digests_can_be_turned_off_for_trusted_tests_on_both_sides():
    hub = th.start_hub(config=th.HubConfig(require_digests=False))
    try:
        with th.connect(hub.url, "trainer", chunk_digests=False) as trainer, \
                th.connect(hub.url, "strict") as strict, \
                th.connect(hub.url, "lax", require_digests=False) as lax:
            assert trainer.publish("policy", 1, {"w": torch.ones(10)}).chunk_digests == ()
            with pytest.raises(UnverifiedVersion, match="no digest"):
                strict.fetch("policy", 1, hold=False)
            assert torch.equal(lax.fetch("policy", 1, hold=False).buffers["w"], torch.ones(10))
    finally:
        hub.stop()
    manifest = build_manifest("m", 1, "hf", {"w": torch.ones(10)})
    assert dataclasses.replace(manifest, chunk_digests=("0" * 16,)).digest == manifest.digest  # layout unchanged
