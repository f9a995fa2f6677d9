"""`python -m tensorhub_dev.netlab {selftest,up,cleanup}` (scripts/netlab.sh wraps it).

selftest builds a 2-datacenter lab, measures shaped vs achieved TCP rates in a few sharing patterns
(and, with --nixl, a NIXL READ across hosts), tears the lab down, and prints one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time

from tensorhub_dev.netlab.errors import NetlabError
from tensorhub_dev.netlab.lab import Lab, cleanup_stale
from tensorhub_dev.netlab.measure import measure_flows, measure_nixl
from tensorhub_dev.netlab.spec import LabSpec

log = logging.getLogger("tensorhub_dev.netlab")


def _sigterm_to_exit(signum, frame):  # noqa: ARG001
    # SystemExit unwinds through `with Lab(...)`, so a terminated run still cleans up.
    raise SystemExit(128 + signum)


def selftest(nic: float, uplink: float, wan: float, mb: float, nixl: bool) -> dict:
    """Each case: (name, flows, expected per-flow Mbit/s under max-min sharing)."""
    spec = LabSpec.uniform(dcs=2, racks_per_dc=2, hosts_per_rack=2, nic_mbit=nic, rack_uplink_mbit=uplink,
                           wan_mbit=wan)
    cases = [
        ("intra_rack", [("d0r0h0", "d0r0h1")], nic),
        ("cross_rack_x2_share_uplink", [("d0r0h0", "d0r1h0"), ("d0r0h1", "d0r1h1")], min(nic, uplink / 2)),
        ("incast_x2_share_dst_nic", [("d0r0h1", "d0r0h0"), ("d0r1h0", "d0r0h0")], nic / 2),
        ("cross_dc", [("d0r0h0", "d1r0h0")], min(nic, wan)),
        ("cross_dc_x2_share_wan", [("d0r0h0", "d1r0h0"), ("d0r1h0", "d1r1h0")], min(nic, wan / 2)),
    ]
    out: dict = {"shaped_mbit": {"nic": nic, "rack_uplink": uplink, "wan": wan}, "cases": []}
    with Lab(spec) as lab:
        for name, pairs, expect in cases:
            # Size each case so it runs about a second at its expected rate.
            nbytes = int(mb * 1e6 * expect / nic)
            res = measure_flows(lab, pairs, nbytes)
            agg = sum(r["bytes"] for r in res) * 8 / max(r["seconds"] for r in res) / 1e6
            out["cases"].append({"case": name, "expected_mbit_per_flow": expect,
                                 "measured_mbit_per_flow": [round(r["mbit_s"], 1) for r in res],
                                 "aggregate_mbit": round(agg, 1), "wan_bytes": res[0]["wan_bytes_during_run"],
                                 "payload_bytes": nbytes * len(pairs)})
        if nixl:
            for name, a, b, nbytes in (("nixl_intra_rack", "d0r0h0", "d0r0h1", 16 << 20),
                                       ("nixl_cross_dc", "d0r0h0", "d1r0h0", 8 << 20)):
                r = measure_nixl(lab, a, b, nbytes)
                out["cases"].append({"case": name, "expected_mbit_per_flow": min(nic, wan) if "dc" in name else nic,
                                     "measured_mbit_per_flow": [round(r["mbit_s"], 1)], "ok": r["ok"],
                                     "wan_bytes": r["wan_bytes_during_run"], "ucx_tls": r["ucx_tls"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="netlab", description=__doc__)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("selftest", help="build a 2-dc lab, measure shaped rates, tear down")
    st.add_argument("--nic-mbit", type=float, default=200)
    st.add_argument("--uplink-mbit", type=float, default=300)
    st.add_argument("--wan-mbit", type=float, default=100)
    st.add_argument("--mb", type=float, default=25, help="payload (MB) of a flow at the NIC rate")
    st.add_argument("--nixl", action="store_true", help="also READ with NIXL (UCX over TCP) across hosts")
    up = sub.add_parser("up", help="build a lab and hold it until Ctrl-C / SIGTERM")
    up.add_argument("--dcs", type=int, default=2)
    up.add_argument("--racks", type=int, default=1)
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--nic-mbit", type=float)
    up.add_argument("--uplink-mbit", type=float)
    up.add_argument("--wan-mbit", type=float)
    cl = sub.add_parser("cleanup", help="delete lab namespaces left by killed runs")
    cl.add_argument("--force", action="store_true", help="also labs whose creator still runs")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, _sigterm_to_exit)
    try:
        if a.cmd == "selftest":
            res = selftest(a.nic_mbit, a.uplink_mbit, a.wan_mbit, a.mb, a.nixl)
        elif a.cmd == "cleanup":
            res = {"removed": cleanup_stale(force=a.force)}
        else:
            spec = LabSpec.uniform(dcs=a.dcs, racks_per_dc=a.racks, hosts_per_rack=a.hosts, nic_mbit=a.nic_mbit,
                                   rack_uplink_mbit=a.uplink_mbit, wan_mbit=a.wan_mbit)
            with Lab(spec) as lab:
                print(json.dumps(lab.describe()), flush=True)
                print("lab is up; run in a host with `ip netns exec <netns> ...`; Ctrl-C tears it down",
                      file=sys.stderr, flush=True)
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
            res = {"closed": lab.prefix}
    except NetlabError as e:
        log.error("%s", e)
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return 2
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
