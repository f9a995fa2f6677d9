"""A client's delta path: publish the delta N-1 -> N beside N, and read N as a delta into buffers holding N-1.

    publisher (holds N-1 and N)                      hub                       reader (into holds N-1)
      publish(N)            ---------------------->  N (layout L)
      publish_delta(N, N-1) -- encode per chunk -->  N (layout delta/L@N-1)
                                                                  <-- fetch(N, into, have=N-1)
                                                      plan the delta form: nearest holder, one WAN copy per dc
                                                                  --> delta bytes, each chunk digest-checked
                                                      base digest checked, applied in place, target digest checked
                                                      failed chunks re-read in full from holders of N (ranged)
                                                      holds N (and the delta form: it serves both onward)

Fail closed: a delta whose header does not describe exactly the reader's base and the version's chunk map is
refused before any byte of ``into`` is written, and the reader reads N in full; chunks that fail a check are
re-read from verified holders of N. When even that fails, the error says which chunks of ``into`` hold neither
version. ``FetchStats.delta`` says what happened and why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.client.delta_base import BaseDigests
from tensorhub_verl.ros.client.delta_chunks import ApplyResult, ChunkApply, encode_delta
from tensorhub_verl.ros.client.delta_stream import DeltaStream
from tensorhub_verl.ros.wire.delta_form import BLOB, HEADER, DeltaHeader, check_header, delta_layout
from tensorhub_verl.ros.client.fetcher import FetchStats
from tensorhub_verl.ros.wire.manifest import Manifest, check_buffers, shard_bytes, shard_chunks
from tensorhub_verl.ros.wire.ranges import ReadPlan, Runs, plan_reads

if TYPE_CHECKING:
    from tensorhub_verl.ros.client.client import Client, _Publication

logger = logging.getLogger("tensorhub_verl.ros.delta")

DELTA_MODES = ("auto", "on", "off")
"""``auto``: publish (or read) a delta only when it is smaller than the version; ``on``: whenever one can be made;
``off``: never."""


@dataclass(slots=True)
class DeltaPublished:
    """What ``Client.publish_delta`` did."""

    model: str
    version: int
    base_version: int
    layout: str
    """The delta form's layout (``delta/<layout>@<base_version>``)."""
    published: bool
    """False when ``mode="auto"`` found the delta no smaller than the version (``reason`` says so)."""
    bytes: int
    """The delta form's bytes (header and encoded chunks): what a reader of the delta moves."""
    version_bytes: int
    """The bytes of the version the delta covers (a row shard's part: that rank's chunks)."""
    changed_elements: int
    elements: int
    encodings: dict[str, int] = field(default_factory=dict)
    """encoding -> chunks encoded so."""
    seconds: float = 0.0
    """Encoding time (a hub of shards: the slowest share's; they encode at once)."""
    reason: str = ""
    shares: tuple["DeltaPublished", ...] = ()
    """A hub of shards: what each shard's share did, in shard order (empty with one hub process)."""

    @property
    def changed_fraction(self) -> float:
        return self.changed_elements / self.elements if self.elements else 0.0

    @staticmethod
    def of_shares(shares: "list[DeltaPublished]", layout: str) -> "DeltaPublished":
        """What publishing the whole version's delta did, from its shares' results (in shard order), as the
        delta form ``layout``: published when every share's delta was (a reader holding the base then reads the
        whole version as deltas); ``reason`` names each share that published none, and why."""
        first = shares[0]
        encodings: dict[str, int] = {}
        for share in shares:
            for name, count in share.encodings.items():
                encodings[name] = encodings.get(name, 0) + count
        skipped = [f"share {i}: {share.reason}" for i, share in enumerate(shares) if not share.published]
        return DeltaPublished(first.model, first.version, first.base_version, layout, not skipped,
                              sum(s.bytes for s in shares), sum(s.version_bytes for s in shares),
                              sum(s.changed_elements for s in shares), sum(s.elements for s in shares), encodings,
                              max(s.seconds for s in shares), "; ".join(skipped), tuple(shares))


