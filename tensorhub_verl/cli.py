"""The `tensorhub` command: hub, status, attach-vllm, bench; with the developer tools installed
(`pip install -e dev/` from a checkout) also demo, sim, netlab and the research benches.

Logging: the library logs under `tensorhub_verl.*` and never configures logging when imported. Only what
starts a process does: this `main()`; the `main()` of each command it delegates to and of each bench (when run
on its own, they configure it as this one would: `basicConfig` does nothing once a handler exists); and the
entry functions of the child processes the package spawns (`bench.procs`, `vllm.engine_proc`). The one
exception, NIXL's own logger, is explained in `ros.planes.nixl._quiet_nixl_logger`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys

from tensorhub_verl.errors import TensorHubError

# Subcommands that live in optional parts of the package, imported only when used.
_DELEGATED = {
    "attach-vllm": "tensorhub_verl.vllm.attach",
}
_BENCHES = {
    "transport": "tensorhub_verl.bench.transport",
    "fanout": "tensorhub_verl.bench.fanout",
    "vllm": "tensorhub_verl.bench.vllm_bench",
    "hub": "tensorhub_verl.bench.hub_load",
    "control": "tensorhub_verl.bench.control",
    "publish-cost": "tensorhub_verl.bench.publish_cost",
    "delta": "tensorhub_verl.bench.delta",
}
# The developer tools: the package ``tensorhub_dev`` (the repository's dev/ tree), never in the product's wheel.
# The product names them only here, as strings, so that one ``tensorhub`` command runs both when dev is installed.
DEV_PACKAGE = "tensorhub_dev"
_DEV_DELEGATED = {
    "demo": "tensorhub_dev.demo",
    "sim": "tensorhub_dev.sim.cli",
    "netlab": "tensorhub_dev.netlab.cli",
}
_DEV_BENCHES = {
    "modes": "tensorhub_dev.bench.modes",
    "transport-lab": "tensorhub_dev.bench.transport_lab",
    "tp-bytes": "tensorhub_dev.bench.tp_bytes",
    "pause-copy": "tensorhub_dev.bench.pause_copy",
    "soak": "tensorhub_dev.bench.soak",
}
DEV_INSTALL_HINT = ("it is a developer tool of the repository's dev/ package (tensorhub_dev), not part of the "
                    "installed product: from a checkout of tensorhub_verl, run `pip install -e dev/` "
                    "(scripts/setup.sh does it)")


def hub_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorhub hub", description="Run the TensorHub metadata hub.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=7777)
    parser.add_argument("--token", default=None, help="bearer token (default: $TENSORHUB_TOKEN)")
    parser.add_argument("--token-file", default=None, help="file holding the bearer token")
    parser.add_argument("--tls-cert", default=None, help="PEM certificate: serve HTTPS only (with --tls-key)")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument("--keep-versions", type=int, default=2, help="retention: newest N versions per model")
    parser.add_argument("--worker-timeout", type=float, default=10.0, help="seconds without heartbeat")
    parser.add_argument("--lease-ttl", type=float, default=30.0, help="seconds one chunk read may take")
    parser.add_argument("--seeds-per-dc", type=int, default=None,
                        help="readers per datacenter that cross the WAN (default: ceil(wan / nic) with "
                             "--nic-gbps and --wan-gbps, else 1)")
    parser.add_argument("--nic-gbps", type=float, default=None, help="a worker's NIC rate, Gbit/s")
    parser.add_argument("--wan-gbps", type=float, default=None, help="the WAN's rate, Gbit/s")
    parser.add_argument("--max-inflight-per-source", type=int, default=8)
    parser.add_argument("--url-file", default=None, help="write the hub URL here once listening")
    parser.add_argument("--shards", type=int, default=1,
                        help="run the hub as this many processes, each serving a share of every version, on "
                             "--port, --port+1, ...; clients connect to the comma-separated URLs it prints")
    parser.add_argument("--regions", default=None, metavar="N|REGION,...",
                        help="run a hub process per region (dc, dc/rack or dc/rack/node; N: dc0/r0..), each "
                             "serving the readers of its region; clients connect to the REGION=URL list it prints")
    parser.add_argument("--owner", action="append", default=[], metavar="MODEL_GLOB=WORKER_GLOB|job:JOB",
                        help="only workers whose id matches WORKER_GLOB (or the workers of job JOB, its public "
                             "name job-<hash>) create versions of the models matching MODEL_GLOB and of their "
                             "<model>.* forms (adapters, deltas) (repeatable; e.g. policy=trainer-*); other "
                             "models belong to the job of their first publisher")
    parser.add_argument("--plane", default="auto", metavar="auto|nixl|tcp",
                        help="the data plane of every worker of this hub (default auto: NIXL for a loopback hub, "
                             "RDMA devices or a UCX_TLS beyond TCP, else TCP); workers on another are refused")
    parser.add_argument("--allow-keyless", action="store_true",
                        help="with a token, admit workers without a job key: they share one default job (each "
                             "may read the others' NIXL memory and publish their models); by default a hub with "
                             "a token admits only workers with a job key ($TENSORHUB_JOB_KEY)")
    parser.add_argument("--allow-unverified", action="store_true",
                        help="accept versions without chunk digests (trusted tests only: their bytes go "
                             "unchecked)")
    return parser


def hub_seeds_per_dc(args: argparse.Namespace) -> int:
    """--seeds-per-dc, else sized from --nic-gbps / --wan-gbps, else 1."""
    from tensorhub_verl.ros.wire.topology import wan_seeds

    links = {k: v for k, v in (("nic_gbps", args.nic_gbps), ("wan_gbps", args.wan_gbps)) if v is not None}
    return wan_seeds(args.seeds_per_dc, links)


def _hub_command(argv: list[str]) -> int:
    from tensorhub_verl.ros.hub.server import HubServer, resolve_token
    from tensorhub_verl.ros.hub.config import HubConfig
    from tensorhub_verl.ros.hub.ownership import OwnerRule
    from tensorhub_verl.ros.hub.planner import PlannerConfig

    args = hub_parser().parse_args(argv)
    if args.regions is not None:
        from tensorhub_verl.ros.hub.shard_launcher import run_shards
        from tensorhub_verl.ros.wire.regions import region_names

        names = region_names(args.regions)
        return run_shards(len(names), args.port, argv, args.url_file, names=names)
    if args.shards != 1:
        from tensorhub_verl.ros.hub.shard_launcher import run_shards
        from tensorhub_verl.ros.client.shares import MAX_SHARDS

        if not 1 <= args.shards <= MAX_SHARDS:
            hub_parser().error(f"--shards must be in [1, {MAX_SHARDS}]")
        return run_shards(args.shards, args.port, argv, args.url_file)
    if args.token is not None:
        print("warning: a token given with --token is visible to every local user (ps, /proc); prefer "
              "--token-file or $TENSORHUB_TOKEN", file=sys.stderr)
    token = args.token if args.token is not None or args.token_file else os.environ.get("TENSORHUB_TOKEN")
    config = HubConfig(keep_versions=args.keep_versions, worker_timeout_s=args.worker_timeout,
                       lease_ttl_s=args.lease_ttl, owners=tuple(OwnerRule.parse(o) for o in args.owner),
                       require_digests=not args.allow_unverified, allow_keyless=args.allow_keyless,
                       plane=args.plane,
                       planner=PlannerConfig(seeds_per_dc=hub_seeds_per_dc(args),
                                             max_inflight_per_source=args.max_inflight_per_source))
    server = HubServer(args.host, args.port, resolve_token(token, args.token_file), config,
                       tls_cert=args.tls_cert, tls_key=args.tls_key)
    print(f"tensorhub hub listening on {server.url} (auth {'on' if token or args.token_file else 'off'})",
          flush=True)
    if args.url_file:
        with open(args.url_file, "w") as f:
            f.write(server.url)
    server.serve_forever()
    return 0


def _status_command(argv: list[str]) -> int:
    from tensorhub_verl.ros.client.hub_client import HubClient
    from tensorhub_verl.ros.wire.messages import StatusReply

    parser = argparse.ArgumentParser(prog="tensorhub status", description="Show models, versions, holders.")
    parser.add_argument("--hub", default=os.environ.get("TENSORHUB_HUB"), help="hub URL ($TENSORHUB_HUB)")
    parser.add_argument("--token", default=os.environ.get("TENSORHUB_TOKEN"))
    parser.add_argument("--ca-file", default=os.environ.get("TENSORHUB_CA_FILE"),
                        help="CA that signed an https hub's certificate ($TENSORHUB_CA_FILE)")
    parser.add_argument("--allow-plain-http", action="store_true",
                        help="send the token to an http:// hub on another host in clear (a network you trust)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.hub:
        parser.error("no hub given: pass --hub URL or set TENSORHUB_HUB")
    client = HubClient(args.hub, args.token, retry_s=5.0, ca_file=args.ca_file,
                       allow_plain_http=args.allow_plain_http)
    try:
        status = client.get("/v1/status", StatusReply).model_dump()
    finally:
        client.close()
    if args.json:
        print(json.dumps(status))
    else:
        print(format_status(status))
    return 0


def format_status(status: dict) -> str:
    lines = [f"hub {status['hub_instance']}: {len(status['workers'])} workers, "
             f"{status['leases_in_flight']} reads in flight, {status['leases_revoked']} revoked", ""]
    header = (f"{'model':<16} {'version':>7} {'layout':<24} {'MB':>9}  {'holder':<24} {'state':<8} "
              f"{'chunks':>9} {'served MB':>10}")
    lines += [header, "-" * len(header)]
    for model, versions in sorted(status["models"].items()):
        for v in versions:
            for i, h in enumerate(v["holders"]):
                key = (model, str(v["version"]), v["layout"], f"{v['bytes'] / 1e6:.1f}") if i == 0 else ("",) * 4
                lines.append(f"{key[0]:<16} {key[1]:>7} {key[2]:<24} {key[3]:>9}  {h['holder']:<24} "
                             f"{h['state']:<8} {h['chunks']:>4}/{v['chunks']:<4} {h['served_bytes'] / 1e6:>10.1f}")
    lines += ["", f"{'worker':<24} {'location':<32} {'spot':<5} {'served MB':>10} {'last seen':>10}"]
    for worker, w in sorted(status["workers"].items()):
        location = ",".join(f"{k}={v}" for k, v in w["location"].items())
        lines.append(f"{worker:<24} {location:<32} {str(w['spot']):<5} {w['bytes_served'] / 1e6:>10.1f} "
                     f"{w['last_seen_s']:>9.1f}s")
    for model, flip in sorted(status.get("flips", {}).items()):
        failed = ",".join(f"v{v}" for v in flip["failed"]) or "none"
        lines += ["", f"fleet flip of {model}: committed v{flip['committed']}, previous v{flip['previous']}, "
                      f"failed checks: {failed}" + (f"; waiting: {flip['blocked']}" if flip["blocked"] else ""),
                  f"{'replica':<24} {'serving':>8} {'staged':>8}"]
        for worker, r in flip["replicas"].items():
            staged = "-" if r["pull"] is None else f"v{r['pull']}"
            if r["outcome"] not in (None, "staged"):  # its check failed, or it could not be read
                staged = f"- (v{r['pull']} {r['outcome'].replace('_', ' ')})"
            serving = "-" if r["serving"] is None else f"v{r['serving']}"
            lines.append(f"{worker:<24} {serving:>8} {staged:>8}")
    return "\n".join(lines)


def _bench_command(argv: list[str]) -> int:
    benches = {**_BENCHES, **_DEV_BENCHES}
    if not argv or argv[0] not in benches:
        print(f"usage: tensorhub bench {{{'|'.join(benches)}}} [--json] ...", file=sys.stderr)
        return 2
    return _delegate(benches[argv[0]], argv[1:], f"bench {argv[0]}")


def _delegate(module: str, argv: list[str], command: str) -> int:
    try:
        entry = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            if module.startswith(DEV_PACKAGE + "."):
                print(f"tensorhub {command}: {DEV_INSTALL_HINT}", file=sys.stderr)
            else:
                print(f"{module} is not available in this install", file=sys.stderr)
            return 2
        raise
    return int(entry.main(argv) or 0)


_COMMANDS = {"hub": _hub_command, "status": _status_command, "bench": _bench_command}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = {**_DELEGATED, **_DEV_DELEGATED}
    choices = sorted([*_COMMANDS, *delegated])
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: tensorhub {{{','.join(choices)}}} ...\n\n{__doc__}")
        return 0 if argv else 2
    level = os.environ.get("TENSORHUB_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command, rest = argv[0], argv[1:]
    try:
        if command in _COMMANDS:
            return _COMMANDS[command](rest)
        if command in delegated:
            return _delegate(delegated[command], rest, command)
    except TensorHubError as e:
        print(f"tensorhub {command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(f"unknown command {command!r}; choose one of {choices}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
