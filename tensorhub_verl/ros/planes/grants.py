"""Read grants: the hub's proof, checked by a holder's TCP server, that a reader holds a lease on exact bytes.

NIXL's reads need no holder check: a reader can only address memory whose metadata the hub handed it with a
lease. A TCP server answers whoever connects, so each lease carries a grant: an HMAC-SHA256, under a key the
holder gave the hub at registration (and nobody else), of the lease id, its expiry and the exact (address,
length) ranges the lease reads. The server serves only those ranges, only until the expiry, and never needs to
ask the hub. The expiry is wall-clock time (readers and holders on different hosts share no monotonic clock);
``CLOCK_SKEW_S`` allows for hosts whose clocks disagree a little.

A grant stays valid until its expiry even if the hub revokes the lease sooner (e.g. it dropped the reader):
the bytes it reads are verified by the chunk's digest either way, and a holder only unpublishes (and may change
its bytes) once no lease is live.
"""

from __future__ import annotations

import hmac
import hashlib
import secrets
import struct
import time
from typing import Sequence

KEY_BYTES = 32
CLOCK_SKEW_S = 5.0
_RANGE = struct.Struct("!QQ")
_DOMAIN = b"tensorhub-read-grant-v1"


def run_ranges(per_chunk: Sequence[Sequence[tuple[int, int]]]) -> list[tuple[int, int]]:
    """The ranges a lease's grant signs: one chunk's ranges as they are; a run's, in chunk order, with each range
    that starts where the one before it ends merged into it (a run's consecutive chunks are mostly contiguous in
    the source's memory, so a grant over 1,024 chunks signs about one range per tensor, not per chunk). The hub
    signs and the reader sends this same list; each chunk's own ranges lie inside it."""
    if len(per_chunk) == 1:
        return list(per_chunk[0])
    merged: list[tuple[int, int]] = []
    for ranges in per_chunk:
        for addr, length in ranges:
            if merged and merged[-1][0] + merged[-1][1] == addr:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((addr, length))
    return merged


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def sign(key: bytes, lease: int, expiry_ms: int, ranges: Sequence[tuple[int, int]]) -> str:
    """The grant string a reader forwards to the holder: ``<lease>.<expiry_ms>.<hmac hex>``."""
    return f"{lease}.{expiry_ms}.{_mac(key, lease, expiry_ms, ranges)}"


def expiry_ms(ttl_s: float) -> int:
    return int((time.time() + ttl_s) * 1000)


def check(key: bytes, grant: str, ranges: Sequence[tuple[int, int]], now: float | None = None) -> str | None:
    """None when ``grant`` covers exactly ``ranges`` and has not expired; else why not (for the refusal)."""
    try:
        lease_text, expiry_text, mac = grant.split(".")
        lease, expiry = int(lease_text), int(expiry_text)
    except ValueError:
        return "malformed grant"
    if not hmac.compare_digest(mac, _mac(key, lease, expiry, ranges)):
        return f"grant of lease {lease} does not cover these ranges"
    if (time.time() if now is None else now) * 1000 > expiry + CLOCK_SKEW_S * 1000:
        return f"grant of lease {lease} expired"
    return None


def _mac(key: bytes, lease: int, expiry: int, ranges: Sequence[tuple[int, int]]) -> str:
    message = b"|".join((_DOMAIN, str(lease).encode(), str(expiry).encode(),
                         b"".join(_RANGE.pack(addr, length) for addr, length in ranges)))
    return hmac.new(key, message, hashlib.sha256).hexdigest()
