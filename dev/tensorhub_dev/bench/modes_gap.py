"""Where `bench modes` loses time against the lab's ceiling: `python -m tensorhub_dev.bench.modes_gap modes.json`.

Reads the JSON of `tensorhub bench modes --out modes.json` (each TensorHub reader's chunk timeline and hub
exchanges) and prints, per mode, the ceiling of the lab's topology and where each reader's stall above it goes:

- ceiling: the least total stall that chunked store-and-forward allows. A chunk takes ``c`` on a NIC and ``w`` on
  the WAN (tbf counts each frame's headers: 1,514 bytes on the wire per 1,448 of payload; M chunks, as many as
  the readers' timelines show). Standalone: the
  trainer sends every chunk at least once, so the last distinct chunk leaves it at ``M c``; the
  reader that got it and the trainer spread it, the holders doubling every ``c``: readers finish at M c,
  (M + 1) c, (M + 1) c, (M + 2) c x 4, (M + 3) c for 8 readers. Cross-dc: the WAN carries one copy, its last
  chunk lands at ``M w`` at the seed, and spreads in dc1 by doubling: 1 reader at M w, then 1, 2, 4 more each
  ``c`` later. The ratio ceiling is the measured pull baseline's total over that.
- goal: whether the issue's goal (``GOALS``) is within the ceiling at this run's pull, and the pull total the goal
  would need at the ceiling and at the byte floor (every reader done when one copy has crossed the bottleneck: the
  trainer's NIC standalone, the WAN cross-dc; no doubling tail at all).
- per reader: when its first read was posted (``start``), the time with no read in flight before its last
  landing (``idle``), the time it waited for exchanges that granted nothing (``starved``), the mean hub round
  trip, and the bytes it read from the trainer, from complete peers and from partial peers.
- sources: how busy the trainer's NIC was while anyone still lacked a chunk (the share of time one of its reads
  was in flight) and, cross-dc, the seed's WAN: the landings' spacing, the WAN's achieved rate, and where its
  time went between the first post and the last landing (``lost_s``, beyond the bytes' wire time): waiting for a
  read to be posted (nothing queued when the previous chunk landed) and, net, landings later than their bytes'
  wire time after the previous landing or their post (request trips, a slow sender; a read that shared the link
  with the one before it lands early after it, a negative share); ``late_s`` is the last landing after the WAN's
  floor (``one_copy_s``), which every reader waits for.
- cross-dc gap: the stall above the ceiling split into the WAN's part (``late_s`` once per reader), the tail's part
  (the readers' time from the last WAN landing to their own last landing, beyond the ceiling's doubling tail) and
  the rest (readers that went late, returns after the last landing).
- spread: for each chunk, from its first landing in the readers' datacenter to its last.
- hops: for each read from a peer, where the time from the chunk landing at that peer to this reader posting
  its read went: the peer's wait to report it (its next exchange), that exchange's round trip (the hub books the
  landing on its way), this reader's wait to ask after the report was answered, and its own exchange's round
  trip. On the lab, an exchange of a reader whose NIC moves bulk data waits in that NIC's queue (tbf: one FIFO,
  up to 50 ms deep) each way.
- idle with work: per reader, the time it had no read in flight while a peer had held, for at least
  ``IDLE_LAG_S``, a chunk it still lacked (a read it could have made, had the hub known and planned it).

Times are on the machine's monotonic clock (every lab host shares it), relative to the earliest reader's go.
Prints one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

MIB = 1 << 20
IDLE_LAG_S = 0.1
"""A peer's chunk counts as readable this long after it landed there (a report and a plan's round trips)."""
WIRE = 1514 / 1448
"""Bytes on the wire per byte of TCP payload (Ethernet + IP + TCP headers with timestamps, 1,500 MTU)."""
GOALS = {"standalone": 6.0, "cross_dc": 7.5}
"""Issue 21, item 5: the ratio against pulling from the trainer each mode should reach."""


def copy_seconds(size_mb: float, mbit: float) -> float:
    """One copy of the version through a link of ``mbit``, headers counted."""
    return size_mb * MIB * 8 * WIRE / (mbit * 1e6)


def ceiling(mode: str, params: dict, readers: int, chunks: int) -> dict:
    """The least total and mean stall of ``readers`` rollouts in ``mode`` for a version of ``chunks`` chunks (see
    the module doc)."""
    c = copy_seconds(params["size_mb"], params["nic_mbit"]) / chunks
    if mode == "cross_dc":
        first, holders = copy_seconds(params["size_mb"], params["wan_mbit"]), 1  # the seed, then doubling in dc1
    else:
        first, holders = chunks * c, 2  # the reader that got the last chunk, and the trainer that sent it
    finish, hop = [first], 1
    while len(finish) < readers:
        finish += [first + hop * c] * min(holders, readers - len(finish))
        holders, hop = holders * 2, hop + 1
    return {"chunks": chunks, "chunk_nic_s": round(c, 4), "one_copy_s": round(first, 3),
            "total_s": round(sum(finish), 2), "mean_s": round(sum(finish) / readers, 3)}


def goal(mode: str, pull: float, ceil: dict, readers: int) -> dict:
    """Whether ``GOALS[mode]`` is within this run's ceiling at its pull, and the pull total it would need at the
    ceiling and at the byte floor (``readers`` x one copy through the bottleneck: no tail)."""
    floor = readers * ceil["one_copy_s"]
    target = GOALS[mode]
    return {"goal": target, "floor_s": round(floor, 2), "ratio_floor": round(pull / floor, 2),
            "pull_for_goal_at_ceiling_s": round(target * ceil["total_s"], 1),
            "pull_for_goal_at_floor_s": round(target * floor, 1), "reachable": pull / ceil["total_s"] >= target}


def _union(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def reader_gaps(r: dict, base: float, trainer: str = "trainer") -> dict:
    """One reader's timeline, in seconds from the earliest go (``base``)."""
    off = r["t0"] - base
    tl = [(p + off, l + off, c, s) for p, l, c, s in r["timeline"]]
    done = max(l for _, l, _, _ in tl)
    busy = _union([(p, l) for p, l, _, _ in tl])
    ex = r.get("exchanges", [])
    starved = sum(b - a for a, b, asked, got in ex if asked and not got)
    by = {"trainer": 0, "peers": 0}
    for _, _, _, s in tl:
        by["trainer" if s == trainer else "peers"] += 1
    return {"worker": r["worker"], "go_s": round(off, 3), "first_post_s": round(min(p for p, *_ in tl), 3),
            "done_s": round(done, 3), "seconds": round(r["seconds"], 3),
            "idle_s": round(done - off - busy, 3), "starved_s": round(starved, 3),
            "exchanges": len(ex), "empty_exchanges": sum(1 for _, _, a, g in ex if a and not g),
            "rtt_ms": round(1000 * statistics.median([b - a for a, b, *_ in ex]), 1) if ex else None,
            "chunks_from": by}


