"""One contract, three client forms: the same tests run against a plain ``Client`` (one hub), a ``ShardedClient``
(a hub run as two processes) and a ``RegionalClient`` (a hub process per region), each made by ``connect`` from
the URL form a user passes. A vLLM engine holder (``vllm.holder.EngineHolder`` over parameters in vLLM's own
layout, loaded by the HF -> vLLM layout oracle instead of an engine's loader) follows a version through each.

Real hub processes, real TCP transfers; the engine holder has no engine (``tests/vllm`` runs it inside vLLM)."""

from __future__ import annotations

import inspect

import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.contract import CONTRACT_METHODS, WorkerClient
from tensorhub_verl.ros.client.delta import DeltaPublished
from tensorhub_verl.ros.client.fetcher import FetchStats
from tensorhub_verl.ros.client.regional_client import RegionalClient
from tensorhub_verl.ros.client.sharded_client import ShardedClient
from tensorhub_verl.ros.wire.manifest import Manifest

CHUNK = 64 << 10
FORMS = ("plain", "sharded", "regional")


@pytest.mark.parametrize("cls", [Client, ShardedClient, RegionalClient], ids=lambda c: c.__name__)
def test_every_form_declares_the_contract_with_one_return_type_per_call(cls):
    for name in CONTRACT_METHODS:
        want, got = inspect.signature(getattr(WorkerClient, name)), inspect.signature(getattr(cls, name))
        assert str(got.return_annotation) == str(want.return_annotation), f"{cls.__name__}.{name} returns " \
                                                                          f"{got.return_annotation}"
        assert list(got.parameters)[:len(want.parameters)] == list(want.parameters), f"{cls.__name__}.{name}"


@pytest.fixture
def hubs(two_hub_processes_per_module):
    """Two hub processes: the shards of one hub for the sharded form, two regions' hubs for the regional form
    (each form its own model and workers), and the first alone for the plain form."""
    return two_hub_processes_per_module


def _url(form: str, procs) -> str:
    if form == "plain":
        return procs[0].url
    if form == "sharded":
        return ",".join(p.url for p in procs)
    return f"dc0/r0={procs[0].url},dc0/r1={procs[1].url}"


def _connect(form: str, procs, worker: str, rack: str = "r0") -> WorkerClient:
    client = th.connect(_url(form, procs), f"{form}-{worker}", location={"dc": "dc0", "rack": rack, "node": worker},
                        chunk_bytes=CHUNK, transport="tcp", hub_retry_s=60.0)
    assert isinstance(client, {"plain": Client, "sharded": ShardedClient, "regional": RegionalClient}[form])
    assert isinstance(client, WorkerClient)
    return client


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(64, 96, generator=g) for i in range(6)}


@pytest.mark.parametrize("form", FORMS)
def test_publish_fetch_query_and_unpublish_return_the_same_types_on_every_form(hubs, form):
    model = f"contract-{form}"
    weights = _weights(1)
    trainer = _connect(form, hubs, "trainer")
    reader = _connect(form, hubs, "reader", rack="r1")
    try:
        published = trainer.publish(model, 1, weights)
        assert isinstance(published, Manifest)
        assert sorted(t.name for t in published.tensors) == sorted(weights)
        assert (published.model, published.version, published.layout) == (model, 1, "hf")

        seen = reader.manifest(model, "latest")
        assert isinstance(seen, Manifest) and seen.version == 1
        assert {t.name: (tuple(t.shape), t.dtype) for t in seen.tensors} == \
               {t.name: (tuple(t.shape), t.dtype) for t in published.tensors}
        assert reader.versions(model) == {1: [f"{form}-trainer"]}
        assert reader.latest(model) == 1 and reader.wait_for_version(model, 0, timeout=10) == 1

        some = {"layer0.weight": torch.empty(64, 96)}
        part = reader.fetch_slices(model, 1, into=some)
        assert isinstance(part, FetchStats) and torch.equal(some["layer0.weight"], weights["layer0.weight"])

        into = seen.allocate()
        stats = reader.fetch(model, 1, into=into)
        assert isinstance(stats, FetchStats) and stats.version == 1
        assert stats.bytes == sum(t.numel() * t.element_size() for t in weights.values())
        assert all(torch.equal(into[name], t) for name, t in weights.items())
        assert isinstance(stats.manifest, Manifest) and stats.manifest.version == 1
        assert (model, 1, "hf") in reader.holdings()

        status = reader.status()
        assert isinstance(status, dict)
        assert {f"{form}-trainer", f"{form}-reader"} <= set(status["workers"])
        assert {v["version"] for v in status["models"][model]} == {1}

        reader.unpublish(model, 1)
        assert (model, 1, "hf") not in reader.holdings()
        with pytest.raises(th.errors.VersionNotFound):
            reader.unpublish(model, 1)  # no longer held: the same error on every form
    finally:
        reader.close()
        trainer.close()


