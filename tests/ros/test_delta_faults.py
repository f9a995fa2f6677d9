"""Deltas under faults and bad input: each case fails closed (the reader holds exactly the version, or is told
what it holds) and says why. Real hub, real clients, real data planes; the killed holder is a real process."""

import functools
import os
import signal

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.bench.hub_proc import HubProcess
from tensorhub_verl.errors import DeltaRefused, NotModelOwner
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.client.delta_chunks import encode_delta
from tensorhub_verl.ros.wire.delta_codec import encode_chunk
from tensorhub_verl.ros.wire.delta_form import BLOB, HEADER

from tests.ros.delta_roles import CHUNK, delta_reader, digest, same_tensors as _same, versions
from tests.ros.roles import GatedPlane, wait_until


def test_a_declared_base_that_is_not_what_the_buffers_hold_is_refused_before_any_byte_is_written(hub):
    v1, v2 = versions(2)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "r1") as r1:
        trainer.publish("policy", 1, v1)
        trainer.publish("policy", 2, v2)
        trainer.publish_delta("policy", 2, 1)
        into = r1.manifest("policy", 2).allocate()
        r1.fetch("policy", 2, into=into)  # r1 holds v2 in `into`
        with pytest.raises(DeltaRefused, match="holds v2 in these buffers, not v1"):
            r1.fetch("policy", 2, into=into, have=1)
        assert _same(into, v2)  # untouched
        assert r1.versions("policy", "hf")[2] == ["r1", "trainer"]  # and still served
        assert r1.versions("policy", "delta/hf@1") == {2: ["trainer"]}  # no byte of the delta was read


def test_a_reader_whose_base_bytes_differ_re_reads_those_chunks_in_full_and_stops_serving_its_base(hub):
    v1, v2 = versions(2)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "r1") as r1:
        trainer.publish("policy", 1, v1)
        into = r1.manifest("policy", 1).allocate()
        r1.fetch("policy", 1, into=into)
        trainer.publish("policy", 2, v2)
        trainer.publish_delta("policy", 2, 1)
        into["embed.weight"][3, 5] += 1  # r1's copy of v1 rots in one chunk that the step leaves alone
        stats = r1.fetch("policy", 2, into=into, have=1)
        assert _same(into, v2)
        assert stats.delta.used and stats.delta.fallback_chunks == 1
        assert "did not hold base version 1" in stats.delta.reasons[0]
        assert stats.delta.fallback_bytes == CHUNK and stats.bytes == stats.delta.delta_bytes + CHUNK
        assert r1.versions("policy", "hf") == {1: ["trainer"], 2: ["r1", "trainer"]}


def _wrong_base(v1, v2):
    """The delta of a publisher whose staged v1 was not its published v1 (every 4096th element of one matrix off),
    as XOR: it parses, but applied to the real v1 it builds other bytes than v2."""
    wrong = {n: t.clone() for n, t in v1.items()}
    wrong["layers.0.mlp.weight"].view(-1)[::4096] += 1
    return wrong, functools.partial(encode_chunk, candidates=("xor",)), None


def _garbled(v1, v2):
    """A delta whose first payload was garbled after its digests were taken: it does not parse."""
    return v1, encode_chunk, 64


@pytest.mark.parametrize("make, failed, reason", [
    (_wrong_base, 8, "does not give version 2's bytes"),
    (_garbled, 1, "payload is refused"),
])
def test_a_delta_that_does_not_build_the_version_is_caught_re_read_in_full_and_not_served_onward(
        hub, make, failed, reason):
    v1, v2 = versions(2)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, th.connect(hub.url, "r1") as r1:
        m1, m2 = trainer.publish("policy", 1, v1), trainer.publish("policy", 2, v2)
        base, encode, garble = make(v1, v2)
        order = [s.name for s in m2.tensors]
        header, blob, _ = encode_delta(m1, [base[n] for n in order], m2, [v2[n] for n in order], encode)
        if garble:
            blob[:garble] ^= 0x5A
        # Published as it is: its own chunk digests hold, so only the checks against v1 and v2 catch it.
        trainer.publish("policy", 2, {HEADER: torch.frombuffer(bytearray(header.to_bytes()), dtype=torch.uint8),
                                      BLOB: blob}, layout="delta/hf@1")
        into = {n: t.clone() for n, t in v1.items()}
        stats = r1.fetch("policy", 2, into=into, have=1)
        assert _same(into, v2)
        assert stats.delta.used and stats.delta.fallback_chunks == failed
        assert reason in stats.delta.reasons[0]
        assert stats.bytes == stats.delta.delta_bytes + stats.delta.fallback_bytes
        assert r1.versions("policy", "delta/hf@1") == {2: ["trainer"]}  # r1 dropped its copy of the bad delta
        assert "r1" in r1.versions("policy", "hf")[2]
        # r1 is of the job that owns the model (the keyless job here): its word withholds the delta from everyone.
        with th.connect(hub.url, "r2") as r2:
            into = {n: t.clone() for n, t in v1.items()}
            second = r2.fetch("policy", 2, into=into, have=1)
            assert _same(into, v2) and not second.delta.used and second.bytes == m2.nbytes
            assert "withheld" in second.delta.reasons[0]


