"""The hub's lifecycle in a verl job: a named, detached Ray actor wrapping the embedded hub.

When the config gives no ``hub_address``, the first party that needs the hub (the updater on the
driver side, or an actor rank) creates the actor ``tensorhub.hub_actor_name`` in namespace
``tensorhub.hub_namespace`` with ``get_if_exists=True``, so concurrent creators get one hub. It runs where
``tensorhub.hub_placement`` says: by default on the head node, where ``python -m verl.trainer.main_ppo`` runs its
driver (a hard constraint: with a soft one Ray may put it on any node), or on a node with a given Ray label or
custom resource. It is detached so that rollout nodes attaching from outside the job (``tensorhub attach-vllm``)
can find it:

    ray.get(ray.get_actor("tensorhub_hub", namespace="tensorhub").url.remote())

or read the URL from ``hub_url_file`` / Ray's internal KV (key ``tensorhub/hub_url/<name>``). ``hub_url_file:
auto`` is a file of this Ray cluster's session, on the hub's node (``session_url_file``), never a fixed global path.
Being detached, it outlives the job; ``stop_hub`` ends it and removes its URL file.

If its process dies, Ray restarts it (``tensorhub.hub_max_restarts``) on the same node (the head's affinity is
hard) with the same arguments: it binds the same port (the one recorded in Ray's KV when the configured port is 0),
the same token (made by the actor's creator) and the same owner rules (the job's model and its ``<model>.*`` forms
belong to the job's key, ``job_owner_rules``: a token holder of another job cannot publish them on the restarted
hub, in any region, before the job's workers are back), so the job's workers find it where it was; each re-registers
itself, its holdings and its fetches with the new instance (``HubClient``). ``hub_restarts`` counts the restarts
(the updater's ``tensorhub/hub_restarts`` step metric).
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
import time

import ray

from tensorhub_verl.errors import ConfigError, HubUnavailable
from tensorhub_verl.ros.client.hub_client import is_loopback_url
from tensorhub_verl.ros.wire.regions import region_names
from tensorhub_verl.verl.config import TensorHubVerlConfig, hub_placement

logger = logging.getLogger("tensorhub_verl.verl.hub_actor")

KV_NAMESPACE = "tensorhub"


def kv_key(actor_name: str) -> str:
    return f"tensorhub/hub_url/{actor_name}"


class TensorHubHubActor:
    """Runs ``th.start_hub`` in the actor's process; the hub's HTTP server lives in its threads."""

    def __init__(self, *, host: str | None, port: int, token: str | None, keep_versions: int,
                 seeds_per_dc: int, url_file: str | None, actor_name: str, tls_cert: str | None = None,
                 tls_key: str | None = None, cooperative: bool = True, namespace: str | None = None,
                 own_token: str | None = None, regions: str | None = None, owners: tuple[str, ...] = (),
                 plane: str = "auto") -> None:
        import tensorhub_verl as th

        bind = host or ray.util.get_node_ip_address()
        if token is None and not is_loopback_url(f"http://{bind}"):
            # Reachable from other hosts: never open. The job's workers get this token through Ray (``token``).
            # ``own_token`` is made by whoever created the actor, so a restart (same arguments) keeps it.
            token = own_token or secrets.token_urlsafe(32)
            logger.info("hub actor %r listens on %s, off loopback, and no token is configured: it uses a token "
                        "of its own, handed to the job's workers through Ray", actor_name, bind)
        self._restarts = _restarts_so_far()
        names = region_names(regions) if regions else [None]
        ports = [port + i if port else 0 for i in range(len(names))]
        if self._restarts and port == 0:
            # Ray restarted this actor (its process died): serve where the job's workers know the hub to be.
            ports = _previous_ports(actor_name, len(names))
            logger.warning("hub actor %r restarted by Ray (restart %d): serving again on port(s) %s; the job's "
                           "workers re-register with it", actor_name, self._restarts, ports)
        self._token = token
        # The job's owner rules are arguments, so Ray's restart of this actor starts every region's hub with them:
        # no publish reaches a restarted hub before they apply.
        config = _hub_config(keep_versions=keep_versions, seeds_per_dc=seeds_per_dc, cooperative=cooperative,
                             owners=owners, plane=plane)
        # A hub of regions: one hub per region, each on a port of its own, in this process.
        self._hubs = []
        try:
            for each in ports:
                self._hubs.append(th.start_hub(host=bind, port=each, token=token, tls_cert=tls_cert, tls_key=tls_key,
                                               config=config))
        except BaseException:
            for hub in self._hubs:
                hub.stop()
            raise
        self._url = self._hubs[0].url if regions is None else \
            ",".join(f"{name}={hub.url}" for name, hub in zip(names, self._hubs))
        self._url_file = session_url_file(actor_name, namespace) if url_file == AUTO_URL_FILE else url_file
        if self._url_file:
            _write_atomically(self._url_file, self._url + "\n")
            logger.info("hub URL written to %s", self._url_file)
        try:  # best effort: the named actor is the primary way to find the hub
            from ray.experimental import internal_kv

            internal_kv._internal_kv_put(kv_key(actor_name), self._url.encode(), overwrite=True,
                                         namespace=KV_NAMESPACE)
        except Exception as e:
            logger.warning("could not record the hub URL in Ray's KV store: %s", e)
        logger.info("TensorHub hub actor %r serving on %s", actor_name, self._url)

    def url(self) -> str:
        """The hub's URL, or a hub of regions' ``REGION=URL`` list (``connect`` takes either)."""
        return self._url

    def token(self) -> str | None:
        """The hub's token: the configured one, or the one this actor made. Only through Ray, never printed."""
        return self._token

    def url_file(self) -> str | None:
        """Where this hub wrote its URL (``hub_url_file``, ``auto`` resolved), or None."""
        return self._url_file

    def ping(self) -> bool:
        return True

    def restarts(self) -> int:
        """Times Ray restarted this actor before this process started it (0: the first start)."""
        return self._restarts

    def stop(self) -> None:
        for hub in self._hubs:
            hub.stop()
        _remove_if_ours(self._url_file, self._url)


