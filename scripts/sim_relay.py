"""Issue 21 item 5, session 13: scatter + relay (reads served when the bytes land) on the lab's workload.

    PYTHONPATH=.:dev python scripts/sim_relay.py

The origin (the trainer) serves each chunk once, to one relay reader, round robin over the readers of the
datacenter (cross-dc: the WAN's one copy per datacenter); every other reader posts its read of that chunk to
the relay ahead of time and the relay serves it when the bytes land (`serve_s` later: the data plane waking).
The hub's control lag L enters only where the hub books: the first lease (L after the start) and, unless
the origin's reads are all posted ahead, the next origin read L after a landing (the relay reports it, the hub
leases the next). Beside main's planner on the same simulator (`calibrate.simulate_lab`, L = `report_lag_s`),
prints total stall (s, summed over the 8 rollouts) at L = 0, 0.1, 0.2 s; JSON last.
"""

import json

from tensorhub_dev.sim import calibrate as C
from tensorhub_dev.sim.engine import FlowSim
from tensorhub_dev.sim.swarm import Swarm

LAGS = (0.0, 0.1, 0.2)


def relay(mode, lag, origin_inflight=1, serve_s=0.005, chunk_mb=2.0, nchunks=None, relay_slots=None,
          origin_first=False, origin_posted=False):
    """One fetch of the lab version by 8 rollouts under scatter + relay, on the flow simulator (links shared
    max-min fair, as TCP shares a NIC); returns (total stall, per-reader seconds).

    relay_slots None: a relay serves every posted read of a chunk the moment it lands; k: a relay serves at
    most k reads at once, oldest chunk first, the reader with most chunks missing first. origin_first: a
    reader takes no relay read while its own origin read is in flight (the origin's bytes keep its NIC).
    origin_posted: every origin read is leased at the start and the origin serves them `origin_inflight` at a
    time with no hub round trip between them (L then enters only once, at the first exchange)."""
    w = C.LabWorkload(chunk_mb=chunk_mb)
    n = nchunks or w.nchunks
    cb = w.size_mb * C.MIB / n
    cluster, hosts = C.lab_cluster(w, mode)
    sim = FlowSim(cluster)
    sw = Swarm(sim, n, cb)
    sw.add_holder("trainer", "trainer")
    names = [f"r{i}" for i in range(w.rollouts)]
    for nm, h in zip(names, hosts):
        sw.add_reader(nm, h)
    relay_of = {c: names[c % len(names)] for c in range(n)}
    queue = list(range(n))
    state = {"origin": 0}
    held = {nm: [] for nm in names}  # landed chunks whose posted reads the relay still owes
    busy = {nm: 0 for nm in names}

    def origin():
        while state["origin"] < origin_inflight and queue:
            c = queue.pop(0)
            state["origin"] += 1
            sw.read(sw.members[relay_of[c]], c, "trainer")

    def serve(rel):
        cap = relay_slots or n * len(names)
        for c in list(held[rel]):
            lacking = [m for m in sw.readers() if c not in m.have and c not in m.inflight]
            if not lacking:
                held[rel].remove(c)
            waiting = sorted((m for m in lacking if not (origin_first and "trainer" in m.inflight.values())),
                             key=lambda m: len(m.have))
            for m in waiting:
                if busy[rel] >= cap:
                    return
                sw.read(m, c, rel)
                busy[rel] += 1

    def landed(reader, c, src):
        if src == "trainer":
            state["origin"] -= 1
            sim.at(sim.now + (0.0 if origin_posted else lag), origin)
            held[reader.name].append(c)
            for rel in names:  # this reader may take relay reads again (origin_first), and c is served
                sim.at(sim.now + serve_s, lambda rel=rel: serve(rel))
        else:
            busy[src] -= 1
            serve(src)

    sw.on_landed.append(landed)
    sim.at(lag, origin)  # the first exchange: the hub hands out the relays and the first origin lease
    sim.run(until=sw.all_done)
    secs = [sw.members[nm].done_at for nm in names]
    return round(sum(secs), 2), [round(s, 3) for s in secs]