def test_a_delta_from_an_outsider_is_refused_and_a_readers_copy_is_not():
    hub = th.start_hub(config=th.HubConfig(heartbeat_s=0.5, owners=("policy=trainer*",)))
    try:
        v1, v2 = versions(2)
        with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer, \
                th.connect(hub.url, "outsider", chunk_bytes=CHUNK) as outsider, th.connect(hub.url, "r1") as r1:
            trainer.publish("policy", 1, v1)
            trainer.publish("policy", 2, v2)
            outsider.fetch("policy", 1)
            outsider.fetch("policy", 2)
            with pytest.raises(NotModelOwner):
                outsider.publish_delta("policy", 2, 1, mode="on")
            assert trainer.versions("policy", "delta/hf@1") == {}
            trainer.publish_delta("policy", 2, 1)
            into = {n: t.clone() for n, t in v1.items()}
            stats = r1.fetch("policy", 2, into=into, have=1)  # a reader outside the owners holds copies
            assert stats.delta.used and _same(into, v2)
            assert r1.versions("policy", "delta/hf@1") == {2: ["r1", "trainer"]}
    finally:
        hub.stop()


def test_the_hub_refuses_a_delta_whose_base_is_not_retained_or_not_older(hub):
    _, v2, v3 = versions(3)
    with th.connect(hub.url, "trainer", chunk_bytes=CHUNK) as trainer:
        trainer.publish("policy", 2, v2)
        trainer.publish("policy", 3, v3)
        form = {HEADER: torch.zeros(8, dtype=torch.uint8), BLOB: torch.zeros(8, dtype=torch.uint8)}
        with pytest.raises(DeltaRefused, match="v1 is not retained"):
            trainer.publish("policy", 3, form, layout="delta/hf@1")
        with pytest.raises(DeltaRefused, match="base must be older"):
            trainer.publish("policy", 2, form, layout="delta/hf@3")
        trainer.publish("policy", 2, v2, layout="vllm/tp1")
        with pytest.raises(DeltaRefused, match="publish v3 in 'vllm/tp1' first"):
            trainer.publish("policy", 3, form, layout="delta/vllm/tp1@2")
        with pytest.raises(DeltaRefused, match="holds no base v1"):
            trainer.publish_delta("policy", 3, 1)
        assert trainer.versions("policy") == {2: ["trainer"], 3: ["trainer"]}
        assert all(not v["layout"].startswith("delta/") for v in trainer.status()["models"]["policy"])


def test_a_delta_holder_killed_mid_read_costs_a_re_plan_onto_another_holder_of_the_delta(hub, roles):
    v1, v2 = versions(2, rows=64)
    with th.connect(hub.url, "trainer", "dc=dc0,rack=r0,node=t", chunk_bytes=CHUNK) as trainer:
        trainer.publish("policy", 1, v1)
        trainer.publish("policy", 2, v2)
        published = trainer.publish_delta("policy", 2, 1, chunk_bytes=8192)
        near = roles(delta_reader, hub.url, "near", "dc=dc0,rack=r1,node=a").result(120)
        assert near["used"] == [True] and near["digest"] == digest(v2)
        kill = lambda n: n == 2 and os.kill(near["pid"], signal.SIGKILL)  # noqa: E731
        plane = GatedPlane("r2-agent", on_read=kill)
        r2 = Client(hub.url, "r2", "dc=dc0,rack=r1,node=a", plane=plane,
                    config=ClientConfig.from_fields(read_timeout_s=3.0, window=1, max_run_chunks=1))
        try:
            into = {n: t.clone() for n, t in v1.items()}
            stats = r2.fetch("policy", 2, into=into, have=1)
            assert _same(into, v2)
            assert stats.delta.used and stats.delta.fallback_chunks == 0
            assert stats.bytes == published.bytes  # the lost read was redone, nothing more
            assert stats.sources.get("near", 0) > 0 and stats.sources.get("trainer", 0) > 0
            assert stats.failed_reads >= 1
        finally:
            r2.close()



def test_after_a_hub_restart_every_holder_of_the_delta_registers_it_again(roles):
    """A hub restart costs no delta: the publisher and a reader that applied it re-register both versions and
    the delta form (each delta after the versions it joins), and a later reader still reads only the delta."""
    hub_process = HubProcess(args=("--worker-timeout", "10")).start()
    url = hub_process.url
    try:
        v1, v2 = versions(2)
        trainer = th.connect(url, "trainer", chunk_bytes=CHUNK, hub_retry_s=60.0)
        r1 = th.connect(url, "r1", hub_retry_s=60.0)
        try:
            trainer.publish("policy", 1, v1)
            trainer.publish("policy", 2, v2)
            published = trainer.publish_delta("policy", 2, 1)
            r1.fetch("policy", 2, into={n: t.clone() for n, t in v1.items()}, have=1)
            hub_process.kill()
            hub_process.start()  # a new instance at the same URL: it knows nothing until holders re-register
            wait_until(lambda: _listed(trainer, "delta/hf@1") == ["r1", "trainer"], 60,
                       "the delta's holders did not re-register")
            with th.connect(url, "r2", hub_retry_s=60.0) as r2:
                into = {n: t.clone() for n, t in v1.items()}
                stats = r2.fetch("policy", 2, into=into, have=1)
                assert _same(into, v2) and stats.delta.used and stats.bytes == published.bytes
        finally:
            r1.close()
            trainer.close()
    finally:
        hub_process.kill()


def _listed(client, layout):
    try:
        return client.versions("policy", layout).get(2, [])
    except Exception:  # the new hub instance is still starting
        return []
