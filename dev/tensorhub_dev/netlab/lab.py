"""Build an emulated cluster of network namespaces, run real processes in it, always tear it down.

    with Lab(LabSpec.uniform(dcs=2, hosts_per_rack=2, nic_mbit=200, wan_mbit=100)) as lab:
        srv = lab.host("d1r0h0").popen([sys.executable, "-m", "...", "serve"])
        lab.host("d0r0h0").run([...], timeout=60)
        crossed = lab.wan_tx_bytes()

Invariants:
- Every name this lab creates starts with its prefix `thl-<creator pid>-<random>`; nothing else is touched.
- Addresses live in a private /16 and hosts route only that /16, so lab traffic cannot leave the lab.
- `close()` runs on every exit path (exception, KeyboardInterrupt, interpreter exit via atexit);
  `cleanup_stale()` removes labs whose creator died without closing.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tensorhub_dev.netlab import iproute
from tensorhub_dev.netlab.errors import NetlabError
from tensorhub_dev.netlab.spec import HostPlan, LabPlan, LabSpec, VethPlan, plan_lab, tbf_args

log = logging.getLogger("tensorhub_dev.netlab")

PREFIX_ROOT = "thl-"
HOST_IFACE = "eth0"
_TERM_GRACE_S = 5.0
_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "ftp_proxy"}


def new_prefix() -> str:
    """Unique per run; carries the creator's pid so `cleanup_stale` can tell live labs from leftovers."""
    return f"{PREFIX_ROOT}{os.getpid()}-{secrets.token_hex(2)}"


