"""The ``tensorhub`` block of a verl job's config, as one validated dataclass.

It reaches the workers as ``actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.tensorhub``
(verl passes ``engine_kwargs[backend]`` to the engine's constructor), composed by the Hydra group
``tensorhub_verl/conf/tensorhub/*.yaml``. Every field is checked here, once, so that a typo fails at startup with
the field's name instead of mid-run on a rollout node.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.ros.client.hub_client import is_loopback_url
from tensorhub_verl.ros.wire.topology import LABEL_KEYS, LINK_KEYS
from tensorhub_verl.settings import STAGING_CHOICES
from tensorhub_verl.ros.client.delta import DELTA_MODES
from tensorhub_verl.verl.dtypes import rollout_dtype



@dataclass(kw_only=True, slots=True)
class TensorHubVerlConfig:
    """How a verl job publishes and pulls weights through TensorHub."""

    hub_address: str | None = None
    """URL of a running hub (``http://host:port``), or the ``REGION=URL,...`` list of a hub of regions
    (``tensorhub hub --regions`` prints it): every worker then connects to its location's region. None: the job
    starts its own hub as a named, detached Ray actor on the driver's node and every worker finds it by name."""
    hub_regions: str | None = None
    """The job's hub actor serves a hub of regions (``ros/wire/regions.py``): a comma-separated list of region names
    (``dc``, ``dc/rack`` or ``dc/rack/node``), or a count N for ``dc0/r0`` .. ``dc0/r{N-1}``; each worker
    connects to the region of its location (``RegionalClient``). The regions' hubs share the actor's process: for
    a process per region, run ``tensorhub hub --regions`` and give its list as ``hub_address``. None: one hub."""
    relay_fanout: int = 0
    """With regions: a region's first copy comes from a reader of its parent region, the regions of a datacenter
    forming a tree of this many children per region (``ClientConfig.relay_fanout``); 0: from the trainer."""
    token: str | None = None
    """Shared secret of the hub, written in the config (verl prints its config: prefer ``token_env``). None:
    ``token_env``'s value, else none (an open hub, only on a trusted network), except that a hub actor of this
    job listening off loopback makes a token of its own (``hub_actor.job_credentials``)."""
    token_env: str | None = "TENSORHUB_TOKEN"
    """Environment variable the token is read from, where it is used (never copied into the config, so
    verl's config dump never shows it)."""
    hub_tls_cert: str | None = None
    """PEM certificate for the job's hub actor (with ``hub_tls_key``): it serves HTTPS only. Workers verify
    it with ``tls_ca_file``."""
    hub_tls_key: str | None = None
    """PEM private key of ``hub_tls_cert``."""
    tls_ca_file: str | None = None
    """PEM file of the CA that signed an https hub's certificate (``hub_address`` https://...)."""
    allow_plain_http: bool = False
    """Send ``token`` to an ``http://`` hub on another host, in clear (a cluster network nobody else can read).
    Off: a job with a token and a plain-HTTP hub off loopback refuses to start and says what to set."""
    transport: str = "auto"
    """The data plane of every worker of the job: 'nixl', 'tcp', or 'auto' (picked per host: NIXL with RDMA or a
    loopback hub, else TCP streams, CUDA memory included). One hub serves one plane: set it explicitly when hosts
    differ (e.g. an RDMA trainer and attached nodes without RDMA, which then pass ``tensorhub attach-vllm
    --transport``)."""
    model: str = "policy"
    """Model name under which the policy's versions are published."""
    keep_versions: int = 2
    """Versions each worker holds at once (and the hub retains). 2 lets rollouts still pulling v-1
    finish while v is published; each kept version costs one model's worth of staging memory. With
    ``staging='gpu'`` a trainer rank holds one version in GPU memory whatever this says (older ones stay
    readable from the rollouts that hold them)."""
    staging: str = "cpu"
    """Where the trainer's published bytes live: 'none' holds the tensors verl's per-tensor generator
    yields (no extra copy; only safe when the engine yields fresh tensors, e.g. FSDP full_tensor
    gathers), 'cpu' copies into pinned CPU buffers allocated once, 'gpu' into GPU buffers allocated once (one
    version: ``keep_versions`` does not multiply GPU memory)."""
    rollout_dtype: str | None = None
    """The dtype the rollout engines serve (the presets set it from ``actor_rollout_ref.rollout.dtype``): the
    trainer casts its floating-point tensors to it as it stages them, so a version crosses the wire once, in the
    bytes the engines serve (half of an fp32 master's for a bf16 rollout). null or 'auto': the parameters'
    dtype. With staging 'none' and a cast, the cast tensors live in buffers on the tensors' own device,
    allocated once and reused (the cast is the copy that 'none' otherwise avoids)."""
    rollout_staging: str = "none"
    """How a rollout engine takes a new version. Its live parameters are always the holder of the version it
    serves. 'none': the pull lands straight in the parameters while the engine is paused (no copy of the
    model anywhere; the pause lasts the whole pull). 'cpu'/'gpu': the pull lands in a staging buffer while the
    engine keeps generating, and the pause is only the copy into the parameters (one extra model shard of
    pinned CPU or of GPU memory per engine rank; 'gpu' must fit beside vLLM's ``gpu_memory_utilization`` share
    or the engine refuses it at setup, naming the numbers)."""
    chunk_mb: int = 8
    """Transfer unit in MiB; many small tensors are packed into one chunk."""
    window: int = 8
    """Leases one worker's fetch keeps in flight (``ClientConfig.window``): more hides more latency per reader
    on fast links (RDMA, NVLink), at the price of more reads in flight at once on each holder."""
    location: dict[str, str] = field(default_factory=dict)
    """Job-wide default location labels (dc, rack, node, gpu; null: unset) for the labels a Ray node does not give
    itself (``node_location``: each node's own labels win). 'node' defaults to the Ray node's IP, so that workers
    on one node read from each other first."""
    link_capacities: dict[str, float] = field(default_factory=dict)
    """Link rates in Gbit/s (nic_gbps, rack_uplink_gbps, wan_gbps). A job uses nic_gbps and wan_gbps only: to size
    seeds_per_dc when it is null (``wan_seeds``). rack_uplink_gbps is checked and accepted, as in
    ``LinkCapacities`` (the simulator's topology uses it), but nothing in a job reads it."""
    seeds_per_dc: int | None = None
    """Readers per datacenter that may pull a version across the WAN; the rest read locally. None: as many
    as it takes for the WAN, not one reader's NIC, to be the limit (link_capacities: ceil(WAN / NIC)), 1
    when link_capacities is not set."""
    hub_actor_name: str = "tensorhub_hub"
    """Name of the hub's Ray actor (when hub_address is None)."""
    hub_namespace: str = "tensorhub"
    """Ray namespace of the hub actor, so that jobs outside this one can find it."""
    hub_host: str | None = None
    """Address the hub actor binds to and advertises. None: loopback when the Ray cluster is one host, else
    the Ray node's IP (reachable from other nodes)."""
    hub_port: int = 0
    """Port of the hub actor's HTTP server; 0 picks a free one."""
    hub_url_file: str | None = None
    """If set, the hub actor writes its URL to this file (for rollout nodes outside the Ray job)."""
    hub_start_timeout_s: float = 60.0
    """Limit for creating the hub actor and reading its URL."""
    hub_max_restarts: int = 3
    """Times Ray restarts the job's hub actor when its process dies (-1: always, 0: never). The restarted hub
    binds the same address, port and token; the job's workers re-register with it (the hub's state is theirs)."""
    hub_placement: str = "head"
    """Where the job's hub actor runs (when hub_address is None): 'head', the Ray head node, where verl's driver
    runs (a hard constraint); 'any', wherever Ray puts it; 'label:KEY=VALUE', a node with that Ray node label
    (``ray start --labels KEY=VALUE``); 'resource:NAME', a node that offers the custom resource NAME
    (``ray start --resources '{"NAME": 1}'``)."""
    trainer_placement: str = "any"
    """Where verl's trainer ranks run (its ``global_pool`` / ``trainer_pool`` placement groups): 'any',
    wherever Ray puts them; 'label:KEY=VALUE', nodes with that Ray node label; 'resource:NAME', nodes offering
    the custom resource NAME (see ``pool_placement``)."""
    rollout_placement: str = "any"
    """Where verl's standalone rollout replicas run (their ``rollout_pool_<rank>`` placement groups): the same
    forms as ``trainer_placement``."""
    helper_placement: str = "any"
    """Where verl's helper actors run: its task runner (the trainer's controller), the agent-loop and reward-loop
    workers (verl spreads them round-robin over every node): the same forms as ``trainer_placement``."""
    cooperative: bool = True
    """False runs the job's hub as the pull-from-trainer baseline of measurements: only complete copies serve
    (in practice the trainer, while replicas pull at once), no reader waits for a nearer copy, no WAN seeding
    (``PlannerConfig.cooperative``)."""
    fetch_timeout_s: float = 600.0
    """Limit of one rollout worker's pull of one version."""
    unpublish_timeout_s: float = 120.0
    """Limit of the wait for in-flight reads before a staging buffer is reused."""
    apply_timeout_s: float = 600.0
    """Limit of one replica's pause-apply-resume."""
    verify_digests: bool = False
    """Digest every version on the trainer and on each rollout after its pull, and fail a replica whose
    bytes differ (``tensorhub/digest_mismatches``). Reads every byte once more on each side: for tests
    and debugging."""
    delta: str = "auto"
    """Deltas between consecutive versions (docs/deltas.md). 'auto': when the trainer publishes version N while
    it still holds N-1 (``keep_versions`` >= 2), it also publishes the delta N-1 -> N (each FSDP rank diffs its own
    rows where they live) if it is smaller than N, and an engine serving N-1 reads the delta, applies it in place
    during its pause and checks the result against N's digests, re-reading in full any chunk that fails. 'on': the
    same, publishing the delta even when it is not smaller. 'off': every update moves the whole version."""
    min_replica_fraction: float = 1.0
    """Fraction of replicas that must apply a version for update_weights to succeed. Below 1.0, a replica
    whose pull fails keeps serving its previous version (reported as tensorhub/version_lag)."""
    max_version_lag: int | None = None
    """Staleness bound: a replica serving a version more than this many behind the newest published stops
    admitting new requests (those in flight finish; new ones wait at its gate) until it has applied a newer one
    (``tensorhub/version_lag/replica_<r>``, ``tensorhub/requests_held_back``); replicas serving the newest
    version any replica serves are never held. verl's load balancer still routes requests to a held replica: use
    it where the trainer can fill a batch without them (fully_async, ``staleness_threshold`` >= 1). None: off."""
    flip_together: bool = False
    """Fleet flip (needs ``rollout_staging`` 'cpu' or 'gpu'): every replica stages the next version and reports it to
    the hub as staged and checked; replicas flip to it together once ``min_replica_fraction`` of them hold it, so the
    fleet never serves more than two versions at once, and never a version whose check failed on any replica. A
    replica behind the fleet stages the fleet's version first. False: each replica applies as soon as it pulled."""
    version_audit_dir: str | None = None
    """Directory where each rollout server appends one JSON line per generate call (request id, replica, the
    version spans its engine recorded, the label it gave) and each agent-loop client one per response (the spans
    of all its calls, the label its sample carries), and one per change of the version a replica serves: an
    audit trail for off-policy corrections. None: off."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"tensorhub.{f.name} must be a number, got {value!r}")
            if f.type == "int" and not isinstance(value, int):
                raise ConfigError(f"tensorhub.{f.name} must be an integer, got {value!r}")
        for url in hub_urls(self.hub_address):
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"tensorhub.hub_address must be an http(s):// URL, a REGION=URL list or null, got "
                                  f"{self.hub_address!r}")
        if self.hub_address is not None and "," in self.hub_address and "=" not in self.hub_address:
            raise ConfigError("tensorhub.hub_address names several hub shards; the verl integration connects to one "
                              "hub process or to a hub of regions (a REGION=URL list, `tensorhub hub --regions`): "
                              "give one URL or that list (a sharded hub serves the tensorhub Python API only)")
        if self.hub_regions is not None:
            from tensorhub_verl.ros.wire.regions import region_names

            if self.hub_address is not None:
                raise ConfigError("tensorhub.hub_regions starts the job's own hub of regions; with hub_address set "
                                  "the job starts no hub: set one of them (a REGION=URL list in hub_address for "
                                  "regions started outside the job)")
            region_names(str(self.hub_regions))  # ConfigError naming the bad item
        if not isinstance(self.relay_fanout, int) or isinstance(self.relay_fanout, bool) or self.relay_fanout < 0:
            raise ConfigError(f"tensorhub.relay_fanout must be an integer >= 0, got {self.relay_fanout!r}")
        if not isinstance(self.allow_plain_http, bool):
            raise ConfigError(f"tensorhub.allow_plain_http must be true or false, got {self.allow_plain_http!r}")
        if (self.hub_tls_cert is None) != (self.hub_tls_key is None):
            raise ConfigError("tensorhub.hub_tls_cert and tensorhub.hub_tls_key go together: set both or neither")
        clear = [url for url in hub_urls(self.hub_address) if url.startswith("http://") and not is_loopback_url(url)]
        if self.resolved_token() and clear and not self.allow_plain_http:
            raise ConfigError(f"tensorhub.token would cross the network in clear to {clear[0]}: use an "
                              f"https:// hub (tensorhub.tls_ca_file for a private CA), or set "
                              f"tensorhub.allow_plain_http=true on a network nobody else can read")
        from tensorhub_verl.ros.planes.factory import TRANSPORTS# on use: it imports the planes

        if self.transport not in TRANSPORTS:
            raise ConfigError(f"tensorhub.transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if not self.model or not isinstance(self.model, str):
            raise ConfigError(f"tensorhub.model must be a non-empty string, got {self.model!r}")
        if self.keep_versions < 1:
            raise ConfigError(f"tensorhub.keep_versions must be >= 1, got {self.keep_versions}")
        if self.staging not in STAGING_CHOICES:
            raise ConfigError(f"tensorhub.staging must be one of {STAGING_CHOICES}, got {self.staging!r}")
        rollout_dtype(self.rollout_dtype)  # raises ConfigError naming the accepted names
        if self.rollout_staging not in STAGING_CHOICES:
            raise ConfigError(f"tensorhub.rollout_staging must be one of {STAGING_CHOICES}, "
                              f"got {self.rollout_staging!r}")
        if self.flip_together and self.rollout_staging == "none":
            raise ConfigError("tensorhub.flip_together needs a staged pull: set tensorhub.rollout_staging to 'cpu' "
                              "or 'gpu' (with 'none' the pull lands in the live parameters, which is the flip)")
        if not 1 <= self.chunk_mb <= 2048:
            raise ConfigError(f"tensorhub.chunk_mb must be in [1, 2048], got {self.chunk_mb}")
        if not 1 <= self.window <= 1024:
            raise ConfigError(f"tensorhub.window must be in [1, 1024], got {self.window}")
        if not isinstance(self.location, dict):
            raise ConfigError(f"tensorhub.location must be a mapping of labels, got {self.location!r}")
        self.location = {key: label for key, label in self.location.items() if label is not None}  # null: unset
        unknown = set(self.location) - set(LABEL_KEYS)
        if unknown:
            raise ConfigError(f"tensorhub.location has unknown label(s) {sorted(unknown)}; accepted: {LABEL_KEYS}")
        unknown = set(self.link_capacities) - set(LINK_KEYS)
        if unknown:
            raise ConfigError(
                f"tensorhub.link_capacities has unknown key(s) {sorted(unknown)}; accepted: {LINK_KEYS}"
            )
        for key, rate in self.link_capacities.items():
            if not isinstance(rate, (int, float)) or rate <= 0:
                raise ConfigError(f"tensorhub.link_capacities.{key} must be > 0 Gbit/s, got {rate!r}")
        if self.seeds_per_dc is not None and (isinstance(self.seeds_per_dc, bool) or not isinstance(
                self.seeds_per_dc, int) or self.seeds_per_dc < 1):
            raise ConfigError(f"tensorhub.seeds_per_dc must be >= 1 (or null: sized from link_capacities), "
                              f"got {self.seeds_per_dc}")
        if not isinstance(self.hub_max_restarts, int) or self.hub_max_restarts < -1:
            raise ConfigError(f"tensorhub.hub_max_restarts must be an integer >= -1 (-1: always restart), "
                              f"got {self.hub_max_restarts!r}")
        if not 0 <= self.hub_port <= 65535:
            raise ConfigError(f"tensorhub.hub_port must be in [0, 65535], got {self.hub_port}")
        hub_placement(self.hub_placement)  # raises ConfigError naming the accepted forms
        for name in ("trainer_placement", "rollout_placement", "helper_placement"):
            pool_placement(getattr(self, name), f"tensorhub.{name}")
        for name in ("hub_start_timeout_s", "fetch_timeout_s", "unpublish_timeout_s", "apply_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"tensorhub.{name} must be > 0, got {getattr(self, name)}")
        if not isinstance(self.cooperative, bool):
            raise ConfigError(f"tensorhub.cooperative must be true or false, got {self.cooperative!r}")
        if not isinstance(self.verify_digests, bool):
            raise ConfigError(f"tensorhub.verify_digests must be true or false, got {self.verify_digests!r}")
        if self.delta not in DELTA_MODES:
            raise ConfigError(f"tensorhub.delta must be one of {DELTA_MODES} (auto: a delta when it is smaller than "
                              f"the version; off: full versions only), got {self.delta!r}")
        if not 0.0 < self.min_replica_fraction <= 1.0:
            raise ConfigError(f"tensorhub.min_replica_fraction must be in (0, 1], got {self.min_replica_fraction}")
        if self.max_version_lag is not None and (isinstance(self.max_version_lag, bool) or not isinstance(
                self.max_version_lag, int) or self.max_version_lag < 0):
            raise ConfigError(f"tensorhub.max_version_lag must be an integer >= 0 (or null: off), "
                              f"got {self.max_version_lag!r}")

    def resolved_token(self) -> str | None:
        """``token``, else the value of ``token_env`` in this process, else None."""
        import os

        return self.token or (os.environ.get(self.token_env) if self.token_env else None) or None

    @property
    def published_dtype(self):
        """The torch dtype versions are published in, or None: the parameters' own (see ``rollout_dtype``)."""
        return rollout_dtype(self.rollout_dtype)

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_mb << 20

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "TensorHubVerlConfig":
        """Builds the config from a plain mapping (verl's ``engine_kwargs['tensorhub']``, a DictConfig, ...)."""
        if values is None:
            return cls()
        if hasattr(values, "items") and not isinstance(values, dict):
            values = _to_plain(values)
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"unknown tensorhub config key(s) {sorted(unknown)}; accepted: {sorted(known)}")
        plain = {k: _to_plain(v) for k, v in values.items()}
        try:
            return cls(**plain)
        except TypeError as e:  # a wrong type for a field: name it instead of a bare TypeError
            raise ConfigError(f"invalid tensorhub config: {e}") from e

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def client_settings(self) -> dict[str, Any]:
        """The ``ClientConfig`` fields every worker of the job connects with (trainer ranks and engines)."""
        return {"chunk_bytes": self.chunk_bytes, "window": self.window, "tls_ca_file": self.tls_ca_file,
                "allow_plain_http": self.allow_plain_http, "transport": self.transport,
                "relay_fanout": self.relay_fanout}

    def uses_regions(self) -> bool:
        """Whether the job's workers connect to a hub of regions (``hub_regions``, or a REGION=URL list)."""
        return self.hub_regions is not None or "=" in (self.hub_address or "")

    def wan_seeds(self) -> int:
        """seeds_per_dc, or sized from link_capacities when it is None."""
        from tensorhub_verl.ros.wire.topology import wan_seeds

        return wan_seeds(self.seeds_per_dc, self.link_capacities)