def _restarts_so_far() -> int:
    """Ray's restart count of the calling actor (``NumRestarts`` in Ray's actor table)."""
    from ray._private.state import actors

    info = actors(actor_id=ray.get_runtime_context().get_actor_id())
    return int(info.get("NumRestarts", 0)) if info else 0


def _previous_ports(actor_name: str, count: int) -> list[int]:
    """The ports of the URL (or of each region's URL) this hub actor served before its restart (Ray's KV store),
    0 for each if none is recorded."""
    from urllib.parse import urlsplit

    from ray.experimental import internal_kv

    from tensorhub_verl.verl.config import hub_urls

    url = internal_kv._internal_kv_get(kv_key(actor_name), namespace=KV_NAMESPACE)
    ports = [urlsplit(u).port or 0 for u in hub_urls(url.decode())] if url else []
    return ports if len(ports) == count else [0] * count


def _hub_config(*, keep_versions: int, seeds_per_dc: int, cooperative: bool = True, owners: tuple[str, ...] = (),
                plane: str = "auto"):
    """The core's HubConfig for this job's retention, WAN seeding, planner (``cooperative=False``: the
    pull-from-trainer baseline of measurements), owner rules and data plane (``tensorhub.transport``)."""
    import tensorhub_verl as th

    return th.HubConfig(keep_versions=keep_versions, owners=owners, plane=plane,
                        planner=th.PlannerConfig(seeds_per_dc=seeds_per_dc, cooperative=cooperative))


def job_owner_rules(cfg: TensorHubVerlConfig) -> tuple[str, ...]:
    """The hub's owner rules for this job: its model (``tensorhub.model``, and with it every ``<model>.*`` form:
    adapters, deltas) belongs to the job's workers, by the job key they connect with (``job_credentials``). None
    without a job key (outside Ray, no ``$TENSORHUB_JOB_KEY``): the model then belongs to its first publisher's
    job, which a restarted hub forgets."""
    from tensorhub_verl.ros.hub.ownership import OwnerRule

    job_key = _job_key(cfg)
    return (str(OwnerRule.for_job(cfg.model, job_key)),) if job_key else ()


AUTO_URL_FILE = "auto"
"""``hub_url_file`` value: a file in the Ray session's directory on the hub's node (``session_url_file``)."""


