"""Manifests on the wire: ``Manifest`` (manifest.py) <-> ``ManifestMsg`` (messages.py), both ways, for the hub
and its clients alike (a client never imports the hub's state to speak to it)."""

from __future__ import annotations

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.wire.manifest import Manifest, TensorBlocks, TensorSpec


def manifest_to_msg(m: Manifest) -> msg.ManifestMsg:
    return msg.ManifestMsg(model=m.model, version=m.version, layout=m.layout, chunk_bytes=m.chunk_bytes,
                           fingerprint=m.fingerprint, chunk_digests=list(m.chunk_digests), row_shards=m.row_shards,
                           digest_algorithm=m.digest_algorithm,
                           block_digests=[msg.TensorBlocksMsg(tensor=b.tensor, dim=b.dim, blocks=b.blocks,
                                                              digests=list(b.digests)) for b in m.block_digests],
                           tensors=[msg.TensorSpecMsg(name=t.name, shape=list(t.shape), dtype=t.dtype,
                                                      nbytes=t.nbytes) for t in m.tensors])


def manifest_from_msg(m: msg.ManifestMsg) -> Manifest:
    return Manifest(m.model, m.version, m.layout,
                    tuple(TensorSpec(t.name, tuple(t.shape), t.dtype, t.nbytes) for t in m.tensors),
                    m.chunk_bytes, m.fingerprint, tuple(m.chunk_digests), m.row_shards,
                    m.digest_algorithm if m.chunk_digests or m.block_digests else "",
                    tuple(TensorBlocks(b.tensor, b.dim, b.blocks, tuple(b.digests)) for b in m.block_digests))
