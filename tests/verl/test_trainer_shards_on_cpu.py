"""``shards.local_shards`` on a real FSDP2 model over gloo: each rank's pieces are exactly its torch.chunk rows
of the full HF tensors (what ``Client.publish_shard`` requires), with no gather."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.verl.conftest import free_port

pytestmark = pytest.mark.timeout(180)


class _Engine:
    """What ``local_shards`` reads of verl's FSDP engine: its ``module``."""

    def __init__(self, module):
        self.module = module


def _tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=99, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg)


def _rank_main(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from torch.distributed.fsdp import fully_shard

        from tensorhub_verl.ros.wire.manifest import row_range
        from tensorhub_verl.verl.shards import local_shards

        model = _tiny_model()
        full = {n: t.detach().clone() for n, t in model.state_dict().items()}
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        shards = local_shards(_Engine(model))
        assert shards is not None and (shards.rank, shards.ranks) == (rank, world)
        assert list(shards.specs) == list(full)
        for name, piece in shards.pieces.items():
            shape, dtype = shards.specs[name]
            assert shape == tuple(full[name].shape) and dtype == full[name].dtype, name
            start, stop = row_range(shape[0], rank, world)
            assert torch.equal(piece, full[name][start:stop]), name
        out[rank] = sum(p.numel() * p.element_size() for p in shards.pieces.values())
    finally:
        dist.destroy_process_group()


def test_each_fsdp2_rank_exports_exactly_its_rows():
    world = 2
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank_main, args=(world, free_port(), out), nprocs=world, join=True)
        sizes = dict(out)
    total = sum(t.numel() * t.element_size() for t in _tiny_model().state_dict().values())
    assert sum(sizes.values()) == total  # the ranks' rows partition the model: no byte twice, none missing
    assert all(abs(n - total / world) < 0.2 * total for n in sizes.values())  # about half each
