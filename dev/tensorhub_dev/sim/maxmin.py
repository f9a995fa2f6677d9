"""Max-min fair rates by progressive filling: the flow-level model of how TCP/RDMA flows share links.

All flows grow at the same speed; when a link fills, its flows freeze at their current rate; the rest
keep growing. Equivalent and faster: repeatedly take the link with the smallest fair share
(remaining capacity / unfrozen flows), freeze its flows at that share, charge them to their other links.
Shares popped this way never decrease, so a heap with lazy invalidation finds each bottleneck in
O(log L): about O(sum of path lengths * log L) per call.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping, Sequence

from tensorhub_verl.errors import ConfigError

Link = Hashable


def max_min_rates(paths: Mapping[int, Sequence[Link]], capacity: Mapping[Link, float]) -> dict[int, float]:
    """Rate of every flow (same unit as `capacity`). Every flow needs a non-empty path of known links."""
    on_link: dict[Link, list[int]] = {}
    for fid, path in paths.items():
        if not path:
            raise ConfigError(f"flow {fid} has an empty path: give same-node transfers a local link")
        for link in path:
            on_link.setdefault(link, []).append(fid)
    remaining: dict[Link, float] = {}
    count: dict[Link, int] = {}
    stamp: dict[Link, int] = {}
    heap: list[tuple[float, int, int, Link]] = []
    order = {}
    for i, (link, fids) in enumerate(on_link.items()):
        try:
            cap = float(capacity[link])
        except KeyError:
            raise ConfigError(f"link {link!r} has no capacity") from None
        if not cap > 0:
            raise ConfigError(f"link {link!r} capacity must be > 0, got {cap}")
        remaining[link], count[link], stamp[link], order[link] = cap, len(fids), 0, i
        # (share, stamp, insertion order, link): the order breaks ties without comparing link ids.
        heap.append((cap / len(fids), 0, i, link))
    heapq.heapify(heap)
    rates: dict[int, float] = {}
    while heap:
        share, st, _, link = heapq.heappop(heap)
        if st != stamp[link] or count[link] == 0:
            continue  # stale entry: this link's share changed since it was pushed
        for fid in on_link[link]:
            if fid in rates:
                continue
            rates[fid] = share
            for other in paths[fid]:
                if other == link:
                    continue
                remaining[other] -= share
                count[other] -= 1
                stamp[other] += 1
                if count[other] > 0:
                    heapq.heappush(heap, (max(remaining[other], 0.0) / count[other], stamp[other], order[other],
                                          other))
        count[link] = 0
    return rates
