"""tensorhub_verl.vllm.lora without vLLM: the adapter's wire form, and AdapterHolder over a real hub."""

from __future__ import annotations

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.vllm.lora import (ADAPTER_LAYOUT, PEFT_CONFIG_KEY, AdapterHolder, adapter_bytes, adapter_model,
                                      base_parameters, pack_adapter, peft_config_dict, unpack_adapter)

CFG = {"r": 4, "lora_alpha": 8, "target_modules": {"q_proj", "v_proj"}, "bias": "none"}


def adapter(seed: float) -> dict[str, torch.Tensor]:
    name = "base_model.model.model.layers.0.self_attn.q_proj"
    return {f"{name}.lora_A.weight": torch.full((4, 16), seed), f"{name}.lora_B.weight": torch.full((16, 4), -seed)}


def test_pack_unpack_round_trip():
    packed = pack_adapter(adapter(1.0), CFG)
    assert packed[PEFT_CONFIG_KEY].dtype == torch.uint8
    tensors, cfg = unpack_adapter(packed)
    assert set(tensors) == set(adapter(1.0)) and cfg["target_modules"] == ["q_proj", "v_proj"] and cfg["r"] == 4


def test_pack_refuses_what_is_not_an_adapter():
    with pytest.raises(errors.InvalidRequest, match="not LoRA weights"):
        pack_adapter({"model.embed_tokens.weight": torch.zeros(2)}, CFG)
    with pytest.raises(errors.InvalidRequest, match="no tensors"):
        pack_adapter({}, CFG)
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
        holder = AdapterHolder(reader, model="policy", load=lambda t, cfg: loaded.append((t, cfg)))
        for v in (1, 2):
            trainer.publish(adapter_model("policy"), v, pack_adapter(adapter(float(v)), CFG), layout=ADAPTER_LAYOUT)
        res = holder.update("latest")
        assert res.applied and res.version == 2 and res.bytes == adapter_bytes(pack_adapter(adapter(2.0), CFG))
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
