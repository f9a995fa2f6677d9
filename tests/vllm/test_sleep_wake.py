"""vLLM sleep and wake of an engine that holds its version (``tensorhub_verl.vllm.sleep``), on a real CPU engine.

The engine sleeps through ``LLM.sleep`` / ``LLM.wake_up`` (the path verl's ``free_cache_engine`` takes), so the
hooks run inside vLLM's own worker calls. vLLM's CPU worker does not free memory when it sleeps, so the test does
what the CuMem allocator does on a GPU (``engine_proc.move_weights``): every parameter moves to new storage (its
bytes copied at level 1, NaN at level 2) and the old storage is overwritten with NaN, so a read served from a
registration made before sleep would return NaN and fail the byte comparison below.
"""

from __future__ import annotations

import pytest
import torch

from tests.requires import require

require("vllm")

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.vllm.engine_proc import EngineProcess, EngineSpec
from tensorhub_dev.testing.layout_oracle import hf_to_vllm
from tensorhub_verl.vllm.layout import layout_name
from tensorhub_verl.vllm.results import HolderStatus, SleepStatus
from tests.vllm.conftest import loc
from tests.vllm.toy_run import N_NEW, PROMPTS

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

LAYOUT = layout_name("qwen2", 1, 0)
WORKER = "sleeper"


@pytest.fixture(scope="module")
def reader(hub):
    """Another process's view: reads the engine's layout and checks its chunk digests as they land."""
    c = th.connect(hub.url, worker="reader", location=loc("n2"), read_timeout_s=5.0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def engine(hub, tiny_models, run):
    with EngineProcess(EngineSpec(model_dir=tiny_models["qwen2"], hub_url=hub.url, worker=WORKER,
                                  location=loc("n1"), client_config={"read_timeout_s": 5.0})) as e:
        assert e.update(1)["version"] == 1
        yield e


def outputs(engine) -> list[list[int]]:
    return [engine.generate(p, N_NEW) for p in PROMPTS]


def read_from_engine(reader, version: int, run, shape) -> None:
    """Reads ``version`` in the engine's layout: every byte comes from the engine, and equals the trainer's
    weights mapped to that layout."""
    bufs = reader.manifest("policy", version, layout=LAYOUT).allocate("cpu")
    stats = reader.fetch("policy", version, into=bufs, layout=LAYOUT, hold=False, timeout=60)
    assert set(stats.sources) == {WORKER}, stats.sources
    expected = hf_to_vllm(run.weights[version], shape)
    assert set(bufs) == set(expected)
    bad = [n for n, t in bufs.items() if not torch.equal(t, expected[n].to(t.dtype))]
    assert not bad, f"tensors {bad[:3]} differ from v{version}"


def holders(trainer, version: int) -> list[str]:
    return trainer.versions("policy", layout=LAYOUT).get(version, [])


def test_level1_sleep_stops_holding_and_wake_holds_again(engine, run, trainer, reader, shape):
    assert WORKER in holders(trainer, 1)
    engine.request("sleep", 60, level=1)
    status = HolderStatus.from_wire(engine.rpc("th_status")[0])
    assert status.asleep == SleepStatus(served=1, level=1, weights_kept=True) and status.worker is None
    assert WORKER not in holders(trainer, 1)
    # A reader while the engine sleeps is planned onto the trainer, never onto the sleeping engine.
    bufs = reader.manifest("policy", 1).allocate("cpu")
    assert set(reader.fetch("policy", 1, into=bufs, hold=False, timeout=60).sources) == {"trainer"}
    with pytest.raises((errors.VersionNotFound, errors.TransferFailed, TimeoutError)):
        reader.fetch("policy", 1, into=reader.manifest("policy", 1, layout=LAYOUT).allocate("cpu"), layout=LAYOUT,
                     hold=False, timeout=5)
    assert engine.request("move_weights", 60)[0] > 0
    engine.request("wake_up", 120)
    assert engine.request("served_version", 30) == 1
    assert WORKER in holders(trainer, 1)
    read_from_engine(reader, 1, run, shape)
    assert outputs(engine) == run.refs[1]


def test_version_published_during_sleep_is_pulled_at_wake(engine, run, trainer, reader, shape):
    engine.request("sleep", 60, level=1)
    run.step_and_publish(2)
    engine.request("move_weights", 60)
    engine.request("wake_up", 300)
    assert engine.request("served_version", 30) == 2
    assert WORKER in holders(trainer, 2) and WORKER not in holders(trainer, 1)
    read_from_engine(reader, 2, run, shape)
    assert outputs(engine) == run.refs[2] != run.refs[1]


def test_level2_sleep_discards_weights_and_wake_pulls_them(engine, run, trainer, reader, shape):
    engine.request("sleep", 60, level=2)
    assert HolderStatus.from_wire(engine.rpc("th_status")[0]).asleep.weights_kept is False
    engine.request("move_weights", 60, discard=True)  # level 2: the bytes are gone
    engine.request("wake_up", 300)
    assert engine.request("served_version", 30) == 2
    read_from_engine(reader, 2, run, shape)
    assert outputs(engine) == run.refs[2]


def test_kv_cache_wake_alone_keeps_the_engine_asleep(engine, run, trainer, reader, shape):
    engine.request("sleep", 60, level=1)
    engine.request("wake_up", 60, tags=["kv_cache"])
    assert HolderStatus.from_wire(engine.rpc("th_status")[0]).asleep.served == 2
    assert WORKER not in holders(trainer, 2)
    with pytest.raises(Exception, match="sleeps"):
        engine.update("latest", timeout=30)
    engine.request("wake_up", 120, tags=["weights"])
    assert engine.request("served_version", 30) == 2
    read_from_engine(reader, 2, run, shape)