@pytest.mark.parametrize("form", FORMS)
def test_publish_delta_returns_one_result_of_the_whole_version_on_every_form(hubs, form):
    """``publish_delta`` returns one ``DeltaPublished`` of the whole version's delta on every form that serves
    deltas (a hub of shards: its shares' results in ``shares``), and a reader holding the base reads the new
    version as that delta; a hub of regions refuses with ``ConfigError``, publishing nothing, and its reader reads
    the version in full."""
    model = f"delta-{form}"
    v1 = _weights(1)
    v2 = {name: t.clone() for name, t in v1.items()}
    for t in v2.values():
        t.view(-1)[:5] += 1.0  # a few elements of every tensor change
    trainer = _connect(form, hubs, "delta-trainer")
    reader = _connect(form, hubs, "delta-reader", rack="r1")
    try:
        trainer.publish(model, 1, v1)
        into = reader.manifest(model, 1).allocate()
        reader.fetch(model, 1, into=into)
        trainer.publish(model, 2, v2)
        if form == "regional":
            with pytest.raises(th.errors.ConfigError, match="hub of regions"):
                trainer.publish_delta(model, 2, 1, mode="on")
            assert trainer.versions(model, "delta/hf@1") == {}
        else:
            published = trainer.publish_delta(model, 2, 1, mode="on")
            assert isinstance(published, DeltaPublished), type(published)
            assert published.published and not published.reason
            assert (published.model, published.version, published.base_version) == (model, 2, 1)
            assert published.layout == "delta/hf@1"
            assert published.version_bytes == sum(t.numel() * t.element_size() for t in v2.values())
            assert published.changed_elements == 5 * len(v2) and published.elements == sum(t.numel() for t in v2.values())
            assert len(published.shares) == (2 if form == "sharded" else 0)
            if published.shares:  # the whole is the sum of its shares
                assert all(isinstance(share, DeltaPublished) and share.published for share in published.shares)
                assert published.bytes == sum(share.bytes for share in published.shares)
        stats = reader.fetch(model, 2, into=into, have=1)
        assert isinstance(stats, FetchStats) and stats.version == 2
        assert all(torch.equal(into[name], t) for name, t in v2.items())
        assert stats.delta.used is (form != "regional"), stats.delta.reasons
        if form != "regional":
            assert stats.bytes == published.bytes  # the delta form only
    finally:
        reader.close()
        trainer.close()


def _holder(client, model: str, shape):
    from tensorhub_dev.testing.layout_oracle import hf_to_vllm
    from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
    from tensorhub_verl.vllm.layout import hf_views, layout_name, vllm_param_shapes

    params = {n: torch.zeros(s) for n, s in vllm_param_shapes(shape).items()}

    def load(weights):  # as vLLM's loaders: copy_ each HF tensor into its parameter, through the layout's mapping
        for name, t in hf_to_vllm(dict(weights), shape).items():
            params[name].copy_(t)

    config = HolderConfig(model=model, layout=layout_name(shape.arch, 1, 0), staging="cpu", fetch_timeout_s=60.0)
    return EngineHolder(client, config, params, load, hf_views=hf_views(params, shape)), params


@pytest.mark.parametrize("form", FORMS)
def test_a_vllm_engine_holder_follows_a_version_through_every_form(hubs, form):
    """The holder reads the trainer's ``hf`` version through the form's ``manifest`` and ``fetch`` (a sharded hub's
    URL list once failed here: ``ShardedClient`` had no ``manifest``), applies it, and holds its own layout."""
    from tensorhub_dev.testing.layout_oracle import hf_to_vllm
    from tensorhub_verl.bench.tiny_model import random_hf_weights
    from tensorhub_verl.vllm.layout import DecoderShape

    shape = DecoderShape(arch="qwen2", num_layers=1, hidden_size=64, intermediate_size=128, num_heads=4,
                         num_kv_heads=2, head_dim=16, vocab_size=128, tie_word_embeddings=True, qkv_bias=True)
    model = f"engine-{form}"
    weights = random_hf_weights(shape)
    trainer = _connect(form, hubs, "engine-trainer")
    engine = _connect(form, hubs, "engine", rack="r1")
    holder = None
    try:
        trainer.publish(model, 1, weights)
        holder, params = _holder(engine, model, shape)
        result = holder.update(1, timeout=60)
        assert result.version == 1
        expected = hf_to_vllm(weights, shape)
        assert all(torch.equal(params[name], t) for name, t in expected.items())
        assert (model, 1, holder.config.layout) in engine.holdings()
    finally:
        if holder is not None:
            holder.close()
        engine.close()
        trainer.close()