def trainer_use(readers: list[dict], base: float, trainer: str = "trainer") -> dict:
    """The share of time, until the trainer's last read landed, that one of its reads was in flight."""
    spans = [(p + r["t0"] - base, l + r["t0"] - base) for r in readers for p, l, _, s in r["timeline"] if s == trainer]
    if not spans:
        return {"reads": 0}
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    return {"reads": len(spans), "first_s": round(start, 3), "last_s": round(end, 3),
            "busy_share": round(_union(spans) / (end - start), 3)}


def wan_pacing(readers: list[dict], base: float, params: dict, trainer: str = "trainer") -> dict:
    """The seed's WAN reads: their landings' spacing against their bytes' WAN time, and where the WAN's time went
    (see the module doc). A chunk's bytes: ``chunk_mb``, less past the end of ``size_mb`` (the few tiny tensors
    after it count as none)."""
    reads = sorted((l + r["t0"] - base, p + r["t0"] - base, c) for r in readers for p, l, c, s in r["timeline"]
                   if s == trainer)
    if not reads:
        return {"reads": 0}
    size, chunk, mbit = params["size_mb"], params["chunk_mb"], params["wan_mbit"]
    wire = [copy_seconds(min(chunk, max(0.0, size - c * chunk)), mbit) for _, _, c in reads]
    landed = [l for l, _, _ in reads]
    first_post = min(p for _, p, _ in reads)
    gaps = [b - a for a, b in zip(landed, landed[1:])]
    waited, slow, worst = 0.0, 0.0, []
    free = first_post  # when the WAN had nothing left to carry of the reads before
    for (l, p, c), w in zip(reads, wire):
        waited += max(0.0, p - free)
        extra = l - max(p, free) - w
        slow += extra
        worst.append((round(extra, 3), c, round(l, 3)))
        free = l
    one_copy = copy_seconds(size, mbit)
    span = landed[-1] - first_post
    return {"reads": len(reads), "first_post_s": round(first_post, 3), "last_landed_s": round(landed[-1], 3),
            "chunk_wan_s": round(copy_seconds(chunk, mbit), 4),
            "median_gap_s": round(statistics.median(gaps), 4) if gaps else None,
            "max_gap_s": round(max(gaps), 4) if gaps else None,
            "wan_rate_share": round(sum(wire) / span, 3) if span > 0 else None,
            "wire_s": round(sum(wire), 3), "lost_s": round(span - sum(wire), 3),
            "waited_for_post_s": round(waited, 3), "slow_s": round(slow, 3),
            "late_s": round(landed[-1] - one_copy, 3),
            "worst": sorted(worst, reverse=True)[:4]}


