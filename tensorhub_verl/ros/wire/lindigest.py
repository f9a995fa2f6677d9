"""A linear digest of tensor bytes, computed with torch ops on the device that holds them (CPU or CUDA alike).

The bytes of a tensor are read as signed 16-bit little-endian words on a grid: ``rows`` rows of ``row_bytes``
bytes (a tensor of 2 or more dims with an even row: its dim-0 rows; any other tensor: one row). Word ``c`` of
row ``r`` weighs, in lane ``l``, ``w = A[l][r * groups + c // GROUP] * B[l][c % GROUP] mod P``, and the digest is
``sum(word * w) mod P`` per lane, ``P = 2**31 - 1``, two lanes: 16 hex chars.

Linear: the digest of a union of disjoint byte sets is the sum (mod P) of their digests, whatever their shapes,
so a chunk's digest is the sum of its segments', and a slice of a tensor (a TP rank's rows or columns) is
checked against the sum of the manifest's block digests that it covers. A byte split from its word (a range
that starts or ends at an odd offset) counts as its share of the word: a low byte as itself, a high byte as
256 times its signed value.

Not cryptographic (like xxh3, which it replaces): it catches torn, stale, garbage and mixed-up bytes, with a
chance of about 2**-62 per wrong chunk of missing them, not a forger who picks bytes to collide -- one would
first need a credential to publish at all.

Exact by construction on every device: on a GPU the inner products over a group of ``GROUP`` words run as a
float64 matmul whose every partial sum is an integer below 2**53 (|word| <= 2**15, |B| < 2**21, GROUP = 2**10), the
rest in int64 with every product below 2**62. The weight tables are made on the host (numpy, fixed seeds) and
copied to the device once; no byte of data leaves its device, only the final scalars come to the host.
A BLAS that does not compute float64 exactly (an emulated or reduced-precision double GEMM) would break that, so
the first digest on each device checks the matmul path against the host's integer result on a fixed block of
extreme and random words; on a mismatch that device uses int64 multiply-and-sum instead (exact, slower), and a
warning says so.

Host memory is digested with numpy in int64 (partial sums below 2**46), on the calling thread only: torch's CPU
ops split each large op over its OpenMP threads, which then spin-wait for the next op, so on a host whose cores
are busy (a rollout beside its peers) one chunk's digest cost several times the CPU of one thread doing it
(``docs/control-plane.md``, "A reader's own cost"). Both ways give the same digest; tests pin each to
``reference``.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import torch

ALGORITHM = "lin31x2/1"
"""Name and version of this digest, carried in manifests: a reader refuses digests of another algorithm."""
P = (1 << 31) - 1
LANES = 2
GROUP = 1 << 10
_B_BOUND = (1 << 21) - 1
_BATCH_WORDS = 1 << 19
"""Words converted to float64 at once (4 MiB of temporaries): bounds device memory and stays in CPU caches."""
_SEEDS = (0x7E45_0A11_D16E_5701, 0x1B3C_9D2F_6A88_E4C3)
logger = logging.getLogger("tensorhub_verl.ros.wire.lindigest")


def _splitmix(index: np.ndarray, seed: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _group_weights(count: int) -> np.ndarray:
    """A[g] for g < count, lanes as columns: in [1, P)."""
    g = np.arange(count, dtype=np.uint64)
    return np.stack([(_splitmix(g, s) % np.uint64(P - 1) + np.uint64(1)).astype(np.int64) for s in _SEEDS], 1)


def _word_weights() -> np.ndarray:
    """B[c] for c < GROUP, lanes as columns: nonzero, |B| <= _B_BOUND."""
    c = np.arange(GROUP, dtype=np.uint64) + np.uint64(1 << 40)
    cols = []
    for s in _SEEDS:
        v = (_splitmix(c, s) % np.uint64(2 * _B_BOUND)).astype(np.int64) - _B_BOUND
        cols.append(np.where(v == 0, 1, v))
    return np.stack(cols, 1).astype(np.float64)


class _Tables:
    """The weight tables, per device, grown on demand (host-made, then copied to the device)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._b = _word_weights()
        self._b_int = self._b.astype(np.int64)
        self._a = _group_weights(1 << 16)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.exact_matmul: dict[torch.device, bool] = {}
        """Per device: whether its float64 matmul passed the self-check (``_check_matmul``)."""

    def get(self, device: torch.device, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A (int64) and B (float64) on ``device``."""
        return self._get(device, groups)[:2]

    def get_exact(self, device: torch.device, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A (int64), B (float64) and B (int64) on ``device``."""
        return self._get(device, groups)

    def _get(self, device: torch.device, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with self._lock:
            self._grow(groups)
            if device not in self._on:
                self._on[device] = (torch.from_numpy(self._a).to(device), torch.from_numpy(self._b).to(device),
                                    torch.from_numpy(self._b_int).to(device))
            return self._on[device]

    def host(self, groups: int) -> tuple[np.ndarray, np.ndarray]:
        """A (int64, lanes as columns) and B (int64) for ``_host_words``."""
        with self._lock:
            self._grow(groups)
            return self._a, self._b_int

    def _grow(self, groups: int) -> None:
        if groups > len(self._a):
            self._a = _group_weights(1 << max(groups - 1, 1).bit_length())
            self._on.clear()


_TABLES = _Tables()


def row_bytes(shape: tuple[int, ...], nbytes: int) -> int:
    """The grid's row length in bytes: dim-0 rows when there are 2+ dims and a row is an even number of bytes."""
    if len(shape) >= 2 and shape[0] > 0 and (nbytes // shape[0]) % 2 == 0 and nbytes // shape[0] > 0:
        return nbytes // shape[0]
    return max(nbytes, 1)


def _groups(rb: int) -> int:
    """Weight groups per grid row: its words, GROUP at a time."""
    return -(-((rb + 1) // 2) // GROUP)


def zero(device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.zeros(LANES, dtype=torch.int64, device=device)


def _words(words: torch.Tensor, row0: int, col0: int, groups: int) -> torch.Tensor:
    """Digest lanes of int16 ``words`` [rows, n] lying at grid rows ``row0``.. and word columns ``col0``..:
    numpy on this thread for host memory, torch ops on the device for the rest (see the module's docstring)."""
    if words.device.type == "cpu":
        return torch.from_numpy(_host_words(words.detach().numpy(), row0, col0, groups))
    return _device_words(words, row0, col0, groups)


def _host_words(x: np.ndarray, row0: int, col0: int, groups: int) -> np.ndarray:
    """``_device_words`` in numpy int64: the same column ranges, each word times its B exactly (no float)."""
    rows, n = x.shape
    acc = np.zeros(LANES, dtype=np.int64)
    if not rows or not n:
        return acc
    a, b = _TABLES.host((row0 + rows) * groups)
    step = max(1, _BATCH_WORDS // n)
    for r in range(0, rows, step):
        block = x[r:r + step]
        m = block.shape[0]
        first = np.arange(row0 + r, row0 + r + m, dtype=np.int64) * groups
        c = 0
        while c < n:
            q, off = divmod(col0 + c, GROUP)
            if off == 0 and n - c >= GROUP:  # whole groups, at most a batch of words at a time
                k = min((n - c) // GROUP, max(1, _BATCH_WORDS // (GROUP * m)))
                y = block[:, c:c + k * GROUP].astype(np.int64).reshape(m * k, GROUP) @ b
                g = (first[:, None] + (q + np.arange(k, dtype=np.int64))[None]).reshape(-1)
                width = k * GROUP
            else:
                width = min(GROUP - off, n - c)
                y = block[:, c:c + width].astype(np.int64) @ b[off:off + width]
                g = first + q
            y %= P
            y *= a[g]
            y %= P
            acc = (acc + y.sum(0)) % P
            c += width
    return acc


def _check_matmul(device: torch.device) -> bool:
    """Whether ``device``'s float64 matmul gives the exact digest: a fixed block of words (the extremes of int16
    and random ones, whole groups and parts of groups, several rows) against ``_host_words``."""
    rng = np.random.default_rng(0x5EED)
    x = rng.integers(-(1 << 15), 1 << 15, size=(3, 2 * GROUP + 37), dtype=np.int64).astype(np.int16)
    x[0, :GROUP] = -(1 << 15)
    x[1, :GROUP] = (1 << 15) - 1
    want = _host_words(x, 5, 7, 4)
    got = _device_words(torch.from_numpy(x).to(device), 5, 7, 4, exact_matmul=True).cpu().numpy()
    return bool((want == got).all())


def _matmul_is_exact(device: torch.device) -> bool:
    known = _TABLES.exact_matmul.get(device)
    if known is None:
        known = _check_matmul(device)
        if not known:
            logger.warning("float64 matmul on %s is not exact (an emulated or reduced-precision double GEMM): "
                           "digests there use int64 multiply-and-sum instead (exact, slower)", device)
        _TABLES.exact_matmul[device] = known
    return known


def _device_words(words: torch.Tensor, row0: int, col0: int, groups: int,
                  exact_matmul: bool | None = None) -> torch.Tensor:
    """Digest lanes of int16 ``words`` [rows, n] on their device (torch ops).

    Column by column range: a run of whole weight groups goes as one [rows * k, GROUP] matmul, a part of one
    group as [rows, part] times that part of B; nothing is padded, so narrow rows cost what they hold.
    ``exact_matmul`` None: the device's self-check decides between the float64 matmul and int64 products."""
    rows, n = words.shape
    acc = zero(words.device)
    if not rows or not n:
        return acc
    if exact_matmul is None:
        exact_matmul = _matmul_is_exact(words.device)
    a, b, b_int = _TABLES.get_exact(words.device, (row0 + rows) * groups)
    step = max(1, _BATCH_WORDS // n)
    for r in range(0, rows, step):
        if not exact_matmul:
            acc = (acc + _int64_rows(words[r:r + step], row0 + r, col0, groups, a, b_int)).remainder_(P)
            continue
        x = words[r:r + step].to(torch.float64)
        m = x.shape[0]
        first = torch.arange(row0 + r, row0 + r + m, device=words.device) * groups
        c = 0
        while c < n:
            q, off = divmod(col0 + c, GROUP)
            if off == 0 and n - c >= GROUP:
                k = (n - c) // GROUP
                y = x[:, c:c + k * GROUP].reshape(m * k, GROUP) @ b
                g = (first[:, None] + (q + torch.arange(k, device=words.device))[None]).reshape(-1)
                width = k * GROUP
            else:
                width = min(GROUP - off, n - c)
                y = x[:, c:c + width] @ b[off:off + width]
                g = first + q
            acc = (acc + (y.to(torch.int64).remainder_(P) * a[g]).remainder_(P).sum(0)).remainder_(P)
            c += width
    return acc


def _int64_rows(words: torch.Tensor, row0: int, col0: int, groups: int, a: torch.Tensor,
                b_int: torch.Tensor) -> torch.Tensor:
    """``_device_words`` of a batch of rows without float: each word times its B in int64 (products below 2**36,
    a group's sum below 2**46), summed per group, then weighted by A as in the matmul path."""
    x = words.to(torch.int64)
    m, n = x.shape
    first = torch.arange(row0, row0 + m, device=words.device) * groups
    acc = zero(words.device)
    c = 0
    while c < n:
        q, off = divmod(col0 + c, GROUP)
        width = min(GROUP - off, n - c)
        y = (x[:, c:c + width, None] * b_int[off:off + width][None]).sum(1)
        acc = (acc + (y.remainder_(P) * a[first + q]).remainder_(P).sum(0)).remainder_(P)
        c += width
    return acc


def _as_words(u8: torch.Tensor) -> torch.Tensor:
    """int16 view of a uint8 [rows, even] tensor (through a copy where its layout does not allow a view)."""
    if u8.storage_offset() % 2 or (u8.shape[0] > 1 and u8.stride(0) % 2) or u8.stride(1) != 1:
        u8 = u8.clone(memory_format=torch.contiguous_format)
    if u8.shape[0] == 1:
        return u8[0].view(torch.int16)[None]
    return u8.view(torch.int16)


def rect(u8: torch.Tensor, row0: int, col0: int, rb: int) -> torch.Tensor:
    """Digest lanes of the bytes ``u8`` [rows, n] lying at grid rows ``row0``.. and byte columns ``col0``..
    of a grid with rows of ``rb`` bytes."""
    rows, n = u8.shape
    acc = zero(u8.device)
    if not rows or not n:
        return acc
    groups = _groups(rb)
    lo, hi = 0, n
    if col0 % 2:  # a high byte without its low byte: 256 times its signed value
        acc = acc + _words(u8[:, :1].view(torch.int8).to(torch.int16) * 256, row0, col0 // 2, groups)
        lo = 1
    if hi > lo and (col0 + n) % 2:  # a low byte without its high byte
        acc = acc + _words(u8[:, hi - 1:hi].to(torch.int16), row0, (col0 + n) // 2, groups)
        hi -= 1
    if hi > lo:
        acc = acc + _words(_as_words(u8[:, lo:hi]), row0, (col0 + lo) // 2, groups)
    return acc.remainder_(P)


def span(data: torch.Tensor, offset: int, rb: int, window: tuple[int, int] | None = None) -> torch.Tensor:
    """Digest lanes of flat uint8 ``data``: the tensor's bytes [offset, offset + len) on a grid of ``rb``-byte
    rows; with ``window`` (c0, c1), only those of its bytes whose column in their row is in [c0, c1)."""
    c0, c1 = window or (0, rb)
    acc = zero(data.device)
    pos, n = 0, data.numel()
    while pos < n:
        row, col = divmod(offset + pos, rb)
        if col == 0 and n - pos >= rb:  # whole rows at once
            count = (n - pos) // rb
            block = data[pos:pos + count * rb].view(count, rb)
            width = rb
        else:
            width = min(rb - col, n - pos)
            block, count = data[pos:pos + width].view(1, width), 1
        a, b = max(col, c0), min(col + width, c1)
        if a < b:
            acc = acc + rect(block[:, a - col:b - col], row, a, rb)
        pos += count * width
    return acc.remainder_(P)


def to_hex(lanes: torch.Tensor | list[int]) -> str:
    values = lanes.tolist() if isinstance(lanes, torch.Tensor) else lanes
    return "".join(f"{int(v) % P:08x}" for v in values)


def from_hex(digest: str) -> list[int]:
    return [int(digest[8 * i:8 * i + 8], 16) for i in range(LANES)] if digest else [0] * LANES


def add_hex(digests) -> str:
    """The digest of the union of disjoint byte sets, from theirs ("" counts as the empty set)."""
    total = [0] * LANES
    for d in digests:
        total = [(t + v) % P for t, v in zip(total, from_hex(d))]
    return to_hex(total)


def many_to_hex(lanes: list[torch.Tensor]) -> list[str]:
    """Hex digests of many lane tensors, with one device-to-host copy of their scalars."""
    if not lanes:
        return []
    return [to_hex(v) for v in torch.stack(lanes).tolist()]


def reference(data: bytes, offset: int, rb: int) -> str:
    """The same digest in plain Python integers, byte by byte from its definition: the tests' yardstick."""
    groups = _groups(rb)
    a_tab = _group_weights(((offset + len(data)) // rb + 1) * groups)
    b_tab = _word_weights().astype(np.int64)
    total = [0] * LANES
    for i, byte in enumerate(data):
        row, col = divmod(offset + i, rb)
        word, high = divmod(col, 2)
        value = (byte - 256 if byte >= 128 else byte) * 256 if high else byte
        for lane in range(LANES):
            w = int(a_tab[row * groups + word // GROUP, lane]) * int(b_tab[word % GROUP, lane])
            total[lane] = (total[lane] + value * w) % P
    return to_hex(total)
