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
the first digest on each device checks the matmul path (``lindigest_cells`` its batched products likewise) against
the host's integer result on a fixed block of extreme and random words; on a mismatch that device uses int64
multiply-and-sum instead (exact, slower), and a warning says so. A device digest takes up to
``DEVICE_BATCH_WORDS`` words per batch, so a GiB costs a few dozen torch ops, not one launch per MiB.

Host memory is digested with numpy on the calling thread only: torch's CPU ops split each large op over its
OpenMP threads, which then spin-wait for the next op, so on a host whose cores are busy (a rollout beside its
peers) one chunk's digest cost several times the CPU of one thread doing it (``docs/control-plane.md``, "A
reader's own cost"). Its inner products run as a float64 matmul too (exact for the same reason), in batches of
``HOST_MATMUL_WORDS`` words, small enough that the BLAS runs each on the calling thread; the first host digest
checks that path against int64 products on the fixed block, and on a mismatch the host uses int64 products
(exact, slower), with a warning. Both ways give the same digest; tests pin each to ``reference``.
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
_BATCH_WORDS = 1 << 17
"""Host words converted to int64 at once where the host multiplies in int64 (the cells' pass, and the linear
digest where the float64 matmul failed its self-check; 1 MiB of temporaries): stays in a core's caches, and stays
below the sizes that a worker thread's malloc arena hands back to the kernel after each batch (a digest off the
main thread, such as a delta reader's base pass, would otherwise take a page fault per 4 KiB of every batch)."""
DEVICE_BATCH_WORDS = 1 << 25
"""Device words converted to float64 at once (256 MiB of temporaries, a quarter as many words for int64
products): a GiB of bytes in a few dozen torch ops, so a digest is bound by the device's memory bandwidth rather
than by launching ops, within a stated bound on what it borrows beside a training job."""
HOST_MATMUL_WORDS = 1 << 16
"""Host words multiplied at once as a float64 matmul (512 KiB of temporaries, a [64, GROUP] @ [GROUP, LANES]
product): below the size at which OpenBLAS splits a matmul over its threads, so it runs on the calling thread,
and, like ``_BATCH_WORDS``, within a core's caches and the malloc arena's kept sizes."""
HOST_NUMPY = True
"""Host tensors through numpy (the default); False sends them down the torch path that device tensors take (tests
and ``bench.digest --device-path`` run it on the CPU where there is no GPU)."""
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
        self._b_pair: np.ndarray | None = None
        self.exact_matmul: dict[torch.device, bool] = {}
        """Per device: whether its float64 matmul passed the self-check (``_check_matmul``)."""
        self.host_exact_matmul: bool | None = None
        """Whether numpy's float64 matmul passed the self-check (``_check_host_matmul``); None before the first
        host digest."""

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

    def host_float(self, groups: int) -> tuple[np.ndarray, np.ndarray]:
        """A (int64, lanes as columns) and B (float64) for ``_host_words``' matmul."""
        with self._lock:
            self._grow(groups)
            return self._a, self._b

    def host_pairs(self, groups: int) -> tuple[np.ndarray, np.ndarray]:
        """A (int64, lanes as columns) and B as complex128, lane 0 real and lane 1 imaginary (exact: every B is
        an integer below 2**21): both lanes' weights of scattered words in one gather."""
        with self._lock:
            self._grow(groups)
            if self._b_pair is None:
                self._b_pair = self._b[:, 0] + 1j * self._b[:, 1]
            return self._a, self._b_pair

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
    if words.device.type == "cpu" and HOST_NUMPY:
        return torch.from_numpy(_host_words(words.detach().numpy(), row0, col0, groups))
    return _device_words(words, row0, col0, groups)


