"""`tensorhub bench modes --json`: the paper's three rollout modes on real processes in the network lab.

Every process (hub, trainer, readers) runs in its own lab host (network namespace, shaped veth, UCX over
TCP), and each mode runs TensorHub and its baseline side by side in one lab:

- standalone: R readers fetch `policy` v1 at once (TensorHub) vs each fetches its own `pull-<i>` v1, a
  model only the trainer holds (every reader pulls everything from the trainer, same transport and client),
  vs a torch.distributed broadcast (gloo over the same shaped NICs; the group is formed before the clock starts).
- elastic: H readers hold v1; J joiners start one by one while the trainer's NIC carries `busy_flows`
  endless TCP flows (training traffic); TensorHub joiners read from peers, baseline joiners from the trainer.
- cross_dc: trainer in dc0, R readers in dc1 behind the WAN; stall and WAN bytes per version.

With ``--delta`` (standalone and cross_dc): an update from v1 to v2, the change drawn from the delta profile
measured on real AdamW steps at ``--delta-lr`` (``bench.delta_profile``; bf16 versions of ``--size-mb``). Every
reader starts holding v1 (fetched before the clock starts, with the lab's links unshaped; a delta reader digests
it as its next base during a generation of ``--generation-s``, the links shaped again) and times its update to v2, four ways side by side:
``tensorhub`` (TensorHub with deltas: nearest holder of the delta, one WAN copy per datacenter),
``pull_from_trainer`` (a: every rollout pulls v2 in full from the trainer), ``delta_from_trainer`` (b: every
rollout pulls the delta from the trainer, the shape of verl's ``delta_sharded``) and ``tensorhub_full`` (c:
TensorHub with v2 in full). The JSON adds the encoded delta's bytes, the WAN bytes against it, and the goals.

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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from tensorhub_verl.bench.control import cpu_seconds
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
    delta: bool = False
    """Time an update v1 -> v2 with deltas against its baselines (standalone and cross_dc; module doc)."""
    delta_lr: float = 1e-6
    """With ``delta``: the learning rate whose measured delta profile draws v2 from v1 (1e-6 or 1e-5)."""
    delta_variants: str = ",".join(("tensorhub", "tensorhub_full", "pull_from_trainer", "delta_from_trainer"))
    """With ``delta``: the variants to run (comma-separated; ``tensorhub`` always runs): fewer for a quicker look,
    with the goals of the baselines left out unreported."""
    generation_s: float = 5.0
    """With ``delta``: seconds between every reader holding v1 and the update, the rollouts' generation: each
    reader digests the v1 it holds as the base of its next delta in that time (``base_digests_ahead``)."""
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

    def cpu_s(self) -> float:
        """CPU seconds (user + system, every thread) the role's process has used so far; 0.0 once it is gone."""
        try:
            return cpu_seconds(psutil.Process(self.proc.pid))
        except psutil.NoSuchProcess:
            return 0.0

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

    def add_reader(self, host: str, model: str, hold: bool = True, delta: str | None = None,
                   base_model: str | None = None) -> Path:
        i = len(self.readers)
        go = self.dir / f"go-{i}"
        h = self.lab.host(host)
        loc = ",".join(f"{k}={v}" for k, v in h.location.items())
        argv = [*_ROLES, "reader", "--hub", self.hub_url, "--worker", f"{self.name}-{i}", "--location", loc,
                "--model", model, "--window", str(self.p.window),
                "--progress", self.p.progress, "--go", str(go),
                "--stop", str(self.stop_file), "--timeout", str(self.p.timeout_s), *(["--hold"] if hold else []),
                *(["--delta", delta, "--base-model", base_model or model] if delta else [])]
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
    out = {"total_s": sum(secs), "max_s": max(secs), "mean_s": statistics.fmean(secs), "seconds": secs,
            "cpu_s": [round(f.get("cpu_s", 0.0), 3) for f in fetched],
            "bytes_from": dict(sorted(sources.items())),
            "partial_source_bytes": sum(f["partial_source_bytes"] for f in fetched),
            "readers": [{k: f[k] for k in _TRACE if k in f} for f in fetched]}
    deltas = [f["delta"] for f in fetched if "delta" in f]
    if deltas:
        out["delta"] = {"used": sum(d["used"] for d in deltas), "readers": len(deltas),
                        "delta_bytes": sum(d["delta_bytes"] for d in deltas),
                        "fallback_chunks": sum(d["fallback_chunks"] for d in deltas),
                        "apply_s": [d["apply_s"] for d in deltas],
                        "apply_after_wire_s": [d["apply_after_wire_s"] for d in deltas],
                        "base_ahead": [d.get("base_ahead", 0) for d in deltas],
                        "base_pass_ahead": [d.get("base_pass_ahead", False) for d in deltas],
                        "landed_digests": [d.get("landed_digests", 0) for d in deltas],
                        "transfer_total_s": sum(f["seconds"] - d["apply_after_wire_s"]
                                                for f, d in zip(fetched, deltas)),
                        "reasons": sorted({r for d in deltas for r in d["reasons"]})[:4]}
    return out


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
                                    "--progress", p.progress, "--delta-lr", str(p.delta_lr if p.delta else 0),
                                    "--stop", str(ctl / "trainer-stop"), "--timeout", str(p.timeout_s * 4)], "trainer")
    control = [(trainer, ctl / "trainer-stop"), (hub, ctl / "hub-stop")]
    try:
        trainer.ready_event = trainer.expect("ready", 180 + (60 * (copies + 1) * p.size_mb / 256 if p.delta else 0))
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


