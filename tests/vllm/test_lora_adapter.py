"""tensorhub_verl.vllm.lora without vLLM: the adapter's wire form, and AdapterHolder over a real hub."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.vllm.lora import (ADAPTER_LAYOUT, BASE_VERSION_KEY, PEFT_CONFIG_KEY, AdapterHolder,
                                      adapter_base_version, adapter_bytes, adapter_model, base_parameters,
                                      pack_adapter, peft_config_dict, unpack_adapter)

CFG = {"r": 4, "lora_alpha": 8, "target_modules": {"q_proj", "v_proj"}, "bias": "none"}


def adapter(seed: float) -> dict[str, torch.Tensor]:
    name = "base_model.model.model.layers.0.self_attn.q_proj"
    return {f"{name}.lora_A.weight": torch.full((4, 16), seed), f"{name}.lora_B.weight": torch.full((16, 4), -seed)}


def test_pack_unpack_round_trip():
    packed = pack_adapter(adapter(1.0), CFG, base_version=0)
    assert packed[PEFT_CONFIG_KEY].dtype == torch.uint8
    tensors, cfg = unpack_adapter(packed)
    assert set(tensors) == set(adapter(1.0)) and cfg["target_modules"] == ["q_proj", "v_proj"] and cfg["r"] == 4


def test_pack_refuses_what_is_not_an_adapter():
    with pytest.raises(errors.InvalidRequest, match="not LoRA weights"):
        pack_adapter({"model.embed_tokens.weight": torch.zeros(2)}, CFG, base_version=0)
    with pytest.raises(errors.InvalidRequest, match="no tensors"):
        pack_adapter({}, CFG, base_version=0)
    with pytest.raises(errors.ConfigError, match="lacks"):
        peft_config_dict({"r": 4})
    with pytest.raises(errors.ManifestMismatch, match=PEFT_CONFIG_KEY):
        unpack_adapter(adapter(1.0))


def test_base_parameters_names_as_without_lora():
    t = torch.zeros(2)
    assert base_parameters({"a.qkv_proj.base_layer.weight": t, "a.norm.weight": t}) == {
        "a.qkv_proj.weight": t, "a.norm.weight": t}
    with pytest.raises(errors.ConfigError, match="collide"):
        base_parameters({"a.base_layer.weight": t, "a.weight": t})


@pytest.fixture()
def hub():
    h = th.start_hub(host="127.0.0.1", port=0)
    yield h
    h.stop()


def test_adapter_holder_applies_holds_and_releases(hub):
    loc = {"dc": "dc0", "rack": "r0", "node": "n0"}
    trainer = th.connect(hub.url, worker="trainer", location=loc)
    reader = th.connect(hub.url, worker="e1", location=loc)
    loaded = []
    try:
        holder = AdapterHolder(reader, model="policy", load=lambda t, cfg: loaded.append((t, cfg)),
                               base_version=lambda: 0)
        for v in (1, 2):
            trainer.publish(adapter_model("policy"), v, pack_adapter(adapter(float(v)), CFG, base_version=0),
                            layout=ADAPTER_LAYOUT)
        res = holder.update("latest")
        assert res.applied and res.version == 2 and res.bytes == adapter_bytes(
            pack_adapter(adapter(2.0), CFG, base_version=0))
        tensors, cfg = loaded[-1]
        assert all(torch.equal(tensors[n], t) for n, t in adapter(2.0).items()) and cfg["r"] == 4
        assert "e1" in trainer.versions(adapter_model("policy"), layout=ADAPTER_LAYOUT)[2]  # peers may read it
        assert holder.update(2).applied is False
        holder.update(1)
        assert holder.status() == {"model": "policy.lora", "served": 1, "held": [1]}

        def refuse(t, cfg):
            raise errors.ConfigError("engine refuses")
        holder._load = refuse
        with pytest.raises(errors.ConfigError):
            holder.update(2)
        assert holder.status()["served"] == 1  # a refused version leaves the served one in place
        with pytest.raises(errors.VersionNotFound):
            holder.update(7, timeout=5)
        holder.close()
        assert holder.status()["held"] == []
    finally:
        reader.close()
        trainer.close()


def test_an_adapter_names_its_base_and_an_engine_refuses_it_on_another_base(hub):
    packed = pack_adapter(adapter(1.0), CFG, base_version=3)
    assert adapter_base_version(packed) == 3 and BASE_VERSION_KEY not in unpack_adapter(packed)[0]
    with pytest.raises(errors.InvalidRequest, match="names the base version"):
        pack_adapter(adapter(1.0), CFG, base_version=-1)
    unnamed = {n: t for n, t in packed.items() if n != BASE_VERSION_KEY}
    with pytest.raises(errors.BaseMismatch, match="names no base version"):
        adapter_base_version(unnamed)
    loc = {"dc": "dc0", "rack": "r0", "node": "n0"}
    with th.connect(hub.url, worker="trainer", location=loc) as trainer, \
            th.connect(hub.url, worker="e1", location=loc) as reader:
        served_base = {"v": 2}
        loaded = []
        holder = AdapterHolder(reader, model="policy", load=lambda t, cfg: loaded.append(t),
                               base_version=lambda: served_base["v"])
        trainer.publish(adapter_model("policy"), 1, pack_adapter(adapter(1.0), CFG, base_version=2),
                        layout=ADAPTER_LAYOUT)
        trainer.publish(adapter_model("policy"), 2, packed, layout=ADAPTER_LAYOUT)  # trained on base v3
        trainer.publish(adapter_model("policy"), 3, unnamed, layout=ADAPTER_LAYOUT)
        assert holder.update(1).applied and len(loaded) == 1
        with pytest.raises(errors.BaseMismatch, match="applies to 'policy' v3, but this engine serves v2") as refused:
            holder.update(2)
        assert (refused.value.base_version, refused.value.held_version) == (3, 2)
        with pytest.raises(errors.BaseMismatch, match="names no base version"):
            holder.update(3)
        assert len(loaded) == 1 and holder.status() == {"model": "policy.lora", "served": 1, "held": [1]}
        served_base["v"] = 3  # the engine's base reached v3: the adapter trained on it applies
        assert holder.update(2).applied and len(loaded) == 2
        holder.close()