def wait_file(path: Path, timeout: float, poll_s: float = 0.02) -> None:
    """Waits for `path` to exist: how processes in a lab's hosts take orders (namespaces share the filesystem,
    not a network the orchestrator is on). Raises TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f}s")
        time.sleep(poll_s)


def ucx_env(iface: str = HOST_IFACE) -> dict[str, str]:
    """Force UCX onto TCP over the host's shaped veth, so bytes really cross the emulated links.
    (Shared memory would bypass the veths: every namespace shares this machine's memory.)"""
    return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": iface}


@dataclass(frozen=True, slots=True)
class Host:
    """One emulated machine: a network namespace with one shaped NIC `eth0`."""

    plan: HostPlan
    lab: "Lab"

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def ip(self) -> str:
        return self.plan.ip

    @property
    def netns(self) -> str:
        return self.plan.netns

    @property
    def location(self) -> dict[str, str]:
        return {"dc": self.plan.dc, "rack": self.plan.rack, "node": self.plan.name}

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        # Proxy settings point outside the lab, which is unreachable from inside: drop them.
        env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARS}
        env.update(ucx_env())
        if extra:
            env.update(extra)
        return env

    def popen(self, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start `argv` inside this host's namespace; the lab terminates it on close."""
        return self.lab._spawn(self.netns, list(argv), self.env(env), kwargs)

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run `argv` to completion inside this host (stdout/stderr captured as text)."""
        proc = self.popen(argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.lab._stop(proc)
            raise NetlabError(f"{argv[:3]}... on {self.name} timed out after {timeout:.0f}s") from e
        if check and proc.returncode != 0:
            raise NetlabError(f"{list(argv)[:4]}... on {self.name} failed rc={proc.returncode}: {err[-2000:]}")
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


class Lab:
    """An emulated cluster; use as a context manager (or call build()/close())."""

    def __init__(self, spec: LabSpec, prefix: str | None = None):
        self.spec = spec
        self.prefix = prefix or new_prefix()
        self.plan: LabPlan = plan_lab(spec, self.prefix)
        self._hosts = {h.name: Host(h, self) for h in self.plan.hosts}
        self._made: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._closed = False
        self._rates: dict[tuple[str, str], float] = {}
        """(namespace, interface) -> the Mbit/s its tbf shapes it to now."""

    # ---- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "Lab":
        return self.build()

    def __exit__(self, *exc) -> None:
        self.close()

    def build(self) -> "Lab":
        iproute.check_available()
        atexit.register(self.close)
        t0 = time.monotonic()
        try:
            self._build()
        except BaseException:
            # KeyboardInterrupt included: never leave half a lab behind.
            self.close()
            raise
        log.info("lab %s: %d namespaces, %d hosts built in %.1fs", self.prefix, len(self._made),
                 len(self._hosts), time.monotonic() - t0)
        return self

    def _build(self) -> None:
        p = self.plan
        for ns in p.namespaces:
            iproute.ip("netns", "add", ns)
            self._made.append(ns)
            iproute.ip("link", "set", "lo", "up", netns=ns)
            # IPv6 neighbour/MLD chatter would pollute the WAN byte counters.
            iproute.in_netns(ns, ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"])
        if p.router_ns:
            iproute.in_netns(p.router_ns, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        for ns, br in p.bridges:
            iproute.ip("link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0", netns=ns)
            iproute.ip("link", "set", br, "up", netns=ns)
        for v in p.veths:
            iproute.ip("link", "add", v.a_if, "type", "veth", "peer", "name", v.b_if, "netns", v.b_ns, netns=v.a_ns)
            for ns, ifname, mbit in ((v.a_ns, v.a_if, v.a_mbit), (v.b_ns, v.b_if, v.b_mbit)):
                if mbit is not None:
                    self._tbf(ns, ifname, mbit)
        for ns, ifname, br in p.ports:
            iproute.ip("link", "set", ifname, "master", br, netns=ns)
        for v in p.veths:
            iproute.ip("link", "set", v.a_if, "up", netns=v.a_ns)
            iproute.ip("link", "set", v.b_if, "up", netns=v.b_ns)
        for ifname, cidr in p.router_addrs:
            iproute.ip("addr", "add", cidr, "dev", ifname, netns=p.router_ns)
        for h in p.hosts:
            iproute.ip("addr", "add", f"{h.ip}/24", "dev", HOST_IFACE, netns=h.netns)
            if h.gateway:
                # Only the lab /16 is routed: anything else is unreachable from inside.
                iproute.ip("route", "add", p.lab_subnet, "via", h.gateway, netns=h.netns)

    def close(self) -> None:
        """Stop every process started in the lab, then delete its namespaces. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for proc in self._procs:
            self._stop(proc)
        for ns in reversed(self._made):
            kill_netns_pids(ns)
            iproute.ip("netns", "del", ns, check=False)
        log.info("lab %s: removed %d namespaces", self.prefix, len(self._made))
        self._made.clear()

    # ---- hosts and processes --------------------------------------------------------------------
    @property
    def hosts(self) -> list[Host]:
        return list(self._hosts.values())

    def host(self, name: str) -> Host:
        try:
            return self._hosts[name]
        except KeyError:
            raise NetlabError(f"no host {name!r} in lab; hosts: {sorted(self._hosts)}") from None

    def _spawn(self, netns: str, argv: list[str], env: dict[str, str], kwargs: dict) -> subprocess.Popen:
        if self._closed or not self._made:
            raise NetlabError(f"lab {self.prefix} is not built (or already closed)")
        # `ip netns exec` execs argv in place, so proc.pid is the program's own pid.
        proc = subprocess.Popen(["ip", "netns", "exec", netns, *argv], env=env, **kwargs)
        self._procs.append(proc)
        return proc

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=_TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_TERM_GRACE_S)

    # ---- faults ---------------------------------------------------------------------------------
    def set_link(self, host: str, up: bool) -> None:
        """Cut (or restore) a host's NIC at the rack's end: like a pulled cable, its eth0 loses carrier but
        keeps its address and routes, so TCP connections over it stall instead of being reset."""
        nic = self._nic(host)
        iproute.ip("link", "set", nic.b_if, "up" if up else "down", netns=nic.b_ns)

    def shape(self, host: str, mbit: float) -> None:
        """Re-shape a host's NIC, both directions (a straggler: a degraded or congested link)."""
        nic = self._nic(host)
        for ns, ifname in ((nic.a_ns, nic.a_if), (nic.b_ns, nic.b_if)):
            self._tbf(ns, ifname, mbit)

    @contextlib.contextmanager
    def unshaped(self):
        """Every shaped link of the lab runs at the host's own speed inside the block, then is shaped again to the
        rate it had: for untimed setup (readers fetching the version they start from), which would otherwise take
        the shaped links minutes. Nothing timed may run inside. TCP restarts a connection idle for a
        retransmission timeout from its initial window (Linux's ``tcp_slow_start_after_idle``), so a connection
        opened inside the block does not carry its unshaped window into a timed read that starts after an idle
        gap."""
        shaped = dict(self._rates)
        for ns, ifname in shaped:
            iproute.tc("qdisc", "del", "dev", ifname, "root", netns=ns)
        try:
            yield self
        finally:
            for (ns, ifname), mbit in shaped.items():
                self._tbf(ns, ifname, mbit)

    def shaped_rates(self) -> dict[tuple[str, str], float]:
        """(namespace, interface) -> Mbit/s of every link a tbf shapes now, read back from the kernel."""
        rates = {}
        for ns, ifname in self._rates:
            out = iproute.tc("qdisc", "show", "dev", ifname, "root", netns=ns)
            m = re.search(r"\btbf\b.*?\brate (\d+(?:\.\d+)?)([KMG]?)bit", out)
            if m:
                rates[(ns, ifname)] = float(m.group(1)) * {"K": 1e-3, "M": 1.0, "G": 1e3, "": 1e-6}[m.group(2)]
        return rates

    def _tbf(self, ns: str, ifname: str, mbit: float) -> None:
        iproute.tc("qdisc", "replace", "dev", ifname, "root", *tbf_args(mbit, self.spec.queue_ms), netns=ns)
        self._rates[(ns, ifname)] = mbit

    def _nic(self, host: str) -> VethPlan:
        netns = self.host(host).netns
        return next(v for v in self.plan.veths if v.a_ns == netns and v.a_if == HOST_IFACE)

    # ---- counters -------------------------------------------------------------------------------
    def wan_tx_bytes_by_dc(self) -> dict[str, int]:
        """Bytes that crossed the WAN into each datacenter so far (router interface tx counters)."""
        if not self.plan.router_ns:
            return {}
        return {dc: _tx_bytes(self.plan.router_ns, ifname) for dc, ifname in self.plan.router_ifs}

    def wan_tx_bytes(self) -> int:
        """Total bytes that crossed the WAN so far (0 in a one-datacenter lab)."""
        return sum(self.wan_tx_bytes_by_dc().values())

    def nic_tx_bytes(self, host: str) -> int:
        """Bytes the host's NIC has sent so far."""
        return _tx_bytes(self.host(host).netns, HOST_IFACE)

    def nic_rx_bytes(self, host: str) -> int:
        """Bytes the host's NIC has received so far (what its rack's end of the link sent it)."""
        nic = self._nic(host)
        return _tx_bytes(nic.b_ns, nic.b_if)

    def describe(self) -> dict:
        return {"prefix": self.prefix, "subnet": self.spec.subnet, "nic_mbit": self.spec.nic_mbit,
                "rack_uplink_mbit": self.spec.rack_uplink_mbit, "wan_mbit": self.spec.wan_mbit,
                "hosts": [{"name": h.name, "ip": h.ip, "netns": h.netns, **h.location} for h in self.hosts]}


