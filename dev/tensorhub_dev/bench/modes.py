"""`tensorhub bench modes --json`: the paper's three rollout modes on real processes in the network lab.

Every process (hub, trainer, readers) runs in its own lab host (network namespace, shaped veth, UCX over
TCP), and each mode runs TensorHub and its baseline side by side in one lab:

- standalone: R readers fetch `policy` v1 at once (TensorHub) vs each fetches its own `pull-<i>` v1, a
  model only the trainer holds (every reader pulls everything from the trainer, same transport and client),
  vs a torch.distributed broadcast (gloo over the same shaped NICs; the group is formed before the clock starts).
- elastic: H readers hold v1; J joiners start one by one while the trainer's NIC carries `busy_flows`
  endless TCP flows (training traffic); TensorHub joiners read from peers, baseline joiners from the trainer.
- cross_dc: trainer in dc0, R readers in dc1 behind the WAN; stall and WAN bytes per version.

Stall: the seconds each rollout waits for the new version (go -> its fetch returned). Every mode reports
the total over rollouts (`tensorhub_s`, `baseline_s[name]`, `ratio` = pull_from_trainer total / TensorHub
total) and the worst rollout (`*_max_s`, `ratio_max`); per-variant details are under `runs`.

Needs root and iproute2 (`tensorhub_dev.netlab`); prints one JSON object as the last line.

    orchestrator (root namespace: no lab address; talks to roles via stdout lines and files)
      |-- hub                [lab host "hub", beside the trainer; --hub-on-trainer puts it on "trainer"]
      |-- trainer            [lab host "trainer"]
      |-- reader processes   [one lab host each]
      `-- busy TCP flows     [trainer -> "sink"] (elastic only)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tensorhub_verl.errors import ConfigError, TensorHubError
from tensorhub_dev.netlab import Lab, NetlabError
from tensorhub_dev.sim.calibrate import LabWorkload, lab_spec
from tensorhub_dev.sim.modes import PAPER

log = logging.getLogger("tensorhub_verl.bench")

_ROLES = [sys.executable, "-m", "tensorhub_dev.bench.modes_roles"]
_PROBE = [sys.executable, "-m", "tensorhub_dev.netlab.probe"]
HUB_PORT = 47900


class BenchError(TensorHubError):
    """A role of the benchmark failed or did not answer in time."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LabBenchParams(LabWorkload):
    """The workload (shared with the simulator) plus how the lab runs it."""

    progress: str = "events"
    """Who drives UCX in the trainer and readers (NixlConfig.progress)."""
    hub_on_trainer: bool = False
    """Run the hub on the trainer's host instead of its own host in the trainer's rack. There, every hub
    reply waits behind the bulk data in the trainer's NIC queue (tbf is one FIFO, up to 50 ms deep)."""
    broadcast: bool = True
    """standalone: also run the torch.distributed (gloo) broadcast baseline."""
    queue_ms: float = 50.0
    """Depth of every lab link's queue (``LabSpec.queue_ms``; every figure before had 50 ms)."""
    first_complete_reads: int = 0
    """The hub's ``PlannerConfig.first_complete_reads`` (0: None, the default plans)."""
    timeout_s: float = 300.0