def cross_dc_gap(rows: list[dict], wan: dict, ceil: dict, total: float) -> dict:
    """The cross-dc stall above the ceiling: the WAN's part, the tail's part and the rest (see the module doc)."""
    if not wan.get("reads"):
        return {}
    readers, last = len(rows), wan["last_landed_s"]
    tail = sum(max(0.0, r["done_s"] - last) for r in rows)
    tail_ceiling = ceil["total_s"] - readers * ceil["one_copy_s"]
    from_wan, from_tail = readers * wan["late_s"], tail - tail_ceiling
    return {"from_wan_s": round(from_wan, 2), "tail_s": round(tail, 2), "tail_ceiling_s": round(tail_ceiling, 2),
            "from_tail_s": round(from_tail, 2), "rest_s": round(total - ceil["total_s"] - from_wan - from_tail, 2)}


def spread(readers: list[dict], base: float) -> dict:
    """Per chunk: from its first landing at a reader to its last (the time to reach every reader)."""
    lands: dict[int, list[float]] = {}
    for r in readers:
        for _, l, c, _ in r["timeline"]:
            lands.setdefault(c, []).append(l + r["t0"] - base)
    spans = [max(v) - min(v) for v in lands.values() if len(v) == len(readers)]
    last = max(lands, key=lambda c: min(lands[c])) if lands else None
    return {"median_s": round(statistics.median(spans), 3) if spans else None,
            "max_s": round(max(spans), 3) if spans else None,
            "last_chunk_first_landing_s": round(min(lands[last]), 3) if last is not None else None,
            "last_chunk_spread_s": round(max(lands[last]) - min(lands[last]), 3) if last is not None else None}


