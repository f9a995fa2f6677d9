"""``vllm.sleep`` without an engine: what a freshly built holder does at wake (``rejoin``) against a real hub and real
clients, and the order of the hooks around a worker's own ``sleep``/``wake_up``."""

from __future__ import annotations

import pytest

import tensorhub_verl as th
from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
from tensorhub_verl.vllm.sleep import Asleep, install_hooks, rejoin, wakes_weights
from tests.vllm.test_holder import LAYOUT, SHAPE, hf_version, loader, new_params, same

pytestmark = pytest.mark.vllm


@pytest.fixture
def trainer(hub):
    c = th.connect(hub.url, worker="sleep-trainer")
    yield c
    c.close()


@pytest.fixture
def woken(hub):
    """A holder as ``th_after_wake`` builds it: a new client, the parameters as they are after wake."""
    made = []

    def make(params, model: str) -> EngineHolder:
        client = th.connect(hub.url, worker=f"sleep-engine-{len(made)}")
        holder = EngineHolder(client, HolderConfig(model=model, layout=LAYOUT, staging="none"), params,
                              loader(params))
        made.append(holder)
        return holder

    yield make
    for holder in made:
        holder.close()
        holder.client.close()


def holders(client, model: str, version: int) -> list[str]:
    return client.versions(model, layout=LAYOUT).get(version, [])


def test_kept_weights_are_held_again(trainer, woken):
    trainer.publish("m1", 1, hf_version(1))
    params = new_params()
    loader(params)(hf_version(1).items())  # level 1: the bytes came back
    holder = woken(params, "m1")
    out = rejoin(holder, Asleep(served=1, level=1))
    assert out["action"] == "held" and holder.served == 1 and not holder.broken
    assert holders(trainer, "m1", 1) == [holder.worker]


def test_kept_weights_behind_the_newest_pull_it(trainer, woken):
    trainer.publish("m2", 1, hf_version(1))
    trainer.publish("m2", 2, hf_version(2))
    params = new_params()
    loader(params)(hf_version(1).items())
    holder = woken(params, "m2")
    out = rejoin(holder, Asleep(served=1, level=1))
    assert (out["action"], out["version"], holder.served) == ("pulled", 2, 2)
    assert same(params, 2) and holders(trainer, "m2", 2) == [holder.worker] and not holders(trainer, "m2", 1)


def test_discarded_weights_are_pulled_or_the_shard_says_it_is_broken(trainer, woken):
    trainer.publish("m3", 4, hf_version(4))
    holder = woken(new_params(), "m3")  # level 2: whatever the new pages hold
    out = rejoin(holder, Asleep(served=4, level=2))
    assert out["action"] == "pulled" and holder.served == 4 and same(holder.params, 4)
    empty = woken(new_params(), "m-none")
    out = rejoin(empty, Asleep(served=None, level=2))
    assert empty.broken and empty.status().served is None and "no version pulled" in out["error"]


def test_a_tp_rank_leaves_the_pull_to_the_driver(trainer, hub):
    """The ranks of a TP>1 engine move together (the updater pulls on all or aborts on all): one rank waking up
    alone pulls nothing, and with its weights gone it says it is broken."""
    trainer.publish("m4", 5, hf_version(5))
    params = new_params()
    with th.connect(hub.url, worker="sleep-tp/rank0") as client:
        holder = EngineHolder(client, HolderConfig(model="m4", layout=LAYOUT, staging="none", shard_group="sleep-tp",
                                                   shard_count=2), params, loader(params))
        out = rejoin(holder, Asleep(served=None, level=2))
        assert out["action"] == "none" and holder.broken and not same(params, 5)
        holder.close()


def test_hooks_run_around_the_workers_own_sleep_and_wake():
    calls = []

    class Worker:
        def sleep(self, level=1):
            calls.append(f"sleep {level}")

        def wake_up(self, tags=None):
            calls.append(f"wake {tags}")

    w = Worker()
    assert install_hooks(w, lambda level: calls.append(f"before {level}"), lambda tags: calls.append(f"after {tags}"))
    assert not install_hooks(w, lambda level: None, lambda tags: None)  # once per worker
    w.sleep(level=2)
    w.wake_up(tags=["kv_cache"])
    assert calls == ["before 2", "sleep 2", "wake ['kv_cache']", "after ['kv_cache']"]
    assert not wakes_weights(["kv_cache"]) and wakes_weights(None) and wakes_weights(["weights"])
    assert not install_hooks(object(), lambda level: None, lambda tags: None)  # nothing can sleep it