class LabProcess:
    """One `modes_roles` role running as a process in a lab host; reads its JSON event lines with deadlines."""

    def __init__(self, lab: Lab, host: str, argv: list[str], name: str):
        self._watch(lab.host(host).popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), name)

    @classmethod
    def on_this_host(cls, argv: list[str], name: str, env: dict[str, str]) -> LabProcess:
        """The role as a plain process of this host, outside any lab (``bench.reader_cpu``)."""
        role = cls.__new__(cls)
        role._watch(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **env}), name)
        return role

    def _watch(self, proc: subprocess.Popen, name: str) -> None:
        self.name, self.proc = name, proc
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._pending = b""
        """Bytes read from stdout but not yet a whole line. The pipe is read raw (os.read), never through
        Python's buffered readline: select() cannot see lines already sitting in that buffer."""

    def expect(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            line = self._next_line(deadline, f"no {event!r} within {timeout:.0f}s", event)
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # a library printed something; only our JSON lines count
            if msg.get("event") == "error":
                raise BenchError(f"{self.name}: {msg.get('error')}")
            if msg.get("event") == event:
                log.debug("%s: %s", self.name, event)
                return msg

    def _next_line(self, deadline: float, late: str, event: str) -> str:
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                raise BenchError(f"{self.name}: {late}")
            data = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not data:
                self.proc.wait(timeout=10)
                err = self.proc.stderr.read()[-1500:]
                raise BenchError(f"{self.name} exited (rc={self.proc.returncode}) before {event!r}: {err}")
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode(errors="replace")

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not exit within %.0fs after stop; terminating it", self.name, timeout)
            Lab._stop(self.proc)


class Phase:
    """One group of readers with its own go/stop files."""

    def __init__(self, lab: Lab, workdir: Path, name: str, hub_url: str, p: LabBenchParams):
        self.lab, self.name, self.hub_url, self.p = lab, name, hub_url, p
        self.dir = workdir / name
        self.dir.mkdir()
        self.stop_file = self.dir / "stop"
        self.readers: list[LabProcess] = []

    def add_reader(self, host: str, model: str, hold: bool = True) -> Path:
        i = len(self.readers)
        go = self.dir / f"go-{i}"
        h = self.lab.host(host)
        loc = ",".join(f"{k}={v}" for k, v in h.location.items())
        argv = [*_ROLES, "reader", "--hub", self.hub_url, "--worker", f"{self.name}-{i}", "--location", loc,
                "--model", model, "--window", str(self.p.window),
                "--progress", self.p.progress, "--go", str(go),
                "--stop", str(self.stop_file), "--timeout", str(self.p.timeout_s), *(["--hold"] if hold else [])]
        self.readers.append(LabProcess(self.lab, host, argv, f"{self.name}-{i}@{host}"))
        return go

    def ready(self) -> None:
        for r in self.readers:
            r.expect("ready", self.p.timeout_s)

    def collect(self, roles: list[LabProcess] | None = None) -> list[dict]:
        return [r.expect("fetched", self.p.timeout_s) for r in (roles or self.readers)]

    def stop(self) -> None:
        self.stop_file.touch()
        for r in self.readers:
            r.wait(60)


_TRACE = ("worker", "location", "window", "t0", "seconds", "sources", "timeline", "exchanges")
"""What `_summary` keeps of each reader's report: its timelines, for `bench.modes_gap`."""


def _summary(fetched: list[dict]) -> dict:
    secs = [f["seconds"] for f in fetched]
    sources: dict[str, int] = {}
    for f in fetched:
        for w, b in f["sources"].items():
            sources[w] = sources.get(w, 0) + b
    return {"total_s": sum(secs), "max_s": max(secs), "mean_s": statistics.fmean(secs), "seconds": secs,
            "cpu_s": [round(f.get("cpu_s", 0.0), 3) for f in fetched],
            "bytes_from": dict(sorted(sources.items())),
            "partial_source_bytes": sum(f["partial_source_bytes"] for f in fetched),
            "readers": [{k: f[k] for k in _TRACE if k in f} for f in fetched]}


def _spec(p: LabBenchParams, mode: str):
    spec, hosts = lab_spec(p, mode)
    return dataclasses.replace(spec, queue_ms=p.queue_ms), hosts


def start_control(lab: Lab, workdir: Path, p: LabBenchParams, copies: int) -> tuple[str, list[tuple[LabProcess, Path]]]:
    """Hub (lab host "hub") and trainer (lab host "trainer"). Returns the hub URL and (role, stop file) in
    stop order: the trainer first (its close() unpublishes through the hub), the hub last."""
    host = lab.host("trainer")
    hub_host = "trainer" if p.hub_on_trainer else "hub"
    ctl = Path(tempfile.mkdtemp(prefix="control-", dir=workdir))  # fresh stop files for every lab
    hub = LabProcess(lab, hub_host, [*_ROLES, "hub", "--host", lab.host(hub_host).ip, "--port", str(HUB_PORT),
                                "--stop", str(ctl / "hub-stop"), "--timeout", str(p.timeout_s * 4),
                                "--max-inflight-per-source", str(p.max_inflight_per_source),
                                "--first-complete-reads", str(p.first_complete_reads)], "hub")
    url = hub.expect("ready", 120)["url"]
    loc = ",".join(f"{k}={v}" for k, v in host.location.items())
    trainer = LabProcess(lab, "trainer", [*_ROLES, "trainer", "--hub", url, "--location", loc, "--size-mb", str(p.size_mb),
                                    "--chunk-mb", str(p.chunk_mb), "--private-copies", str(copies),
                                    "--progress", p.progress,
                                    "--stop", str(ctl / "trainer-stop"), "--timeout", str(p.timeout_s * 4)], "trainer")
    control = [(trainer, ctl / "trainer-stop"), (hub, ctl / "hub-stop")]
    try:
        trainer.expect("ready", 180)
    except BaseException:
        stop_control(control)
        raise
    return url, control


def stop_control(control: list[tuple[LabProcess, Path]]) -> None:
    for role, stop in control:
        stop.touch()
        role.wait(60)



def _ab(lab: Lab, workdir: Path, url: str, p: LabBenchParams, hosts: list[str], mode: str) -> dict:
    """TensorHub phase then pull-from-trainer phase, R readers starting together; WAN bytes of each."""
    out = {}
    for variant in ("tensorhub", "pull_from_trainer"):
        ph = Phase(lab, workdir, f"{mode}-{variant}", url, p)
        gos = [ph.add_reader(h, "policy" if variant == "tensorhub" else f"pull-{i}") for i, h in enumerate(hosts)]
        ph.ready()
        wan0 = lab.wan_tx_bytes()
        for go in gos:
            go.touch()
        try:
            out[variant] = _summary(ph.collect())
        finally:
            ph.stop()
        out[variant]["wan_bytes"] = lab.wan_tx_bytes() - wan0
    return out


def _broadcast(lab: Lab, workdir: Path, p: LabBenchParams, hosts: list[str]) -> dict:
    """torch.distributed broadcast (gloo) from rank 0 on the trainer host to one rank per rollout host."""
    d = Path(tempfile.mkdtemp(prefix="broadcast-", dir=workdir))
    go, stop = d / "go", d / "stop"
    master = f"{lab.host('trainer').ip}:{HUB_PORT + 1}"
    ranks = []
    try:
        for rank, host in enumerate(["trainer", *hosts]):
            argv = [*_ROLES, "bcast", "--master", master, "--rank", str(rank), "--world", str(len(hosts) + 1),
                    "--size-mb", str(p.size_mb), "--go", str(go), "--stop", str(stop), "--timeout", str(p.timeout_s)]
            ranks.append(LabProcess(lab, host, argv, f"bcast-{rank}@{host}"))
        for r in ranks:
            r.expect("ready", p.timeout_s)
        go.touch()
        fetched = [r.expect("fetched", p.timeout_s) for r in ranks]
    finally:
        stop.touch()
        for r in ranks:
            r.wait(60)
    return _summary(fetched[1:])  # rank 0 is the trainer: it waits too, but it is no rollout


def standalone_and_elastic(p: LabBenchParams, workdir: Path, modes: tuple[str, ...]) -> dict:
    spec, rollout_hosts = _spec(p, "standalone")  # elastic runs in the same lab
    with Lab(spec) as lab:
        url, control = start_control(lab, workdir, p, copies=max(p.rollouts, p.joiners))
        out = {}
        try:
            if "standalone" in modes:
                t0 = time.monotonic()
                runs = _ab(lab, workdir, url, p, rollout_hosts[: p.rollouts], "standalone")
                if p.broadcast:
                    runs["broadcast"] = _broadcast(lab, workdir, p, rollout_hosts[: p.rollouts])
                out["standalone"] = _result("standalone", runs, p)
                log.info("standalone done in %.0fs", time.monotonic() - t0)
            if "elastic" in modes:
                t0 = time.monotonic()
                runs = _elastic(lab, workdir, url, p, rollout_hosts)
                out["elastic"] = _result("elastic", runs, p, busy_flows=p.busy_flows)
                log.info("elastic done in %.0fs", time.monotonic() - t0)
        finally:
            stop_control(control)
    return out



def _elastic(lab: Lab, workdir: Path, url: str, p: LabBenchParams, hosts: list[str]) -> dict:
    holder_hosts, joiner_hosts = hosts[: p.holders], hosts[p.holders: p.holders + p.joiners]
    holders = Phase(lab, workdir, "elastic-holders", url, p)
    gos = [holders.add_reader(h, "policy") for h in holder_hosts]
    holders.ready()
    for go in gos:
        go.touch()
    holders.collect()
    busy = _busy_flows(lab, p)
    out = {}
    try:
        for variant in ("tensorhub", "pull_from_trainer"):
            ph = Phase(lab, workdir, f"elastic-{variant}", url, p)
            gos = [ph.add_reader(h, "policy" if variant == "tensorhub" else f"pull-{i}")
                   for i, h in enumerate(joiner_hosts)]
            ph.ready()
            for i, go in enumerate(gos):  # one by one, as replicas added to a running job
                if i:
                    time.sleep(p.join_interval_s)
                go.touch()
            try:
                out[variant] = _summary(ph.collect())
            finally:
                ph.stop()
    finally:
        for proc in busy:
            Lab._stop(proc)
        holders.stop()
    return out


def _busy_flows(lab: Lab, p: LabBenchParams) -> list[subprocess.Popen]:
    """Endless TCP flows trainer -> sink: the trainer's NIC is busy with training traffic."""
    procs = []
    sink = lab.host("sink")
    for i in range(p.busy_flows):
        port = HUB_PORT + 10 + i
        srv = sink.popen([*_PROBE, "serve", "--host", sink.ip, "--port", str(port), "--timeout", str(p.timeout_s * 4)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        snd = lab.host("trainer").popen([*_PROBE, "send", "--host", sink.ip, "--port", str(port), "--bytes",
                                         str(10 ** 13), "--timeout", str(p.timeout_s)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs += [snd, srv]
    return procs



def cross_dc(p: LabBenchParams, workdir: Path) -> dict:
    spec, rollout_hosts = _spec(p, "cross_dc")
    with Lab(spec) as lab:
        url, control = start_control(lab, workdir, p, copies=p.rollouts)
        try:
            runs = _ab(lab, workdir, url, p, rollout_hosts, "cross_dc")
        finally:
            stop_control(control)
    version = p.size_mb * (1 << 20)
    res = _result("cross_dc", runs, p)
    res["wan_bytes"] = {v: r["wan_bytes"] for v, r in runs.items()}
    res["wan_copies_per_version"] = {v: round(r["wan_bytes"] / version, 2) for v, r in runs.items()}
    return res


def _result(mode: str, runs: dict, p: LabBenchParams, **extra) -> dict:
    """The mode's JSON: totals (the stall summed over rollouts) and worst rollout, TensorHub vs each baseline."""
    th = runs["tensorhub"]
    bases = [v for v in runs if v != "tensorhub"]
    ideal = p.size_mb * (1 << 20) * 8 / ((p.wan_mbit if mode == "cross_dc" else p.nic_mbit) * 1e6)
    return {"metric": "join seconds summed over joiners" if mode == "elastic" else "stall seconds summed over rollouts",
            "readers": len(th["seconds"]),
            "tensorhub_s": round(th["total_s"], 3), "baseline_s": {v: round(runs[v]["total_s"], 3) for v in bases},
            "ratio": runs["pull_from_trainer"]["total_s"] / th["total_s"],
            "ratio_vs": {v: runs[v]["total_s"] / th["total_s"] for v in bases},
            "tensorhub_max_s": round(th["max_s"], 3), "baseline_max_s": {v: round(runs[v]["max_s"], 3) for v in bases},
            "ratio_max": runs["pull_from_trainer"]["max_s"] / th["max_s"],
            "ideal_one_reader_s": round(ideal, 3), "paper_ratio": PAPER[mode], "runs": runs, **extra}


def plot(result: dict, out_dir: Path) -> list[str]:
    """PNGs: the lab's modes, and time vs readers / vs model size (see tensorhub_dev.sim.plots)."""
    from tensorhub_dev.sim.plots import plot_all

    return plot_all(result, out_dir)


def run(p: LabBenchParams, modes: tuple[str, ...], plots: Path | None) -> dict:
    result: dict = {"bench": "modes", "params": asdict(p), "modes": {}}
    with tempfile.TemporaryDirectory(prefix="thl-bench-") as d:
        workdir = Path(d)
        if {"standalone", "elastic"} & set(modes):
            result["modes"].update(standalone_and_elastic(p, workdir, modes))
        if "cross_dc" in modes:
            result["modes"]["cross_dc"] = cross_dc(p, workdir)
    # The simulator on the same topologies and workload: its error against what was just measured.
    from tensorhub_dev.sim.calibrate import calibrate

    result["sim_vs_lab"] = calibrate(result)["rows"]
    if plots is not None:
        plots.mkdir(parents=True, exist_ok=True)
        result["plots"] = plot(result, plots)
    return result


def _yes_no(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tensorhub bench modes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="standalone,elastic,cross_dc")
    ap.add_argument("--plots", type=Path, help="write the PNGs here (lab modes, time vs readers and vs size)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    for name, default in asdict(LabBenchParams()).items():
        kind = _yes_no if isinstance(default, bool) else type(default)
        ap.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default)
    a = ap.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    modes = tuple(m for m in a.modes.split(",") if m)
    unknown = set(modes) - set(PAPER)
    try:
        if unknown:
            raise ConfigError(f"unknown mode(s) {sorted(unknown)}; choose from {sorted(PAPER)}")
        params = LabBenchParams(**{k: getattr(a, k) for k in asdict(LabBenchParams())})
        result = run(params, modes, a.plots)
    except (NetlabError, TensorHubError) as e:
        print(json.dumps({"bench": "modes", "error": type(e).__name__, "message": str(e)}))
        return 2
    if not a.json:
        for mode, r in result["modes"].items():
            bases = "  ".join(f"{v} {t:7.2f}s ({r['ratio_vs'][v]:4.1f}x)" for v, t in r["baseline_s"].items())
            print(f"{mode:<11} total stall: tensorhub {r['tensorhub_s']:7.2f}s  {bases}  "
                  f"(worst rollout {r['ratio_max']:4.1f}x; paper {r['paper_ratio']}x)")
    text = json.dumps(result)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
