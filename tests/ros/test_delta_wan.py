"""One WAN copy of a delta per datacenter: readers behind a WAN that all hold the base and ask for the next
version at once read its delta across the WAN once (the seed), the others from the seed as its chunks land.
Datacenters are location labels here (one host); the planner's distance rules are what is exercised."""

import threading

import torch

import tensorhub_verl as th
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig

from tests.ros.delta_roles import CHUNK, versions


def test_readers_in_another_datacenter_pull_one_wan_copy_of_the_delta_and_spread_it_locally(hub):
    v1, v2 = versions(2, rows=64)  # a delta of several chunks
    names = ["a", "b", "c"]
    readers = [Client(hub.url, name, f"dc=dc1,rack=r0,node={name}",
                      config=ClientConfig.from_fields(window=4, max_run_chunks=1)) for name in names]
    try:
        with th.connect(hub.url, "trainer", "dc=dc0,rack=r0,node=t", chunk_bytes=CHUNK) as trainer:
            trainer.publish("policy", 1, v1)
            trainer.publish("policy", 2, v2)
            published = trainer.publish_delta("policy", 2, 1, chunk_bytes=8192)
            assert published.published and published.bytes > 4 * 8192  # several chunks of the delta form
            buffers = [{n: t.clone() for n, t in v1.items()} for _ in names]
            results: dict[str, object] = {}
            start = threading.Barrier(len(names))

            def run(i: int) -> None:
                start.wait(30)
                try:
                    results[names[i]] = readers[i].fetch("policy", 2, into=buffers[i], have=1, timeout=120)
                except Exception as e:  # reported below
                    results[names[i]] = e

            threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(names))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(150)
            for name, into in zip(names, buffers):
                stats = results[name]
                assert not isinstance(stats, Exception), stats
                assert stats.delta.used and all(torch.equal(into[n], v2[n]) for n in v2), name
            crossed = sum(results[name].sources.get("trainer", 0) for name in names)
            assert crossed == published.bytes  # exactly one copy of the delta crossed the WAN
            assert sum(results[name].bytes for name in names) == 3 * published.bytes
            assert trainer.versions("policy", "delta/hf@1") == {2: ["a", "b", "c", "trainer"]}
    finally:
        for r in readers:
            r.close()
