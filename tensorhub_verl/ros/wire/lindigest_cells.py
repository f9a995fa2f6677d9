"""Many digests of one run of bytes in one pass: the cells of a grid cut into row bands and column windows.

A tensor's block digests (``integrity.block_digests``) are, per chunk segment, the digests of its blocks along
dim 0 and dim 1. On the grid (``lindigest``) a dim-0 block is a band of whole rows, or, on a grid of one row, a
window of its columns; a dim-1 block is a window of columns of every row. So one call here gives both: the lanes
of each cell (band, window), from which a dim-0 block is a band's sum over windows and a dim-1 block a window's
sum over bands.

One pass over the bytes, in few ops whatever the number of cells, the same on the host (numpy int64, on the
calling thread) and on a device (torch; float64 matmuls whose every partial sum is an integer below 2**53, or
int64 products where the device's self-check found its matmul inexact):

- the words of a rect of whole words in whole weight groups go through one [rows * k, GROUP] matmul, and each
  (row, group) sum is credited to the window of the group's first word;
- the rest of the words (a group the rect starts or ends inside) and the pieces of groups that a window cut
  splits are "runs" (at most GROUP words of one group, the same columns in every row), all gathered into one
  [rows, runs, longest run] block and multiplied with their masked B in one batched product; a piece of a
  group that the matmul already credited to the group's first window is moved: added to its own window and
  taken from the first;
- a byte without its word (a rect's odd edges, and the high byte of a word that an odd window cut splits) counts
  as its share of the word, as in ``lindigest.rect``: a lone byte is credited to its window, a split high byte
  moved from the low byte's window to its own.

Every (row, group) or (row, run) sum is weighted by its group's A and added into its cell with one scatter-add;
only the final lanes come to the host. Tests pin every cell to ``lindigest.reference``.
"""

from __future__ import annotations

import bisect
import functools
import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from tensorhub_verl.ros.wire import lindigest
from tensorhub_verl.ros.wire.lindigest import GROUP, LANES, P

__all__ = ["cells", "device_cells", "host_cells"]
logger = logging.getLogger("tensorhub_verl.ros.wire.lindigest_cells")
_EXACT: dict[torch.device, bool] = {}
"""Per device: whether its batched float64 products passed ``_check_products``."""


def cells(data: torch.Tensor, offset: int, rb: int, cuts: Sequence[int] = (),
          band_rows: int | None = None) -> torch.Tensor:
    """Digest lanes of flat uint8 ``data``, the bytes [offset, offset + len) of a tensor on a grid of ``rb``-byte
    rows, per cell: [bands, windows, LANES] int64 in [0, P), on ``data``'s device. Windows: the row's columns cut
    at the byte columns ``cuts`` (sorted, each in (0, rb)); bands: ``band_rows`` rows each (None: one band),
    counted from the band that holds byte ``offset``. The cells of all its bands and windows sum to
    ``lindigest.span(data, offset, rb)``."""
    cuts = tuple(int(c) for c in cuts)
    if any(not 0 < c < rb for c in cuts) or list(cuts) != sorted(set(cuts)):
        raise ValueError(f"window cuts must be distinct, sorted and inside a row of {rb} bytes, got {cuts}")
    if band_rows is not None and band_rows < 1:
        raise ValueError(f"band_rows must be a positive number of rows or None, got {band_rows}")
    if data.device.type == "cpu" and lindigest.HOST_NUMPY:
        return host_cells(data, offset, rb, cuts, band_rows)
    return device_cells(data, offset, rb, cuts, band_rows)


def host_cells(data: torch.Tensor, offset: int, rb: int, cuts: tuple[int, ...],
               band_rows: int | None) -> torch.Tensor:
    """``cells`` of host bytes in numpy int64 on the calling thread (arguments already checked)."""
    return _Pass(data, offset, rb, cuts, band_rows, host=True).run()


def device_cells(data: torch.Tensor, offset: int, rb: int, cuts: tuple[int, ...], band_rows: int | None,
                 exact_matmul: bool | None = None) -> torch.Tensor:
    """``cells`` with torch ops on ``data``'s device (arguments already checked); ``exact_matmul`` None: the
    device's self-check decides between float64 products and int64 ones."""
    return _Pass(data, offset, rb, cuts, band_rows, host=False, exact_matmul=exact_matmul).run()