@dataclass(slots=True)
class DeltaStats:
    """How a ``fetch(have=...)`` went (``FetchStats.delta``)."""

    base_version: int
    used: bool = False
    """The delta form was read and applied (possibly with some chunks re-read in full)."""
    delta_bytes: int = 0
    """Bytes of the delta form read."""
    changed_elements: int = 0
    elements: int = 0
    fallback_chunks: int = 0
    """Chunks of the version re-read in full after a failed check (all of them when the delta was not used)."""
    fallback_bytes: int = 0
    full_chunks: int = 0
    """Chunks read in full beside a used delta because it cannot be checked on them (a ranged reader's slices
    that cover digest blocks in part): by design, not after a failed check."""
    full_bytes: int = 0
    reasons: list[str] = field(default_factory=list)
    """Why the delta was not used, or why chunks were re-read."""
    apply_seconds: float = 0.0
    """Time spent applying (decode, write, digest), most of it while later chunks of the delta were on the wire."""
    apply_after_wire_seconds: float = 0.0
    """How long applying went on after the delta's last byte landed: what the apply added to the stall."""
    base_pass_ahead: bool = False
    """The base's digests were made from the moment this reader came to hold it, before this read began
    (``ClientConfig.fetch.base_digests_ahead``); else from the start of this read."""
    base_digests_ahead: int = 0
    """Chunks of ``into`` digested (checked as the base) before their payload was applied: ahead of this read,
    or while the delta was on the wire."""
    landed_digests: int = 0
    """Chunks digested in full after their payload landed: the digest passes on the apply's critical path."""

    @property
    def changed_fraction(self) -> float:
        return self.changed_elements / self.elements if self.elements else 0.0


MIN_DELTA_CHUNK_BYTES = 64 << 10
DELTA_CHUNKS = 16
"""A delta form is cut into about this many chunks (at least ``MIN_DELTA_CHUNK_BYTES``, at most the version's
chunk size): it is far smaller than its version, and more chunks spread through a datacenter sooner."""