def hub_urls(address: str | None) -> list[str]:
    """The hub URLs in ``tensorhub.hub_address``: one URL, or each URL of a ``REGION=URL`` list."""
    if address is None:
        return []
    if "=" not in address:
        return [address]
    from tensorhub_verl.ros.wire.regions import parse_regions

    return list(parse_regions(address).values())


HUB_PLACEMENTS = ("head", "any", "label:KEY=VALUE", "resource:NAME")


def hub_placement(text: Any) -> tuple[str, str | None, str | None]:
    """``tensorhub.hub_placement`` as (kind, key, value): ('head'|'any', None, None), ('label', KEY, VALUE) or
    ('resource', NAME, None). Raises ConfigError on anything else."""
    if text in ("head", "any"):
        return text, None, None
    kind, _, rest = str(text).partition(":")
    key, eq, value = rest.partition("=")
    if isinstance(text, str) and kind == "label" and key and eq and value:
        return "label", key, value
    if isinstance(text, str) and kind == "resource" and rest and not eq:
        return "resource", rest, None
    raise ConfigError(f"tensorhub.hub_placement must be one of {', '.join(HUB_PLACEMENTS)}, got {text!r}")


POOL_PLACEMENTS = ("any", "label:KEY=VALUE", "resource:NAME")


def pool_placement(text: Any, setting: str = "tensorhub.trainer_placement") -> tuple[str, str | None, str | None]:
    """A verl resource pool's placement (``trainer_placement`` / ``rollout_placement``) as (kind, key, value):
    ('any', None, None), ('label', KEY, VALUE) or ('resource', NAME, None). Raises ConfigError naming
    ``setting`` on anything else ('head' included: a pool's bundles may span several nodes)."""
    if text != "head":
        try:
            return hub_placement(text)
        except ConfigError:
            pass
    raise ConfigError(f"{setting} must be one of {', '.join(POOL_PLACEMENTS)}, got {text!r}")


def _to_plain(value: Any) -> Any:
    """OmegaConf containers to dict/list, so that validation sees plain values (no OmegaConf import here)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # omegaconf absent: nothing to convert
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value