def _products_are_exact(device: torch.device) -> bool:
    """Whether cells on ``device`` may use float64 products: its matmul passed ``lindigest``'s self-check and its
    batched products this module's; otherwise int64 products (exact, slower), with a warning."""
    if not lindigest._matmul_is_exact(device):
        return False
    known = _EXACT.get(device)
    if known is None:
        known = _check_products(device)
        if not known:
            logger.warning("batched float64 products on %s are not exact: its block digests use int64 products "
                           "instead (exact, slower)", device)
        _EXACT[device] = known
    return known


def _check_products(device: torch.device) -> bool:
    """Whether ``device``'s float64 products give the host's cells on the self-check's words (``lindigest``), cut
    into windows inside groups and inside words, in bands of two rows."""
    raw = torch.from_numpy(lindigest._CHECK_WORDS).view(torch.uint8).reshape(-1)
    layout = (13, 2 * GROUP + 6, (7, GROUP + 3, 2 * GROUP + 1), 2)  # offset, row bytes, window cuts, band rows
    want = host_cells(raw, *layout)
    return torch.equal(want, device_cells(raw.to(device), *layout, exact_matmul=True).cpu())


@dataclass(frozen=True, slots=True, eq=False)
class _Plan:
    """What to compute of a rect of ``width`` bytes at byte column ``col`` of every row (the same for each row):
    made on the host once per shape, from the grid geometry alone.

    Sources (one lane pair per row each): ``k`` whole groups by matmul, then ``runs``, then ``lone`` bytes.
    Entries: (source, window, sign) credited into the cells; ``group`` of each source, for its A."""

    lo: int
    """First byte (from the rect's start) of its whole words, and how many words follow."""
    words: int
    head: int
    """Words before the first whole group (its matmul starts there), and the number of whole groups."""
    k: int
    run_index: np.ndarray
    """[runs, longest] word indices into the rect's whole words (a run's tail repeats its last index)."""
    run_b: np.ndarray
    """[runs, longest, LANES] int64: B of each run word, 0 past the run's end."""
    lone_cols: np.ndarray
    """Byte indices (from the rect's start) of the lone bytes: the high ones, then the low ones."""
    lone_high: int
    lone_b: np.ndarray
    """[lone, LANES] int64: B of each lone byte's word."""
    group: np.ndarray
    """Per source: its weight group in the row."""
    source: np.ndarray
    window: np.ndarray
    sign: np.ndarray
    moves: bool
    """Whether any entry takes a source a second time (a piece or byte moved between windows)."""
    on_device: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def row_cost(self) -> int:
        """Temporaries per row, in words: the whole words, the gathered runs, and the entries' lane pairs."""
        return self.words + self.run_index.size + 4 * (len(self.group) + len(self.source))


