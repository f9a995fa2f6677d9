"""Worker roles that tests run in separate processes, and a gated transport for in-process readers."""

from __future__ import annotations

import os
import threading
import time

import torch

import tensorhub_verl as th
from tensorhub_verl.bench.procs import content_digest as digest
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.planes.base import DataPlane, ReadState
from tensorhub_verl.ros.planes.nixl import NixlPlane
from tests.waits import wait_until  # noqa: F401 - the roles' tests import it from here


def make_weights(seed: int = 0, size_mb: float = 4.0) -> dict[str, torch.Tensor]:
    """Mixed dtypes and sizes: big matrices span chunks, tiny ones share a chunk."""
    g = torch.Generator().manual_seed(seed)
    n = max(1024, int(size_mb * (1 << 20) / 4 / 3))
    return {
        "embed.weight": torch.randn(n, generator=g),
        "layers.0.mlp.weight": torch.randn(n, generator=g).to(torch.bfloat16),
        "layers.0.attn.weight": torch.randn(n // 2, 2, generator=g).to(torch.float16),
        "layers.0.norm.weight": torch.randn(7, generator=g),
        "step": torch.tensor([seed], dtype=torch.int64),
        "lm_head.weight": torch.randn(n, generator=g),
    }


def holder(results, control, hub_url, worker, seed, size_mb, chunk_bytes, version=1, token=None, transport="auto"):
    client = th.connect(hub_url, worker, token=token, chunk_bytes=chunk_bytes, hub_retry_s=60.0, transport=transport)
    weights = make_weights(seed, size_mb)
    client.publish("policy", version, weights)
    results.put(("ok", {"pid": os.getpid(), "digest": digest(weights)}))
    _serve(results, control, client, version)


def _serve(results, control, client, version) -> None:
    """Holds what the client published until told to unpublish (answers) or stop (closes)."""
    while True:
        command = control.get(timeout=600)
        if command == "stop":
            client.close()
            return
        if command == "unpublish":
            client.unpublish("policy", version)
            results.put(("ok", "unpublished"))


def shard_weights(seed: int = 0, size_mb: float = 4.0) -> dict[str, torch.Tensor]:
    """``make_weights`` plus a 0-dim tensor: rows that split unevenly, tensors with fewer rows than ranks."""
    return make_weights(seed, size_mb) | {"scale": torch.tensor(1.5 + seed)}


def shard_holder(results, control, hub_url, worker, rank, ranks, seed, size_mb, chunk_bytes, version=1):
    """Row shard ``rank`` of ``ranks``: publishes only its rows of every tensor (as an FSDP2 rank holds them)."""
    client = th.connect(hub_url, worker, chunk_bytes=chunk_bytes, hub_retry_s=60.0)
    full = shard_weights(seed, size_mb)
    specs = {name: (t.shape, t.dtype) for name, t in full.items()}
    pieces = {name: (t if t.dim() == 0 else t[slice(*th.row_range(t.shape[0], rank, ranks))]).clone()
              for name, t in full.items()}
    del full  # this process keeps only its rows
    manifest = client.publish_shard("policy", version, pieces, specs=specs, rank=rank, ranks=ranks)
    results.put(("ok", {"pid": os.getpid(), "chunks": sorted(th.shard_chunks(manifest, rank)),
                        "bytes": sum(manifest.chunks()[c].nbytes for c in th.shard_chunks(manifest, rank))}))
    _serve(results, control, client, version)


def tampering_holder(results, control, hub_url, worker, seed, size_mb, chunk_bytes, version=1, transport="auto"):
    """Publishes the same bytes as ``holder`` with the same seed, then breaks its promise: changes them."""
    client = th.connect(hub_url, worker, chunk_bytes=chunk_bytes, hub_retry_s=60.0, transport=transport)
    weights = make_weights(seed, size_mb)
    client.publish("policy", version, weights)
    for t in weights.values():
        t.view(-1)[:1] = 0 if t.dtype == torch.bool else 1  # one element of every tensor: every chunk differs
    for t in weights.values():
        if t.numel() > 1:
            t.view(-1)[::max(1, t.numel() // 512)] += 1
    results.put(("ok", {"pid": os.getpid()}))
    control.get(timeout=600)
    client.close()


def reader(results, control, hub_url, worker, version="latest", hold=True, window=8, max_run_chunks=1024):
    client = th.connect(hub_url, worker, window=window, max_run_chunks=max_run_chunks, hub_retry_s=60.0)
    buffers = client.manifest("policy", version).allocate()
    results.put(("ok", "ready"))
    control.get(timeout=600)
    stats = client.fetch("policy", version, into=buffers, hold=hold)
    results.put(("ok", {"digest": digest(buffers), "sources": stats.sources, "bytes": stats.bytes,
                        "partial_source_bytes": stats.partial_source_bytes}))
    control.get(timeout=600)
    client.close()


def stalling_reader(results, control, hub_url, worker, announce):
    """Fetches policy v1 one read at a time; after ``announce`` reads it stops noticing that reads finish, so
    the next chunk lands in its buffers unverified and unannounced (a fetch caught mid-way). Then it waits
    to be killed."""
    transport = GatedPlane(f"{worker}-agent")
    transport.on_read = lambda n: n > announce and transport.finish_gate.clear()
    client = Client(hub_url, worker, plane=transport,
                    config=ClientConfig.from_fields(window=1, max_run_chunks=1, hub_retry_s=60.0))  # a chunk per lease
    threading.Thread(target=client.fetch, args=("policy", 1), daemon=True).start()
    deadline = time.monotonic() + 120
    while transport.reads <= announce and time.monotonic() < deadline:
        time.sleep(0.01)
    results.put(("ok", {"pid": os.getpid(), "reads": transport.reads}))
    control.get(timeout=600)


class GatedPlane(DataPlane):
    """Real transfers (NIXL unless ``inner`` is given), but the test decides when reads may start or finish.

    ``start_gate`` blocks every read after the first ``hold_after``; ``finish_gate`` makes polls report
    "in progress" while it is closed; ``on_read(n)`` runs before the n-th read is posted. ``polls`` counts polls,
    ``most_in_flight`` is the most reads posted and not yet released at once. It declares the inner
    plane's grant capability; it never lands reads on its own threads: the gate, not the inner plane, decides
    when a read finishes, so the fetch loop polls (and hashes what landed).
    """

    lands_on_own_threads = False

    def __init__(self, name: str, hold_after: int | None = None, on_read=None, inner: DataPlane | None = None):
        self.inner = inner or NixlPlane(name)
        self.name, self.needs_grant = self.inner.name, self.inner.needs_grant
        self.preconnect_peers = self.inner.preconnect_peers
        super().__init__(self.inner.agent_name)
        self.grant_key = self.inner.grant_key
        self.hold_after = hold_after
        self.on_read = on_read
        self.reads = 0
        self.polls = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.start_gate = threading.Event()
        self.finish_gate = threading.Event()
        self.finish_gate.set()
        self.holding = threading.Event()

    def register(self, tensors):
        return self.inner.register(tensors)

    def unregister(self, tensors):
        self.inner.unregister(tensors)

    def metadata(self):
        return self.inner.metadata()

    def load_peer(self, agent_name, metadata):
        self.inner.load_peer(agent_name, metadata)

    def _start_read(self, peer, copies, grant, wake):
        self.reads += 1
        if self.on_read is not None:
            self.on_read(self.reads)
        if self.hold_after is not None and self.reads > self.hold_after:
            self.holding.set()
            self.start_gate.wait(120)
        handle = self.inner._start_read(peer, copies, grant, None)  # no wake: the gate decides
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return handle

    def poll(self, handle):
        self.polls += 1
        return self.inner.poll(handle) if self.finish_gate.is_set() else ReadState.IN_PROGRESS

    def release(self, handle):
        self.in_flight -= 1
        self.inner.release(handle)

    def close(self):
        self.inner.close()


def listening_addresses(pid: int) -> list[str]:
    """IPv4 addresses on which process ``pid`` has TCP sockets listening (from /proc, no tools needed)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                raw = bytes.fromhex(local.split(":")[0])[::-1]
                found.append(".".join(str(b) for b in raw))
    return found


def exposed_holder(results, control, hub_url, worker):
    """Publishes a small version, then reports where its process listens."""
    os.environ.pop("UCX_NET_DEVICES", None)
    client = th.connect(hub_url, worker)
    client.publish("policy", 1, make_weights(1, 0.1))
    results.put(("ok", listening_addresses(os.getpid())))
    control.get(timeout=600)
    client.close()


def tp_weights() -> dict[str, torch.Tensor]:
    """Two matrices that TP ranks read in slices: rows of ``q`` (column-parallel), columns of ``o`` (row-parallel)."""
    g = torch.Generator().manual_seed(11)
    return {"q": torch.randn(512, 256, generator=g).to(torch.bfloat16), "o": torch.randn(256, 512, generator=g)}


def sliced_holder(results, control, hub_url, worker, chunk_bytes, lie=False, transport="auto"):
    """Publishes ``tp_weights``; a liar then swaps the column halves of ``o`` in place, so that each TP rank reading
    its columns from it gets the other rank's: chunks only ever read in part, which only block digests check."""
    client = th.connect(hub_url, worker, chunk_bytes=chunk_bytes, hub_retry_s=60.0, transport=transport)
    weights = tp_weights()
    client.publish("policy", 1, weights)
    if lie:
        left, right = weights["o"].chunk(2, 1)
        weights["o"].copy_(torch.cat([right, left], 1))
    results.put(("ok", {"pid": os.getpid()}))
    _serve(results, control, client, 1)


def tp_shard_holder(results, control, hub_url, worker, rank, ranks, chunk_bytes, lie=False, transport="auto"):
    """Row shard ``rank`` of ``tp_weights`` (an FSDP rank of the trainer); a liar publishes its true rows, digests
    and all, then swaps the column halves of its rows of ``o`` in place: a TP rank reading its columns of them
    gets the other TP rank's, in chunks read only in part."""
    client = th.connect(hub_url, worker, chunk_bytes=chunk_bytes, hub_retry_s=60.0, transport=transport)
    full = tp_weights()
    specs = {name: (t.shape, t.dtype) for name, t in full.items()}
    pieces = {name: t[slice(*th.row_range(t.shape[0], rank, ranks))].clone() for name, t in full.items()}
    client.publish_shard("policy", 1, pieces, specs=specs, rank=rank, ranks=ranks)
    if lie:
        left, right = pieces["o"].chunk(2, 1)
        pieces["o"].copy_(torch.cat([right, left], 1))
    results.put(("ok", {"pid": os.getpid()}))
    _serve(results, control, client, 1)


def tp3_weights() -> dict[str, torch.Tensor]:
    """A row-parallel weight that TP=3 ranks read in thirds of its 384 columns: 16 blocks of 24 columns, so each
    third starts or ends inside a block."""
    g = torch.Generator().manual_seed(13)
    return {"o3": torch.randn(96, 384, generator=g)}


def edge_holder(results, control, hub_url, worker, chunk_bytes, lie=False, transport="auto"):
    """Publishes ``tp3_weights``; a liar then changes one byte of every row at column 128: the first column of TP
    rank 1's third, inside the block (columns 120..143) that the third covers only in part."""
    client = th.connect(hub_url, worker, chunk_bytes=chunk_bytes, hub_retry_s=60.0, transport=transport)
    weights = tp3_weights()
    client.publish("policy", 1, weights)
    if lie:
        weights["o3"][:, 128:129].view(torch.uint8)[:, 0] += 1
    results.put(("ok", {"pid": os.getpid()}))
    _serve(results, control, client, 1)