def session_url_file(actor_name: str, namespace: str | None = None) -> str:
    """``<Ray session dir>/tensorhub/<namespace>.<actor>.url`` for the calling Ray process: one file per Ray
    cluster session and hub, on the hub's node (``/tmp/ray/session_latest/tensorhub/...`` by default)."""
    from ray._private import worker

    node = worker._global_node
    if node is None:
        raise ConfigError("hub_url_file 'auto' needs a connected Ray process (it names a file in Ray's session dir)")
    # The hub actor's own namespace (an actor's runtime context reports its creator's job namespace).
    namespace = namespace or ray.get_runtime_context().namespace or "default"
    return os.path.join(node.get_session_dir_path(), "tensorhub", f"{namespace}.{actor_name}.url")


def _remove_if_ours(path: str | None, url: str) -> None:
    """Removes a URL file that still names this hub (a newer hub may have rewritten it)."""
    if not path:
        return
    try:
        with open(path) as f:
            if f.read().strip() != url:
                return
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        logger.warning("could not remove the hub URL file %s: %s", path, e)


def _write_atomically(path: str, text: str) -> None:
    """Readers polling the file never see a half-written URL."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tensorhub-url-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def default_hub_host() -> str | None:
    """Where the hub binds when ``tensorhub.hub_host`` is null: loopback when the whole Ray cluster is one
    host, else None (the node's IP, reachable from the other nodes).

    Ray reports a host's outward address as its node IP; on one host every process reaches loopback, and a
    hub on loopback is reachable from nothing else. Rollout nodes attaching from other hosts to a one-node
    job need ``tensorhub.hub_host`` set to an address they can reach.
    """
    alive = [node for node in ray.nodes() if node.get("Alive")]
    return "127.0.0.1" if len(alive) == 1 else None


def head_node_id() -> str | None:
    """The Ray head node's id (where the verl driver runs), or None if Ray does not say."""
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return None


def ensure_hub(cfg: TensorHubVerlConfig, *, node_id: str | None = None) -> str:
    """Returns the hub URL: ``cfg.hub_address`` if set, else the URL of the job's hub actor,
    creating it (once, cluster-wide) where ``cfg.hub_placement`` says (``node_id``: on that node) if it does not
    exist."""
    if cfg.hub_address:
        return cfg.hub_address
    if not ray.is_initialized():
        raise ConfigError("tensorhub.hub_address is null and Ray is not initialized: "
                          "set tensorhub.hub_address or run inside the verl job")
    host = cfg.hub_host or default_hub_host()
    if (host is None or not is_loopback_url(f"http://{host}")) and cfg.hub_tls_cert is None \
            and not cfg.allow_plain_http:
        raise ConfigError(f"the job's hub actor would listen on {host or 'the node address'}, off loopback, with a "
                          f"token (configured or its own) that would cross the network in clear over plain HTTP: "
                          f"give it TLS (tensorhub.hub_tls_cert, tensorhub.hub_tls_key, and tensorhub.tls_ca_file "
                          f"for the workers), or set tensorhub.allow_plain_http=true on a network nobody else can "
                          f"read")
    options = dict(name=cfg.hub_actor_name, namespace=cfg.hub_namespace, lifetime="detached",
                   get_if_exists=True, num_cpus=0, max_concurrency=8, max_restarts=cfg.hub_max_restarts,
                   **placement_options(cfg, node_id))
    actor = ray.remote(TensorHubHubActor).options(**options).remote(
        host=host, port=cfg.hub_port, token=cfg.resolved_token(),
        keep_versions=cfg.keep_versions, seeds_per_dc=cfg.wan_seeds(), url_file=cfg.hub_url_file,
        actor_name=cfg.hub_actor_name, tls_cert=cfg.hub_tls_cert, tls_key=cfg.hub_tls_key,
        cooperative=cfg.cooperative, namespace=cfg.hub_namespace, own_token=secrets.token_urlsafe(32),
        regions=cfg.hub_regions, owners=job_owner_rules(cfg), plane=cfg.transport)
    try:
        url = ray.get(actor.url.remote(), timeout=cfg.hub_start_timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        raise HubUnavailable(f"hub actor {cfg.hub_namespace}/{cfg.hub_actor_name} gave no URL within "
                             f"{cfg.hub_start_timeout_s} s") from e
    except ray.exceptions.RayActorError as e:
        raise HubUnavailable(f"hub actor {cfg.hub_namespace}/{cfg.hub_actor_name} failed to start: {e}") from e
    return url


def hub_restarts(cfg: TensorHubVerlConfig, timeout: float = 5.0) -> int | None:
    """Times Ray restarted the job's hub actor, or None: the job uses ``hub_address``, or the actor did not
    answer within ``timeout`` (it is being restarted)."""
    if cfg.hub_address or not ray.is_initialized():
        return None
    try:
        actor = ray.get_actor(cfg.hub_actor_name, namespace=cfg.hub_namespace)
        return ray.get(actor.restarts.remote(), timeout=timeout)
    except ValueError:
        return None  # no hub actor of that name (e.g. a test's own hub URL)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e:
        logger.warning("hub actor %s/%s gave no restart count: %s", cfg.hub_namespace, cfg.hub_actor_name, e)
        return None


def job_credentials(cfg: TensorHubVerlConfig) -> tuple[str | None, str | None]:
    """(token, job key) a worker of this job connects with, handed over through Ray, never a command line.

    The token: ``cfg``'s (``token``, else ``token_env`` here), else the job's hub actor's own. The job key
    (``ClientConfig.job_key``, which makes the job the owner of the models it publishes): one random secret per
    Ray cluster and model, kept in Ray's internal KV store (the first worker to ask writes it; a re-run of the
    job on the same cluster finds it, so it still owns its model on a hub that outlived the first run);
    ``$TENSORHUB_JOB_KEY`` overrides it. Outside Ray: no job key (the hub's default job)."""
    token = cfg.resolved_token()
    if token is None and not cfg.hub_address and ray.is_initialized():
        actor = ray.get_actor(cfg.hub_actor_name, namespace=cfg.hub_namespace)
        token = ray.get(actor.token.remote(), timeout=cfg.hub_start_timeout_s)
    return token, _job_key(cfg)


def _job_key(cfg: TensorHubVerlConfig) -> str | None:
    """``$TENSORHUB_JOB_KEY``, else, in a process connected to Ray, the job's secret from Ray's KV store, else
    None."""
    if os.environ.get("TENSORHUB_JOB_KEY"):
        return os.environ["TENSORHUB_JOB_KEY"]
    if not ray.is_initialized():
        return None
    from ray.experimental import internal_kv

    key = f"tensorhub/job_key/{cfg.hub_address or cfg.hub_namespace + '/' + cfg.hub_actor_name}/{cfg.model}"
    internal_kv._internal_kv_put(key, secrets.token_urlsafe(32).encode(), overwrite=False, namespace=KV_NAMESPACE)
    value = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
    return value.decode() if value else None


def placement_options(cfg: TensorHubVerlConfig, node_id: str | None = None) -> dict:
    """The hub actor's Ray options for ``cfg.hub_placement`` (``node_id``, if given, wins: a hard pin there)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    kind, key, value = hub_placement(cfg.hub_placement)
    if node_id is None and kind == "head":
        node_id = head_node_id()
        if node_id is None:
            raise HubUnavailable("tensorhub.hub_placement=head but Ray reports no head node: set "
                                 "tensorhub.hub_placement to any, label:KEY=VALUE or resource:NAME")
    if node_id is not None:
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}
    if kind == "label":
        return {"label_selector": {key: value}}
    if kind == "resource":
        return {"resources": {key: 0.001}}
    return {}


def find_hub(name: str = "tensorhub_hub", namespace: str = "tensorhub", timeout: float = 30.0) -> str:
    """URL of a running hub actor, for processes attaching from outside the job (after ``ray.init``)."""
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError as e:
        raise HubUnavailable(f"no hub actor {namespace}/{name} in this Ray cluster") from e
    try:
        return ray.get(actor.url.remote(), timeout=timeout)
    except ray.exceptions.GetTimeoutError as e:
        raise HubUnavailable(f"hub actor {namespace}/{name} did not answer within {timeout} s") from e


def stop_hub(name: str = "tensorhub_hub", namespace: str = "tensorhub", timeout: float = 30.0) -> bool:
    """Stops and removes the hub actor; False if there was none. Returns once Ray no longer finds it by name
    (``ray.kill`` frees the name asynchronously: a caller that starts a new hub, or a node that attaches, right
    after would otherwise find the dead one)."""
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    deadline = time.monotonic() + timeout
    try:
        ray.get(actor.stop.remote(), timeout=timeout)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e:
        logger.warning("hub actor %s/%s did not stop cleanly: %s", namespace, name, e)
    ray.kill(actor, no_restart=True)
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return True
        time.sleep(0.05)
    logger.warning("hub actor %s/%s was killed but Ray still lists its name after %.0f s", namespace, name, timeout)
    return True
