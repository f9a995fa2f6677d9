"""TensorHub in the simulator: the hub's own parts plan every read, on simulated time.

The planner is the hub's (`tensorhub_verl.ros.hub.planner`: `reader_request` builds the request, `plan_chunks`
picks the sources), and the leases are booked in the hub's own lease book (`ros.hub.lease_book.LeaseBook`), which
answers the planner's questions as it does in the hub: reads in flight per source, the chunks pulled now per
place, the chunks crossing the WAN into each datacenter. What is the simulator's own is only what the hub learns
from the wire: holders are the complete members plus the members holding part of the version (readers still
filling, and a sharded trainer's ranks, each with its shard's chunks), and the first `seeds_per_dc` readers of a
datacenter to ask become its seeds (the only ones that may cross the WAN).

Readers keep `window` reads in flight (the client's FetchSettings.window). A reader whose plan came back
short re-plans after every event, as a hub waiter wakes on every change: plan passes run once per event,
after all of that event's completions are booked.

A seed posts `wan_posted` WAN reads at once and queues the rest of its WAN assignments (the client's
ClientConfig.wan_reads_posted): the next starts the moment one lands.

`report_lag_s` models the real client's hub round trip: a landed chunk is booked (its lease ends, the
reader's window slot frees, peers may read it from the reader) only that long after it landed.

With `hub` (`HubCosts`) the hub is a modeled resource instead (`sim.hub.HubQueue`): a reader's begin,
exchanges and end queue at the hub, each books the chunks that landed since the reader's last request (so a
landed chunk holds its window slot, and is hidden from peers, until then), plans, and costs the hub its
service time; the reader starts the planned reads only once the answer is back. One simulated chunk stands for
many real leases (`HubCosts.leases_for`): the exchange that plans it grants the first `leases_per_exchange`,
and the reader asks for the rest one exchange after another while the bytes move; the chunk lands when both
its bytes and the answer to its last exchange are there. Those further exchanges go beside the reader's
own (the fetcher sends one at a time, for all its reads): the hub's work is the same, the queue sees a few
more requests at once. A free hub (every cost 0) reproduces the figures without it.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.hub.lease_book import Lease, LeaseBook
from tensorhub_verl.ros.hub.planner import (
    Assignment,
    HolderView,
    PlannerConfig,
    SwarmView,
    plan_chunks,
    reader_request,
)
from tensorhub_verl.ros.wire.topology import Distance
from tensorhub_dev.sim.hub import HubQueue, HubRequest
from tensorhub_dev.sim.hub_costs import HubCosts
from tensorhub_dev.sim.swarm import Member, Swarm

log = logging.getLogger("tensorhub_dev.sim")

_KEY = ("model", 1, "hf")
"""The one version a run reads (the lease book's key)."""


class TensorHub:
    def __init__(self, swarm: Swarm, config: PlannerConfig | None = None, window: int = 8,
                 report_lag_s: float = 0.0, fair_share: bool = True, wan_posted: int = 1,
                 hub: HubCosts | None = None):
        if hub is not None and report_lag_s > 0:
            raise ConfigError("report_lag_s and a modeled hub both delay bookings: give one of them")
        self.swarm = swarm
        self.fair_share = fair_share
        """Mirror the hub's per-reader share of a source's slots (HubState._plan)."""
        self.report_lag_s = report_lag_s
        self.unreported: Counter[str] = Counter()
        """reader -> chunks landed but not yet booked with the hub (they still use a window slot)."""
        self._hidden: dict[str, set[int]] = defaultdict(set)
        self.config = config or PlannerConfig()
        self.window = window
        self.seeds: dict[str, list[str]] = defaultdict(list)
        self.book = LeaseBook()
        """The leases in flight, booked as the hub books them."""
        self._lease_of: dict[tuple[str, int], int] = {}
        self._leases_issued = 0
        """(reader, chunk) -> its lease's id in ``book``."""
        self.wan_posted = wan_posted
        self._wan_active: Counter[str] = Counter()
        self._wan_queue: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self._frozen: dict[str, frozenset[int]] = {}
        self._pending = False
        self.plan_calls = 0
        self.hub = hub
        self.hub_queue = HubQueue(swarm.sim, hub.cores, hub.free) if hub is not None else None
        self._leases_per_chunk = hub.leases_for(swarm.chunk_bytes) if hub is not None else 1
        self._reports: dict[str, list[tuple[int, str]]] = defaultdict(list)
        """reader -> (chunk, source) landed since its last request to the hub."""
        self._asking: set[str] = set()
        """Readers with a begin, exchange or end at the hub (one at a time, as the fetcher)."""
        self._begun: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self.empty_exchanges = 0
        """Exchanges that neither reported nor got anything: a waiting reader's re-plans."""
        swarm.on_landed.append(self._landed)

    def join(self, name: str, node: str) -> None:
        self.swarm.add_reader(name, node)
        self._schedule()

    # ---- bookkeeping of leases, as the hub keeps them -----------------------------------------
    def _is_wan(self, reader: Member, chunk: int) -> bool:
        lease = self.book.get(self._lease_of.get((reader.name, chunk), -1))
        return lease is not None and lease.distance == Distance.WAN

    def _landed(self, reader: Member, chunk: int, source: str) -> None:
        if self._is_wan(reader, chunk):
            self._wan_active[reader.name] -= 1
            if self._wan_queue[reader.name]:
                self._start_wan(reader, *self._wan_queue[reader.name].pop(0))
        if self.hub is not None or self.report_lag_s > 0:
            self.unreported[reader.name] += 1
            self._hidden[reader.name].add(chunk)
        if self.hub is not None:
            self._reports[reader.name].append((chunk, source))
            self._schedule()
        elif self.report_lag_s > 0:
            self.swarm.sim.at(self.swarm.sim.now + self.report_lag_s, lambda: self._book(reader, chunk, source))
        else:
            self._book(reader, chunk, source)

    def _book(self, reader: Member, chunk: int, source: str, replan: bool = True) -> None:
        if chunk in self._hidden[reader.name]:
            self.unreported[reader.name] -= 1
            self._hidden[reader.name].discard(chunk)
        self.book.pop(self._lease_of.pop((reader.name, chunk)))
        self._frozen.pop(reader.name, None)
        if replan:
            self._schedule()

    def _schedule(self) -> None:
        # One plan pass per event: every completion of this instant is booked before anyone re-plans.
        if not self._pending:
            self._pending = True
            self.swarm.sim.at(self.swarm.sim.now, self._plan_pass)

    def _plan_pass(self) -> None:
        self._pending = False
        if self.hub_queue is not None:
            self._ask_pass()
            return
        for reader in self.swarm.readers():
            if reader.done_at is None and self._occupied(reader) < self.window:
                for a in self._plan_one(reader):
                    self._start(reader, a)

    # ---- the hub as a modeled resource ---------------------------------------------------------
    def _ask_pass(self) -> None:
        """Every reader with chunks to report, or room in its window, sends a request unless one is out."""
        now = self.swarm.sim.now
        for reader in self.swarm.readers():
            if reader.name in self._asking:
                continue
            wants = (reader.done_at is None and self._occupied(reader) < self.window
                     and now >= self._retry_at.get(reader.name, 0.0))
            if self._reports[reader.name] or wants:
                self._ask(reader)

    def _ask(self, reader: Member) -> None:
        name, hub = reader.name, self.hub
        reports, self._reports[name] = self._reports[name], []
        kind = "exchange" if name in self._begun else "begin"
        if reader.done_at is not None:
            kind = "end"
        self._begun.add(name)
        self._asking.add(name)
        granted: list[Assignment] = []
        room = 0

        def book() -> None:
            for chunk, source in reports:
                self._book(reader, chunk, source, replan=False)
            if reports and not hub.free:
                self._schedule()  # readers waiting at the hub re-plan on the change

        def serve() -> float:
            nonlocal room
            if kind == "end":
                return hub.end_s
            room = self.window - self._occupied(reader)
            if reader.done_at is None and room > 0:
                granted.extend(self._plan_one(reader))
            leases = len(granted) * min(hub.leases_per_exchange, self._leases_per_chunk)
            self.hub_queue.leases += leases
            if not granted and not reports:
                self.empty_exchanges += 1
            return hub.exchange_cost(leases, first=kind == "begin")

        def answer() -> None:
            self._asking.discard(name)
            for a in granted:
                self._start(reader, a)
            if hub.retry_s > 0 and reader.done_at is None and len(granted) < room:
                self._retry_at[name] = self.swarm.sim.now + hub.retry_s
                self.swarm.sim.at(self._retry_at[name], self._schedule)
            if self._reports[name]:
                self._schedule()

        self.hub_queue.submit(HubRequest(kind, serve, book, answer))

    def _ask_more(self, reader: Member, chunk: int, leases_left: int) -> None:
        """The next exchange of a read whose chunk stands for more leases than one exchange grants."""
        leases = min(leases_left, self.hub.leases_per_exchange)

        def serve() -> float:
            self.hub_queue.leases += leases
            return self.hub.exchange_cost(leases)

        def answer() -> None:
            if leases_left > leases:
                self._ask_more(reader, chunk, leases_left - leases)
            else:
                self.swarm.release(reader.name, chunk)

        self.hub_queue.submit(HubRequest("more", serve, answer=answer))

    def hub_report(self) -> dict | None:
        """The hub's figures for the run so far (None without a modeled hub)."""
        if self.hub_queue is None:
            return None
        return {**self.hub_queue.report(self.swarm.sim.now), "leases_per_chunk": self._leases_per_chunk,
                "run_chunks": self.hub.run_chunks, "empty_exchanges": self.empty_exchanges}

    def _occupied(self, reader: Member) -> int:
        """Window slots in use: reads in flight, WAN reads queued, landed chunks not yet booked."""
        return len(reader.inflight) + len(self._wan_queue[reader.name]) + self.unreported[reader.name]

    def _holder_views(self) -> list[HolderView]:
        views = []
        for m in self.swarm.members.values():
            if self.swarm.is_complete(m):
                chunks = None
            else:  # a reader still filling, or a trainer rank holding its shard (an active partial holder)
                chunks = self._frozen.get(m.name)
                if chunks is None:
                    chunks = self._frozen[m.name] = frozenset(m.have - self._hidden[m.name])
                if not chunks:
                    continue
            views.append(HolderView(m.name, m.location, chunks, self.book.reads_from(_KEY, m.name),
                                    int(self.swarm.served[m.name])))
        return views

    def _plan_one(self, reader: Member) -> list[Assignment]:
        dc = reader.location.dc
        queued = {c for c, _ in self._wan_queue[reader.name]}
        needed = [c for c in range(self.swarm.nchunks)
                  if c not in reader.have and c not in reader.inflight and c not in queued]
        room = self.window - self._occupied(reader)
        filling = sum(1 for r in self.swarm.readers() if r.done_at is None)
        own_wan = self._wan_active[reader.name] + len(self._wan_queue[reader.name])
        # Built (and the reader made a seed while there is room) before the early return, as the hub does.
        request, self.seeds[dc] = reader_request(reader.name, reader.location, needed, room, seeds=self.seeds[dc],
                                                 filling=filling, own_inflight=Counter(reader.inflight.values()),
                                                 own_wan_reads=own_wan, config=self.config,
                                                 fair_share=self.fair_share,
                                                 held=len(reader.have - self._hidden[reader.name]))
        if not needed:
            return []
        view = SwarmView(self._holder_views(), self.book.pulling(_KEY), self.book.wan_pulling(_KEY))
        self.plan_calls += 1
        plan = plan_chunks(request, view, self.config)
        for a in plan:  # the leases, booked as the hub books them (one chunk each: the simulator asks for no runs)
            lease = Lease(self._next_lease(), _KEY, reader.name,
                          reader.location, a.source, a.chunk, self.swarm.chunk_bytes, a.distance, float("inf"))
            self.book.add(lease)
            self._lease_of[(reader.name, a.chunk)] = lease.id
        return plan

    def _next_lease(self) -> int:
        self._leases_issued += 1
        return self._leases_issued

    def _start(self, reader: Member, a: Assignment) -> None:
        """The reader acts on an assignment: reads it, or queues it behind its WAN reads."""
        if a.distance == Distance.WAN and self._wan_active[reader.name] >= self.wan_posted:
            self._wan_queue[reader.name].append((a.chunk, a.source))
        elif a.distance == Distance.WAN:
            self._start_wan(reader, a.chunk, a.source)
        else:
            self._read(reader, a.chunk, a.source)

    def _start_wan(self, reader: Member, chunk: int, source: str) -> None:
        self._wan_active[reader.name] += 1
        self._read(reader, chunk, source)

    def _read(self, reader: Member, chunk: int, source: str) -> None:
        hub = self.hub
        more = 0 if hub is None or hub.free else self._leases_per_chunk - hub.leases_per_exchange
        if more > 0:
            self.swarm.read(reader, chunk, source, held=True)
            self._ask_more(reader, chunk, more)
        else:
            self.swarm.read(reader, chunk, source)
