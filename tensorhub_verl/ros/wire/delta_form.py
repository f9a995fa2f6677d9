"""A delta: the second form of a version, N-1 -> N, served through the hub like any layout of N.

The delta from ``base_version`` in layout L to version N is published as layout ``delta/L@<base_version>`` of
version N (``delta_layout``); a version published in row shards has one such delta per rank, each of that rank's
chunks, diffed where its rows live (``delta/L@<base_version>:<rank>of<ranks>``). Its bytes are two uint8 tensors:

- ``header``: the JSON of a ``DeltaHeader`` (never pickle): the base and target versions, L's layout digest,
  and per chunk of L's chunk map the encoding, the payload's place in ``blob``, the digest of the base chunk and
  of the target chunk;
- ``blob``: the encoded chunks (``delta_codec``), back to back, in chunk order.

So the hub tracks, plans and retains a delta as it does every layout of N: its holders are the publisher and
every reader that fetched it, read nearest first, one WAN copy per datacenter, each chunk of the delta form
checked against its own digest as it lands, and it goes when N goes. A reader holding the base applies it chunk
by chunk, checking the base chunk's digest before and the target chunk's after (``client/delta_apply.py``).

No chains: a delta names one base; a layout that is itself a delta has no delta.

This module is pure: names, the header's wire model, and the checks of a header against the manifests.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tensorhub_verl.errors import DeltaRefused
from tensorhub_verl.ros.wire.manifest import Manifest
from tensorhub_verl.ros.wire.messages import MAX_CHUNKS, Name, Version

PREFIX = "delta/"
HEADER = "header"
"""The delta form's tensor holding the header's JSON."""
BLOB = "blob"
"""The delta form's tensor holding the encoded chunks."""
FORMAT = "tensorhub-delta/1"
SAME = "same"
"""The encoding of a chunk whose bytes did not change: no payload."""
_MAX_HEADER_BYTES = 256 << 20

_Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
_Count = Annotated[int, Field(ge=0, le=2**62)]


_NAME = re.compile(r"^delta/(?P<base>.+)@(?P<version>[0-9]{1,19})(?::(?P<rank>[0-9]{1,5})of(?P<ranks>[0-9]{1,5}))?$")


def delta_layout(base_layout: str, base_version: int, part: tuple[int, int] | None = None) -> str:
    """The layout name of the delta from ``base_version`` in ``base_layout`` to the version it is published as;
    with ``part`` = (rank, ranks), of row shard ``rank``'s part of it (``delta/<layout>@<base>:<rank>of<ranks>``:
    the chunks that rank holds, ``manifest.shard_chunks``)."""
    if is_delta_layout(base_layout):
        raise DeltaRefused(f"layout {base_layout!r} is itself a delta: deltas do not chain")
    name = f"{PREFIX}{base_layout}@{int(base_version)}"
    return name if part is None else f"{name}:{int(part[0])}of{int(part[1])}"


def is_delta_layout(layout: str) -> bool:
    return layout.startswith(PREFIX)


def parse_delta_layout(layout: str) -> tuple[str, int] | None:
    """(base layout, base version) of a delta layout (whole or a row shard's part); None for any other layout.
    Raises DeltaRefused for a name that starts like a delta's but is not one."""
    named = _parse(layout)
    return None if named is None else (named[0], named[1])


def delta_part(layout: str) -> tuple[int, int] | None:
    """(rank, ranks) of a row shard's part of a delta; None for a whole delta or any other layout."""
    named = _parse(layout)
    return None if named is None else named[2]


def _parse(layout: str) -> tuple[str, int, tuple[int, int] | None] | None:
    if not is_delta_layout(layout):
        return None
    m = _NAME.match(layout)
    if m is None or is_delta_layout(m["base"]) or (m["rank"] is not None and int(m["rank"]) >= int(m["ranks"])):
        raise DeltaRefused(f"layout {layout!r} starts with {PREFIX!r} but is not {PREFIX}<base layout>@<base "
                           f"version>[:<rank>of<ranks>]; layouts under {PREFIX!r} are the deltas of versions")
    part = None if m["rank"] is None else (int(m["rank"]), int(m["ranks"]))
    return m["base"], int(m["version"]), part