def delta_chunk_bytes(delta_bytes: int, version_chunk_bytes: int) -> int:
    size = max(MIN_DELTA_CHUNK_BYTES, -(-delta_bytes // DELTA_CHUNKS))
    return min(version_chunk_bytes, -(-size // 4096) * 4096)


def publish_delta(client: "Client", model: str, version: int, base_version: int, layout: str = "hf",
                  mode: str = "auto", chunk_bytes: int | None = None) -> DeltaPublished:
    """Encodes and publishes the delta ``base_version`` -> ``version`` of ``layout`` from what ``client`` holds
    of both (see ``Client.publish_delta``)."""
    if mode not in ("auto", "on"):
        raise errors.ConfigError(f"publish_delta mode must be 'auto' or 'on', got {mode!r}")
    if not isinstance(base_version, int) or isinstance(base_version, bool) or not 0 <= base_version < version:
        raise errors.DeltaRefused(f"a delta to v{version} needs an int base version below it, got {base_version!r}")
    base, target = (_held(client, model, v, layout) for v in (base_version, version))
    for held, what in ((base, f"base v{base_version}"), (target, f"v{version}")):
        if held is None:
            raise errors.DeltaRefused(
                f"{client.worker} holds no {what} of {model!r} ({layout}) to diff: publish v{version} first, and "
                f"keep v{base_version} published (and its bytes unchanged) until its delta is published")
    if base.manifest.digest != target.manifest.digest or base.shard_rank != target.shard_rank:
        raise errors.DeltaRefused(f"v{base_version} and v{version} of {model!r} ({layout}) differ in tensors, chunk "
                                  f"size or row shard: a delta needs one chunk map; readers read v{version} in full")
    rank, m = target.shard_rank, target.manifest
    part = None if rank is None else (rank, m.row_shards)
    chunks = range(len(m.chunks())) if rank is None else _own_range(m, rank)
    for held in (base, target):
        digests = held.manifest.chunk_digests
        if not (digests and all(digests[chunks.start:chunks.stop])):
            raise errors.DeltaRefused(f"v{held.manifest.version} of {model!r} was published without chunk digests: "
                                      f"a delta is checked against both versions' digests "
                                      f"(ClientConfig.publish.chunk_digests)")
    dl = delta_layout(layout, base_version, part)
    order = [spec.name for spec in m.tensors]
    starts = None if rank is None else [shard_bytes(spec, rank, m.row_shards)[0] for spec in m.tensors]
    header, blob, enc = encode_delta(base.manifest, [base.tensors[n] for n in order], m,
                                     [target.tensors[n] for n in order], chunks=chunks, starts=starts)
    raw = header.to_bytes()
    head = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    own_bytes = sum(m.chunks()[c].nbytes for c in chunks)
    out = DeltaPublished(model, version, base_version, dl, False, len(raw) + blob.numel(), own_bytes,
                         enc.changed_elements, enc.elements, dict(enc.encodings), enc.seconds)
    if mode == "auto" and out.bytes >= out.version_bytes:
        out.reason = f"the delta ({out.bytes} bytes) is no smaller than the version ({out.version_bytes} bytes)"
        logger.info("%s v%d: no delta from v%d published: %s", model, version, base_version, out.reason)
        return out
    client.publish(model, version, {HEADER: head, BLOB: blob}, layout=dl,
                   chunk_bytes=chunk_bytes or delta_chunk_bytes(out.bytes, m.chunk_bytes))
    out.published = True
    logger.info("%s publishes the delta of %s v%d from v%d: %d bytes for %d (%.2f%% of elements changed)",
                client.worker, model, version, base_version, out.bytes, out.version_bytes,
                100 * out.changed_fraction)
    return out


def check_delta_args(mode: str, have: object) -> None:
    """Raises on a delta mode or a declared base a delta read cannot take (before anything moves)."""
    if mode not in DELTA_MODES:
        raise errors.ConfigError(f"delta mode must be one of {DELTA_MODES}, got {mode!r}")
    if not isinstance(have, int) or isinstance(have, bool) or have < 0:
        raise errors.InvalidRequest(f"have must be the int version that into holds, got {have!r}")


def fetch_with_delta(client: "Client", model: str, version: int | str, into: Mapping[str, torch.Tensor],
                     layout: str, hold: bool, timeout: float | None, have: int, mode: str = "auto") -> FetchStats:
    """``Client.fetch(..., have=...)``: reads ``version`` as the delta from ``have`` where one is published, else
    in full; ``into`` must hold ``have`` (see ``Client.fetch``)."""
    client._check_open()
    check_delta_args(mode, have)
    if into is None:
        raise errors.InvalidRequest("fetch(have=...) needs into: the buffers that hold version `have`")
    started = time.monotonic()
    deadline = started + (timeout or client.config.timeouts.fetch_timeout_s)
    manifest = client.through_restart(lambda: client.manifest(model, version, layout), deadline)
    check_buffers(manifest, into)
    tensors = {spec.name: into[spec.name] for spec in manifest.tensors}
    if have >= manifest.version:
        raise errors.InvalidRequest(f"into holds v{have} of {model!r}; v{manifest.version} is not newer: nothing "
                                    f"to fetch")
    own = _check_declared_base(client, model, have, layout, tensors)
    # The base's digests made since this reader came to hold it (taken before the unpublish drops them).
    ahead = None if own is None else client._take_base_digests(own, manifest, list(tensors.values()))
    delta = DeltaStats(have, base_pass_ahead=ahead is not None)
    applied: dict[int, ApplyResult] = {}
    try:
        if own is not None:  # nobody reads these bytes as v{have} from here on: they are about to change
            client._drain(own, timeout)
        read = None if mode == "off" else _read_delta(client, manifest, have, tensors, hold, started, timeout,
                                                      delta, None if own is None else own.manifest, applied, ahead)
    finally:
        if ahead is not None:
            ahead.stop()
    if read is None:  # no usable delta (nothing of it written): N in full, as a reader without N-1 reads it
        stats = client._run_fetch(manifest, tensors, None, hold, started, timeout)
        stats.buffers, stats.manifest = dict(into), manifest
        delta.fallback_chunks, delta.fallback_bytes = len(manifest.chunks()), stats.bytes
        stats.delta = delta
        _digest_ahead(client, manifest, hold, mode)
        return stats
    # Each part was applied as it landed: apply_and_reread takes its result and re-reads what failed.
    stats = apply_and_reread(client, manifest, have, read, lambda header, blob: applied[id(header)],
                             lambda failed: client._run_fetch(manifest, tensors, _chunk_plan(manifest, failed), False,
                                                              started, timeout),
                             delta, hold, timeout)
    stats.chunks = len(manifest.chunks())
    if hold:  # every chunk now matches v{N}'s digests: serve it as a holder of N
        client._hold(manifest, tensors)
        _digest_ahead(client, manifest, hold, mode)
    stats.seconds = time.monotonic() - started
    stats.buffers, stats.manifest, stats.delta = dict(into), manifest, delta
    return stats


def _digest_ahead(client: "Client", manifest: Manifest, hold: bool, mode: str) -> None:
    """A delta reader that now holds N digests it from here on, as the base of its next delta read."""
    if hold and mode != "off" and client.config.fetch.base_digests_ahead != "off":
        client._digest_held_ahead(manifest.model, manifest.version, manifest.layout)


def apply_and_reread(client: "Client", manifest: Manifest, have: int,
                     read: list[tuple[DeltaHeader, torch.Tensor, FetchStats]],
                     apply: Callable[[DeltaHeader, torch.Tensor], ApplyResult],
                     reread: Callable[[list[int]], FetchStats], delta: DeltaStats, holds_form: bool,
                     timeout: float | None) -> FetchStats:
    """Applies each part of a read delta form (``apply``: whole buffers or a reader's slices), then re-reads in
    full (``reread``) every chunk that failed a check; the stats of both, ``delta`` filled in. A delta whose
    payload does not give the version from a base that checked out is reported to the hub and, if this reader
    holds it (``holds_form``), no longer served from here."""
    model, version = manifest.model, manifest.version
    stats = FetchStats(model, version, manifest.layout)
    failed: list[int] = []
    delta.used = True
    for header, blob, dstats in read:
        try:
            result = apply(header, blob)
        except Exception as e:  # a fault of the apply itself (device, memory): the buffers' state is unknown
            raise errors.TransferFailed(
                f"applying the delta of {model!r} v{version} from v{have} failed ({type(e).__name__}: {e}); "
                f"into holds neither version now: fetch v{version} in full before using it") from e
        delta.apply_seconds += result.seconds
        delta.landed_digests += result.landed_digests
        delta.changed_elements += header.changed_elements
        delta.elements += header.total_elements
        delta.reasons.extend(result.reasons)
        failed.extend(result.failed)
        if result.bad_target:
            # Its base chunks checked out, so the delta itself is wrong (a publisher whose base bytes were not
            # its published base, or a codec fault): this reader does not serve it onward, and tells the hub.
            _report(client, model, version, dstats.layout, result.reasons)
            if holds_form:
                _drop(client, model, version, dstats.layout, timeout)
        delta.delta_bytes += dstats.bytes
        _add(stats, dstats)
    failed = sorted(set(failed))
    if failed:
        logger.warning("%s: %d chunk(s) of %s v%d failed the delta's checks (%s); re-reading them in full",
                       client.worker, len(failed), model, version, "; ".join(delta.reasons))
        try:
            more = reread(failed)
        except errors.TensorHubError as e:
            raise errors.TransferFailed(
                f"v{version} of {model!r}: {len(failed)} chunk(s) failed the delta's checks and could not be "
                f"re-read in full ({e}); into holds v{version} except chunks {failed[:16]} (neither version): "
                f"fetch v{version} in full before using it") from e
        delta.fallback_chunks, delta.fallback_bytes = len(failed), more.bytes
        _add(stats, more)
    return stats


def _read_delta(client: "Client", manifest: Manifest, have: int, tensors: dict[str, torch.Tensor], hold: bool,
                started: float, timeout: float | None, delta: DeltaStats, base: Manifest | None = None,
                applied: dict[int, ApplyResult] | None = None, ahead: BaseDigests | None = None
                ) -> list[tuple[DeltaHeader, torch.Tensor, FetchStats]] | None:
    """Reads and checks the delta form from ``have`` to ``manifest``'s version (a version in row shards: every
    rank's part); None (with the reason in ``delta``) when there is none or it cannot be used, ``tensors`` then
    holding ``have`` as before. ``base``: the manifest this client held ``have`` under, if it did (else the hub's
    is asked for). Without ``applied`` nothing is written into ``tensors``; with it (whole buffers), each part is
    applied into ``tensors`` as it lands (``DeltaStream``) and its ``ApplyResult`` stored under ``id(header)``;
    a delta given up part way then gets every chunk applied so far put back to ``have``. ``ahead``: the base's
    digests made since this reader came to hold it (``delta_base.BasePasses``), used in place of a pass started
    now."""
    model, version, layout = manifest.model, manifest.version, manifest.layout
    ranks = manifest.row_shards
    parts = [(delta_layout(layout, have), range(len(manifest.chunks())))] if ranks == 1 else \
        [(delta_layout(layout, have, (r, ranks)), _own_range(manifest, r)) for r in range(ranks)]
    try:
        forms = [(client.manifest(model, version, dl), dl, chunks) for dl, chunks in parts]
    except errors.DeltaWithheld as e:
        delta.reasons.append(str(e))
        return None
    except errors.VersionNotFound:
        delta.reasons.append(f"no delta from v{have} to v{version} is published"
                             + ("" if ranks == 1 else f" by every one of its {ranks} row shards"))
        return None
    # Whole buffers applied as they land: their base chunks are digested from now on, while the delta is on the
    # wire, so that a chunk's payload is applied on landing without a full pass (``ChunkApply``).
    base_digests = None if applied is None else ahead or BaseDigests(
        manifest, list(tensors.values()), range(len(manifest.chunks())),
        client.config.timeouts.fetch_timeout_s).start()
    try:
        if base is None:
            try:
                base = client.manifest(model, have, layout)
            except errors.VersionNotFound:
                base = None  # out of retention: the header's base digests are checked against into's bytes alone
        return _read_forms(client, manifest, have, tensors, hold, started, timeout, delta, base, applied, forms,
                           base_digests)
    finally:
        if base_digests is not None:
            base_digests.stop()
            delta.base_digests_ahead = base_digests.ahead


def _read_forms(client: "Client", manifest: Manifest, have: int, tensors: dict[str, torch.Tensor], hold: bool,
                started: float, timeout: float | None, delta: DeltaStats, base: Manifest | None,
                applied: dict[int, ApplyResult] | None, forms: list[tuple[Manifest, str, range]],
                base_digests: BaseDigests | None) -> list[tuple[DeltaHeader, torch.Tensor, FetchStats]] | None:
    """``_read_delta`` once the delta forms' manifests are known (``forms``: per part, its manifest, layout and
    chunks of the version)."""
    model, version = manifest.model, manifest.version
    device = next(iter(tensors.values())).device
    ordered = list(tensors.values())
    read, held, streams = [], [], []
    for dm, dl, chunks in forms:
        if {s.name for s in dm.tensors} != {HEADER, BLOB} or any(len(s.shape) != 1 or s.dtype != "uint8"
                                                                 for s in dm.tensors):
            delta.reasons.append(f"layout {dl!r} is not a delta form (uint8 {HEADER!r} and {BLOB!r})")
            return _given_up(client, model, version, held, streams, timeout)
        buffers = {spec.name: torch.empty(spec.shape, dtype=torch.uint8,
                                          device=device if spec.name == BLOB else "cpu") for spec in dm.tensors}

        def checked(raw: bytes, chunks=chunks, blob_bytes=buffers[BLOB].numel()) -> DeltaHeader:
            header = DeltaHeader.from_bytes(raw)
            check_header(header, manifest, have, blob_bytes, base, chunks)
            return header

        stream = None if applied is None else DeltaStream(
            dm, buffers, lambda raw, checked=checked: ChunkApply(manifest, checked(raw), ordered, base_digests),
            client.config.timeouts.fetch_timeout_s)
        if stream is not None:
            streams.append(stream)
        try:
            dstats = client._run_fetch(dm, buffers, None, hold, started, timeout,
                                       on_landed=None if stream is None else stream.landed)
        except errors.TransferFailed as e:
            delta.reasons.append(f"the delta could not be read: {e}")
            return _given_up(client, model, version, held, streams, timeout)
        except BaseException:
            for st in streams:
                st.abandon()
            raise
        landed = time.monotonic()
        if hold:
            held.append(dl)
        if stream is None:
            try:
                header = checked(buffers[HEADER].numpy().tobytes())
            except errors.DeltaRefused as e:
                delta.reasons.append(str(e))
                logger.warning("%s: %s; reading v%d in full", client.worker, e, version)
                return _given_up(client, model, version, held, streams, timeout)
            read.append((header, buffers[BLOB], dstats))
            continue
        try:
            result = stream.close()
        except errors.TransferFailed as e:  # a fault of the apply itself (device, memory): state unknown
            raise errors.TransferFailed(
                f"applying the delta of {model!r} v{version} from v{have} failed ({e}); into holds neither "
                f"version now: fetch v{version} in full before using it") from e
        if result is None:
            delta.reasons.append(str(stream.refused))
            logger.warning("%s: %s; reading v%d in full", client.worker, stream.refused, version)
            return _given_up(client, model, version, held, streams, timeout)
        delta.apply_after_wire_seconds += time.monotonic() - landed
        applied[id(stream.header)] = result
        read.append((stream.header, buffers[BLOB], dstats))
    return read


def _given_up(client: "Client", model: str, version: int, held: list[str], streams: list[DeltaStream],
              timeout: float | None) -> None:
    """A delta not used: every chunk applied so far gets its base words back, and this reader serves none of
    its parts onward."""
    for stream in streams:
        stream.abandon()
    for dl in held:
        _drop(client, model, version, dl, timeout)
    return None


def _own_range(manifest: Manifest, rank: int) -> range:
    own = sorted(shard_chunks(manifest, rank))
    return range(own[0], own[-1] + 1) if own else range(0)


def _add(stats: FetchStats, more: FetchStats) -> None:
    stats.bytes += more.bytes
    for worker, n in more.sources.items():
        stats.sources[worker] = stats.sources.get(worker, 0) + n
    stats.partial_source_bytes += more.partial_source_bytes
    stats.failed_reads += more.failed_reads
    stats.corrupt_reads += more.corrupt_reads
    stats.exchanges += more.exchanges
    stats.landings.extend(more.landings)
    stats.exchange_log.extend(more.exchange_log)


def _check_declared_base(client: "Client", model: str, have: int, layout: str,
                         tensors: dict[str, torch.Tensor]) -> "_Publication | None":
    """The client's own holding of ``have`` in these very buffers (None if it holds none there). Raises
    DeltaRefused when it holds another version of ``model`` in them: the caller declared a base its buffers do not
    hold. Nothing is written before this."""
    storages = {t.untyped_storage().data_ptr() for t in tensors.values() if t.numel()}
    with client._lock:
        held = [h for (holder, m, v, lay), h in client._held.items()
                if holder == client.worker and m == model and lay == layout
                and storages & {t.untyped_storage().data_ptr() for t in h.tensors.values() if t.numel()}]
    other = [h for h in held if h.manifest.version != have]
    if other:
        raise errors.DeltaRefused(
            f"fetch(have={have}) of {model!r}: {client.worker} holds v{other[0].manifest.version} in these buffers, "
            f"not v{have}; nothing was written. Pass have={other[0].manifest.version}, or fetch without have")
    return held[0] if held else None


def _held(client: "Client", model: str, version: int, layout: str) -> "_Publication | None":
    with client._lock:
        return client._held.get((client.worker, model, version, layout))


def _report(client: "Client", model: str, version: int, layout: str, reasons: list[str]) -> None:
    try:
        client._hub.post("/v1/delta/report", msg.DeltaReport(worker=client.worker, model=model, version=version,
                                                             layout=layout, reason="; ".join(reasons)[:2000]),
                         msg.DeltaReportAck)
    except errors.TensorHubError as e:
        logger.warning("%s could not report the bad delta %s of %s v%d: %s", client.worker, layout, model, version, e)


def _drop(client: "Client", model: str, version: int, layout: str, timeout: float | None) -> None:
    try:
        client.unpublish(model, version, layout, timeout=timeout)
    except errors.TensorHubError as e:
        logger.warning("%s could not drop its copy of %s v%d (%s): %s", client.worker, model, version, layout, e)


def _chunk_plan(manifest: Manifest, chunks: list[int]) -> ReadPlan:
    """A ranged read of whole chunks into whole-tensor buffers: each chunk checked against its digest, and served
    onward once landed."""
    full = plan_reads(manifest, {i: Runs.whole(spec) for i, spec in enumerate(manifest.tensors)})
    return ReadPlan({c: full.pieces[c] for c in chunks}, frozenset(chunks), frozenset(), full.regions,
                    full.tensor_nbytes)


__all__ = ["DELTA_MODES", "DeltaPublished", "DeltaStats", "apply_and_reread", "check_delta_args", "fetch_with_delta", "publish_delta"]