DELTA_VARIANTS = ("tensorhub", "tensorhub_full", "pull_from_trainer", "delta_from_trainer")
"""With ``--delta``: (model, base model, fetch's delta mode) of each variant's readers, ``{i}`` the reader."""
_DELTA_READS = {"tensorhub": ("policy", "policy", "auto"), "tensorhub_full": ("policy", "policy", "off"),
                "pull_from_trainer": ("pull-{i}", "policy", "off"),
                "delta_from_trainer": ("pull-{i}", "pull-{i}", "auto")}
"""A delta reader holds its own model's v1 (from the trainer, untimed), so that it digests its base during the
generation as TensorHub's readers do; a full reader needs no base and takes v1's bytes from ``policy``."""


def _ab_delta(lab: Lab, workdir: Path, url: str, p: LabBenchParams, hosts: list[str], mode: str,
              control: list[tuple[LabProcess, Path]]) -> dict:
    """Every variant of ``DELTA_VARIANTS`` in turn, R readers holding v1 starting together; WAN bytes of each
    update (into each datacenter) while it ran, and the CPU seconds the hub and the trainer spent on it (go ->
    every reader's fetch returned): beside the readers' own (``cpu_s``), what the update asked of the lab's
    cores."""
    out = {}
    chosen = {"tensorhub", *p.delta_variants.split(",")}
    unknown = chosen - set(DELTA_VARIANTS)
    if unknown:
        raise ConfigError(f"unknown --delta-variants {sorted(unknown)}; choose from {DELTA_VARIANTS}")
    for variant in (v for v in DELTA_VARIANTS if v in chosen):
        model, base, delta = _DELTA_READS[variant]
        ph = Phase(lab, workdir, f"{mode}-{variant}", url, p)
        with lab.unshaped():  # every reader's v1, untimed, at the hosts' own speed instead of the shaped links'
            gos = [ph.add_reader(h, model.format(i=i), delta=delta, base_model=base.format(i=i))
                   for i, h in enumerate(hosts)]
            ph.ready()
        time.sleep(p.generation_s)
        wan0 = lab.wan_tx_bytes_by_dc()
        cpu0 = {role.name: role.cpu_s() for role, _ in control}
        t0 = time.monotonic()
        for go in gos:
            go.touch()
        try:
            fetched = ph.collect()
            wall = time.monotonic() - t0
            out[variant] = _summary(fetched)
            out[variant]["control_cpu_s"] = {role.name: round(role.cpu_s() - cpu0[role.name], 3)
                                             for role, _ in control}
            out[variant]["update_wall_s"] = round(wall, 3)
        finally:
            ph.stop()
        wan1 = lab.wan_tx_bytes_by_dc()
        out[variant]["wan_bytes_into"] = {dc: wan1[dc] - wan0[dc] for dc in wan1}
        out[variant]["wan_bytes"] = sum(out[variant]["wan_bytes_into"].values())
        log.info("%s %s: stall %.2f s summed over %d readers", mode, variant, out[variant]["total_s"], len(hosts))
    return out


DELTA_GOALS = {"cross_dc": {"pull_from_trainer": 19.0, "delta_from_trainer": 4.0},
               "standalone": {"delta_from_trainer": 2.0}}
"""With ``--delta``: how many times lower than each baseline TensorHub's summed stall should be."""
WAN_OVER_DELTA_GOAL = 1.05
"""With ``--delta``, cross_dc: the WAN bytes of one update over the encoded delta's bytes."""


def _transfer(run: dict) -> float:
    """A variant's stall summed over readers less the time their apply of a delta (decode, write and the digest
    checks, on the readers' CPUs) went on after its last byte landed: the part that the network and the plan
    set (the rest of the apply overlaps the wire)."""
    return run["delta"]["transfer_total_s"] if "delta" in run else run["total_s"]


