"""`tensorhub demo ros`: a hub, a publisher and several reader processes on this machine.

The publisher (the "trainer") holds version 1, readers fetch it at once and serve each other; then
the trainer publishes version 2 and the readers follow. Prints what moved, from where, how fast.
"""

from __future__ import annotations

import argparse
import json
import time

from tensorhub_verl.bench.procs import Role, random_weights
from tensorhub_verl.ros.wire.integrity import tensor_digests
from tensorhub_verl.ros.planes.factory import TRANSPORTS


def _trainer(results, control, hub_url: str, size_mb: float, versions: int, transport: str) -> None:
    import tensorhub_verl as th

    client = th.connect(hub_url, "trainer", location={"dc": "dc0", "rack": "r0", "node": "n0"}, transport=transport)
    weights = random_weights(size_mb, seed=1)
    for version in range(1, versions + 1):
        if version > 1:
            client.unpublish("policy", version - 1)  # waits for in-flight reads; then we may write
            for t in weights.values():  # stands in for an optimizer step, in place
                t.mul_(0.99).add_(0.01)
        client.publish("policy", version, weights)
        results.put(("ok", {"version": version, "digests": tensor_digests(weights)}))
        control.get(timeout=600)
    client.close()


def _rollout(results, control, hub_url: str, name: str, node: str, versions: int, transport: str) -> None:
    import tensorhub_verl as th

    client = th.connect(hub_url, name, location={"dc": "dc0", "rack": "r0", "node": node}, transport=transport)
    seen = None
    for _ in range(versions):
        version = client.wait_for_version("policy", newer_than=seen, timeout=120)
        buffers = client.manifest("policy", version).allocate()
        stats = client.fetch("policy", version, into=buffers)
        if seen is not None:
            client.unpublish("policy", seen)
        seen = version
        results.put(("ok", {"worker": name, "version": version, "bytes": stats.bytes, "seconds": stats.seconds,
                            "sources": stats.sources, "digests": tensor_digests(buffers)}))
        control.get(timeout=600)
    client.close()


def run(readers: int, size_mb: float, versions: int, transport: str = "auto") -> list[dict]:
    import tensorhub_verl as th

    hub = th.start_hub(plane=transport)  # the hub's plane: every worker's
    print(f"hub at {hub.url}; trainer publishes {versions} versions of ~{size_mb:.0f} MB to {readers} rollouts")
    trainer = Role(_trainer, hub.url, size_mb, versions, transport)
    rollouts = [Role(_rollout, hub.url, f"rollout-{i}", f"n{i // 2}", versions, transport) for i in range(readers)]
    rows = []
    try:
        for _ in range(versions):
            published = trainer.result(120)
            fetched = [r.result(600) for r in rollouts]
            print(f"\nversion {published['version']}:")
            print(f"  {'reader':<11} {'MB':>7} {'seconds':>8} {'GB/s':>6}  sources (MB)")
            for f in fetched:
                ok = f["digests"] == published["digests"]  # every tensor's dtype, shape and bytes
                sources = ", ".join(f"{w}={b / 1e6:.0f}" for w, b in sorted(f["sources"].items()))
                print(f"  {f['worker']:<11} {f['bytes'] / 1e6:>7.1f} {f['seconds']:>8.3f} "
                      f"{f['bytes'] / f['seconds'] / 1e9:>6.2f}  {sources}  {'bytes OK' if ok else 'BYTES DIFFER'}")
                rows.append(f | {"bytes_ok": ok})
            trainer.send("next")
            for r in rollouts:
                r.send("next")
        from_trainer = sum(f["sources"].get("trainer", 0) for f in rows)
        total = sum(f["bytes"] for f in rows)
        print(f"\ntrainer served {from_trainer / 1e6:.0f} MB of {total / 1e6:.0f} MB moved "
              f"({from_trainer / total:.0%}); the rest came from rollouts that already held the chunks.")
    finally:
        for role in [trainer, *rollouts]:
            role.stop()
        hub.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub demo ros", description=__doc__)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--size-mb", type=float, default=64)
    parser.add_argument("--versions", type=int, default=2)
    parser.add_argument("--transport", choices=TRANSPORTS, default="auto",
                        help="the data plane (PlaneConfig.kind): auto picks NIXL shared memory on one host")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = run(args.readers, args.size_mb, args.versions, args.transport)
    ok = all(r["bytes_ok"] for r in rows)
    print(json.dumps({"demo": "ok" if ok else "bytes differ", "readers": args.readers, "versions": args.versions,
                      "seconds": round(time.monotonic() - started, 2),
                      "trainer_bytes": sum(r["sources"].get("trainer", 0) for r in rows),
                      "total_bytes": sum(r["bytes"] for r in rows)}))
    return 0 if ok else 1
