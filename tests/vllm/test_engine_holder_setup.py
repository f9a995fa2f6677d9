"""Both ways of driving an engine set up a rank's holder alike (``vllm.engine_holder.holder_for_engine``): vLLM's
weight-transfer backend as the worker extension filters LoRA's base parameters to one layout, checks GPU staging
against vLLM's memory share, and makes the engine's TP ranks one shard group under rank worker ids.

In process, without an engine: a module whose parameters are named as a LoRA-enabled vLLM names them stands for
the model, and vLLM's parallel state is rank 1 of TP 2 (``compat.tp_rank_and_size``). The GPU staging check is
reached with the parameters said to be on a GPU (``engine_holder.on_gpu``): there is no GPU here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.vllm import compat, engine_holder, memory

pytestmark = pytest.mark.vllm

WORKER = "engine-0"


class LoraModel(torch.nn.Module):
    """Parameters named as vLLM names them with LoRA enabled: the base weights under ``.base_layer``."""

    def __init__(self):
        super().__init__()
        self.qkv_proj = torch.nn.Module()
        self.qkv_proj.base_layer = torch.nn.Linear(8, 24, bias=False)
        self.embed = torch.nn.Embedding(16, 8)


def _vllm_config(utilization: float = 0.5):
    hf = SimpleNamespace(model_type="fakearch", tie_word_embeddings=False)
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=hf, quantization=None),
                           cache_config=SimpleNamespace(gpu_memory_utilization=utilization))


@pytest.fixture
def rank1_of_2(monkeypatch):
    monkeypatch.setattr(compat, "tp_rank_and_size", lambda: (1, 2))


@pytest.fixture
def embedded_hub():
    hub = th.start_hub(host="127.0.0.1", port=0, plane="tcp")  # the holders below connect on the TCP plane
    yield hub
    hub.stop()


def _via_weight_transfer(hub_url: str, module: torch.nn.Module, staging: str = "cpu"):
    from tensorhub_verl.vllm.weight_transfer import TensorHubInitInfo, TensorHubWeightTransferEngine

    backend = TensorHubWeightTransferEngine.__new__(TensorHubWeightTransferEngine)  # vLLM's engine is not run here
    backend.holder, backend.model, backend.vllm_config = None, module, _vllm_config()
    backend.model_config = backend.vllm_config.model_config
    backend.init_transfer_engine(TensorHubInitInfo(hub_url=hub_url, model="policy", worker=WORKER, staging=staging,
                                                   location={"dc": "dc0", "rack": "r0", "node": "n0"},
                                                   client_config={"transport": "tcp"}))
    return backend.holder


def _via_extension(hub_url: str, module: torch.nn.Module, staging: str = "cpu"):
    from tensorhub_verl.vllm.extension import build_holder

    worker_obj = SimpleNamespace(vllm_config=_vllm_config(), model_runner=SimpleNamespace(model=module))
    return build_holder(worker_obj, hub_url=hub_url, model="policy", worker=WORKER, staging=staging,
                        location={"dc": "dc0", "rack": "r0", "node": "n1"}, client_config={"transport": "tcp"})


@pytest.mark.parametrize("path", [_via_weight_transfer, _via_extension], ids=["weight_transfer", "extension"])
def test_a_rank_holds_its_base_parameters_in_its_engines_shard_group(embedded_hub, rank1_of_2, path):
    module = LoraModel()
    holder = path(embedded_hub.url, module)
    try:
        assert sorted(holder.params) == ["embed.weight", "qkv_proj.weight"]  # '.base_layer' gone: one layout
        assert holder.params["qkv_proj.weight"].data_ptr() == module.qkv_proj.base_layer.weight.data_ptr()
        assert holder.client.worker == f"{WORKER}/rank1"
        assert (holder.config.shard_group, holder.config.shard_count) == (WORKER, 2)
        assert holder.config.layout == "vllm/fakearch/tp2/rank1"
    finally:
        holder.close()
        holder.client.close()


@pytest.mark.parametrize("path", [_via_weight_transfer, _via_extension], ids=["weight_transfer", "extension"])
def test_gpu_staging_is_checked_against_vllms_memory_share_before_connecting(embedded_hub, rank1_of_2,
                                                                              monkeypatch, path):
    checked = []

    def refuse(params, utilization):
        checked.append((sorted(params), utilization))
        raise errors.ConfigError("no room for the staging buffers")

    monkeypatch.setattr(engine_holder, "on_gpu", lambda params: True)  # no GPU here: say the parameters are on one
    monkeypatch.setattr(memory, "check_engine_gpu_staging", refuse)
    with pytest.raises(errors.ConfigError, match="no room"):
        path(embedded_hub.url, LoraModel(), staging="gpu")
    assert checked == [(["embed.weight", "qkv_proj.weight"], 0.5)]
    assert embedded_hub.state.status().workers == {}  # refused before any client registered
