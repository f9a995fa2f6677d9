"""The per-chunk delta codec: a chunk of version N encoded against the same chunk of version N-1.

Pure functions on torch tensors: no I/O, no processes. A chunk is a 1-D uint8 tensor of its bytes, on any device;
its bytes are read as words of the element size of ``dtype`` (a trailing partial word, where the chunk's length
is not a multiple of it, travels as its target bytes). The diff runs with torch ops on the chunk's device; only
the compact streams (positions, steps, values) go to the host for zstd.

Encodings, picked per chunk by the measured change (``encode_chunk``: the smallest payload wins):

- ``dense``: the target chunk's bytes themselves (also whenever more than ``DENSE_FRACTION`` of the words changed,
  or when nothing else is smaller). Idempotent.
- ``overwrite``: the changed words' positions and their target values. Idempotent: applying it twice, or to a
  chunk that already holds the target, gives the target.
- ``xor``: the XOR of base and target, every word, its byte planes zstd-compressed apart. Not idempotent.
- ``ulp``: the changed words' positions and, per word, its step in the float's ordered integer representation
  (sign-magnitude mapped to a monotone integer, so that a small update moves a bf16 word by +-1 or +-2),
  zigzag-coded. Not idempotent. For dtypes that are not floating point the words' own integer values step.

A float32 chunk whose changed words hold bf16 values in base and target alike (a bf16 trainer publishing for
float32 rollouts: each word is a bf16 value up-cast, its low 16 bits zero) is encoded on the words' high 16-bit
halves, the bf16 values themselves: ``overwrite_bf16``, ``xor_bf16`` and ``ulp_bf16`` are the encodings above
applied to those halves, and ``dense_bf16`` (a chunk whose every word is such a value) the halves themselves. So
the delta of a float32 version of bf16 values costs what the bf16 version's delta costs. The decoder rebuilds each
float32 word from its high half with a zero low half; the chunk's digests, of the float32 bytes, check the
result as for every encoding. ``encode_chunk`` picks them by itself wherever they apply (``bf16_halves``).

Positions travel as gaps (``pos[i] - pos[i-1] - 1``, the first as itself) in four little-endian byte planes, and
every value stream in byte planes of the word size: each plane is zstd level 1 compressed apart (its own entropy
table: the low plane of a gap or step stream carries nearly all the information, the high planes are nearly all
zeros), stored raw when zstd does not shrink it, and as nothing when it is all zeros.

Non-idempotent encodings are safe because the protocol checks the base chunk's digest before applying and the
target's after (``delta_digest``); a payload that does not parse is refused (``DeltaCorrupt``) before a byte of
``into`` is written.

Payload (every encoding but ``dense``, whose payload is the raw chunk, and ``dense_bf16``, whose payload is the
words' high halves, 2 little-endian bytes each, then the chunk's tail bytes)::

    header   "<4sBBBBBQQ"  magic b"THDC", format 1, encoding id, value size, tail length, streams, words, changed
    streams  "<BQQ" each   kind (0 raw, 1 zstd, 2 all zeros), raw length, stored length
    tail     tail length bytes of the target (the partial word at the chunk's end)
    data     the streams' stored bytes, in order

Encoding ids: 1 ``overwrite``, 2 ``xor``, 3 ``ulp`` (values of the chunk's word size), 4 ``overwrite_bf16``, 5
``xor_bf16``, 6 ``ulp_bf16`` (values of 2 bytes, the high halves of a float32 chunk's 4-byte words; the words and
tail length still count the chunk's 4-byte words). A decoder refuses an id, a value size or a chunk that does
not match the encoding it was told, before a byte is written.

The payload is ``bytes`` (what the wire and the hub's holders keep); ``apply_chunk`` also takes any object with
the buffer protocol (a memoryview, a numpy array, a CPU uint8 tensor's numpy view).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import zstandard

from tensorhub_verl.errors import DeltaCorrupt

DENSE = "dense"
OVERWRITE = "overwrite"
XOR = "xor"
ULP = "ulp"
ENCODINGS = (DENSE, OVERWRITE, XOR, ULP)
"""The encodings of whole words, for chunks of any dtype."""
DENSE_BF16 = "dense_bf16"
OVERWRITE_BF16 = "overwrite_bf16"
XOR_BF16 = "xor_bf16"
ULP_BF16 = "ulp_bf16"
BF16 = {DENSE: DENSE_BF16, OVERWRITE: OVERWRITE_BF16, XOR: XOR_BF16, ULP: ULP_BF16}
"""Each encoding's form on the high halves of a float32 chunk's words (the module docstring)."""
BF16_ENCODINGS = tuple(BF16.values())
"""The encodings of float32 chunks whose changed words hold bf16 values (``dense_bf16``: whose every word does)."""
KNOWN = ENCODINGS + BF16_ENCODINGS
"""Every encoding ``apply_chunk`` understands."""
_WHOLE = {half: whole for whole, half in BF16.items()}
DEFAULT_CANDIDATES = (ULP, OVERWRITE)
"""What ``encode_chunk`` tries, besides ``dense``, when it is not told otherwise. ``xor`` only when asked: it
compresses every word of the chunk (a zstd pass over all of it, not only over the changed words' streams), and
on optimizer steps ``ulp`` is the smaller (``tensorhub bench delta`` prints both)."""
STEP_BYTES_FOR_OVERWRITE = 0.5
"""After ``ulp``, ``overwrite`` is tried only when ``ulp``'s steps took more than this many bytes per changed
word per byte of the word: both share the positions, so ``overwrite`` can win only where the steps are large
(they then hold about as much as the words themselves); small steps compress far below the words."""
DENSE_FRACTION = 0.30
"""Above this fraction of changed words a chunk goes ``dense`` without trying the others."""
ZSTD_LEVEL = 1

_MAGIC = b"THDC"
_FORMAT = 1
_HEADER = struct.Struct("<4sBBBBBQQ")
_STREAM = struct.Struct("<BQQ")
_RAW, _ZSTD, _ZEROS = 0, 1, 2
_ID = {OVERWRITE: 1, XOR: 2, ULP: 3, OVERWRITE_BF16: 4, XOR_BF16: 5, ULP_BF16: 6}
_HALF_BITS = 16
_LOW = (1 << _HALF_BITS) - 1
_GAP_BYTES = 4
_MAX_WORDS = (1 << 31) - 1
_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """One chunk's delta: ``apply_chunk(encoding, payload, into=<base chunk>, dtype=...)`` turns the base into
    the target."""

    encoding: str
    """One of ``ENCODINGS``."""
    payload: bytes
    """What crosses the wire: for ``dense`` the target chunk's bytes, else the framed streams (module docstring)."""
    changed: int
    """Words (elements of the chunk's dtype) whose bytes differ between base and target."""
    elements: int
    """Whole words in the chunk (its length // the element size)."""

    @property
    def nbytes(self) -> int:
        return len(self.payload)


@dataclass(frozen=True, slots=True)
class ChunkChanges:
    """What a delta changes in one chunk, on the chunk's device: enough to apply it and to update a linear
    digest without reading the unchanged words (``delta_digest``)."""

    positions: torch.Tensor
    """int64 word indices, strictly increasing."""
    old: torch.Tensor
    """The base's words at ``positions`` (signed int of the element size)."""
    new: torch.Tensor
    """The target's words at ``positions``."""
    tail_offset: int
    """Byte offset of the partial word at the chunk's end (== the chunk's length when there is none)."""
    old_tail: bytes
    new_tail: bytes
    word_bytes: int

    def byte_changes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(chunk byte offsets int64, old bytes uint8, new bytes uint8) of every byte of every changed word, and
        of the tail's bytes, in increasing offset order."""
        w = self.word_bytes
        dev = self.positions.device
        offs = (self.positions[:, None] * w + torch.arange(w, device=dev)[None]).reshape(-1)
        old = self.old.reshape(-1).view(torch.uint8)
        new = self.new.reshape(-1).view(torch.uint8)
        if self.old_tail != self.new_tail:
            k = len(self.new_tail)
            offs = torch.cat([offs, torch.arange(self.tail_offset, self.tail_offset + k, device=dev)])
            old = torch.cat([old, torch.frombuffer(bytearray(self.old_tail), dtype=torch.uint8).to(dev)])
            new = torch.cat([new, torch.frombuffer(bytearray(self.new_tail), dtype=torch.uint8).to(dev)])
        return offs, old, new


# ---------------------------------------------------------------------------------------------------- words
#
# Host chunks go through numpy views of their memory, on the calling thread (torch's CPU ops split each op over
# OpenMP threads that then spin-wait, which costs several times the CPU on a busy host); device chunks through
# torch ops on their device. The arithmetic below is written once for both: ``^ >> << & -`` and fancy indexing
# mean the same on numpy arrays and torch tensors, and integer arithmetic wraps in both.

_NP_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_NP_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
HOST_NUMPY = True
"""Host chunks through numpy (the default); False sends them down the torch path that device chunks take (the
tests run it on the CPU where there is no GPU)."""


def _word_bytes(dtype: torch.dtype) -> int:
    """The word size for ``dtype``: its element size, or single bytes for an element size without an integer
    type of its width (complex128)."""
    return dtype.itemsize if dtype.itemsize in _INT else 1


def _check_chunk(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D uint8 tensor of one chunk's bytes, got "
                         f"{getattr(t, 'dtype', type(t))} of shape {tuple(getattr(t, 'shape', ()))}")


def _words(u8: torch.Tensor, w: int):
    """The words of ``u8``: a numpy view of host memory (writes go through), a torch view on a device (a copy
    where its address is not word-aligned: ``_write`` then writes bytes)."""
    if u8.device.type == "cpu" and HOST_NUMPY:
        return u8.detach().numpy().view(_NP_INT[w])
    if w > 1 and u8.storage_offset() % w:
        return u8.contiguous().clone().view(_INT[w])
    return u8.view(_INT[w])


def _nonzero(x):
    return np.flatnonzero(x) if isinstance(x, np.ndarray) else x.nonzero().reshape(-1)


def _keys(words, floating: bool):
    """The ordered integer of each word: for floats, sign-magnitude mapped to a monotone integer (an
    involution: the same map takes keys back to words); for other dtypes the word itself."""
    if not floating:
        return words
    bits = words.itemsize * 8 if isinstance(words, np.ndarray) else words.element_size() * 8
    return words ^ ((words >> (bits - 1)) & ((1 << (bits - 1)) - 1))


def _bits(x) -> int:
    return x.itemsize * 8 if isinstance(x, np.ndarray) else x.element_size() * 8


def _zigzag(d):
    return (d << 1) ^ (d >> (_bits(d) - 1))


def _unzigzag(z):
    return ((z >> 1) & ((1 << (_bits(z) - 1)) - 1)) ^ -(z & 1)


def _planes(x, w: int) -> list[np.ndarray]:
    """The ``w`` little-endian byte planes of integer words, as host uint8 arrays."""
    if isinstance(x, np.ndarray):
        return [(x >> (8 * i)).astype(np.uint8) if i else x.astype(np.uint8) for i in range(w)]
    return [((x >> (8 * i)) if i else x).to(torch.uint8).cpu().numpy() for i in range(w)]


def _from_planes(planes: Sequence[np.ndarray | None], w: int, n: int, like):
    """``n`` words of ``w`` bytes from their byte planes (None: a plane of zeros), where ``like`` lives (numpy,
    or torch on its device)."""
    if isinstance(like, np.ndarray):
        return _host_from_planes(planes, n, _NP_UINT[w]).view(_NP_INT[w])
    # planes decoded from a payload are read-only views of it: copied before torch takes them
    acc = torch.zeros(n, dtype=torch.int64, device=like.device)
    for i, plane in enumerate(planes):
        if plane is not None:
            acc |= torch.from_numpy(plane.copy()).to(like.device).to(torch.int64) << (8 * i)
    return acc.to(_INT[w])


def _host_from_planes(planes: Sequence[np.ndarray | None], n: int, dtype) -> np.ndarray:
    """The ``n`` unsigned words whose little-endian byte planes are ``planes`` (None: a plane of zeros), as
    ``dtype`` (an unsigned integer of the words' size, or a wider integer): from the highest plane that is not
    zeros down, shifted and or-ed in place, so that a plane of zeros above it costs nothing."""
    top = max((i for i, p in enumerate(planes) if p is not None), default=None)
    if top is None:
        return np.zeros(n, dtype=dtype)
    acc = planes[top].astype(dtype)
    for plane in planes[top - 1::-1] if top else ():
        acc <<= 8
        if plane is not None:
            acc |= plane
    return acc


def _gaps(positions):
    """Gaps between increasing positions (the first from -1), each minus one: a run of changed words is zeros."""
    if isinstance(positions, np.ndarray):
        return (np.diff(positions, prepend=-1) - 1).astype(np.int32)
    prev = torch.cat([positions.new_full((1,), -1), positions[:-1]])
    return (positions - prev - 1).to(torch.int32)


def _hi(words):
    """The high 16-bit halves of 4-byte words, as 2-byte words (for a float32 word: its bf16 truncation)."""
    if isinstance(words, np.ndarray):
        return (words >> _HALF_BITS).astype(np.int16)
    return (words >> _HALF_BITS).to(torch.int16)


def _up(halves):
    """4-byte words whose high halves are ``halves`` and whose low halves are zero (a bf16 value's float32)."""
    if isinstance(halves, np.ndarray):
        return halves.astype(np.int32) << _HALF_BITS
    return halves.to(torch.int32) << _HALF_BITS


def _low_zero(words) -> bool:
    """Whether every one of the 4-byte ``words`` has a zero low half."""
    return not bool((words & _LOW).any())


def _tensor(x, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x.to(device)


# ---------------------------------------------------------------------------------------------------- zstd

_LOCAL = threading.local()


def _cctx() -> zstandard.ZstdCompressor:
    c = getattr(_LOCAL, "cctx", None)
    if c is None:
        c = _LOCAL.cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _dctx() -> zstandard.ZstdDecompressor:
    d = getattr(_LOCAL, "dctx", None)
    if d is None:
        d = _LOCAL.dctx = zstandard.ZstdDecompressor()
    return d


def _pack_stream(plane: np.ndarray) -> tuple[int, int, bytes]:
    if not plane.any():
        return _ZEROS, plane.size, b""
    packed = _cctx().compress(plane)
    if len(packed) < plane.size:
        return _ZSTD, plane.size, packed
    return _RAW, plane.size, plane.tobytes()


def _frame(encoding: str, w: int, elements: int, changed: int, tail: bytes, planes: list[np.ndarray]) -> bytes:
    streams = [_pack_stream(p) for p in planes]
    head = [_HEADER.pack(_MAGIC, _FORMAT, _ID[encoding], w, len(tail), len(streams), elements, changed)]
    head += [_STREAM.pack(kind, raw, len(data)) for kind, raw, data in streams]
    return b"".join(head + [tail] + [data for _, _, data in streams])


# ---------------------------------------------------------------------------------------------------- encode


@dataclass(frozen=True, slots=True)
class _Diff:
    w: int
    floating: bool
    elements: int
    base_words: object
    target_words: object
    positions: object
    tail: bytes
    target: torch.Tensor


def _diff(base: torch.Tensor, target: torch.Tensor, dtype: torch.dtype) -> _Diff:
    _check_chunk(base, "base")
    _check_chunk(target, "target")
    if base.numel() != target.numel() or base.device != target.device:
        raise ValueError(f"base and target must be one chunk's bytes on one device: {base.numel()} bytes on "
                         f"{base.device} against {target.numel()} on {target.device}")
    w = _word_bytes(dtype)
    elements = base.numel() // w
    if elements > _MAX_WORDS:
        raise ValueError(f"a chunk of {elements} words is beyond the codec's {_MAX_WORDS}: use smaller chunks")
    body = elements * w
    bw = _words(base[:body], w)
    tw = _words(target[:body], w)
    positions = _nonzero(bw != tw)
    tail = target[body:].cpu().numpy().tobytes()
    return _Diff(w, dtype.is_floating_point and dtype.itemsize == w, elements, bw, tw, positions, tail, target)


def _changed(d: _Diff) -> int:
    return int(d.positions.size if isinstance(d.positions, np.ndarray) else d.positions.numel())


def _bf16_changes(d: _Diff) -> bool:
    """Whether the sparse bf16 encodings apply: a float32 chunk whose changed words hold bf16 values (zero low
    halves) in base and target. The unchanged words do not matter: the sparse encodings never write them."""
    if not (d.floating and d.w == 4):
        return False
    return _low_zero(d.base_words[d.positions] | d.target_words[d.positions])


def _bf16_chunk(d: _Diff) -> bool:
    """Whether ``dense_bf16`` applies: a float32 chunk whose every target word holds a bf16 value."""
    return d.floating and d.w == 4 and _low_zero(d.target_words)


def _encode(d: _Diff, encoding: str) -> EncodedChunk:
    changed = _changed(d)
    whole = _WHOLE.get(encoding, encoding)
    if whole not in ENCODINGS:
        raise ValueError(f"unknown delta encoding {encoding!r}: one of {KNOWN}")
    half = encoding != whole
    if half and not (_bf16_chunk(d) if whole == DENSE else _bf16_changes(d)):
        raise ValueError(f"{encoding} encodes float32 chunks whose {'words' if whole == DENSE else 'changed words'} "
                         f"hold bf16 values (zero low halves); this chunk's do not: use {whole}")
    if encoding == DENSE:
        return EncodedChunk(DENSE, d.target.cpu().numpy().tobytes(), changed, d.elements)
    if encoding == DENSE_BF16:
        halves = _hi(d.target_words)
        halves = halves if isinstance(halves, np.ndarray) else halves.cpu().numpy()
        return EncodedChunk(DENSE_BF16, halves.astype("<i2").tobytes() + d.tail, changed, d.elements)
    # the values' words: the chunk's own, or the high halves of its 4-byte words
    w, value = (2, _hi) if half else (d.w, lambda x: x)
    if whole == XOR:
        planes = _planes(value(d.base_words ^ d.target_words), w)
    elif whole == OVERWRITE:
        planes = _planes(_gaps(d.positions), _GAP_BYTES) + _planes(value(d.target_words[d.positions]), w)
    else:
        kb = _keys(value(d.base_words[d.positions]), d.floating)
        kt = _keys(value(d.target_words[d.positions]), d.floating)
        planes = _planes(_gaps(d.positions), _GAP_BYTES) + _planes(_zigzag(kt - kb), w)
    return EncodedChunk(encoding, _frame(encoding, w, d.elements, changed, d.tail, planes), changed, d.elements)


def encode_chunk(base: torch.Tensor, target: torch.Tensor, *, dtype: torch.dtype,
                 candidates: Sequence[str] = DEFAULT_CANDIDATES,
                 dense_fraction: float = DENSE_FRACTION, bf16_halves: bool = True) -> EncodedChunk:
    """The smallest encoding of ``target`` against ``base`` (1-D uint8 tensors of one chunk's bytes, same length,
    same device) among ``candidates`` and ``dense``; ``dense`` outright when more than ``dense_fraction`` of the
    words changed. ``dtype``: the chunk's element dtype, whose element size sets the words (a chunk that mixes
    dtypes is still exact, only less compact; an element size without an integer type is read as bytes).

    With ``bf16_halves`` (the default), a float32 chunk whose changed words hold bf16 values in base and target
    takes each candidate's ``_bf16`` form (``BF16``), and a dense one ``dense_bf16`` where every word does: they
    carry the same words in half the bytes."""
    d = _diff(base, target, dtype)
    if _changed(d) > dense_fraction * d.elements:
        return _encode(d, _dense(d, bf16_halves))
    sparse_half = bf16_halves and _bf16_changes(d)
    w = 2 if sparse_half else d.w
    best = None
    for encoding in candidates:
        encoding = _WHOLE.get(encoding, encoding)
        if encoding == DENSE:
            continue
        if encoding == OVERWRITE and best is not None and _WHOLE.get(best.encoding, best.encoding) == ULP \
                and _step_bytes(best.payload, w) <= STEP_BYTES_FOR_OVERWRITE * w * best.changed:
            continue
        e = _encode(d, BF16[encoding] if sparse_half else encoding)
        if best is None or e.nbytes < best.nbytes:
            best = e
    half_dense = d.elements * 2 + len(d.tail)
    if best is not None and best.nbytes < min(half_dense, base.numel()):
        return best  # smaller than either dense form: no pass over the chunk to tell which applies
    dense = _dense(d, bf16_halves)
    if best is None or best.nbytes >= (half_dense if dense == DENSE_BF16 else base.numel()):
        return _encode(d, dense)
    return best


def _dense(d: _Diff, bf16_halves: bool) -> str:
    """``dense_bf16`` where it applies and is allowed, else ``dense`` (a pass over the whole chunk)."""
    return DENSE_BF16 if bf16_halves and _bf16_chunk(d) else DENSE


def _step_bytes(payload: bytes, w: int) -> int:
    """Stored bytes of a ``ulp`` frame's step streams (the ones after its position streams), of ``w``-byte
    values."""
    first = _HEADER.size + _GAP_BYTES * _STREAM.size
    return sum(_STREAM.unpack_from(payload, first + i * _STREAM.size)[2] for i in range(w))


def encode_each(base: torch.Tensor, target: torch.Tensor, *, dtype: torch.dtype,
                encodings: Sequence[str] = ENCODINGS) -> dict[str, EncodedChunk]:
    """Every encoding in ``encodings`` of one chunk (for benchmarks and tests: ``encode_chunk`` picks one). A
    ``_bf16`` encoding of a chunk it does not apply to raises ``ValueError``."""
    d = _diff(base, target, dtype)
    return {e: _encode(d, e) for e in encodings}


# ---------------------------------------------------------------------------------------------------- decode


def _corrupt(encoding: str, reason: str) -> DeltaCorrupt:
    return DeltaCorrupt(f"delta payload ({encoding}) refused, nothing written: {reason}; read the chunk of the "
                        f"target version in full instead", encoding=encoding, reason=reason)


def _parse(encoding: str, payload, n: int, w: int, vw: int) -> tuple[bytes, list[np.ndarray | None], int]:
    """Checks a framed payload against the chunk of ``n`` bytes (``w``-byte words) it is applied to, its values
    being ``vw``-byte words, and decompresses its streams: (tail, planes, bytes per plane), a plane of zeros as
    None."""
    try:
        buf = memoryview(payload).cast("B")
    except TypeError:
        raise _corrupt(encoding, f"a payload of type {type(payload).__name__} has no bytes") from None
    if len(buf) < _HEADER.size:
        raise _corrupt(encoding, f"{len(buf)} bytes is shorter than the {_HEADER.size}-byte header")
    magic, fmt, ident, ww, tail_len, count, elements, changed = _HEADER.unpack_from(buf, 0)
    if magic != _MAGIC or fmt != _FORMAT:
        raise _corrupt(encoding, f"not a delta payload of format {_FORMAT} (magic {bytes(magic)!r}, format {fmt})")
    if ident != _ID[encoding]:
        raise _corrupt(encoding, f"the payload is of another encoding (id {ident})")
    if ww != vw:
        raise _corrupt(encoding, f"encoded with {ww}-byte values, applied with {vw}-byte values")
    if elements != n // w or tail_len != n % w:
        raise _corrupt(encoding, f"encoded for a chunk of {elements} words + {tail_len} bytes, applied to one of "
                                 f"{n} bytes")
    if changed > elements:
        raise _corrupt(encoding, f"{changed} changed words in a chunk of {elements}")
    per = [elements] * vw if _WHOLE.get(encoding, encoding) == XOR else [changed] * (_GAP_BYTES + vw)
    if count != len(per):
        raise _corrupt(encoding, f"{count} streams, expected {len(per)}")
    pos = _HEADER.size + count * _STREAM.size
    if len(buf) < pos + tail_len:
        raise _corrupt(encoding, "truncated stream table")
    table = [_STREAM.unpack_from(buf, _HEADER.size + i * _STREAM.size) for i in range(count)]
    tail = bytes(buf[pos:pos + tail_len])
    pos += tail_len
    if pos + sum(stored for _, _, stored in table) != len(buf):
        raise _corrupt(encoding, f"streams of {sum(s for _, _, s in table)} bytes do not fill the "
                                 f"{len(buf) - pos} bytes after the header")
    planes = []
    for i, ((kind, raw, stored), want) in enumerate(zip(table, per)):
        if raw != want:
            raise _corrupt(encoding, f"stream {i} holds {raw} bytes, expected {want}")
        data = buf[pos:pos + stored]
        pos += stored
        if kind == _ZEROS and stored == 0:
            planes.append(None)
        elif kind == _RAW and stored == raw:
            planes.append(np.frombuffer(data, dtype=np.uint8))
        elif kind == _ZSTD:
            try:
                out = _dctx().decompress(data, max_output_size=raw)
            except zstandard.ZstdError as e:
                raise _corrupt(encoding, f"stream {i} does not decompress ({e})") from None
            if len(out) != raw:
                raise _corrupt(encoding, f"stream {i} decompressed to {len(out)} bytes, expected {raw}")
            planes.append(np.frombuffer(out, dtype=np.uint8))
        else:
            raise _corrupt(encoding, f"stream {i}: kind {kind} with {stored} stored bytes for {raw}")
    return tail, planes, per[0]


def _positions(planes: Sequence[np.ndarray | None], n: int, elements: int, encoding: str) -> np.ndarray:
    """The ``n`` changed words' positions (int64, strictly increasing) from their gaps' byte planes."""
    positions = _host_from_planes(planes, n, np.int64)  # each gap below 2**32: n of them stay below 2**63
    positions += 1
    if n:
        positions[0] -= 1  # the first gap counts from -1
    np.cumsum(positions, out=positions)
    if positions.size and positions[-1] >= elements:
        raise _corrupt(encoding, f"a position {int(positions[-1])} beyond the chunk's {elements} words")
    return positions


def decode_chunk(encoding: str, payload, base: torch.Tensor, *, dtype: torch.dtype) -> ChunkChanges:
    """What ``payload`` changes in ``base`` (1-D uint8, the base chunk's bytes, any device), without writing:
    raises ``DeltaCorrupt`` on a malformed payload, or a ``_bf16`` one for a chunk that is not float32.
    ``apply_chunk`` writes what this returns."""
    _check_chunk(base, "into")
    if encoding not in KNOWN:
        raise _corrupt(str(encoding), f"unknown encoding, not one of {KNOWN}")
    w = _word_bytes(dtype)
    whole = _WHOLE.get(encoding, encoding)
    half = whole != encoding
    if half and not (dtype.is_floating_point and dtype.itemsize == w == 4):
        raise _corrupt(encoding, f"a {encoding} payload rebuilds float32 words, applied to a chunk of {dtype}")
    n = base.numel()
    elements = n // w
    body = elements * w
    dev = base.device
    bw = _words(base[:body], w)
    old_tail = base[body:].cpu().numpy().tobytes() if body < n else b""
    if whole == DENSE:
        try:
            target = np.frombuffer(memoryview(payload).cast("B"), dtype=np.uint8)
        except TypeError:
            raise _corrupt(encoding, f"a payload of type {type(payload).__name__} has no bytes") from None
        size = elements * 2 + n - body if half else n
        if target.size != size:
            raise _corrupt(encoding, f"{target.size} bytes for a chunk of {n} (expected {size})")
        cut = elements * 2 if half else body
        tw = _up(target[:cut].view("<i2").astype(np.int16)) if half else target[:cut].view(_NP_INT[w])
        if not isinstance(bw, np.ndarray):
            tw = torch.from_numpy(tw.copy()).to(dev)
        positions = _nonzero(bw != tw)
        new_tail = target[cut:].tobytes()
        return _changes(positions, bw[positions], tw[positions], body, old_tail, new_tail, w, dev)
    vw = 2 if half else w
    tail, planes, size = _parse(encoding, payload, n, w, vw)
    # values as decoded (``vw``-byte words) -> the chunk's words: the identity, or bf16 halves to float32 words
    value, word = (_hi, _up) if half else ((lambda x: x), (lambda x: x))
    if whole == XOR:
        x = _from_planes(planes, vw, size, bw)
        positions = _nonzero(x)
        old = bw[positions]
        return _changes(positions, old, word(value(old) ^ x[positions]), body, old_tail, tail, w, dev)
    positions = _positions(planes[:_GAP_BYTES], size, elements, encoding)
    if not isinstance(bw, np.ndarray):
        positions = torch.from_numpy(positions).to(dev)
    values = _from_planes(planes[_GAP_BYTES:], vw, size, bw)
    old = bw[positions]
    if whole == OVERWRITE:
        return _changes(positions, old, word(values), body, old_tail, tail, w, dev)
    floating = dtype.is_floating_point and dtype.itemsize == w
    if isinstance(values, np.ndarray) and not half:  # host words: the same steps, in place
        new = _host_ulp(old, values, floating)
    else:
        new = word(_keys(_keys(value(old), floating) + _unzigzag(values), floating))
    return _changes(positions, old, new, body, old_tail, tail, w, dev)


def _host_ulp(old: np.ndarray, steps: np.ndarray, floating: bool) -> np.ndarray:
    """``_keys(_keys(old) + _unzigzag(steps))`` on host words, in place in ``steps`` (the decoder's own array)
    with one temporary: each op as in ``_keys`` and ``_unzigzag``, integer arithmetic wrapping alike."""
    bits = old.itemsize * 8
    low = (1 << (bits - 1)) - 1
    sign = steps & 1  # unzigzag: (z >> 1 & low) ^ -(z & 1)
    np.negative(sign, out=sign)
    steps >>= 1
    steps &= low
    steps ^= sign
    if not floating:
        steps += old
        return steps
    np.right_shift(old, bits - 1, out=sign)  # keys: x ^ (x >> (bits - 1) & low)
    sign &= low
    sign ^= old
    steps += sign
    np.right_shift(steps, bits - 1, out=sign)
    sign &= low
    steps ^= sign
    return steps


def _changes(positions, old, new, body, old_tail, new_tail, w, dev) -> ChunkChanges:
    positions = _tensor(positions, dev)
    return ChunkChanges(positions if positions.dtype == torch.int64 else positions.to(torch.int64),
                        _tensor(old, dev), _tensor(new, dev), body, old_tail, new_tail, w)


def write_changes(changes: ChunkChanges, into: torch.Tensor) -> None:
    """Writes decoded changes into the chunk ``into`` (the bytes ``decode_chunk`` read)."""
    w = changes.word_bytes
    body = changes.tail_offset
    if into.device.type == "cpu" and HOST_NUMPY:
        words = into[:body].detach().numpy().view(_NP_INT[w])
        words[changes.positions.numpy()] = changes.new.numpy()
    elif w == 1 or into.storage_offset() % w == 0:
        into[:body].view(_INT[w])[changes.positions] = changes.new
    else:
        offs = (changes.positions[:, None] * w + torch.arange(w, device=into.device)[None]).reshape(-1)
        into[offs] = changes.new.reshape(-1).view(torch.uint8)
    if changes.new_tail and changes.new_tail != changes.old_tail:
        into[body:] = torch.frombuffer(bytearray(changes.new_tail), dtype=torch.uint8).to(into.device)


def apply_chunk(encoding: str, payload, into: torch.Tensor, *, dtype: torch.dtype) -> None:
    """Turns ``into`` (1-D uint8, holding the base chunk's bytes, any device) into the target chunk in place.
    A malformed payload raises ``DeltaCorrupt`` before a byte is written (it is decoded and checked in full
    first). Applying a non-idempotent encoding to bytes other than its base gives bytes other than its target:
    the caller checks the base's digest before and the target's after."""
    write_changes(decode_chunk(encoding, payload, into, dtype=dtype), into)
