"""One delta read end to end on this host: a reader that holds v1 reads v2 as its delta, beside a reader that
reads v2 in full, through one embedded hub and the default data plane.

    PYTHONPATH=. python scripts/delta_fetch_inprocess.py [MIB] [CHANGED_PERCENT]

A bf16 version of MIB MiB (default 64) whose step moves CHANGED_PERCENT (default 2) of its elements by one or two
units in the last place, as small optimizer steps move bf16 weights. Prints the delta's size, bytes per changed
element, the publisher's encode time, the reader's apply time (decode, target digests derived from the base's,
write, one digest pass) and both fetches' times, then one JSON object.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import tensorhub_verl as th


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    percent = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    torch.manual_seed(0)
    n = mib << 19
    base = {"w": torch.randn(4096, n // 4096).to(torch.bfloat16)}
    target = {"w": base["w"].clone()}
    words = target["w"].view(-1).view(torch.int16)
    moved = torch.randperm(n)[: int(n * percent / 100)]
    steps = torch.randint(1, 3, (moved.numel(),), dtype=torch.int16)
    words[moved] += steps * (torch.randint(0, 2, (moved.numel(),), dtype=torch.int16) * 2 - 1)
    hub = th.start_hub()
    try:
        with th.connect(hub.url, "trainer") as trainer, th.connect(hub.url, "r1") as r1, \
                th.connect(hub.url, "r2") as r2:
            trainer.publish("p", 1, base)
            trainer.publish("p", 2, target)
            published = trainer.publish_delta("p", 2, 1)
            into = {"w": base["w"].clone()}
            t0 = time.monotonic()
            stats = r1.fetch("p", 2, into=into, have=1)
            delta_s = time.monotonic() - t0
            if not torch.equal(into["w"], target["w"]):
                raise SystemExit("the delta did not give v2's bytes")
            t0 = time.monotonic()
            r2.fetch("p", 2)
            full_s = time.monotonic() - t0
    finally:
        hub.stop()
    out = {"version_bytes": published.version_bytes, "delta_bytes": published.bytes,
           "changed_fraction": round(published.changed_fraction, 4),
           "bytes_per_changed_element": round(published.bytes / max(1, published.changed_elements), 3),
           "encodings": published.encodings, "encode_s": round(published.seconds, 3),
           "apply_s": round(stats.delta.apply_seconds, 3), "fetch_delta_s": round(delta_s, 3),
           "fetch_full_s": round(full_s, 3)}
    for key, value in out.items():
        print(f"{key:28s} {value}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
