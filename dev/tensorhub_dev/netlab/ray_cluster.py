"""A Ray cluster across lab hosts, as on real machines: ``ray start --head`` on one host, ``ray start --address``
on the others, each node started with its host's location as Ray node labels (``tensorhub/dc``, ``/rack``,
``/node``: what ``tensorhub_verl.verl.node_location`` reads in every worker).

    with Lab(spec) as lab, LabRayCluster(lab, head="d0r0h0", workers=["d1r0h0"], log_dir=out) as cluster:
        lab.host("d0r0h0").run([... verl job ...], env={"RAY_ADDRESS": cluster.address}, timeout=...)

Each ``ray start --block`` runs in its host's namespace under the lab, which stops it (and everything in the
namespace) when it closes; ``close()`` stops the nodes first, workers before the head.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tensorhub_dev.netlab.errors import NetlabError
from tensorhub_dev.netlab.lab import Host, Lab, kill_netns_pids

log = logging.getLogger("tensorhub_dev.netlab.ray_cluster")

RAY_PORT = 6379
RAY_ADDRESS_FILE = "/tmp/ray/ray_current_cluster"
"""Where ``ray start --head`` records the newest cluster's address (Ray's default temp dir), read by ``ray.init()``."""
LABEL_PREFIX = "tensorhub/"
"""The prefix of the location labels (``tensorhub_verl.verl.node_location.RAY_LABEL_PREFIX``)."""


def ray_labels(location: Mapping[str, str]) -> str:
    """``ray start --labels`` for a host's location: ``tensorhub/dc=dc0,tensorhub/rack=r0,tensorhub/node=h``."""
    return ",".join(f"{LABEL_PREFIX}{key}={value}" for key, value in location.items())


class LabRayCluster:
    """One Ray node per named host. ``num_gpus`` gives each host's logical GPU slots (verl's CPU presets schedule
    trainer ranks and replicas on them), ``resources`` each host's custom Ray resources (``ray start --resources``),
    ``env`` what every node's processes inherit."""

    def __init__(self, lab: Lab, *, head: str, workers: Sequence[str], log_dir: Path, num_cpus: int = 16,
                 num_gpus: Mapping[str, int] | None = None,
                 resources: Mapping[str, Mapping[str, float]] | None = None, env: Mapping[str, str] | None = None,
                 start_timeout_s: float = 240.0):
        self.lab = lab
        self.head: Host = lab.host(head)
        self.workers: list[Host] = [lab.host(name) for name in workers]
        self.log_dir = Path(log_dir)
        self.num_cpus = num_cpus
        self.num_gpus = dict(num_gpus or {})
        self.resources = {name: dict(values) for name, values in (resources or {}).items()}
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self._procs: list[tuple[Host, subprocess.Popen]] = []

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{RAY_PORT}"

    def __enter__(self) -> "LabRayCluster":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _ray_start(self, host: Host, *first: str) -> None:
        argv = [str(Path(sys.executable).with_name("ray")), "start", *first, "--block",
                f"--node-ip-address={host.ip}", f"--num-cpus={self.num_cpus}",
                f"--num-gpus={self.num_gpus.get(host.name, 0)}", f"--labels={ray_labels(host.location)}",
                "--disable-usage-stats"]
        if self.resources.get(host.name):
            argv.append(f"--resources={json.dumps(self.resources[host.name])}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"ray-{host.name}.log", "w") as out:
            proc = host.popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self._procs.append((host, proc))

    def start(self) -> None:
        self._ray_start(self.head, "--head", f"--port={RAY_PORT}", "--include-dashboard=false")
        self.wait_for_nodes(1)
        # One worker at a time, each given a second try: ``ray start`` gives its raylet a fixed 30 s to register,
        # which several nodes starting at once on a loaded machine can miss.
        for count, host in enumerate(self.workers, start=2):
            for attempt in (1, 2):
                self._ray_start(host, f"--address={self.address}")
                try:
                    self.wait_for_nodes(count)
                    break
                except NetlabError as e:
                    if attempt == 2:
                        raise
                    log.warning("Ray node on %s did not start (%s); trying once more", host.name, e)
                    self._stop(host, self._procs.pop()[1])
                    kill_netns_pids(host.netns)  # a raylet the failed start left behind
        log.info("Ray cluster at %s: head %s, workers %s", self.address, self.head.name,
                 [h.name for h in self.workers])

    def nodes(self) -> list[dict]:
        """The cluster's alive nodes as Ray lists them (address, labels, resources), asked from the head host."""
        code = ("import json, ray; ray.init(log_to_driver=False); "
                "print(json.dumps([{'ip': n['NodeManagerAddress'], 'labels': n.get('Labels', {}), "
                "'resources': n['Resources']} for n in ray.nodes() if n['Alive']]))")
        return self._ask(code, "list the nodes")

    def actors(self) -> list[dict]:
        """Every actor the cluster has run (dead ones included, from Ray's control store): its class, name,
        state and the ``tensorhub/node`` label of the node it ran on."""
        code = ("import json, ray; ray.init(log_to_driver=False); "
                "hosts = {n['NodeID']: n.get('Labels', {}).get('tensorhub/node') for n in ray.nodes()}; "
                "print(json.dumps([{'class': a['ActorClassName'], 'name': a['Name'], 'state': a['State'], "
                "'host': hosts.get(a['Address']['NodeID'])} for a in ray._private.state.actors().values()]))")
        return self._ask(code, "list the actors")

    def _ask(self, code: str, what: str) -> list[dict]:
        proc = self.head.run([sys.executable, "-c", code], timeout=120, check=False,
                             env={**self.env, "RAY_ADDRESS": self.address})
        if proc.returncode != 0:
            raise NetlabError(f"could not {what} of the Ray cluster at {self.address}: {proc.stderr[-1500:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def wait_for_nodes(self, count: int) -> list[dict]:
        deadline = time.monotonic() + self.start_timeout_s
        last: object = None
        while time.monotonic() < deadline:
            for host, proc in self._procs:
                if proc.poll() is not None:
                    raise NetlabError(f"ray start on {host.name} exited ({proc.returncode}); see "
                                      f"{self.log_dir / f'ray-{host.name}.log'}")
            try:
                nodes = self.nodes()
                if len(nodes) >= count:
                    return nodes
                last = f"{len(nodes)} node(s)"
            except NetlabError as e:
                last = e
            time.sleep(3.0)
        raise NetlabError(f"the Ray cluster at {self.address} did not reach {count} nodes within "
                          f"{self.start_timeout_s:.0f} s (last: {last})")

    def close(self) -> None:
        """Stops every node, workers first (``ray start --block`` ends its node's processes on SIGTERM)."""
        for host, proc in reversed(self._procs):
            self._stop(host, proc)
        self._procs.clear()
        self._forget_address()

    def _forget_address(self) -> None:
        """``ray start --head`` records its address in the host's shared Ray temp dir, and a killed head leaves it
        there; a later ``ray.init()`` on this machine would then try to join the lab's gone cluster. Removed
        when it still names this cluster."""
        recorded = Path(RAY_ADDRESS_FILE)
        try:
            if recorded.read_text().strip() == self.address:
                recorded.unlink()
        except FileNotFoundError:
            pass

    @staticmethod
    def _stop(host: Host, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                log.warning("ray start on %s ignored SIGTERM for 60 s; killing it", host.name)
                proc.kill()
                proc.wait(30)


__all__ = ["LABEL_PREFIX", "LabRayCluster", "RAY_PORT", "ray_labels"]