def scheduled(mode, lag, serve_s=0.005):
    """The slotted best case's schedule run on the flow simulator: each reader reads its relay chunks one at
    a time in the slotted order (posted to the relay when the previous lands, served when the chunk lands
    there); the origin serves its reads one at a time, all posted ahead (no hub lag between them)."""
    order = []
    slotted(mode, 0.0, schedule_out=order)
    w = C.LabWorkload()
    cluster, hosts = C.lab_cluster(w, mode)
    sim = FlowSim(cluster)
    sw = Swarm(sim, w.nchunks, w.chunk_bytes)
    sw.add_holder("trainer", "trainer")
    names = [f"r{i}" for i in range(w.rollouts)]
    for nm, h in zip(names, hosts):
        sw.add_reader(nm, h)
    relay_of = {c: names[c % len(names)] for c in range(w.nchunks)}
    nxt = {nm: 0 for nm in names}
    waiting = {}  # chunk -> readers whose posted read waits for it to land at its relay

    def post(i):
        nm = names[i]
        if nxt[nm] < len(order[i]):
            c = order[i][nxt[nm]]
            nxt[nm] += 1
            if c in sw.members[relay_of[c]].have:
                sw.read(sw.members[nm], c, relay_of[c])
            else:
                waiting.setdefault(c, []).append(nm)

    def origin(c):
        if c < w.nchunks:
            sw.read(sw.members[relay_of[c]], c, "trainer")

    def landed(reader, c, src):
        if src == "trainer":
            origin(c + 1)
            for nm in waiting.pop(c, ()):
                sim.at(sim.now + serve_s, lambda nm=nm: sw.read(sw.members[nm], c, reader.name))
        else:
            post(names.index(reader.name))

    sw.on_landed.append(landed)
    sim.at(lag, lambda: (origin(0), [post(i) for i in range(len(names))]))
    sim.run(until=sw.all_done)
    return round(sum(sw.members[nm].done_at for nm in names), 2)


def ceiling(mode, chunk_mb=2.0):
    """The per-reader floor: every byte once through the reader's NIC (and the WAN once, cross-dc), summed."""
    w = C.LabWorkload(chunk_mb=chunk_mb)
    nic = w.size_mb * C.MIB / (w.nic_mbit * C.MBIT)
    wan = w.size_mb * C.MIB / (w.wan_mbit * C.MBIT)
    return round(w.rollouts * (wan if mode == "cross_dc" else nic), 2)


VARIANTS = {
    "flow model, origin 1 read at a time, relay serves all at once": dict(origin_inflight=1),
    "flow model, origin 2 at a time, relay serves all at once": dict(origin_inflight=2),
    "flow model, origin 3 at a time, relay serves all at once": dict(origin_inflight=3),
    "flow model, origin 2 at a time, relay serves 1 read at a time": dict(origin_inflight=2, relay_slots=1),
    "flow model, origin 2 at a time, relay serves 2 reads at a time": dict(origin_inflight=2, relay_slots=2),
    "flow model, origin 3 at a time, relay serves 2 reads at a time": dict(origin_inflight=3, relay_slots=2),
    "flow model, origin 2 at a time, relay serves 2 at a time, 1 MiB chunks": dict(
        origin_inflight=2, relay_slots=2, chunk_mb=1.0),
    "flow model, origin 2 at a time, all at once, no relay read during a reader's origin read": dict(
        origin_inflight=2, origin_first=True),
    "flow model, origin 3 at a time, all at once, no relay read during a reader's origin read": dict(
        origin_inflight=3, origin_first=True),
    "flow model, origin 3 at a time, 2 at a time, no relay read during a reader's origin read": dict(
        origin_inflight=3, relay_slots=2, origin_first=True),
    "flow model, origin reads posted ahead, 2 at a time, no relay read during a reader's origin read": dict(
        origin_inflight=2, origin_first=True, origin_posted=True),
    "flow model, origin reads posted ahead, 3 at a time, no relay read during a reader's origin read": dict(
        origin_inflight=3, origin_first=True, origin_posted=True),
    "flow model, origin reads posted ahead, 4 at a time, no relay read during a reader's origin read": dict(
        origin_inflight=4, origin_first=True, origin_posted=True),
}


