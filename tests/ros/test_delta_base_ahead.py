"""A reader's base digested from the moment it holds it (``delta_base.BasePasses``): the next delta's apply
finds every base chunk digested, so no chunk is digested in full on landing; a base whose bytes changed after
the hold is still caught and re-read; a pass is used only for the very buffers and chunk map it digested."""

import dataclasses

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.ros.client.delta_base import BasePasses
from tensorhub_verl.ros.wire.manifest import build_manifest

from tests.ros.delta_roles import CHUNK, same_tensors, versions

WAIT_S = 30.0


def test_a_delta_reader_digests_the_version_it_holds_for_its_next_delta(hub):
    v1, v2, v3 = versions(3)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "r1") as r1:
        for version, weights in enumerate((v1, v2), start=1):
            trainer.publish("policy", version, weights)
        trainer.publish_delta("policy", 2, 1)
        into = r1.manifest("policy", 1).allocate()
        r1.fetch("policy", 1, into=into)  # a plain fetch: by default not digested ahead
        assert not r1._base_passes.wait((r1.worker, "policy", 1, "hf"), 0.0)
        first = r1.fetch("policy", 2, into=into, have=1)
        assert first.delta.used and not first.delta.base_pass_ahead
        # Holding v2 after a delta read: its digests are made now, before v3 exists.
        assert r1._base_passes.wait((r1.worker, "policy", 2, "hf"), WAIT_S)
        trainer.publish("policy", 3, v3)
        trainer.publish_delta("policy", 3, 2)
        stats = r1.fetch("policy", 3, into=into, have=2)
        chunks = len(r1.manifest("policy", 3).chunks())
        assert same_tensors(into, v3) and stats.delta.used and stats.delta.fallback_chunks == 0
        assert stats.delta.base_pass_ahead
        assert (stats.delta.base_digests_ahead, stats.delta.landed_digests) == (chunks, 0)


def test_a_base_written_after_its_hold_is_refused_chunk_by_chunk_and_re_read(hub):
    v1, v2 = versions(2)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, \
            th.connect(hub.url, "r1", base_digests_ahead="all") as r1:
        trainer.publish("policy", 1, v1)
        trainer.publish("policy", 2, v2)
        trainer.publish_delta("policy", 2, 1)
        into = r1.manifest("policy", 1).allocate()
        r1.fetch("policy", 1, into=into)
        # A write into held buffers (what the holder contract forbids; a stray kernel, a bad mapping) before the
        # pass reads them: the pass digests what the buffers hold, and the delta refuses that chunk as its base.
        r1._base_passes.drop((r1.worker, "policy", 1, "hf"))
        into["layers.0.mlp.weight"][0, :16] += 1
        r1._digest_held_ahead("policy", 1, "hf")
        key = (r1.worker, "policy", 1, "hf")
        assert r1._base_passes.wait(key, WAIT_S)
        assert r1._base_passes._passes[key].mismatched == [4]  # the first chunk of layers.0.mlp.weight
        stats = r1.fetch("policy", 2, into=into, have=1)
        assert same_tensors(into, v2)
        assert stats.delta.used and stats.delta.base_pass_ahead and stats.delta.landed_digests == 0
        assert stats.delta.fallback_chunks == 1  # the written chunk, re-read in full from the trainer


def test_a_pass_is_taken_only_for_its_own_buffers_and_chunk_map():
    v1 = versions(1)[0]
    manifest = build_manifest("policy", 1, "hf", v1, CHUNK)
    tensors = [v1[s.name] for s in manifest.tensors]
    passes = BasePasses(timeout_s=WAIT_S)
    key = ("r1", "policy", 1, "hf")
    try:
        assert passes.start(key, manifest, tensors) and passes.wait(key, WAIT_S)
        assert passes.take(key, manifest, [t.clone() for t in tensors]) is None  # other buffers: stopped
        assert not passes.wait(key, 0.0)  # and forgotten
        passes.start(key, manifest, tensors)
        other = dataclasses.replace(manifest, chunk_bytes=CHUNK * 2)  # another chunk map over the same bytes
        assert passes.take(key, other, tensors) is None
        passes.start(key, manifest, tensors)
        taken = passes.take(key, manifest, tensors)
        assert taken is not None and taken.finished(WAIT_S) and taken.ahead == len(manifest.chunks())
        # Buffers not in CPU memory are digested by the read itself.
        meta = [torch.empty_like(t, device="meta") for t in tensors]
        assert not passes.start(("r1", "policy", 2, "hf"), manifest, meta)
    finally:
        passes.close()


def test_unpublishing_a_holding_drops_its_pass(hub):
    v1 = versions(1)[0]
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, \
            th.connect(hub.url, "r1", base_digests_ahead="all") as r1:
        trainer.publish("policy", 1, v1)
        r1.fetch("policy", 1)
        key = (r1.worker, "policy", 1, "hf")
        assert r1._base_passes.wait(key, WAIT_S)
        r1.unpublish("policy", 1)  # its bytes may change from here on: nothing digested before may be used
        assert not r1._base_passes.wait(key, 0.0)


def test_base_digests_ahead_takes_only_its_modes():
    with pytest.raises(errors.ConfigError, match="base_digests_ahead"):
        th.ClientConfig.from_fields(base_digests_ahead="always")