class DeltaHeader(BaseModel):
    """What a delta claims: checked against the target's manifest (``check_header``) before any byte is applied.

    It covers chunks ``first_chunk`` .. ``first_chunk + len(encodings) - 1`` of the layout's chunk map (all of
    them, or a row shard's own). Per chunk ``first_chunk + i``: ``encodings[i]`` names the codec's encoding (``same``: unchanged,
    no payload), its payload is ``blob[offsets[i]:offsets[i] + lengths[i]]``, ``base_digests[i]`` and
    ``target_digests[i]`` are the chunk's digests in the base and the target version, ``changed[i]`` of its
    ``elements[i]`` elements differ."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: Literal["tensorhub-delta/1"] = FORMAT
    model: Name
    layout: Name
    """The base and target versions' layout (never a delta)."""
    base_version: Version
    target_version: Version
    layout_digest: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    digest_algorithm: Annotated[str, Field(min_length=1, max_length=64)]
    first_chunk: _Count = 0
    encodings: list[Annotated[str, Field(pattern=r"^[a-z0-9_+.-]{1,32}$")]] = Field(max_length=MAX_CHUNKS)
    offsets: list[_Count] = Field(max_length=MAX_CHUNKS)
    lengths: list[_Count] = Field(max_length=MAX_CHUNKS)
    base_digests: list[_Digest] = Field(max_length=MAX_CHUNKS)
    target_digests: list[_Digest] = Field(max_length=MAX_CHUNKS)
    changed: list[_Count] = Field(max_length=MAX_CHUNKS)
    elements: list[_Count] = Field(max_length=MAX_CHUNKS)

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "DeltaHeader":
        """Parses a fetched header; raises DeltaRefused naming what is wrong with it."""
        if len(raw) > _MAX_HEADER_BYTES:
            raise DeltaRefused(f"a delta header of {len(raw)} bytes exceeds {_MAX_HEADER_BYTES}")
        try:
            return cls.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as e:  # json's errors are ValueErrors
            raise DeltaRefused(f"the delta's header is malformed: {str(e)[:500]}") from None

    @property
    def changed_elements(self) -> int:
        return sum(self.changed)

    @property
    def total_elements(self) -> int:
        return sum(self.elements)


def check_header(header: DeltaHeader, target: Manifest, base_version: int, blob_bytes: int,
                 base: Manifest | None = None, chunks: range | None = None) -> None:
    """Raises DeltaRefused unless ``header`` is the delta from ``base_version`` to ``target`` (same model, layout,
    chunk map, digests) over ``chunks`` (default: every chunk; a row shard's part: its own), whose payloads lie
    inside a blob of ``blob_bytes`` bytes; where the base version's manifest is known (``base``), its chunk
    digests must be the header's base digests. Nothing is applied before this passes."""
    where = f"the delta of {target.model!r} v{target.version} ({target.layout})"
    if (header.model, header.layout, header.target_version) != (target.model, target.layout, target.version):
        raise DeltaRefused(f"{where} claims to be of {header.model!r} v{header.target_version} ({header.layout})")
    if header.base_version != base_version:
        raise DeltaRefused(f"{where} declares base version {header.base_version}, the reader holds "
                           f"{base_version}: not applied")
    if header.layout_digest != target.digest or header.digest_algorithm != target.digest_algorithm:
        raise DeltaRefused(f"{where} was made for another chunk map or digest algorithm than the version's")
    chunks = range(len(target.chunks())) if chunks is None else chunks
    n = len(header.encodings)
    if range(header.first_chunk, header.first_chunk + n) != chunks:
        raise DeltaRefused(f"{where} describes chunks [{header.first_chunk}, {header.first_chunk + n}), expected "
                           f"[{chunks.start}, {chunks.stop})")
    columns = (header.offsets, header.lengths, header.base_digests, header.target_digests, header.changed,
               header.elements)
    if any(len(c) != n for c in columns):
        raise DeltaRefused(f"{where}: its header's columns differ in length")
    digests = tuple(target.chunk_digests[chunks.start:chunks.stop])
    if tuple(header.target_digests) != digests:
        first = next((i for i, (a, b) in enumerate(zip(header.target_digests, digests)) if a != b), 0)
        raise DeltaRefused(f"{where}: its target digest of chunk {chunks.start + first} is not the version's")
    if base is not None and base.chunk_digests and \
            tuple(header.base_digests) != tuple(base.chunk_digests[chunks.start:chunks.stop]):
        raise DeltaRefused(f"{where}: its base digests are not those of v{base_version}'s manifest")
    end = 0
    for i, (encoding, offset, length) in enumerate(zip(header.encodings, header.offsets, header.lengths)):
        if offset != end or offset + length > blob_bytes:
            raise DeltaRefused(f"{where}: chunk {chunks.start + i}'s payload [{offset}, {offset + length}) is not "
                               f"where the previous one ends ({end}) inside the blob of {blob_bytes} bytes")
        end = offset + length
        if encoding == SAME and (length or header.base_digests[i] != header.target_digests[i]):
            raise DeltaRefused(f"{where}: chunk {chunks.start + i} is marked unchanged but carries a payload or a "
                               f"new digest")


__all__ = ["BLOB", "DeltaHeader", "HEADER", "PREFIX", "SAME", "check_header", "delta_layout", "delta_part",
           "is_delta_layout", "parse_delta_layout"]