def _tx_bytes(netns: str, ifname: str) -> int:
    out = iproute.ip("-j", "-s", "link", "show", "dev", ifname, netns=netns)
    try:
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])
    except (ValueError, KeyError, IndexError) as e:
        raise NetlabError(f"cannot parse tx counters of {netns}/{ifname}: {out[:200]!r}") from e


def kill_netns_pids(netns: str) -> None:
    """Kill what still runs in a namespace we own (children of our children), by pid."""
    for pid in iproute.netns_pids(netns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = PREFIX_ROOT, *, force: bool = False) -> list[str]:
    """Delete lab namespaces under `prefix` whose creator process is gone (all of them with `force`).

    Returns the names deleted. A lab's namespaces are named `thl-<pid>-<hex>-...`.
    """
    iproute.check_available()
    removed = []
    for ns in iproute.list_netns():
        if not ns.startswith(prefix) or not ns.startswith(PREFIX_ROOT):
            continue
        parts = ns[len(PREFIX_ROOT):].split("-", 1)
        creator = int(parts[0]) if parts[0].isdigit() else None
        if not force and creator is not None and _pid_alive(creator):
            continue
        kill_netns_pids(ns)
        iproute.ip("netns", "del", ns, check=False)
        removed.append(ns)
    if removed:
        log.info("removed %d stale lab namespaces under %r", len(removed), prefix)
    return removed
