"""`tensorhub bench soak`: versions flow from a trainer to readers that join and leave while faults strike.

Real processes and a real HTTP hub: a trainer publishes ``--versions`` versions; each version is fetched in
two waves by the ``--readers`` reader processes (the second wave reads from the first as well as from the
trainer), and on a seeded share of versions one fault strikes:

    holder_kill         SIGKILL a first-wave reader while the second wave reads the version it holds
    holder_stop         SIGSTOP one the same way, SIGCONT after 0.5-1.5 worker timeouts
    reader_kill         SIGKILL a second-wave reader mid-fetch (retried on the next version if it had finished)
    hub_restart         SIGKILL the hub mid-version and start a new instance at the same URL
    bad_peer_garbage    an impostor registers unusable NIXL metadata and claims the version
    bad_peer_tamper     a holder publishes the version's bytes, then changes them

Readers also leave and new ones join (``--churn``); killed readers are replaced. A quarter of the first
readers are spared by faults and churn, so that their memory is measured over the whole run. Every reader checks every
byte it fetched against the version's expected content (a pure function of seed and version): a mismatch
is a torn read. Every fetch has a timeout, and the orchestrator waits for each answer with a bound: a
reader that does not answer is a hang. Reports versions delivered, faults injected and survived, torn
reads, hangs, failed fetches, and RSS at start and end of the hub, the trainer and the long-lived readers.
Exit status 0 when there was no torn read and no hang. Last line printed: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field

from tensorhub_dev.bench import soak_roles
from tensorhub_verl.bench.hub_proc import HubProcess, rss_bytes
from tensorhub_verl.bench.procs import Role
from tensorhub_verl.errors import ConfigError

log = logging.getLogger("tensorhub_dev.bench.soak")

FAULTS = ("holder_kill", "holder_stop", "reader_kill", "hub_restart", "bad_peer_garbage", "bad_peer_tamper")
_PRE_FETCH = ("bad_peer_garbage", "bad_peer_tamper")
_START_S = 180.0
"""Limit for a role process to start (imports torch and NIXL: seconds, more on a loaded host)."""
_ANSWER_GRACE_S = 30.0
"""How much longer than its fetch timeout a reader may take to answer before it counts as hung."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakConfig:
    versions: int = 200
    """Versions the trainer publishes (version 1 is a warm-up: no fault)."""
    readers: int = 8
    """Reader processes kept alive (killed ones are replaced)."""
    seconds: float = 900.0
    """No new version is published after this long; the run then winds down."""
    seed: int = 0
    fault_rate: float = 0.5
    """Share of versions on which a fault strikes (at least one of each kind when there are enough)."""
    churn: float = 0.05
    """Chance per version that an idle reader leaves and a new one joins."""
    size_mb: float = 2.0
    """Size of a version."""
    chunk_kb: int = 64
    worker_timeout_s: float = 5.0
    fetch_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.versions < 2 or self.readers < 2:
            raise ConfigError(f"a soak needs >= 2 versions and >= 2 readers, got {self.versions}, {self.readers}")
        if not 0 <= self.fault_rate <= 1 or not 0 <= self.churn <= 1:
            raise ConfigError(f"fault_rate and churn are probabilities, got {self.fault_rate}, {self.churn}")
        if self.seconds <= 0 or self.size_mb <= 0 or self.fetch_timeout_s <= 0:
            raise ConfigError("seconds, size_mb and fetch_timeout_s must be > 0")


def plan_faults(versions: int, rate: float, rng: random.Random) -> dict[int, str]:
    """Which fault strikes which version: ``rate`` of versions 2..N (at least one of each kind when there is
    room), kinds dealt in shuffled rounds. The first round opens with a hub restart and a reader kill (which
    is tried again on later versions when its victim finished first), so a short run has them all. Hub
    restarts only strike the first half: the last hub instance lives through half of the run at least,
    and its memory growth is measured over that."""
    slots = list(range(2, versions + 1))
    half = (versions + 1) // 2
    count = min(len(slots), max(round(rate * len(slots)), len(FAULTS) if rate > 0 else 0))
    if count == 0:
        return {}
    chosen = sorted(rng.sample(slots, count))
    if chosen[0] > half:
        chosen[0] = rng.choice([v for v in slots if v <= half and v not in chosen])
        chosen.sort()
    opening = ["hub_restart", "reader_kill"]
    deck = opening + rng.sample([k for k in FAULTS if k not in opening], len(FAULTS) - len(opening))
    plan: dict[int, str] = {}
    for v in chosen:
        if not deck:
            deck = rng.sample(FAULTS, len(FAULTS))
        kind = deck.pop(0)
        if kind == "hub_restart" and v > half:
            kind = deck.pop(0) if deck else rng.choice([k for k in FAULTS if k != "hub_restart"])
        plan[v] = kind
    return plan


