"""``tensorhub bench tp-bytes``: bytes each TP rank reads from the trainer's 'hf' layout, vs the model's bytes.

A publisher holds a random Llama- or Qwen2-shaped model (float32, 'hf' layout); for each TP size, every rank
of one engine reads its slices of it with ``Client.fetch_slices`` into plain tensors in vLLM's layout for that
rank (``layout.hf_views``), over the real data plane, and the result is checked byte for byte against
``layout_oracle.hf_to_vllm``. Reported per TP size: the model's bytes, each rank's bytes read, and the engine's total
over the model (1.0: the engine moved one model; KV heads replicated across ranks, when there are more ranks
than KV heads, are read once per rank that holds them). The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from tensorhub_verl.bench import positive_ints

logger = logging.getLogger("tensorhub_dev.bench.tp_bytes")

SHAPES = {
    "llama": dict(num_layers=4, hidden_size=512, intermediate_size=1408, num_heads=8, num_kv_heads=2, head_dim=64,
                  vocab_size=32000, tie_word_embeddings=False, qkv_bias=False),
    "qwen2": dict(num_layers=4, hidden_size=512, intermediate_size=1408, num_heads=8, num_kv_heads=2, head_dim=64,
                  vocab_size=32000, tie_word_embeddings=True, qkv_bias=True),
}


def measure(arch: str, tps: tuple[int, ...] = (1, 2, 4), timeout_s: float = 300.0) -> dict:
    """Runs the reads for one architecture; returns ``{"arch", "model_bytes", "tp": {N: {...}}}``."""
    import torch

    import tensorhub_verl as th
    from tensorhub_dev.testing.layout_oracle import hf_to_vllm
    from tensorhub_verl.vllm.layout import DecoderShape, hf_views, vllm_param_shapes
    from tensorhub_verl.bench.tiny_model import random_hf_weights

    shape = DecoderShape(arch=arch, **SHAPES[arch])
    hf = random_hf_weights(shape)
    model_bytes = sum(t.numel() * t.element_size() for t in hf.values())
    hub = th.start_hub(host="127.0.0.1", port=0)
    out: dict = {"arch": arch, "model_bytes": model_bytes, "tp": {}}
    try:
        with th.connect(hub.url, "trainer", location="dc=dc0,rack=r0,node=trainer") as trainer:
            trainer.publish("policy", 1, hf)
            for tp in tps:
                per_rank, seconds = [], []
                for rank in range(tp):
                    params = {n: torch.zeros(s) for n, s in vllm_param_shapes(shape, tp, rank).items()}
                    views = hf_views(params, shape, tp, rank)
                    with th.connect(hub.url, f"tp{tp}-rank{rank}", location="dc=dc0,rack=r0,node=engine") as c:
                        stats = c.fetch_slices("policy", 1, into=views.views, slices=views.slices,
                                               timeout=timeout_s)
                    for pad in views.padding:
                        pad.zero_()
                    expected = hf_to_vllm(hf, shape, tp, rank)
                    wrong = [n for n, t in expected.items() if not torch.equal(params[n], t)]
                    if wrong:
                        raise th.errors.TransferFailed(f"TP={tp} rank {rank}: {wrong[:3]} differ from hf_to_vllm")
                    per_rank.append(stats.bytes)
                    seconds.append(stats.seconds)
                out["tp"][tp] = {"per_rank_bytes": per_rank, "engine_over_model": sum(per_rank) / model_bytes,
                                 "rank_over_model": max(per_rank) / model_bytes, "seconds": seconds}
                logger.info("%s TP=%d: per rank %s bytes of %d (engine %.3fx the model)", arch, tp, per_rank,
                            model_bytes, sum(per_rank) / model_bytes)
    finally:
        hub.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tensorhub bench tp-bytes", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print only the JSON result line")
    p.add_argument("--arch", default="llama,qwen2", help=f"comma list of {sorted(SHAPES)}")
    p.add_argument("--tp", default=(1, 2, 4), type=positive_ints, help="comma list of TP sizes")
    ns = p.parse_args(argv)
    if not ns.json:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    t0 = time.monotonic()
    results = [measure(arch, ns.tp) for arch in ns.arch.split(",") if arch]
    if not ns.json:
        print(f"{'arch':6} {'TP':>3} {'model MB':>9} {'per rank MB':>24} {'rank/model':>10} {'engine/model':>12}")
        for r in results:
            for tp, row in r["tp"].items():
                ranks = " ".join(f"{b / 1e6:.1f}" for b in row["per_rank_bytes"])
                print(f"{r['arch']:6} {tp:>3} {r['model_bytes'] / 1e6:>9.1f} {ranks:>24} "
                      f"{row['rank_over_model']:>10.3f} {row['engine_over_model']:>12.3f}")
    print(json.dumps({"bench": "tp-bytes", "seconds": time.monotonic() - t0, "results": results}))
    return 0