def slotted(mode, lag, nchunks=32, readers=8, origin_helps=False, schedule_out=None):
    """The depth-one relay's best case, in slots of one chunk time on a NIC (no link sharing): each slot the
    origin sends the next chunk to its relay (cross-dc: one chunk per 2 slots, the WAN's rate), every relay
    sends one landed chunk to one reader that lacks it, every reader takes at most one chunk (the relay taking
    the origin's chunk takes nothing else). Relay->reader pairs are matched greedily, oldest chunk first, the
    reader with most chunks missing first. `origin_helps`: once the origin has sent every chunk it serves any
    chunk to any reader too (one per slot). Returns (total stall in s, summed over readers; each reader's
    last slot)."""
    w = C.LabWorkload()
    c = w.chunk_bytes / (w.nic_mbit * C.MBIT) * (w.nchunks / nchunks)
    per = 2 if mode == "cross_dc" else 1
    have = [set() for _ in range(readers)]
    order = [[] for _ in range(readers)]  # the relay reads each reader got, in slot order
    landed_at = {}
    done = [None] * readers
    s = 0
    while any(d is None for d in done):
        busy_in = set()
        # the origin's chunk in flight during slot s: chunk s // per, landing at the end of its last slot
        k = s // per
        if k < nchunks:
            busy_in.add(k % readers)
            if s % per == per - 1:
                landed_at[k] = s + 1
        pairs = []
        free_in = [q for q in range(readers) if q not in busy_in and done[q] is None]
        used_relay, used_reader = set(), set()
        for ch in sorted(x for x, t in landed_at.items() if t <= s):
            rel = ch % readers
            if rel in used_relay:
                continue
            cands = [q for q in free_in if q not in used_reader and q != rel and ch not in have[q]]
            if cands:
                q = max(cands, key=lambda q: (nchunks - len(have[q]), -q))
                pairs.append((ch, q))
                used_relay.add(rel)
                used_reader.add(q)
        if origin_helps and not busy_in and len(landed_at) == nchunks:
            need = [(len(have[q]), q, ch) for q in free_in if q not in used_reader
                    for ch in range(nchunks) if ch not in have[q]]
            if need:
                _, q, ch = min(need)
                pairs.append((ch, q))
        for ch, q in pairs:
            have[q].add(ch)
            order[q].append(ch)
        for k2, t in landed_at.items():
            if t == s + 1:
                have[k2 % readers].add(k2)
        s += 1
        for q in range(readers):
            if done[q] is None and len(have[q]) == nchunks:
                done[q] = s
    if schedule_out is not None:
        schedule_out.extend(order)
    return round(sum(lag + d * c for d in done), 2), done


if __name__ == "__main__":
    rows = {}
    main = [C.simulate_lab(C.LabWorkload(), ("standalone", "cross_dc"), report_lag_s=lag) for lag in LAGS]
    for mode in ("standalone", "cross_dc"):
        for strat in ("pull_from_trainer", "tensorhub"):
            key = f"{mode} | main: {strat}"
            rows[key] = [round(m[mode][strat]["total_s"], 2) for m in main]
            print(f"{key}: {rows[key]}")
        print(f"{mode}: byte floor (every byte once through each reader's NIC / the WAN) {ceiling(mode)} s")
        for name, kw in VARIANTS.items():
            key = f"{mode} | {name}"
            res = [relay(mode, lag, **kw) for lag in LAGS]
            rows[key] = [r[0] for r in res]
            print(f"{key}: {rows[key]}   per reader at L=0.1: {res[1][1]}")
    for mode in ("standalone", "cross_dc"):
        for helps in (False, True):
            tail = ", origin helps at the tail" if helps else ""
            key = f"{mode} | slotted best case (no link sharing){tail}"
            rows[key] = [slotted(mode, lag, origin_helps=helps)[0] for lag in LAGS]
            print(f"{key}: {rows[key]}")
        key = f"{mode} | slotted best case, 1 MiB chunks"
        rows[key] = [slotted(mode, lag, nchunks=64)[0] for lag in LAGS]
        print(f"{key}: {rows[key]}")
        key = f"{mode} | flow model running the slotted schedule (origin posted, 1 relay read per reader)"
        rows[key] = [scheduled(mode, lag) for lag in LAGS]
        print(f"{key}: {rows[key]}")
    print(json.dumps({"lags_s": LAGS, "total_s": rows}))