@functools.lru_cache(maxsize=256)
def _plan(col: int, width: int, rb: int, cuts: tuple[int, ...]) -> _Plan:
    """The plan of a rect of ``width`` bytes at byte column ``col`` of a grid of ``rb``-byte rows cut at ``cuts``."""
    b = lindigest._TABLES.host(1)[1]
    win = functools.partial(bisect.bisect_right, cuts)  # the window of a byte column
    lo, hi = col, col + width
    lone: list[tuple[int, bool, int, int]] = []  # (byte column, high, window, window it is moved from or -1)
    if lo % 2:
        lone.append((lo, True, win(lo), -1))
        lo += 1
    if hi > lo and hi % 2:
        lone.append((hi - 1, False, win(hi - 1), -1))
        hi -= 1
    for c in cuts:  # a word split by a cut counts in its low byte's window: its high byte is moved to its own
        if c % 2 and lo < c < hi:
            lone.append((c, True, win(c), win(c - 1)))
    lone.sort(key=lambda x: not x[1])  # high bytes first: they take their signed value times 256
    w0, nw = lo // 2, max(0, (hi - lo) // 2)
    head = min(-(-w0 // GROUP) * GROUP, w0 + nw) - w0
    k = (nw - head) // GROUP
    word_cuts = sorted({-(-c // 2) for c in cuts if w0 < -(-c // 2) < w0 + nw})

    def pieces(start: int, end: int) -> list[tuple[int, int]]:
        edges = [start] + [u for u in word_cuts if start < u < end] + [end]
        return [(x, y) for x, y in zip(edges, edges[1:]) if y > x]

    runs: list[tuple[int, int, int, int]] = []  # (first word, end word, window, window it is moved from or -1)
    for start, end in ((w0, w0 + head), (w0 + head + k * GROUP, w0 + nw)):  # partial groups, in their pieces
        runs.extend((x, y, win(2 * x), -1) for x, y in pieces(start, end))
    for q in range(k):  # pieces of whole groups that a cut splits: moved from the group's first window
        g0 = w0 + head + q * GROUP
        runs.extend((x, y, win(2 * x), win(2 * g0)) for x, y in pieces(g0, g0 + GROUP)[1:])
    longest = max((y - x for x, y, _, _ in runs), default=0)
    run_index = np.zeros((len(runs), longest), dtype=np.int64)
    run_b = np.zeros((len(runs), longest, LANES), dtype=np.int64)
    for i, (x, y, _, _) in enumerate(runs):
        run_index[i] = np.minimum(np.arange(x, x + longest), y - 1) - w0
        run_b[i, :y - x] = b[x % GROUP:x % GROUP + y - x]
    whole = [w0 + head + q * GROUP for q in range(k)]
    group = [g // GROUP for g in whole] + [x // GROUP for x, _, _, _ in runs] + [c // 2 // GROUP for c, *_ in lone]
    credits = [(win(2 * g), -1) for g in whole] + [(w, base) for _, _, w, base in runs] + \
        [(w, base) for _, _, w, base in lone]
    entries = [(i, w, 1) for i, (w, _) in enumerate(credits)] + \
        [(i, base, -1) for i, (_, base) in enumerate(credits) if base >= 0]
    return _Plan(lo=lo - col, words=nw, head=head, k=k, run_index=run_index, run_b=run_b,
                 lone_cols=np.array([c - col for c, *_ in lone], dtype=np.int64),
                 lone_high=sum(1 for x in lone if x[1]),
                 lone_b=np.array([b[c // 2 % GROUP] for c, *_ in lone], dtype=np.int64).reshape(-1, LANES),
                 group=np.array(group, dtype=np.int64), source=np.array([e[0] for e in entries], dtype=np.int64),
                 window=np.array([e[1] for e in entries], dtype=np.int64),
                 sign=np.array([e[2] for e in entries], dtype=np.int64), moves=len(entries) > len(credits))


class _Pass:
    """One call of ``cells``: the rects of its bytes (a partial first row, whole rows, a partial last row, as in
    ``lindigest.span``; a row longer than a batch in runs of columns), a batch of rows of each at a time."""

    def __init__(self, data: torch.Tensor, offset: int, rb: int, cuts: tuple[int, ...], band_rows: int | None,
                 host: bool, exact_matmul: bool | None = None):
        self.data, self.offset, self.rb, self.cuts, self.host = data.detach(), offset, rb, cuts, host
        self.windows = len(cuts) + 1
        self.band = band_rows or (1 << 62)
        n = data.numel()
        self.first_band = offset // rb // self.band
        self.bands = (offset + max(n, 1) - 1) // rb // self.band - self.first_band + 1
        self.groups = lindigest._groups(rb)
        top = ((offset + n - 1) // rb + 1) * self.groups if n else 1
        if host:
            self.a, _ = lindigest._TABLES.host(top)
            self.out = np.zeros((self.bands * self.windows, LANES), dtype=np.int64)
        else:
            self.exact = _products_are_exact(data.device) if exact_matmul is None else exact_matmul
            self.a, b, b_int = lindigest._TABLES.get_exact(data.device, top)
            self.b = b if self.exact else b_int
            self.out = torch.zeros(self.bands * self.windows, LANES, dtype=torch.int64, device=data.device)

    def run(self) -> torch.Tensor:
        n, rb = self.data.numel(), self.rb
        cap = lindigest.DEVICE_BATCH_WORDS if not self.host else lindigest._BATCH_WORDS
        cap = cap if self.host or self.exact else max(GROUP, cap // 4)
        pos = 0
        while pos < n:
            row, col = divmod(self.offset + pos, rb)
            count, width = ((n - pos) // rb, rb) if col == 0 and n - pos >= rb else (1, min(rb - col, n - pos))
            block = self.data[pos:pos + count * width].view(count, width)
            for c in range(0, width, 2 * cap):  # a row longer than a batch: runs of columns
                piece = block[:, c:c + 2 * cap]
                plan = _plan(col + c, piece.shape[1], rb, self.cuts)
                step = max(1, cap // max(1, plan.row_cost))
                for r in range(0, count, step):
                    self._rect(piece[r:r + step], row + r, plan)
            pos += count * width
        out = torch.from_numpy(self.out) if self.host else self.out
        return out.view(self.bands, self.windows, LANES)

    def _rect(self, u8: torch.Tensor, row0: int, plan: _Plan) -> None:
        if self.host:
            self._host_rect(u8, row0, plan)
        else:
            self._device_rect(u8, row0, plan)

    def _host_rect(self, u8: torch.Tensor, row0: int, plan: _Plan) -> None:
        m = u8.shape[0]
        b = lindigest._TABLES.host(1)[1]
        sources = []
        if plan.words:
            x = lindigest._as_words(u8[:, plan.lo:plan.lo + 2 * plan.words]).numpy().astype(np.int64)
            if plan.k:
                whole = x[:, plan.head:plan.head + plan.k * GROUP].reshape(m * plan.k, GROUP)
                sources.append((whole @ b).reshape(m, plan.k, LANES))
            if len(plan.run_index):
                runs = x[:, plan.run_index].transpose(1, 0, 2)  # [runs, m, longest]: one matmul per run
                sources.append(np.matmul(runs, plan.run_b).transpose(1, 0, 2))
        if len(plan.lone_cols):
            v = u8.numpy()[:, plan.lone_cols].astype(np.int64)
            v[:, :plan.lone_high] = np.where(v[:, :plan.lone_high] >= 128, v[:, :plan.lone_high] - 256,
                                             v[:, :plan.lone_high]) * 256
            sources.append(v[:, :, None] * plan.lone_b[None])
        raw = np.concatenate(sources, 1) % P
        rows = np.arange(row0, row0 + m, dtype=np.int64)
        weighted = raw * self.a[rows[:, None] * self.groups + plan.group[None]] % P
        if plan.moves:
            weighted = weighted[:, plan.source] * plan.sign[None, :, None]
        bands = rows // self.band
        starts = np.flatnonzero(np.diff(bands, prepend=-1))  # the batch's rows by band (contiguous)
        per_band = np.add.reduceat(weighted, starts, axis=0)  # each band's entries below 2**62
        ids = ((bands[starts] - self.first_band) * self.windows)[:, None] + plan.window[None]
        np.add.at(self.out, ids.reshape(-1), per_band.reshape(-1, LANES))
        self.out %= P

    def _device_rect(self, u8: torch.Tensor, row0: int, plan: _Plan) -> None:
        m, dev = u8.shape[0], u8.device
        dt = self.b.dtype
        t = _device_arrays(plan, dev, dt)
        sources = []
        if plan.words:
            x = lindigest._as_words(u8[:, plan.lo:plan.lo + 2 * plan.words])
            x = x.to(dt, memory_format=torch.contiguous_format)
            if plan.k:
                whole = x[:, plan.head:plan.head + plan.k * GROUP].contiguous().view(m * plan.k, GROUP)
                y = whole @ self.b if dt == torch.float64 else (whole[..., None] * self.b).sum(1)
                sources.append(y.view(m, plan.k, LANES))
            if len(plan.run_index):
                g = x[:, t["run_index"]]
                sources.append(torch.einsum("mrl,rlc->mrc", g, t["run_b"]) if dt == torch.float64 else
                               (g[..., None] * t["run_b"][None]).sum(2))
        if len(plan.lone_cols):
            v = u8[:, t["lone_cols"]]
            h = plan.lone_high
            values = torch.cat([v[:, :h].view(torch.int8).to(dt) * 256, v[:, h:].to(dt)], 1)
            sources.append(values[:, :, None] * t["lone_b"][None])
        raw = (sources[0] if len(sources) == 1 else torch.cat(sources, 1)).to(torch.int64).remainder_(P)
        rows = torch.arange(row0, row0 + m, device=dev)
        weighted = (raw * self.a[rows[:, None] * self.groups + t["group"][None]]).remainder_(P)
        if plan.moves:
            weighted = weighted[:, t["source"]] * t["sign"][None, :, None]
        ids = ((rows // self.band - self.first_band) * self.windows)[:, None] + t["window"][None]
        self.out.index_add_(0, ids.reshape(-1), weighted.reshape(-1, LANES))
        self.out.remainder_(P)


def _device_arrays(plan: _Plan, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The plan's arrays on ``device`` (B tables in ``dtype``), copied there once per plan and device; a copy to
    a GPU goes from pinned memory without waiting for the device."""
    key = (device, dtype)
    got = plan.on_device.get(key)
    if got is None:
        arrays = {"run_index": plan.run_index, "group": plan.group, "source": plan.source, "window": plan.window,
                  "sign": plan.sign, "lone_cols": plan.lone_cols}
        got = {name: _upload(torch.from_numpy(a), device) for name, a in arrays.items()}
        got["run_b"] = _upload(torch.from_numpy(plan.run_b).to(dtype), device)
        got["lone_b"] = _upload(torch.from_numpy(plan.lone_b).to(dtype), device)
        plan.on_device[key] = got
    return got


def _upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
