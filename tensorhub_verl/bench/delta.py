"""`tensorhub bench delta`: what a delta between two RL versions costs, on versions from real optimizer steps.

A random llama (``--params``, default ~17M) is trained with AdamW on random tokens at each learning rate of
``--lrs`` (default 1e-6 and 1e-5, the same batches for both, side by side): fp32 master weights, every step's
version published as bf16, as a trainer publishes to bf16 rollouts. For each delta N-1 -> N, per chunk of the
version (the product's chunking, ``--chunk-mib``):

- the changed fraction (bf16 words whose bits differ);
- the encoded bytes per changed word of every encoding (``ros.wire.delta_codec``), and of the chooser's pick
  (the mix);
- encode (the chooser, as a publisher runs it), apply (decode + write into a copy of N-1) and verify (N's chunk
  digests from N-1's and the changed words, ``ros.wire.delta_digest``) throughput, in GB/s of version bytes, on the
  CPU (``--threads``) and, when a GPU is present, on it;
- against the time the version takes in full, and the delta, on links of ``--link-gbit`` (default 25 and 1);
- the same version published in float32 for float32 rollouts (each word a bf16 value up-cast): bytes per changed
  element of the chooser with the codec's ``_bf16`` encodings (the words' high halves) and without them (whole
  float32 words), each against the bf16 delta, and encode / apply / verify throughput of the float32 version.

Every applied version is checked byte for byte and by digest. ``--profile-out FILE`` writes the measured
``DeltaProfile`` per learning rate (``bench.delta_profile``: what the lab and the simulator draw deltas from).
Prints a line per delta, a summary per learning rate, then one JSON object.

    tensorhub bench delta [--params 17M] [--steps 6] [--lrs 1e-6,1e-5] [--link-gbit 25,1] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from tensorhub_verl.bench.delta_profile import BLOCK_BYTES, DeltaProfile
from tensorhub_verl.ros.wire import delta_codec as dc
from tensorhub_verl.ros.wire.delta_digest import chunk_grid, target_digest_from_base
from tensorhub_verl.ros.wire.integrity import chunk_digests
from tensorhub_verl.ros.wire.manifest import TensorSpec, dtype_from_name, split_into_chunks

VOCAB = 8192
GOAL_BYTES_PER_CHANGED = 2.0


def _params_arg(text: str) -> int:
    scale = {"k": 1e3, "m": 1e6, "b": 1e9}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * scale[t[-1]] if t and t[-1] in scale else float(t)
    except ValueError:
        value = 0
    if value < 1e4:
        raise argparse.ArgumentTypeError(f"{text!r}: a parameter count of at least 10k, e.g. 17M or 2.5e8")
    return int(value)


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: positive numbers separated by commas, e.g. 1e-6,1e-5")
    return values


def shape_for(params: int, vocab: int = VOCAB) -> dict:
    """Llama sizes whose parameter count is nearest ``params`` (head dim 64, layers ~ hidden / 64, untied head)."""
    best = None
    for hidden in range(64, 8193, 64):
        layers = max(2, hidden // 64)
        inter = 64 * round(hidden * 8 / 3 / 64)
        count = 2 * vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden) + hidden
        if best is None or abs(count - params) < abs(best["params"] - params):
            best = {"hidden_size": hidden, "num_layers": layers, "intermediate_size": inter, "params": count}
    return best


def build_model(params: int, seed: int, vocab: int = VOCAB):
    import transformers

    s = shape_for(params, vocab)
    heads = s["hidden_size"] // 64
    config = transformers.LlamaConfig(
        hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"], num_hidden_layers=s["num_layers"],
        num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=512,
        tie_word_embeddings=False, initializer_range=0.02, torch_dtype="float32")
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).float()


def _version(model) -> tuple[list[TensorSpec], torch.Tensor]:
    """The model's parameters as a bf16 version: specs in order, and the flat bytes."""
    tensors = [(n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]
    specs = [TensorSpec.of(n, t) for n, t in tensors]
    return specs, torch.cat([t.reshape(-1).view(torch.uint8) for _, t in tensors])


def _as_float32(specs, flat: torch.Tensor) -> tuple[list[TensorSpec], torch.Tensor]:
    """A bf16 version published in float32 (the rollouts' dtype): specs and flat bytes of the exact up-casts."""
    return ([TensorSpec(s.name, s.shape, "float32", s.nbytes * 2) for s in specs],
            flat.view(torch.bfloat16).float().view(torch.uint8))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _chunk_slices(chunks) -> list[tuple[int, int]]:
    out, start = [], 0
    for c in chunks:
        out.append((start, start + c.nbytes))
        start += c.nbytes
    return out


def _tensors_of(flat: torch.Tensor, specs) -> list[torch.Tensor]:
    out, start = [], 0
    for s in specs:
        out.append(flat[start:start + s.nbytes])
        start += s.nbytes
    return out


def _rows(flat: torch.Tensor, specs) -> list[torch.Tensor]:
    """Per tensor, its bytes shaped as the tensor's grid sees them (``chunk_digests`` takes tensors)."""
    return [t.view(dtype_from_name(s.dtype)).view(s.shape) for t, s in zip(_tensors_of(flat, specs), specs)]


def _timed(fn, device: str):
    """(fn(), wall seconds, this thread's CPU seconds). On a host whose cores are shared the CPU seconds say what
    a core of its own would take (the codec runs on the calling thread: numpy, zstd, torch at ``--threads 1``)."""
    _sync(device)
    wall, cpu = time.perf_counter(), time.thread_time()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - wall, time.thread_time() - cpu


def _timed_pass(base: torch.Tensor, target: torch.Tensor, chunks, specs, slices, base_dig, target_dig,
                device: str, dtype: torch.dtype) -> dict:
    """Encode (the chooser), apply (decode + write) and verify (target digests from the changes) every chunk of
    one delta on ``device``, and the full digest of the result for comparison; returns wall and CPU seconds of
    each, the chosen encodings and whether the result is exact."""
    base, target = base.to(device), target.to(device)
    grids = [chunk_grid(c, specs) for c in chunks]
    encoded, *encode = _timed(lambda: [dc.encode_chunk(base[a:b], target[a:b], dtype=dtype)
                                       for a, b in slices], device)
    into = base.clone()

    def apply():
        out = []
        for (a, b), e in zip(slices, encoded):
            ch = dc.decode_chunk(e.encoding, e.payload, into[a:b], dtype=dtype)
            dc.write_changes(ch, into[a:b])
            out.append(ch)
        return out

    changes, *apply_s = _timed(apply, device)
    digests, *verify = _timed(lambda: [target_digest_from_base(base_dig[c.index], g, ch)
                                       for c, g, ch in zip(chunks, grids, changes)], device)
    full, *full_digest = _timed(lambda: chunk_digests(chunks, _rows(into, specs)), device)
    out = {"encoded": encoded, "exact": bool(torch.equal(into, target)),
           "digests_match": list(digests) == list(target_dig) == list(full)}
    for name, (wall, cpu) in (("encode", encode), ("apply", apply_s), ("verify", verify),
                              ("full_digest", full_digest)):
        out[f"{name}_s"], out[f"{name}_cpu_s"] = wall, cpu
    return out


def _stats(base: torch.Tensor, target: torch.Tensor) -> tuple[list[float], np.ndarray]:
    """Changed fraction per ``BLOCK_BYTES`` block, and every changed word's signed ulp step."""
    bw, tw = base.numpy().view(np.int16), target.numpy().view(np.int16)
    changed = bw != tw
    per = BLOCK_BYTES // 2
    fractions = [float(changed[i:i + per].mean()) for i in range(0, changed.size, per)]
    where = np.flatnonzero(changed)
    kb = dc._keys(bw[where], True).astype(np.int32)
    kt = dc._keys(tw[where], True).astype(np.int32)
    return fractions, kt - kb


def _form(base: torch.Tensor, target: torch.Tensor, specs, chunk_bytes: int, devices: list[str],
          dtype: torch.dtype) -> dict:
    """The chooser's delta of one form of the version (its dtype, chunked alike), timed on each device: its
    bytes, its mix of encodings, and per device throughput in GB/s of this form's bytes and exactness."""
    chunks = split_into_chunks(tuple(specs), chunk_bytes)
    slices = _chunk_slices(chunks)
    base_dig = chunk_digests(chunks, _rows(base, specs))
    target_dig = chunk_digests(chunks, _rows(target, specs))
    gb = base.numel() / 1e9
    rec: dict = {"slices": slices}
    for device in devices:
        timed = _timed_pass(base, target, chunks, specs, slices, base_dig, target_dig, device, dtype)
        chosen = timed.pop("encoded")
        mix: dict[str, int] = {}
        for e in chosen:
            mix[e.encoding] = mix.get(e.encoding, 0) + 1
        names = ("encode", "apply", "verify", "full_digest")
        rec[device] = {**{f"{n}_gbps": gb / timed[f"{n}_s"] for n in names},
                       **{f"{n}_cpu_gbps": gb / max(timed[f"{n}_cpu_s"], 1e-9) for n in names},
                       "exact": timed["exact"], "digests_match": timed["digests_match"],
                       **{k: v for k, v in timed.items() if k.endswith("_s")}}
        rec.setdefault("delta_bytes", sum(e.nbytes for e in chosen))
        rec.setdefault("mix", mix)
    return rec


def measure(base: torch.Tensor, target: torch.Tensor, specs, chunk_bytes: int, links: tuple[float, ...],
            devices: list[str]) -> tuple[dict, list[float], np.ndarray]:
    nbytes = base.numel()
    elements = nbytes // 2
    form = _form(base, target, specs, chunk_bytes, devices, torch.bfloat16)
    per_encoding = {e: 0 for e in (dc.OVERWRITE, dc.XOR, dc.ULP)}
    changed = 0
    for a, b in form.pop("slices"):
        each = dc.encode_each(base[a:b], target[a:b], dtype=torch.bfloat16, encodings=tuple(per_encoding))
        for e, enc in each.items():
            per_encoding[e] += enc.nbytes
        changed += next(iter(each.values())).changed
    rec = {"changed_fraction": changed / elements, "changed": changed,
           "bytes_per_changed": {e: v / max(changed, 1) for e, v in per_encoding.items()}, **form}
    rec["chosen_bytes_per_changed"] = rec["delta_bytes"] / max(changed, 1)
    rec["delta_over_version"] = rec["delta_bytes"] / nbytes
    rec["links"] = {f"{g:g}": {"full_s": nbytes * 8 / (g * 1e9), "delta_s": rec["delta_bytes"] * 8 / (g * 1e9)}
                    for g in links}
    rec["float32"] = _float32_form(base, target, specs, chunk_bytes, devices, rec["delta_bytes"], changed)
    fractions, steps = _stats(base, target)
    return rec, fractions, steps


def _float32_form(base: torch.Tensor, target: torch.Tensor, specs, chunk_bytes: int, devices: list[str],
                  bf16_delta_bytes: int, changed: int) -> dict:
    """The version published in float32 for float32 rollouts: the chooser's delta (with the ``_bf16``
    encodings) timed as the bf16 one, and its size without them (whole float32 words), each per changed element
    and against the bf16 delta."""
    specs32, base32 = _as_float32(specs, base)
    _, target32 = _as_float32(specs, target)
    rec = _form(base32, target32, specs32, chunk_bytes, devices, torch.float32)
    plain = sum(dc.encode_chunk(base32[a:b], target32[a:b], dtype=torch.float32, bf16_halves=False).nbytes
                for a, b in rec.pop("slices"))
    rec["plain_delta_bytes"] = plain
    rec["chosen_bytes_per_changed"] = rec["delta_bytes"] / max(changed, 1)
    rec["plain_bytes_per_changed"] = plain / max(changed, 1)
    rec["over_bf16"] = rec["delta_bytes"] / max(bf16_delta_bytes, 1)
    rec["plain_over_bf16"] = plain / max(bf16_delta_bytes, 1)
    return rec


def _line(lr: float, step: int, rec: dict, links, devices) -> str:
    bpc = "  ".join(f"{e} {v:.2f}" for e, v in rec["bytes_per_changed"].items())
    mix = ",".join(f"{e}x{n}" for e, n in sorted(rec["mix"].items()))
    parts = [f"lr {lr:g} step {step}: changed {100 * rec['changed_fraction']:.2f}%  B/changed {bpc}  chosen "
             f"{rec['chosen_bytes_per_changed']:.2f} ({mix}) = {100 * rec['delta_over_version']:.2f}% of the version"]
    for d in devices:
        r = rec[d]
        figures = "  ".join(f"{n.replace('_', ' ')} {r[n + '_gbps']:.2f} ({r[n + '_cpu_gbps']:.2f})"
                            for n in ("encode", "apply", "verify", "full_digest"))
        parts.append(f"  {d}: GB/s of version bytes, wall (per CPU second): {figures}  "
                     f"exact {r['exact'] and r['digests_match']}")
    for g in links:
        link = rec["links"][f"{g:g}"]
        parts.append(f"  at {g:g} Gbit/s: version in full {1e3 * link['full_s']:.1f} ms, delta "
                     f"{1e3 * link['delta_s']:.2f} ms")
    f = rec["float32"]
    mix = ",".join(f"{e}x{n}" for e, n in sorted(f["mix"].items()))
    parts.append(f"  float32 version (bf16 values): chosen {f['chosen_bytes_per_changed']:.2f} B/changed ({mix}) = "
                 f"{f['over_bf16']:.2f}x the bf16 delta; whole float32 words {f['plain_bytes_per_changed']:.2f} = "
                 f"{f['plain_over_bf16']:.2f}x")
    for d in devices:
        r = f[d]
        parts.append(f"  float32 {d}: GB/s of float32 version bytes, wall (per CPU second): encode "
                     f"{r['encode_gbps']:.2f} ({r['encode_cpu_gbps']:.2f})  apply {r['apply_gbps']:.2f} "
                     f"({r['apply_cpu_gbps']:.2f})  exact {r['exact'] and r['digests_match']}")
    return "\n".join(parts)


def _summary(records: list[dict], links, devices, nbytes: int) -> dict:
    med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    out = {"changed_fraction": med([r["changed_fraction"] for r in records]),
           "chosen_bytes_per_changed": med([r["chosen_bytes_per_changed"] for r in records]),
           "bytes_per_changed": {e: med([r["bytes_per_changed"][e] for r in records])
                                 for e in records[0]["bytes_per_changed"]},
           "delta_over_version": med([r["delta_over_version"] for r in records])}
    keys = [f"{n}{kind}_gbps" for n in ("encode", "apply", "verify", "full_digest") for kind in ("", "_cpu")]
    f32 = [r["float32"] for r in records]
    out["float32"] = {k: med([f[k] for f in f32]) for k in ("chosen_bytes_per_changed", "plain_bytes_per_changed",
                                                             "over_bf16", "plain_over_bf16")}
    for d in devices:
        out["float32"][d] = {k: med([f[d][k] for f in f32]) for k in keys}
        out["float32"][d]["all_exact"] = all(f[d]["exact"] and f[d]["digests_match"] for f in f32)
    for d in devices:
        out[d] = {k: med([r[d][k] for r in records]) for k in keys}
        out[d]["all_exact"] = all(r[d]["exact"] and r[d]["digests_match"] for r in records)
        # wall and per CPU second, against the link moving the version in full
        out[d]["faster_than_link"] = {
            f"{g:g}": {f"{n}{kind}": out[d][f"{n}{kind}_gbps"] * 8 > g for n in ("encode", "apply")
                       for kind in ("", "_cpu")} for g in links}
    return out


def run(params: int, steps: int, lrs: tuple[float, ...], links: tuple[float, ...], chunk_mib: float, threads: int,
        batch: int, seq: int, seed: int, devices: list[str], vocab: int = VOCAB
        ) -> tuple[dict, dict[float, DeltaProfile]]:
    torch.set_num_threads(threads)
    models = {lr: build_model(params, seed, vocab) for lr in lrs}
    optims = {lr: torch.optim.AdamW(m.parameters(), lr=lr) for lr, m in models.items()}
    versions = {lr: _version(m) for lr, m in models.items()}
    specs, first = versions[lrs[0]]
    nbytes = first.numel()
    print(f"model: {sum(p.numel() for p in models[lrs[0]].parameters()) / 1e6:.1f}M parameters, "
          f"{shape_for(params, vocab)}, version {nbytes / 1e6:.1f} MB bf16, chunks of {chunk_mib:g} MiB, devices {devices}")
    g = torch.Generator().manual_seed(seed + 1)
    records: dict[float, list[dict]] = {lr: [] for lr in lrs}
    fractions: dict[float, list[float]] = {lr: [] for lr in lrs}
    steps_seen: dict[float, list[np.ndarray]] = {lr: [] for lr in lrs}
    for step in range(1, steps + 1):
        tokens = torch.randint(0, vocab, (batch, seq), generator=g)
        for lr in lrs:
            model, opt = models[lr], optims[lr]
            t0 = time.perf_counter()
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            train_s = time.perf_counter() - t0
            base = versions[lr][1]
            specs, target = _version(model)
            rec, fr, st = measure(base, target, specs, int(chunk_mib * (1 << 20)), links, devices)
            rec.update(step=step, lr=lr, loss=float(loss.detach()), train_s=train_s)
            records[lr].append(rec)
            fractions[lr].extend(fr)
            steps_seen[lr].append(st)
            versions[lr] = (specs, target)
            print(_line(lr, step, rec, links, devices), flush=True)
    summary = {f"{lr:g}": _summary(records[lr], links, devices, nbytes) for lr in lrs}
    for lr in lrs:
        s = summary[f"{lr:g}"]
        print(f"lr {lr:g} median: changed {100 * s['changed_fraction']:.2f}%  chosen {s['chosen_bytes_per_changed']:.2f} "
              f"B/changed (goal <= {GOAL_BYTES_PER_CHANGED:g} at 1-3% changed)  "
              + "  ".join(f"{d}: encode {s[d]['encode_gbps']:.2f} ({s[d]['encode_cpu_gbps']:.2f}) / apply "
                          f"{s[d]['apply_gbps']:.2f} ({s[d]['apply_cpu_gbps']:.2f}) / verify {s[d]['verify_gbps']:.2f} "
                          f"({s[d]['verify_cpu_gbps']:.2f}) GB/s wall (per CPU second)" for d in devices))
        f = s["float32"]
        print(f"lr {lr:g} median, float32 version of bf16 values: chosen {f['chosen_bytes_per_changed']:.2f} "
              f"B/changed = {f['over_bf16']:.2f}x the bf16 delta (whole float32 words: "
              f"{f['plain_bytes_per_changed']:.2f} = {f['plain_over_bf16']:.2f}x)  "
              + "  ".join(f"{d}: encode {f[d]['encode_gbps']:.2f} ({f[d]['encode_cpu_gbps']:.2f}) / apply "
                          f"{f[d]['apply_gbps']:.2f} ({f[d]['apply_cpu_gbps']:.2f}) GB/s of float32 bytes"
                          for d in devices))
    profiles = {lr: DeltaProfile.measure(lr, fractions[lr], np.concatenate(steps_seen[lr]),
                                         bytes_per_changed=summary[f"{lr:g}"]["chosen_bytes_per_changed"],
                                         changed_fraction=statistics.mean(r["changed_fraction"]
                                                                          for r in records[lr]),
                                         seed=seed) for lr in lrs}
    result = {"bench": "delta", "params": sum(p.numel() for p in models[lrs[0]].parameters()),
              "version_bytes": nbytes, "chunk_mib": chunk_mib, "threads": threads, "devices": devices,
              "links_gbit": list(links), "goal_bytes_per_changed": GOAL_BYTES_PER_CHANGED,
              "summary": summary, "steps": {f"{lr:g}": records[lr] for lr in lrs}}
    return result, profiles


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensorhub bench delta", description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=_params_arg, default=_params_arg("17M"),
                   help="parameters of the random llama (17M, 100M, 2.5e8, ...)")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps (deltas) per learning rate")
    p.add_argument("--lrs", type=_floats, default=(1e-6, 1e-5), help="AdamW learning rates, side by side")
    p.add_argument("--link-gbit", type=_floats, default=(25.0, 1.0), help="link speeds to compare with, Gbit/s")
    p.add_argument("--chunk-mib", type=float, default=8.0, help="chunk size of the version (the product's default)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary of the random llama")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where encode/apply/verify are timed: auto = the CPU, and the GPU when present")
    p.add_argument("--profile-out", default=None, help="write the measured DeltaProfile per learning rate (JSON)")
    p.add_argument("--json", action="store_true", help="accepted for symmetry; the JSON line is always printed")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.steps < 1:
        parser().error("--steps must be >= 1")
    if a.device == "auto":
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    elif a.device == "cuda" and not torch.cuda.is_available():
        parser().error("--device cuda: no CUDA device here")
    else:
        devices = [a.device]
    result, profiles = run(a.params, a.steps, a.lrs, a.link_gbit, a.chunk_mib, a.threads, a.batch, a.seq, a.seed,
                           devices, a.vocab)
    if a.profile_out:
        Path(a.profile_out).write_text(json.dumps({f"{lr:g}": json.loads(p.to_json())
                                                   for lr, p in profiles.items()}, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