def _host_words(x: np.ndarray, row0: int, col0: int, groups: int,
                exact_matmul: bool | None = None) -> np.ndarray:
    """``_device_words`` in numpy: the same column ranges, each group's inner products with B as a float64
    matmul (every partial sum an integer below 2**53) or, with ``exact_matmul`` False, in int64; None: the host's
    self-check decides (``_host_matmul_is_exact``)."""
    rows, n = x.shape
    acc = np.zeros(LANES, dtype=np.int64)
    if not rows or not n:
        return acc
    if exact_matmul is None:
        exact_matmul = _host_matmul_is_exact()
    if exact_matmul:
        a, b = _TABLES.host_float((row0 + rows) * groups)
        dtype, batch = np.float64, HOST_MATMUL_WORDS
    else:
        a, b = _TABLES.host((row0 + rows) * groups)
        dtype, batch = np.int64, _BATCH_WORDS
    step = max(1, batch // n)
    for r in range(0, rows, step):
        block = x[r:r + step]
        m = block.shape[0]
        first = np.arange(row0 + r, row0 + r + m, dtype=np.int64) * groups
        c = 0
        while c < n:
            q, off = divmod(col0 + c, GROUP)
            if off == 0 and n - c >= GROUP:  # whole groups, at most a batch of words at a time
                k = min((n - c) // GROUP, max(1, batch // (GROUP * m)))
                y = block[:, c:c + k * GROUP].astype(dtype).reshape(m * k, GROUP) @ b
                g = (first[:, None] + (q + np.arange(k, dtype=np.int64))[None]).reshape(-1)
                width = k * GROUP
            else:
                width = min(GROUP - off, n - c)
                y = block[:, c:c + width].astype(dtype) @ b[off:off + width]
                g = first + q
            if exact_matmul:
                y = y.astype(np.int64)
            y %= P
            y *= a[g]
            y %= P
            for lane in range(LANES):  # a column at a time: numpy sums a 1-D run faster than axis 0
                acc[lane] = (acc[lane] + y[:, lane].sum()) % P
            c += width
    return acc


def _check_host_matmul() -> bool:
    """Whether numpy's float64 matmul gives the exact digest: the self-check's block against int64 products."""
    want = _host_words(_CHECK_WORDS, 5, 7, 4, exact_matmul=False)
    return bool((_host_words(_CHECK_WORDS, 5, 7, 4, exact_matmul=True) == want).all())


def _host_matmul_is_exact() -> bool:
    known = _TABLES.host_exact_matmul
    if known is None:
        known = _check_host_matmul()
        if not known:
            logger.warning("numpy's float64 matmul is not exact (an emulated or reduced-precision double GEMM): "
                           "host digests use int64 products instead (exact, slower)")
        _TABLES.host_exact_matmul = known
    return known


def _check_matmul(device: torch.device) -> bool:
    """Whether ``device``'s float64 matmul gives the exact digest: a fixed block of words (the extremes of int16
    and random ones, whole groups and parts of groups, several rows) against ``_host_words``."""
    want = _host_words(_CHECK_WORDS, 5, 7, 4, exact_matmul=False)
    got = _device_words(torch.from_numpy(_CHECK_WORDS).to(device), 5, 7, 4, exact_matmul=True).cpu().numpy()
    return bool((want == got).all())


def _check_words() -> np.ndarray:
    """The self-check's words: random ones, a group of the most negative and a group of the most positive."""
    x = np.random.default_rng(0x5EED).integers(-(1 << 15), 1 << 15, size=(3, 2 * GROUP + 37)).astype(np.int16)
    x[0, :GROUP] = -(1 << 15)
    x[1, :GROUP] = (1 << 15) - 1
    return x


_CHECK_WORDS = _check_words()


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
    """Digest lanes of int16 ``words`` [rows, n] on their device (torch ops), in [0, P).

    A batch of up to ``DEVICE_BATCH_WORDS`` words at a time (whole rows, or a run of whole groups of one long
    row), each in at most three parts: the rest of a group the batch starts inside, a run of whole groups as one
    [rows * k, GROUP] matmul, and the start of a group it ends inside. Nothing is padded, so narrow rows cost
    what they hold; the group weights A of a part are a strided view of the table, never a gather; nothing
    reads a value back to the host. ``exact_matmul`` None: the device's self-check decides between the float64
    matmul and int64 products."""
    rows, n = words.shape
    if not rows or not n:
        return zero(words.device)
    if exact_matmul is None:
        exact_matmul = _matmul_is_exact(words.device)
    a, b, b_int = _TABLES.get_exact(words.device, (row0 + rows - 1) * groups + -(-(col0 + n) // GROUP))
    cap = DEVICE_BATCH_WORDS if exact_matmul else max(GROUP, DEVICE_BATCH_WORDS // 4)  # int64: 4x the bytes
    cols = max(GROUP, cap // GROUP * GROUP)
    step = max(1, cap // min(n, cols))
    parts = []
    for r in range(0, rows, step):
        x = words[r:r + step]
        c = 0
        while c < n:  # a long row in runs of whole groups, each ending on a group edge
            end = min(n, (col0 + c + cols) // GROUP * GROUP - col0)
            parts.extend(_batch_lanes(x[:, c:end], a, (row0 + r) * groups, groups, col0 + c,
                                      b if exact_matmul else b_int))
            c = end
    return _total(parts, words.device)


def _batch_lanes(x: torch.Tensor, a: torch.Tensor, first: int, groups: int, c0: int,
                 b: torch.Tensor) -> list[torch.Tensor]:
    """Lanes (not yet reduced mod P) of int16 ``x`` [m, w] at word column ``c0`` of grid rows whose first group is
    A[first], one per part (see ``_device_words``); ``b`` float64 for the matmul, int64 for exact products."""
    m, w = x.shape
    q, off = divmod(c0, GROUP)
    head = min(GROUP - off, w) if off else 0
    k = (w - head) // GROUP

    def weights(q: int, count: int) -> torch.Tensor:  # A[first + r * groups + q + j], a view [m, count, LANES]
        return a.as_strided((m, count, LANES), (groups * LANES, LANES, 1), a.storage_offset() + (first + q) * LANES)

    out = []
    if head:
        out.append(_weigh(_dot(x[:, :head], b[off:off + head]), weights(q, 1)[:, 0]))
        q += 1
    if k:
        y = _dot(x[:, head:head + k * GROUP], b, whole_groups=True)
        out.append(_weigh(y.view(m, k, LANES), weights(q, k)))
        q += k
    if head + k * GROUP < w:
        out.append(_weigh(_dot(x[:, head + k * GROUP:], b[:w - head - k * GROUP]), weights(q, 1)[:, 0]))
    return out


def _dot(x: torch.Tensor, b: torch.Tensor, whole_groups: bool = False) -> torch.Tensor:
    """int64 inner products of int16 rows ``x`` [m, w] with ``b`` [w, LANES] (``whole_groups``: of each of its
    GROUP-word groups with ``b`` [GROUP, LANES]): a float64 matmul (every partial sum an integer below 2**53)
    when ``b`` is float64, else int64 products summed."""
    f = x.to(b.dtype, memory_format=torch.contiguous_format)
    if whole_groups:
        f = f.view(-1, GROUP)
    if b.dtype == torch.float64:
        return (f @ b).to(torch.int64)
    return (f[..., None] * b).sum(-2)


def _weigh(y: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Sum over groups of (y mod P) * A mod P: each term below 2**31, so sums of up to 2**32 of them fit int64."""
    return (y.remainder_(P) * a).remainder_(P).reshape(-1, LANES).sum(0)


def _total(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of lane tensors mod P, with as few ops as there are parts to add."""
    if not parts:
        return zero(device)
    total = parts[0] if len(parts) == 1 else torch.stack(parts).sum(0)
    return total.remainder(P)


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
    if not rows or not n:
        return zero(u8.device)
    groups = _groups(rb)
    lo, hi = 0, n
    parts = []
    if col0 % 2:  # a high byte without its low byte: 256 times its signed value
        parts.append(_words(u8[:, :1].view(torch.int8).to(torch.int16) * 256, row0, col0 // 2, groups))
        lo = 1
    if hi > lo and (col0 + n) % 2:  # a low byte without its high byte
        parts.append(_words(u8[:, hi - 1:hi].to(torch.int16), row0, (col0 + n) // 2, groups))
        hi -= 1
    if hi > lo:
        parts.append(_words(_as_words(u8[:, lo:hi]), row0, (col0 + lo) // 2, groups))
    return _sum_reduced(parts, u8.device)


def span(data: torch.Tensor, offset: int, rb: int, window: tuple[int, int] | None = None) -> torch.Tensor:
    """Digest lanes of flat uint8 ``data``: the tensor's bytes [offset, offset + len) on a grid of ``rb``-byte
    rows; with ``window`` (c0, c1), only those of its bytes whose column in their row is in [c0, c1)."""
    c0, c1 = window or (0, rb)
    parts = []
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
            parts.append(rect(block[:, a - col:b - col], row, a, rb))
        pos += count * width
    return _sum_reduced(parts, data.device)


def _sum_reduced(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum mod P of lane tensors each in [0, P): one of them as it is."""
    return parts[0] if len(parts) == 1 else _total(parts, device)


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