def _quantiles(values: list[float]) -> dict:
    v = sorted(values)
    if not v:
        return {}
    return {f"p{q}_ms": round(1000 * v[min(len(v) - 1, q * len(v) // 100)], 1) for q in (10, 50, 90)}


def hops(readers: list[dict], base: float) -> dict:
    """For each read from a peer (a reader of this run), where the time from the chunk landing at the peer to the
    read's post went (p10 / p50 / p90 over the reads; see the module doc)."""
    runs = {}
    for r in readers:
        off = r["t0"] - base
        runs[r["worker"]] = ([(p + off, l + off, c, s) for p, l, c, s in r["timeline"]],
                             sorted((a + off, b + off) for a, b, *_ in r.get("exchanges", [])))
    landed = {w: {c: l for _, l, c, _ in tl} for w, (tl, _) in runs.items()}
    parts: dict[str, list[float]] = {k: [] for k in ("post_after_landing", "source_report_wait", "source_report_rtt",
                                                     "reader_ask_after_report", "reader_ask_rtt")}
    for tl, ex in runs.values():
        for posted, _, chunk, source in tl:
            if source not in runs or chunk not in landed[source]:
                continue
            at = landed[source][chunk]
            report = next((e for e in runs[source][1] if e[0] >= at), None)
            ask = next((e for e in reversed(ex) if e[1] <= posted + 1e-3), None)
            if report is None or ask is None:
                continue
            parts["post_after_landing"].append(posted - at)
            parts["source_report_wait"].append(report[0] - at)
            parts["source_report_rtt"].append(report[1] - report[0])
            parts["reader_ask_after_report"].append(ask[0] - report[1])
            parts["reader_ask_rtt"].append(ask[1] - ask[0])
    return {"reads": len(parts["post_after_landing"]), **{k: _quantiles(v) for k, v in parts.items()}}


def idle_with_work(readers: list[dict], base: float, lag: float = IDLE_LAG_S, step: float = 0.005) -> dict:
    """Per reader: seconds with no read in flight while a peer had held a chunk it lacked for ``lag`` or more
    (sampled every ``step``)."""
    tls = {r["worker"]: [(p + r["t0"] - base, l + r["t0"] - base, c) for p, l, c, _ in r["timeline"]]
           for r in readers}
    landed = {w: {c: l for _, l, c in tl} for w, tl in tls.items()}
    out = {}
    for w, tl in tls.items():
        first = {}
        for other, lands in landed.items():
            if other != w:
                for c, l in lands.items():
                    first[c] = min(first.get(c, l), l)
        posted = {c: p for p, _, c in tl}
        end, t, idle = max(l for _, l, _ in tl), min(p for p, _, _ in tl), 0.0
        while t < end:
            if not any(p <= t < l for p, l, _ in tl) and \
                    any(at + lag <= t and posted.get(c, end) > t for c, at in first.items()):
                idle += step
            t += step
        out[w] = round(idle, 3)
    return {"total_s": round(sum(out.values()), 3), "readers": out}


def analyse(result: dict) -> dict:
    params, out = result["params"], {}
    for mode, res in result["modes"].items():
        th = res["runs"]["tensorhub"]
        readers = [r for r in th.get("readers", []) if r.get("timeline")]
        if mode == "elastic" or not readers:
            continue
        base = min(r["t0"] for r in readers)
        ceil = ceiling(mode, params, len(readers), len({c for r in readers for _, _, c, _ in r["timeline"]}))
        pull = res["baseline_s"]["pull_from_trainer"]
        rows = [reader_gaps(r, base) for r in readers]
        entry = {"tensorhub_s": res["tensorhub_s"], "pull_s": pull, "ratio": round(res["ratio"], 2),
                 "ceiling": ceil, "ratio_ceiling": round(pull / ceil["total_s"], 2),
                 "goal": goal(mode, pull, ceil, len(readers)),
                 "gap_s": round(res["tensorhub_s"] - ceil["total_s"], 2),
                 "start_s": round(sum(r["first_post_s"] for r in rows), 3),
                 "idle_s": round(sum(r["idle_s"] for r in rows), 3),
                 "starved_s": round(sum(r["starved_s"] for r in rows), 3),
                 "trainer": trainer_use(readers, base), "spread": spread(readers, base),
                 "hops": hops(readers, base), "idle_with_work": idle_with_work(readers, base), "readers": rows}
        if mode == "cross_dc":
            entry["wan"] = wan_pacing(readers, base, params)
            entry["gap"] = cross_dc_gap(rows, entry["wan"], ceil, res["tensorhub_s"])
        out[mode] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorhub_dev.bench.modes_gap", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path, help="the --out file of `tensorhub bench modes`")
    a = ap.parse_args(argv)
    report = analyse(json.loads(a.json.read_text()))
    for mode, e in report.items():
        c = e["ceiling"]
        print(f"{mode}: tensorhub {e['tensorhub_s']:.2f} s vs ceiling {c['total_s']:.2f} s (gap {e['gap_s']:.2f} s); "
              f"ratio {e['ratio']}x of a ceiling {e['ratio_ceiling']}x (pull {e['pull_s']:.1f} s)")
        g = e["goal"]
        print(f"  goal {g['goal']}x: {'within' if g['reachable'] else 'beyond'} the ceiling at this pull; it needs a "
              f"pull of {g['pull_for_goal_at_ceiling_s']:.1f} s at the ceiling, {g['pull_for_goal_at_floor_s']:.1f} s "
              f"at the byte floor ({g['floor_s']:.2f} s summed: {g['ratio_floor']}x at this pull)")
        print(f"  summed over readers: first read posted {e['start_s']:.2f} s, idle {e['idle_s']:.2f} s, "
              f"starved {e['starved_s']:.2f} s; trainer {e['trainer']}; spread {e['spread']}")
        print(f"  idle with work (a peer had a chunk it lacked for {IDLE_LAG_S} s): "
              f"{e['idle_with_work']['total_s']:.2f} s summed")
        print(f"  hops (peer landed -> read posted): {e['hops']}")
        if "wan" in e:
            print(f"  WAN: {e['wan']}")
            print(f"  gap above the ceiling: {e['gap']}")
        for r in e["readers"]:
            print(f"  {r['worker']:<22} go {r['go_s']:6.3f} first {r['first_post_s']:6.3f} done {r['done_s']:6.3f} "
                  f"idle {r['idle_s']:5.3f} starved {r['starved_s']:5.3f} ex {r['exchanges']:3d} "
                  f"(empty {r['empty_exchanges']:2d}) rtt {r['rtt_ms']} ms  chunks {r['chunks_from']}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
