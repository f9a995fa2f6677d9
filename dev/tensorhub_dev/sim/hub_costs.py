"""What one hub request costs the hub, and the protocol's shape that sets how many requests an update makes.

The simulator's chunks are coarse (a 100 GB version in 64 chunks), the real client's are not (8 MiB): a
simulated chunk stands for ``chunk_bytes / real_chunk_bytes`` real chunks. A lease covers ``run_chunks`` of
them (1 today: one lease per chunk read), and an exchange carries ``leases_per_exchange`` leases (the fetcher
asks again when half its window of 8 is free, so about 4). Reading one simulated chunk thus takes
``ceil(ceil(real chunks / run_chunks) / leases_per_exchange)`` exchanges, each costing the hub ``exchange_s``
plus ``lease_s`` per lease it grants.

Calibration reads `tensorhub bench control`'s JSON: its hub CPU per exchange (begins included) at the least
contended points (the fewest readers), where its load processes steal the least CPU from the hub. That bench
counts an exchange's leases in the exchange's cost and cannot tell the two apart, so a calibrated ``lease_s``
is 0 and ``exchange_s`` is the cost of an exchange as the bench makes them (about 7 leases each); begins are
exchanges in its count, and an end (one request that books the last chunks and drops nothing from the plan)
is charged as one exchange.

    tensorhub bench control --chunks 256,1024,4096,12800 --readers 8 > control.txt
    python -m tensorhub_dev.sim.hub_costs control.txt     # the costs, JSON last
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass

from tensorhub_verl.errors import ConfigError

MIB = 1 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class HubCosts:
    exchange_s: float = 0.0
    """Hub CPU per exchange: booking its reports, planning, the reply (HTTP and pydantic included)."""
    lease_s: float = 0.0
    """Hub CPU per lease granted, its completion included, on top of ``exchange_s``."""
    begin_s: float = 0.0
    """Hub CPU per begin (a reader's first request, which also plans its first reads)."""
    end_s: float = 0.0
    """Hub CPU per end (books a reader's last chunks)."""
    cores: int = 1
    """Requests the hub serves at once, first come first served."""
    run_chunks: int = 1
    """Real chunks per lease: 1 is today's protocol; more is a lease over a run of chunks from one source."""
    real_chunk_mib: float = 8.0
    """The real transfer unit (``ClientConfig`` chunking), MiB."""
    leases_per_exchange: int = 4
    """Leases one exchange grants: the fetcher asks when half of its window (8) is free."""
    retry_s: float = 0.0
    """A reader whose answer came back short asks for work again no sooner than this (the fetcher waits
    20 ms); it still reports landed chunks at once."""

    def __post_init__(self) -> None:
        if min(self.exchange_s, self.lease_s, self.begin_s, self.end_s, self.retry_s) < 0:
            raise ConfigError("hub costs and retry_s must be >= 0")
        if min(self.cores, self.run_chunks, self.leases_per_exchange) < 1 or not self.real_chunk_mib > 0:
            raise ConfigError("cores, run_chunks and leases_per_exchange must be >= 1, real_chunk_mib > 0")

    @property
    def free(self) -> bool:
        """Every request costs nothing: the hub answers at once, however many wait (the planner's ideal)."""
        return self.exchange_s == self.lease_s == self.begin_s == self.end_s == 0

    def leases_for(self, chunk_bytes: float) -> int:
        """Real leases one simulated chunk of ``chunk_bytes`` takes."""
        real_chunks = math.ceil(chunk_bytes / (self.real_chunk_mib * MIB) - 1e-9)
        return math.ceil(max(real_chunks, 1) / self.run_chunks)

    def exchange_cost(self, leases: int, first: bool = False) -> float:
        return (self.begin_s if first else self.exchange_s) + leases * self.lease_s


MEASURED_EXCHANGE_S = 0.545e-3
"""`tensorhub bench control`'s 8-reader points with one chunk per lease (`--run-chunks 1`): 0.51 to 0.59 ms per
exchange from 256 to 12,800 chunks, median 0.545 ms."""

MEASURED = HubCosts(exchange_s=MEASURED_EXCHANGE_S, begin_s=MEASURED_EXCHANGE_S, end_s=MEASURED_EXCHANGE_S,
                    retry_s=0.02)
"""Today's hub as measured, one core, one chunk per lease."""


def calibrate_hub(report: dict, readers: int | None = None) -> dict:
    """Hub costs (in ms, as ``ModeParams``' ``hub_*_ms`` fields) from a `bench control` JSON report.

    Uses the points with ``readers`` synthetic readers (default: the fewest the report has); the per-exchange
    figure is their median CPU per exchange."""
    points = [p for p in report.get("points", ()) if p.get("hub_cpu_per_exchange_ms")]
    if report.get("bench") != "control" or not points:
        raise ConfigError("not a `tensorhub bench control` report with measured points")
    chosen = min(p["readers"] for p in points) if readers is None else readers
    per_exchange = [p["hub_cpu_per_exchange_ms"] for p in points if p["readers"] == chosen]
    if not per_exchange:
        raise ConfigError(f"the report has no point with {chosen} readers")
    ms = statistics.median(per_exchange)
    return {"hub_exchange_ms": ms, "hub_lease_ms": 0.0, "hub_begin_ms": ms, "hub_end_ms": ms,
            "real_chunk_mib": float(report.get("chunk_mib", 8.0)), "from_readers": chosen,
            "from_points": len(per_exchange), "reads_per_exchange_measured":
                statistics.median(p["reads_per_exchange"] for p in points if p["readers"] == chosen)}


def load_control_report(path: str) -> dict:
    """The JSON line (the last) of a `bench control` output file."""
    with open(path) as fh:
        lines = fh.read().strip().splitlines()
    if not lines:
        raise ConfigError(f"{path} is empty")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tensorhub_dev.sim.hub_costs BENCH_CONTROL_OUTPUT", file=sys.stderr)
        return 2
    try:
        out = calibrate_hub(load_control_report(args[0]))
    except (ConfigError, OSError, ValueError, KeyError) as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return 2
    print(json.dumps({**out, "measured_defaults": asdict(MEASURED)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