@dataclass(slots=True)
class _Reader:
    name: str
    role: Role
    pid: int | None = None
    frozen_until: float = 0.0
    rss_start: int | None = None
    first_version: int | None = None
    keep: bool = False
    """Spared by faults and churn: it lives through the whole run, so its memory growth is measured."""


@dataclass(slots=True)
class _Report:
    fetches: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0, "torn": 0, "hung": 0})
    delivered: set[int] = field(default_factory=set)
    injected: dict[str, int] = field(default_factory=dict)
    survived: dict[str, int] = field(default_factory=dict)
    fault_log: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    version_seconds: dict[str, list[float]] = field(default_factory=dict)
    """Seconds from publish to the last fetch of each version, by the fault that struck it (``none``)."""


class Soak:
    """One run. ``run()`` returns the report; every process it started is gone when it returns."""

    def __init__(self, config: SoakConfig, workdir: str | None = None):
        self.c = config
        self.rng = random.Random(config.seed)
        self.plan = plan_faults(config.versions, config.fault_rate, self.rng)
        if workdir:
            os.makedirs(workdir, exist_ok=True)
        hub_log = os.path.join(workdir, "hub.log") if workdir else None
        self.hub = HubProcess(args=("--worker-timeout", str(config.worker_timeout_s), "--keep-versions", "2"),
                              stderr_path=hub_log)
        self.readers: dict[str, _Reader] = {}
        self.joining: list[_Reader] = []
        self.names = (f"reader-{i}" for i in range(10**9))
        self.report = _Report()
        self.pending: list[str] = []
        """Faults that could not strike their version (no victim, or it had finished): tried on the next."""
        self.hub_rss: dict = {}
        self._timers: list[threading.Timer] = []

    # ------------------------------------------------------------------------------------------- run
    def run(self) -> dict:
        started = time.monotonic()
        self.hub.start()
        chunk = self.c.chunk_kb << 10
        self.trainer = Role(soak_roles.trainer, self.hub.url, self.c.seed, self.c.size_mb, chunk)
        self.tamperer = Role(soak_roles.tamperer, self.hub.url, self.c.seed, self.c.size_mb, chunk)
        try:
            trainer_pid = self.trainer.result(_START_S)["pid"]
            self.tamperer.result(_START_S)
            for i in range(self.c.readers):
                self._join(keep=i < max(1, self.c.readers // 4))
            self._admit(wait=True)
            published, trainer_rss = 0, None
            for version in range(1, self.c.versions + 1):
                if time.monotonic() - started > self.c.seconds:
                    log.warning("time is up after %d versions", published)
                    break
                self._version(version)
                published = version
                if version == 1:
                    trainer_rss = rss_bytes(trainer_pid)
                if self.hub_rss.get("pid") != self.hub.pid:  # after the first version of each hub instance
                    self._note_hub_rss(start=True, version=version)
            report = self._summary(published, time.monotonic() - started, trainer_pid, trainer_rss)
        finally:
            self._teardown()
        return report

    def _version(self, version: int) -> None:
        began = time.monotonic()
        fault = self.plan.get(version)
        if fault is None and self.pending:
            fault = self.pending.pop(0)  # a fault that found no victim last time: try again
        self._call(self.trainer, ("publish", version), "published")
        victims: set[str] = set()
        entry = {"version": version, "fault": fault}
        if fault in _PRE_FETCH:
            self._bad_peer(fault, version)
        self._admit()
        ready = [r for r in self.readers.values() if r.frozen_until <= time.monotonic()]
        if len(ready) < 2:  # most were killed or frozen: wait for the replacements
            self._admit(wait=True)
            ready = [r for r in self.readers.values() if r.frozen_until <= time.monotonic()]
        # Spared readers go last, into the second wave: both waves keep victims for the faults.
        spared = [r for r in ready if r.keep]
        ready = [r for r in ready if not r.keep]
        self.rng.shuffle(ready)
        split = max(1, (len(ready) + 1) // 2)
        first, second = ready[:split], ready[split:] + spared
        outcomes = self._wave(first, version)
        for r in second:
            r.role.send(("fetch", version))
        if fault is not None and fault not in _PRE_FETCH:
            victims = self._strike(fault, version, first, second, entry)
        outcomes += self._collect(second, version, victims)
        self._churn()
        entry["seconds"] = round(time.monotonic() - began, 2)
        log.info("v%d: %s, %s in %.2f s", version, fault or "no fault", outcomes, entry["seconds"])
        if version > 1:  # version 1 is the warm-up
            kind = fault if fault is not None and entry.get("injected", True) else "none"
            self.report.version_seconds.setdefault(kind, []).append(entry["seconds"])
        if fault is not None and entry.get("injected", True):
            bad = [o for o in outcomes if o != "ok"]
            self.report.injected[fault] = self.report.injected.get(fault, 0) + 1
            if not bad:
                self.report.survived[fault] = self.report.survived.get(fault, 0) + 1
            entry.update(injected=True, survived=not bad, fetches=len(outcomes))
            self.report.fault_log.append(entry)

    # ---------------------------------------------------------------------------------------- faults
    def _bad_peer(self, fault: str, version: int) -> None:
        if fault == "bad_peer_garbage":
            soak_roles.impostor(self.hub.url, f"garbage-{version}", os.urandom(300), version)
        else:
            self._call(self.tamperer, ("tamper", version), "tampered")

    def _strike(self, fault: str, version: int, first: list[_Reader], second: list[_Reader], entry: dict) -> set[str]:
        time.sleep(self.rng.uniform(0.0, 0.02))  # somewhere in the second wave's fetches
        if fault == "hub_restart":
            self.hub.kill()
            self.hub.start()
            return set()
        if fault == "reader_kill":
            return self._kill_mid_fetch(second, entry)
        candidates = [r for r in first if not r.keep]
        if not candidates:
            self.pending.append(fault)
            entry["injected"] = False
            return set()
        victim = self.rng.choice(candidates)
        if fault == "holder_kill":
            self._kill(victim)
        else:
            pause = self.rng.uniform(0.5, 1.5) * self.c.worker_timeout_s
            os.kill(victim.pid, signal.SIGSTOP)
            victim.frozen_until = time.monotonic() + pause
            timer = threading.Timer(pause, _resume, (victim.pid,))
            timer.daemon = True
            timer.start()
            self._timers.append(timer)
            entry["frozen_s"] = round(pause, 2)
        entry["victim"] = victim.name
        return set()

    def _kill_mid_fetch(self, second: list[_Reader], entry: dict) -> set[str]:
        candidates = [r for r in second if not r.keep]
        if not candidates:
            self.pending.append("reader_kill")
            entry["injected"] = False
            return set()
        victim = self.rng.choice(candidates)
        event = victim.role.result(self.c.fetch_timeout_s)
        if event["event"] != "started":
            raise RuntimeError(f"{victim.name} answered {event} before starting its fetch")
        os.kill(victim.pid, signal.SIGKILL)
        try:
            done = victim.role.queue.get(timeout=0.5)  # it finished before the kill landed?
        except queue.Empty:
            done = None
        self._forget(victim)
        entry["victim"] = victim.name
        entry["injected"] = done is None
        if done is not None:
            self.pending.append("reader_kill")
            self._record(done[1])  # not mid-fetch after all: its fetch counts, the fault is tried again
        return {victim.name}

    def _kill(self, reader: _Reader) -> None:
        try:
            os.kill(reader.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._forget(reader)

    def _forget(self, reader: _Reader) -> None:
        reader.role.process.join(10)
        self.readers.pop(reader.name, None)
        self._join()  # a replacement joins

    # --------------------------------------------------------------------------------------- readers
    def _join(self, keep: bool = False) -> None:
        name = next(self.names)
        role = Role(soak_roles.reader, self.hub.url, name, self.c.seed, self.c.size_mb, self.c.fetch_timeout_s)
        self.joining.append(_Reader(name, role, keep=keep))

    def _admit(self, wait: bool = False) -> None:
        """Readers that finished starting join the swarm (without waiting for the slow ones, unless told)."""
        for r in list(self.joining):
            try:
                event = r.role.result(_START_S if wait else 0.001)
            except TimeoutError:
                continue
            r.pid = event["pid"]
            self.joining.remove(r)
            self.readers[r.name] = r

    def _churn(self) -> None:
        idle = [r for r in self.readers.values() if r.frozen_until <= time.monotonic() and not r.keep]
        if idle and self.rng.random() < self.c.churn:
            leaving = self.rng.choice(idle)
            leaving.role.send("stop")  # close(): unpublishes what it holds, says goodbye
            self.readers.pop(leaving.name)
            threading.Thread(target=leaving.role.stop, args=(30,), daemon=True).start()
            self._join()

    def _wave(self, readers: list[_Reader], version: int) -> list[str]:
        for r in readers:
            r.role.send(("fetch", version))
        return self._collect(readers, version, set())

    def _collect(self, readers: list[_Reader], version: int, victims: set[str]) -> list[str]:
        deadline = time.monotonic() + self.c.fetch_timeout_s + _ANSWER_GRACE_S
        outcomes = []
        for r in readers:
            if r.name in victims or r.name not in self.readers:
                continue  # killed on purpose
            try:
                while (event := r.role.result(max(0.001, deadline - time.monotonic())))["event"] != "fetched":
                    pass
            except (TimeoutError, RuntimeError) as e:  # no answer in time, or the process died
                outcome = "hung" if isinstance(e, TimeoutError) else "failed"
                self.report.fetches[outcome] += 1
                self.report.errors.append(f"v{version} {r.name}: {e}"[:300])
                outcomes.append(outcome)
                self._kill(r)
                continue
            outcomes.append(self._record(event))
            if r.rss_start is None and event["ok"]:
                r.rss_start, r.first_version = rss_bytes(r.pid), version
        return outcomes

    def _record(self, event: dict) -> str:
        outcome = "torn" if event["torn"] else "ok" if event["ok"] else "failed"
        self.report.fetches[outcome] += 1
        if outcome == "ok":
            self.report.delivered.add(event["version"])
            self.report.seconds.append(event["seconds"])
        elif outcome == "failed":
            self.report.errors.append(f"v{event['version']}: {event.get('error')}")
        return outcome

    # ------------------------------------------------------------------------------------------ misc
    def _call(self, role: Role, command: tuple, event: str) -> dict:
        role.send(command)
        answer = role.result(self.c.fetch_timeout_s + _ANSWER_GRACE_S)
        if answer["event"] != event:
            raise RuntimeError(f"expected {event!r}, got {answer}")
        return answer

    def _note_hub_rss(self, start: bool, version: int) -> None:
        rss = rss_bytes(self.hub.pid)
        if start:
            self.hub_rss = {"pid": self.hub.pid, "start": rss, "from_version": version}
        else:
            self.hub_rss["end"] = rss

    def _summary(self, published: int, seconds: float, trainer_pid: int, trainer_rss: int | None) -> dict:
        rep = self.report
        self._note_hub_rss(start=False, version=published)
        memory = {"hub": _growth(self.hub_rss.get("start"), self.hub_rss.get("end"),
                                 published - self.hub_rss.get("from_version", 1) + 1),
                  "trainer": _growth(trainer_rss, rss_bytes(trainer_pid), published)}
        for r in sorted(self.readers.values(), key=lambda r: r.name):
            if r.first_version is not None and (r.keep or published - r.first_version + 1 >= published // 2):
                memory[r.name] = _growth(r.rss_start, rss_bytes(r.pid), published - r.first_version + 1)
        injected = sum(rep.injected.values())
        return {
            "soak": "ok" if rep.fetches["torn"] == 0 and rep.fetches["hung"] == 0 else "failed",
            "seed": self.c.seed, "versions_requested": self.c.versions, "versions_published": published,
            "versions_delivered": len(rep.delivered), "readers": self.c.readers, "seconds": round(seconds, 1),
            "fetches": dict(rep.fetches), "torn_reads": rep.fetches["torn"], "hangs": rep.fetches["hung"],
            "faults_injected": injected, "faults_survived": sum(rep.survived.values()),
            "injected": dict(sorted(rep.injected.items())), "survived": dict(sorted(rep.survived.items())),
            "fetch_p50_s": round(statistics.median(rep.seconds), 3) if rep.seconds else None,
            "fetch_max_s": max(rep.seconds, default=None), "memory_mb": memory,
            "time_lost_per_fault_s": _time_lost(rep.version_seconds),
            "fault_log": rep.fault_log, "errors": rep.errors[:20],
        }

    def _teardown(self) -> None:
        for timer in self._timers:
            timer.cancel()
        everyone = [self.trainer, self.tamperer, *(r.role for r in self.readers.values()),
                    *(r.role for r in self.joining)]
        for r in self.readers.values():
            if r.pid is not None:
                _resume(r.pid)
        for role in everyone:
            try:
                role.send("stop")
            except (OSError, ValueError):
                pass
        for role in everyone:
            role.stop(timeout=30)
        self.hub.stop()


def _resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _time_lost(seconds: dict[str, list[float]]) -> dict:
    """Per fault kind: the median seconds of a version it struck minus the median of a fault-free version."""
    if not seconds.get("none"):
        return {}
    clean = statistics.median(seconds["none"])
    lost = {kind: round(statistics.median(s) - clean, 2) for kind, s in sorted(seconds.items()) if kind != "none"}
    return {"fault_free_version_p50_s": round(clean, 2), **lost}


def _growth(start: int | None, end: int | None, versions: int) -> dict:
    mb = lambda b: None if b is None else round(b / 2**20, 1)  # noqa: E731
    return {"rss_start_mb": mb(start), "rss_end_mb": mb(end), "versions": versions,
            "growth_mb": None if start is None or end is None else mb(end - start)}


def format_summary(r: dict) -> str:
    lines = [f"soak {r['soak']}: {r['versions_delivered']}/{r['versions_published']} versions delivered "
             f"({r['versions_requested']} requested) to {r['readers']} readers in {r['seconds']} s (seed {r['seed']})",
             f"fetches: {r['fetches']}; fetch p50 {r['fetch_p50_s']} s, max {r['fetch_max_s']} s",
             f"faults: {r['faults_injected']} injected, {r['faults_survived']} survived"]
    for kind in FAULTS:
        lines.append(f"  {kind:<18} injected {r['injected'].get(kind, 0):>3}  survived {r['survived'].get(kind, 0):>3}")
    lines.append(f"torn reads: {r['torn_reads']}   hangs: {r['hangs']}")
    lost = dict(r["time_lost_per_fault_s"])
    if lost:
        clean = lost.pop("fault_free_version_p50_s")
        lines.append(f"time lost per fault (median version with it, minus {clean} s without): "
                     + ", ".join(f"{k} {v:+} s" for k, v in lost.items()))
    lines.append("memory (RSS MB, start -> end over versions):")
    for proc, m in r["memory_mb"].items():
        lines.append(f"  {proc:<12} {m['rss_start_mb']} -> {m['rss_end_mb']} ({m['growth_mb']:+} MB over "
                     f"{m['versions']} versions)" if m["growth_mb"] is not None else f"  {proc:<12} {m}")
    lines += [f"  error: {e}" for e in r["errors"][:5]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorhub bench soak", description=__doc__.splitlines()[0])
    defaults = SoakConfig()
    parser.add_argument("--versions", type=int, default=defaults.versions)
    parser.add_argument("--readers", type=int, default=defaults.readers)
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="no new version after this long")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--fault-rate", type=float, default=defaults.fault_rate)
    parser.add_argument("--churn", type=float, default=defaults.churn)
    parser.add_argument("--size-mb", type=float, default=defaults.size_mb)
    parser.add_argument("--worker-timeout", type=float, default=defaults.worker_timeout_s)
    parser.add_argument("--fetch-timeout", type=float, default=defaults.fetch_timeout_s)
    parser.add_argument("--workdir", default=None, help="keep the hub's log here")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = SoakConfig(versions=args.versions, readers=args.readers, seconds=args.seconds, seed=args.seed,
                        fault_rate=args.fault_rate, churn=args.churn, size_mb=args.size_mb,
                        worker_timeout_s=args.worker_timeout, fetch_timeout_s=args.fetch_timeout)
    report = Soak(config, args.workdir).run()
    if not args.json:
        print(format_summary(report))
    print(json.dumps(report), flush=True)
    return 0 if report["soak"] == "ok" else 1