def _delta_extra(mode: str, runs: dict, trainer: dict, readers_dc: str | None) -> dict:
    """The encoded delta, the WAN bytes per update against it, and each goal met or not."""
    delta_bytes = trainer["delta_bytes"]
    th = runs["tensorhub"]
    extra = {"delta": {"bytes": delta_bytes, "version_bytes": trainer["bytes"], "lr": trainer["lr"],
                       "changed_fraction": round(trainer["changed_fraction"], 5), "encodings": trainer["encodings"],
                       "encode_s": trainer["encode_s"]},
             "goals": {f"vs_{v}": {"goal": g, "ratio": round(runs[v]["total_s"] / th["total_s"], 2),
                                   "met": runs[v]["total_s"] / th["total_s"] >= g,
                                   "ratio_without_apply": round(_transfer(runs[v]) / _transfer(th), 2)}
                       for v, g in DELTA_GOALS[mode].items() if v in runs},
             "transfer_s": {v: round(_transfer(r), 3) for v, r in runs.items()}}
    if readers_dc is not None:
        into = {v: r["wan_bytes_into"].get(readers_dc, 0) for v, r in runs.items()}
        extra["wan_bytes_into_readers_dc"] = into
        extra["wan_over_delta"] = {v: round(b / delta_bytes, 3) for v, b in into.items()}
        ratio = into["tensorhub"] / delta_bytes
        extra["goals"]["wan_over_delta"] = {"goal": WAN_OVER_DELTA_GOAL, "ratio": round(ratio, 3),
                                            "both_ways": round(th["wan_bytes"] / delta_bytes, 3),
                                            "met": ratio <= WAN_OVER_DELTA_GOAL}
    return extra


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
                if p.delta:
                    runs = _ab_delta(lab, workdir, url, p, rollout_hosts[: p.rollouts], "standalone", control)
                    out["standalone"] = _result("standalone", runs, p,
                                                **_delta_extra("standalone", runs, control[0][0].ready_event, None))
                else:
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
            runs = _ab_delta(lab, workdir, url, p, rollout_hosts, "cross_dc", control) if p.delta else \
                _ab(lab, workdir, url, p, rollout_hosts, "cross_dc")
        finally:
            stop_control(control)
    version = p.size_mb * (1 << 20)
    extra = _delta_extra("cross_dc", runs, control[0][0].ready_event, lab.host(rollout_hosts[0]).location["dc"]) \
        if p.delta else {}
    res = _result("cross_dc", runs, p, **extra)
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
            "ratio": runs["pull_from_trainer"]["total_s"] / th["total_s"] if "pull_from_trainer" in runs else None,
            "ratio_vs": {v: runs[v]["total_s"] / th["total_s"] for v in bases},
            "tensorhub_max_s": round(th["max_s"], 3), "baseline_max_s": {v: round(runs[v]["max_s"], 3) for v in bases},
            "ratio_max": runs["pull_from_trainer"]["max_s"] / th["max_s"] if "pull_from_trainer" in runs else None,
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
    if p.delta:
        return result  # the simulator's calibration and the plots compare full versions
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
    ap.add_argument("--modes", default=None,
                    help="default standalone,elastic,cross_dc (with --delta: standalone,cross_dc)")
    ap.add_argument("--plots", type=Path, help="write the PNGs here (lab modes, time vs readers and vs size)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    for name, default in asdict(LabBenchParams()).items():
        kind = _yes_no if isinstance(default, bool) else type(default)
        ap.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default,
                        **({"nargs": "?", "const": True} if isinstance(default, bool) else {}))
    a = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, through `with Lab(...)`: a stopped run takes its namespaces and roles down.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    modes = tuple(m for m in (a.modes or ("standalone,cross_dc" if a.delta else "standalone,elastic,cross_dc"))
                  .split(",") if m)
    unknown = set(modes) - set(PAPER)
    try:
        if unknown:
            raise ConfigError(f"unknown mode(s) {sorted(unknown)}; choose from {sorted(PAPER)}")
        if a.delta and "elastic" in modes:
            raise ConfigError("--delta runs standalone and cross_dc (a joiner holds no v1: it reads in full); "
                              "drop elastic from --modes")
        params = LabBenchParams(**{k: getattr(a, k) for k in asdict(LabBenchParams())})
        result = run(params, modes, a.plots)
    except (NetlabError, TensorHubError) as e:
        print(json.dumps({"bench": "modes", "error": type(e).__name__, "message": str(e)}))
        return 2
    if not a.json:
        for mode, r in result["modes"].items():
            bases = "  ".join(f"{v} {t:7.2f}s ({r['ratio_vs'][v]:4.1f}x)" for v, t in r["baseline_s"].items())
            print(f"{mode:<11} total stall: tensorhub {r['tensorhub_s']:7.2f}s  {bases}  "
                  + (f"(worst rollout {r['ratio_max']:4.1f}x; paper {r['paper_ratio']}x)" if r["ratio_max"] else ""))
            if "goals" in r:
                d = r["delta"]
                print(f"{'':<11} delta {d['bytes'] / 1e6:.2f} MB of {d['version_bytes'] / 1e6:.1f} MB "
                      f"({100 * d['changed_fraction']:.2f}% changed, lr {d['lr']:g}); goals: " + "  ".join(
                          f"{k} {g['ratio']}x (goal {g['goal']}x: {'met' if g['met'] else 'not met'}"
                          + (f"; {g['ratio_without_apply']}x without the apply)" if "ratio_without_apply" in g
                             else ")")
                          for k, g in r["goals"].items()))
    text = json.dumps(result)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
