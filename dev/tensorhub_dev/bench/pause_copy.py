"""``tensorhub bench pause-copy``: what a rollout's pause costs behind an FSDP-sharded trainer, and what a version
in the rollout's dtype saves. Two side-by-side comparisons in one run.

One process, a real hub, real clients and data plane: ``--ranks`` trainer ranks publish each version as row
shards of a random float32 (master) model of Qwen2 shape (``Publisher`` with ``shard``, as the ``tensorhub``
checkpoint engine does with FSDP2), and ``--replicas`` rollout engines (``EngineHolder`` over plain tensors in
vLLM's layout: no vLLM) apply each version one after the other, as the verl updater does.

- ``pause_copy``: the trainer's ranks registered as reliable workers (a complete, live shard group: a replica
  that stops serving the old version copies nothing) against the same ranks registered as spot (not a reliable
  copy: the last replica to drop the old version copies it to CPU inside its pause, which is what every job with
  2+ FSDP ranks paid before the hub counted a complete group). Reported: bytes preserved and stall per step.
- ``dtype``: bf16 engines; versions published in bf16 (the trainer casts, ``tensorhub.rollout_dtype``) and pulled
  straight into the parameters, against versions published in the parameters' fp32 and taken through a staging
  copy and the engine's loader (``rollout_staging=cpu``, the one way a bf16 engine took an fp32 version before).
  Reported: bytes read from the trainer and by each replica per step (a replica that reads from a peer reads the
  peer's engine layout, in the engine's dtype, in both), pull and stall.
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

logger = logging.getLogger("tensorhub_dev.bench.pause_copy")


def _shape(layers: int, vocab: int):
    from tensorhub_verl.vllm.layout import DecoderShape

    return DecoderShape(arch="qwen2", num_layers=layers, hidden_size=512, intermediate_size=1408, num_heads=8,
                        num_kv_heads=2, head_dim=64, vocab_size=vocab, tie_word_embeddings=True, qkv_bias=True)


def _run(hub_url: str, tag: str, *, shape, steps: int, ranks: int, replicas: int, spot_trainer: bool,
         publish_dtype, engine_staging: str, timeout_s: float) -> list[dict]:
    """One configuration: per step, the trainer ranks publish version v, then each replica applies it."""
    import torch

    import tensorhub_verl as th
    from tensorhub_verl.ros.wire.manifest import row_range
    from tensorhub_dev.testing.layout_oracle import hf_to_vllm
    from tensorhub_verl.bench.tiny_model import random_hf_weights
    from tensorhub_verl.verl.dtypes import published_dtype
    from tensorhub_verl.verl.publisher import Publisher
    from tensorhub_verl.vllm.holder import EngineHolder, HolderConfig
    from tensorhub_verl.vllm.layout import hf_views, layout_name, vllm_param_shapes

    model = f"policy-{tag}"
    master = random_hf_weights(shape)  # float32 master weights, updated in place each step
    specs = {n: (tuple(t.shape), published_dtype(t.dtype, publish_dtype)) for n, t in master.items()}
    # as the checkpoint engine
    trainer_cfg = th.ClientConfig.from_fields(spot=spot_trainer, preserve_on_unpublish=False)
    clients, publishers, holders = [], [], []
    try:
        for r in range(ranks):
            c = th.connect(hub_url, f"{tag}-actor-{r}", location="dc=dc0,rack=r0,node=trainer", config=trainer_cfg)
            clients.append(c)
            publishers.append(Publisher(c, model=model, keep=2, staging="cpu", chunk_bytes=8 << 20,
                                        unpublish_timeout_s=timeout_s, shard=(r, ranks), dtype=publish_dtype))
        for i in range(replicas):
            c = th.connect(hub_url, f"{tag}-rollout-{i}", location=f"dc=dc0,rack=r0,node=rollout{i}")
            clients.append(c)
            params = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in vllm_param_shapes(shape).items()}

            def load(weights, params=params):  # vLLM's loaders copy_ into the parameters (and cast)
                for name, t in hf_to_vllm(dict(weights), shape).items():
                    params[name].copy_(t)

            holders.append(EngineHolder(c, HolderConfig(model=model, layout=layout_name("qwen2", 1, 0),
                                                        staging=engine_staging, fetch_timeout_s=timeout_s),
                                        params, load, hf_views=hf_views(params, shape)))
        rows = []
        for v in range(1, steps + 1):
            with torch.no_grad():
                for t in master.values():
                    t.add_(1e-3)  # the optimizer step
            t0 = time.monotonic()
            for r, p in enumerate(publishers):
                p.begin(v)
                for name, t in master.items():
                    p.add(name, t if t.dim() == 0 else t[slice(*row_range(t.shape[0], r, ranks))])
                p.finish(specs)
            publish_s = time.monotonic() - t0
            results = [h.update(v, timeout=timeout_s) for h in holders]
            rows.append({"version": v, "publish_s": publish_s,
                         "stall_s": [res.stall_s for res in results],
                         "pull_s": [res.pull_s for res in results],
                         "bytes": [res.bytes for res in results],
                         "bytes_from_trainer": sum(n for res in results for w, n in res.sources.items()
                                                   if "-actor-" in w),
                         "preserved_bytes": sum(res.preserved_bytes for res in results)})
            logger.info("%s v%d: stall %s, preserved %d bytes", tag, v,
                        [round(s, 3) for s in rows[-1]["stall_s"]], rows[-1]["preserved_bytes"])
        return rows
    finally:
        for h in holders:
            h.close()
        for p in publishers:
            p.close()
        for c in clients:
            c.close()


def _summary(rows: list[dict]) -> dict:
    later = rows[1:] or rows  # the first version has nothing to drop, and pays the connections
    # Times: medians over versions (a shared machine's hiccups land on single steps). The last replica to
    # apply is the one that drops the old version's last copy, when there is nothing else to keep it.
    return {"steps": rows,
            "preserved_bytes_per_step": statistics.mean(r["preserved_bytes"] for r in later),
            "stall_s_max_median": statistics.median(max(r["stall_s"]) for r in later),
            "last_replica_stall_s_median": statistics.median(r["stall_s"][-1] for r in later),
            "pull_s_median": statistics.median(statistics.mean(r["pull_s"]) for r in later),
            "bytes_per_replica_step": statistics.mean(statistics.mean(r["bytes"]) for r in later),
            "bytes_from_trainer_per_step": statistics.mean(r["bytes_from_trainer"] for r in later)}


def measure(*, layers: int = 4, vocab: int = 32000, steps: int = 5, ranks: int = 2, replicas: int = 2,
            timeout_s: float = 300.0) -> dict:
    import torch

    import tensorhub_verl as th
    from tensorhub_verl.bench.tiny_model import random_hf_weights

    shape = _shape(layers, vocab)
    fp32_bytes = sum(t.numel() * t.element_size() for t in random_hf_weights(shape).values())
    hub = th.start_hub(host="127.0.0.1", port=0)
    common = dict(shape=shape, steps=steps, ranks=ranks, replicas=replicas, timeout_s=timeout_s)
    try:
        pause = {"reliable_trainer": _summary(_run(hub.url, "reliable", spot_trainer=False,
                                                   publish_dtype=torch.bfloat16, engine_staging="none", **common)),
                 "spot_trainer": _summary(_run(hub.url, "spot", spot_trainer=True, publish_dtype=torch.bfloat16,
                                               engine_staging="none", **common))}
        dtype = {"bf16_published": _summary(_run(hub.url, "cast", spot_trainer=False, publish_dtype=torch.bfloat16,
                                                 engine_staging="none", **common)),
                 "fp32_published_staged": _summary(_run(hub.url, "nocast", spot_trainer=False, publish_dtype=None,
                                                        engine_staging="cpu", **common))}
    finally:
        hub.stop()
    return {"model_fp32_bytes": fp32_bytes, "ranks": ranks, "replicas": replicas, "pause_copy": pause,
            "dtype": dtype}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tensorhub bench pause-copy", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print only the JSON result line")
    p.add_argument("--layers", type=int, default=4, help="decoder layers of the Qwen2-shaped model (size)")
    p.add_argument("--steps", type=int, default=5, help="versions per configuration")
    p.add_argument("--ranks", type=int, default=2, help="trainer ranks (row shards)")
    p.add_argument("--replicas", type=int, default=2, help="rollout engines")
    ns = p.parse_args(argv)
    if min(ns.layers, ns.steps, ns.ranks, ns.replicas) < 1:
        p.error("--layers, --steps, --ranks and --replicas must be >= 1")
    if not ns.json:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    t0 = time.monotonic()
    out = measure(layers=ns.layers, steps=ns.steps, ranks=ns.ranks, replicas=ns.replicas)
    if not ns.json:
        print(f"model: {out['model_fp32_bytes'] / 1e6:.1f} MB in fp32, {ns.ranks} trainer ranks, "
              f"{ns.replicas} replicas; versions 2..{ns.steps}: bytes are means, seconds medians")
        print(f"{'configuration':34} {'preserved MB/step':>17} {'max stall s':>11} {'last stall s':>12} "
              f"{'pull s':>7} {'MB/replica':>10} {'MB from trainer':>15}")
        for group in ("pause_copy", "dtype"):
            for name, s in out[group].items():
                print(f"{group + '/' + name:34} {s['preserved_bytes_per_step'] / 1e6:>17.1f} "
                      f"{s['stall_s_max_median']:>11.3f} {s['last_replica_stall_s_median']:>12.3f} "
                      f"{s['pull_s_median']:>7.3f} "
                      f"{s['bytes_per_replica_step'] / 1e6:>10.1f} {s['bytes_from_trainer_per_step'] / 1e6:>15.1f}")
    print(json.dumps({"bench": "pause-copy", "seconds": time.monotonic() - t0, **out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
