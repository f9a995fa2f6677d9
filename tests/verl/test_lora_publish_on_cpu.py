"""tensorhub_verl.verl.lora without a verl job: names, results, and the adapter publisher over a real hub."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.verl.lora import AdapterPublisher, adapter_update_result, checkpoint_names, lora_adapter_engine
from tensorhub_verl.vllm.lora import ADAPTER_LAYOUT, adapter_model, unpack_adapter
from tensorhub_verl.vllm.results import AdapterUpdate, UpdateResult

CFG = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def test_checkpoint_names_drop_verl_base_layer():
    t = torch.zeros(1)
    assert list(checkpoint_names([("model.layers.0.self_attn.q_proj.base_layer.weight", t),
                                  ("model.norm.weight", t)])) == [("model.layers.0.self_attn.q_proj.weight", t),
                                                                  ("model.norm.weight", t)]


def test_lora_adapter_engine_only_for_unmerged_peft():
    peft = SimpleNamespace(peft_config={"default": None})
    assert lora_adapter_engine(SimpleNamespace(module=peft, model_config=SimpleNamespace(lora={})))
    assert not lora_adapter_engine(SimpleNamespace(module=peft, model_config=SimpleNamespace(lora={"merge": True})))
    assert not lora_adapter_engine(SimpleNamespace(module=torch.nn.Linear(1, 1), model_config=None))


def test_adapter_update_result_adds_the_base_that_moved_in_the_same_step():
    # one rank's answer as it arrives through msgpack (a dict), and the same as the object pickling delivers
    ranks = [{"version": 3, "applied": True, "bytes": 10, "seconds": 0.1, "sources": {"trainer": 6, "peer": 4}}]
    base = UpdateResult(version=0, applied=True, bytes=1000, rank_bytes=[1000], sources={"trainer": 1000},
                        source_layouts=["hf"], pull_s=0.5)
    res = adapter_update_result(3, ranks, base)
    assert (res.version, res.bytes, res.rank_bytes, res.sources) == (3, 1010, [1010], {"trainer": 1006, "peer": 4})
    assert res.source_layouts == ["hf", ADAPTER_LAYOUT] and res.pull_s == 0.5
    assert adapter_update_result(3, ranks).bytes == 10
    assert adapter_update_result(3, [AdapterUpdate.from_wire(ranks[0])]) == adapter_update_result(3, ranks)


def test_adapter_publisher_copies_and_keeps_the_newest():
    hub = th.start_hub(host="127.0.0.1", port=0)
    # As the trainer connects in a verl job: an old version leaving the window is not copied to CPU.
    client = th.connect(hub.url, worker="trainer", location={"dc": "d", "rack": "r", "node": "n"},
                        preserve_on_unpublish=False)
    try:
        pub = AdapterPublisher(client, model="policy", keep=2, unpublish_timeout_s=10)
        live = torch.ones(2, 4)
        for v in (1, 2, 3):
            metrics = pub.publish(v, {A: live}, CFG, base_version=0)
            live.add_(1)  # the optimizer moves the parameter; published versions must not change
        assert pub.held_versions == [2, 3] and sorted(client.versions(adapter_model("policy"))) == [2, 3]
        assert metrics["tensorhub/adapter_bytes"] == metrics["tensorhub/publish_bytes"] > 2 * 4 * 4
        with th.connect(hub.url, worker="reader", location={"dc": "d", "rack": "r", "node": "m"}) as reader:
            stats = reader.fetch(adapter_model("policy"), 2, into=None, layout=ADAPTER_LAYOUT, hold=False)
        tensors, cfg = unpack_adapter(stats.buffers)
        assert torch.equal(tensors[A], torch.full((2, 4), 2.0)) and cfg["r"] == 2
        with pytest.raises(errors.InvalidRequest):
            pub.publish(4, {"model.norm.weight": live}, CFG, base_version=0)
    finally:
        client.close()
        hub.stop()
