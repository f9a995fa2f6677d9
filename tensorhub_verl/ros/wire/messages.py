"""One pydantic model per hub request and response. Every field is validated; unknown fields are refused.

Requests are strict: no coercion (``"1"``, ``true`` or ``1000.0`` are not the integer 1 or 1000), no
Infinity or NaN, and every list, string and number has a hard cap here. Caps that depend on the deployment
(bytes and chunks per version, tensors per version) are ``HubLimits``, checked by the hub before its lock.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

Name = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9._:/@~+=-]+$")]
Version = Annotated[int, Field(ge=0, le=2**62)]
MAX_TENSORS = 100_000
"""Hard cap of tensors per version (HubLimits.max_tensors may lower it)."""
MAX_DIMS = 8
MAX_CHUNKS = 1 << 20
"""Hard cap of chunks per version; the hub's own limit (HubLimits.max_chunks) is lower by default."""
MAX_SOURCES = 4096
MAX_RUN_CHUNKS = 1024
"""Most consecutive chunks one lease may cover (``Exchange.run_chunks``)."""
RunChunks = Annotated[int, Field(ge=1, le=MAX_RUN_CHUNKS)]
MAX_ROW_SHARDS = 65_536
"""Hard cap of row shards per version (the hub also caps tensors x row shards: HubLimits.max_shard_pieces)."""
INSTANCE_HEADER = "X-TensorHub-Instance"
"""Every hub response names the hub instance, so clients notice a restart and re-register."""
CREDENTIAL_HEADER = "X-TensorHub-Credential"
"""The per-worker secret that registration returns; every later call for that worker carries it. A header,
not a body field: request bodies end up in logs and error messages, headers do not."""
JOB_KEY_HEADER = "X-TensorHub-Job-Key"
"""Sent with a registration only: the secret that admits the worker to its job, whose members alone create
versions of the job's models (``ownership.py``). Absent: the hub's default job."""
REGISTER_PATH = "/v1/workers/register"
HUB_INFO_PATH = "/v1/hub"
HOLDER_SEPARATOR = "~"
"""A worker's holders are named ``<worker>`` or ``<worker>~<suffix>`` (e.g. its CPU archive ``w~cpu``), so
worker ids may not contain it: no worker can publish under a holder name that belongs to another."""
STANDBY_SUFFIX = "~standby"
"""The holder of a publisher's copy in a region that takes its first copy from another region (``regions.py``):
the planner reads a chunk from it only where no other holder as near has that chunk (``planner.py``)."""
RELAY_SUFFIX = "~relay"
"""The holder of a reader's checked copy, registered in another region's hub as that region's first source
(``regional_client.py``)."""
WorkerId = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9._:/@+=-]+$")]


def _is_base64(text: str) -> str:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"not valid base64: {e}") from None
    return text


Base64 = Annotated[str, Field(min_length=4, max_length=64 << 20), AfterValidator(_is_base64)]
Seconds = Annotated[float, Field(ge=0, le=86_400)]


class Strict(BaseModel):
    """Requests (and messages that travel both ways): strict types, finite numbers, no unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Reply(BaseModel):
    """Hub replies, parsed by clients from JSON (object keys arrive as strings): lax types."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LocationMsg(Strict):
    dc: Name = "dc0"
    rack: Name = "r0"
    node: Name = "n0"
    gpu: Name | None = None


class TensorSpecMsg(Strict):
    name: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$")]
    shape: list[Annotated[int, Field(ge=0, le=2**48)]] = Field(max_length=MAX_DIMS)
    dtype: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9_]+$")]
    nbytes: Annotated[int, Field(ge=0, le=2**52)]


class TensorBlocksMsg(Strict):
    """One tensor's block digests along one dim (``manifest.TensorBlocks``)."""

    tensor: Annotated[int, Field(ge=0, lt=MAX_TENSORS)]
    dim: Annotated[int, Field(ge=0, le=1)]
    blocks: Annotated[int, Field(ge=1, le=64)]
    digests: list[Annotated[str, Field(pattern=r"^([0-9a-f]{16})?$")]] = Field(max_length=MAX_CHUNKS)


class ManifestMsg(Strict):
    model: Name
    version: Version
    layout: Name
    tensors: list[TensorSpecMsg] = Field(min_length=1, max_length=MAX_TENSORS)
    chunk_bytes: Annotated[int, Field(ge=4096, le=1 << 31)]
    fingerprint: Annotated[str, Field(max_length=128)] = ""
    chunk_digests: list[Annotated[str, Field(pattern=r"^([0-9a-f]{16})?$")]] = Field(default=[], max_length=MAX_CHUNKS)
    """The digest of each chunk (``digest_algorithm``), hex, from the publisher; readers check every chunk against
    it. Empty: unchecked. A row shard's publish sends "" for the chunks of other ranks (see limits.py)."""
    digest_algorithm: Annotated[str, Field(max_length=32)] = "xxh3_64"
    """What computed the digests; a publisher that does not say used xxh3-64. Readers refuse other than theirs."""
    block_digests: list[TensorBlocksMsg] = Field(default=[], max_length=2 * MAX_TENSORS)
    """Per-tensor block digests, which check ranged reads of chunks read in part (integrity.py)."""
    row_shards: Annotated[int, Field(ge=1, le=MAX_ROW_SHARDS)] = 1
    """The chunk map is aligned to this many dim-0 row shards (manifest.py); 1: the plain chunk map."""


class RegionMsg(Strict):
    """Where one tensor lives in its holder's memory, as the data plane needs it."""

    addr: Annotated[int, Field(ge=0, lt=2**64)]
    device: Annotated[int, Field(ge=0, le=1023)] = 0
    mem: Literal["DRAM", "VRAM"] = "DRAM"
    offset: Annotated[int, Field(ge=0, le=2**52)] = 0
    """Bytes of the tensor before ``addr``'s byte: a row shard's region starts mid-tensor. The byte at
    tensor offset ``o`` lives at ``addr + (o - offset)``."""
    nbytes: Annotated[int, Field(ge=0, le=2**52)] | None = None
    """Bytes of the tensor held from ``offset`` on; None: through the tensor's end. Readers refuse to read
    outside [offset, offset + nbytes)."""


class RegisterWorker(Strict):
    worker: WorkerId
    location: LocationMsg
    spot: bool = False
    agent_name: Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[\x21-\x7e]+$")]
    agent_metadata_b64: Base64
    grant_key_b64: Annotated[str, Field(min_length=44, max_length=44), AfterValidator(_is_base64)] | None = None
    """A data plane whose server checks each read (TCP) gives the hub this 32-byte key: every lease on this
    worker's memory then carries a grant signed with it (planes/grants.py). Never sent to anyone else."""
    preconnect: Annotated[int, Field(ge=0, le=16)] = 0
    """How many likely sources the reply should name (``WorkerAck.peers``), so the worker connects to them
    before its first fetch needs them. Named only between workers whose data planes check grants."""
    plane: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9_-]+$")] = "nixl"
    """The worker's data plane (``planes/factory.py``: 'nixl' or 'tcp'). Every worker of one hub uses the hub's
    plane (``HubConfig.plane``): the hub refuses a worker that declares another (``PlaneMismatch``)."""


class WorkerAck(Reply):
    worker: Name
    hub_instance: str
    heartbeat_s: float
    release: list["HoldingKey"] = []
    """Holdings the hub asks this worker to drop (older than the retention window)."""
    credential: str = ""
    """Set in the reply to a registration only: the secret that proves this worker's identity from now on
    (send it as the ``X-TensorHub-Credential`` header). Re-registering a live id needs it."""
    peers: list["PeerMsg"] = []
    """Set in the reply to a registration only: up to ``RegisterWorker.preconnect`` workers that hold the newest
    version of some model, nearest first: the sources a worker that just joined most likely reads from."""
    plane: str = ""
    """The hub's data plane (``planes/one_plane.py``)."""


class HubInfo(Reply):
    """``GET /v1/hub``: what a client needs before it registers."""

    hub_instance: str
    plane: str
    """The data plane every worker of this hub uses: a client on 'auto' creates this one."""


class PeerMsg(Reply):
    """A worker whose data-plane server checks a hub-signed grant on every read (the TCP plane), so its
    metadata is only an address: knowing it lets a peer connect early, not read. (NIXL metadata is a
    capability, and goes only to a reader with a lease on that worker: ``SourceInfo``.)"""

    worker: Name
    agent_name: str
    agent_metadata_b64: str


class HoldingKey(Reply):
    model: Name
    version: Version
    layout: Name


class Publish(Strict):
    worker: Name
    holder: Name
    manifest: ManifestMsg
    regions: list[RegionMsg] = Field(max_length=MAX_TENSORS)
    shard_group: Name | None = None
    """Set by each shard of a k-shard engine (e.g. TP ranks): no shard is visible until all k committed."""
    shard_count: Annotated[int, Field(ge=1, le=65536)] = 1
    shard_rank: Annotated[int, Field(ge=0, lt=MAX_ROW_SHARDS)] | None = None
    """Set by row shard ``shard_rank`` of a ``manifest.row_shards``-way row-sharded version (an FSDP rank): it
    holds only that rank's rows, so its regions start at its first byte of each tensor. Needs
    ``shard_count == manifest.row_shards`` and a ``shard_group``; the group's ranks are all distinct."""


class Unpublish(Strict):
    worker: Name
    holder: Name
    model: Name
    version: Version
    layout: Name
    wait_s: Annotated[float, Field(ge=0, le=60)] = 5.0


class DrainAck(Reply):
    """A holder's reads drained (or still ``inflight`` when the call's wait ran out)."""

    drained: bool
    inflight: int


class UnpublishAck(DrainAck):
    """Reply of ``/v1/unpublish``."""


class EndFetchAck(DrainAck):
    """Reply of ``/v1/fetch/end``: a fetch that does not keep the version drains like an unpublish."""


class OkReply(Reply):
    """Reply of the calls that only succeed or raise: ``/v1/publish``, ``/v1/workers/leave``."""

    ok: bool = True


class PreserveQuery(Strict):
    holder: Name
    model: Name
    version: Version
    layout: Name


class PreserveAnswer(Reply):
    must_preserve: bool
    reason: str = ""


class BeginFetch(Strict):
    worker: Name
    holder: Name
    model: Name
    version: Version
    layout: Name
    digest: Annotated[str, Field(max_length=64)]
    regions: list[RegionMsg] = Field(max_length=MAX_TENSORS)
    have: list[Annotated[int, Field(ge=0, lt=MAX_CHUNKS)]] = Field(default=[], max_length=MAX_CHUNKS)
    """Chunks already landed: a fetch re-registered after a hub restart keeps its progress."""
    need: list[Annotated[int, Field(ge=0, lt=MAX_CHUNKS)]] | None = Field(default=None, max_length=MAX_CHUNKS)
    """A ranged read (``ranges.py``): only these chunks are planned for it; None: every chunk. Its regions
    then cover the byte range of each tensor its buffers hold ((0, 0): none), and it never holds the version."""
    unserved: list[Annotated[int, Field(ge=0, lt=MAX_CHUNKS)]] = Field(default=[], max_length=MAX_CHUNKS)
    """Chunks of ``need`` this reader reads only in part (or into strided buffers): never served from it."""
    want: Annotated[int, Field(ge=0, le=1024)] = 0
    """Assignments wanted in the reply (``BeginFetchReply.first``), as an ``Exchange`` would ask: the reads
    start one hub round trip sooner. 0: none, the reply is only the manifest."""
    run_chunks: RunChunks = 1
    """As ``Exchange.run_chunks``, for the first exchange."""


class FailedRead(Strict):
    lease: Annotated[int, Field(ge=0)]
    reason: Annotated[str, Field(max_length=2000)] = ""
    corrupt: bool = False
    """The read landed but its bytes did not match the chunk's digest: the source is quarantined."""
    landed: list[Annotated[int, Field(ge=0, lt=MAX_CHUNKS)]] = Field(default=[], max_length=MAX_RUN_CHUNKS)
    """Chunks of a run lease (``AssignmentMsg.count`` > 1) that did land, digests checked: the hub books them
    as a completed read would; the run's other chunks are needed again."""


class Exchange(Strict):
    worker: Name
    holder: Name
    model: Name
    version: Version
    layout: Name
    completed: list[Annotated[int, Field(ge=0)]] = Field(default=[], max_length=16_384)
    failed: list[FailedRead] = Field(default=[], max_length=16_384)
    want: Annotated[int, Field(ge=0, le=1024)] = 4
    """Leases wanted: each covers one chunk, or a run of them (``run_chunks``)."""
    run_chunks: RunChunks = 1
    """Most consecutive chunks one lease may cover: a reader on a fast link asks for runs, so that it makes one
    exchange per run instead of one per few chunks (1: a lease per chunk)."""
    wait_s: Annotated[float, Field(ge=0, le=10)] = 0.0
    known_sources: dict[Name, Annotated[int, Field(ge=0)]] = Field(default={}, max_length=MAX_SOURCES)
    """holder -> generation of its region/agent info the reader already has cached."""


class SourceInfo(Reply):
    holder: Name
    worker: Name
    generation: int
    agent_name: str
    agent_metadata_b64: str = ""
    """Empty when the reader already holds this generation's metadata (``Exchange.known_sources``)."""
    regions: dict[int, RegionMsg]
    """tensor index -> address, only for the tensors that this reply's leases from this source read."""
    partial: bool


class AssignmentMsg(Reply):
    lease: int
    chunk: int
    count: int = 1
    """The lease reads chunks [chunk, chunk + count) from ``source`` (a run; 1: one chunk)."""
    source: Name
    distance: int
    grant: str = ""
    """The lease's proof for the source's data-plane server (grants.py); empty when the source needs none. A
    run's grant signs all of its chunks' ranges (``grants.run_ranges``)."""


class ExchangeReply(Reply):
    assignments: list[AssignmentMsg]
    sources: list[SourceInfo]
    revoked: list[int]
    """Leases whose reads must not be trusted (they outlived their deadline); their chunks are needed again."""
    have: int
    total: int
    unservable: list[int] = []


class BeginFetchReply(Reply):
    """Reply of ``/v1/fetch/begin``: when the request wanted some, the fetch's first exchange (assignments and
    their sources), so the first reads need no second round trip. No manifest: the reader has it already (the
    hub checked the request's digest against it), and parsing it again cost each fetch about a millisecond."""

    first: ExchangeReply | None = None


class EndFetch(Strict):
    worker: Name
    holder: Name
    model: Name
    version: Version
    layout: Name
    ok: bool
    hold: bool
    seconds: Seconds = 0.0
    wait_s: Annotated[float, Field(ge=0, le=60)] = 5.0


class DeltaReport(Strict):
    """A reader's report that a delta form (``delta_form.py``) does not build its version: its base chunks had the
    base digests, yet its payloads do not give the target's. On independent evidence the hub stops listing it."""

    worker: WorkerId
    model: Name
    version: Version
    layout: Name
    reason: Annotated[str, Field(max_length=2000)] = ""


class DeltaReportAck(Reply):
    quarantined: bool
    """Whether the delta is now withheld from every reader (they read the version in full)."""


FLIP_REPORT_PATH = "/v1/flip/report"


PullOutcome = Literal["staged", "check_failed", "unavailable"]
"""How a replica's pull of a version for the fleet flip ended: ``staged`` (every chunk landed and matched its
digest), ``check_failed`` (bytes were read and did not match the version's digests: a corrupt or wrong version,
blocked everywhere) or ``unavailable`` (the bytes were never read: no holder, a dead holder, a timeout; the
replica just does not hold it)."""


class FlipReport(Strict):
    """A rollout replica's report for the fleet flip (``hub/flip_rule.py``): the version it serves, and the version
    of its last staged pull with how that pull ended. The reply says whether it flips now, and to which version.

    A report of an older client (``staged``, ``failed``) is read where it is unambiguous: ``staged: N`` is
    ``pull: N, outcome: staged``. Its ``failed`` cannot tell a failed check from a version nobody could serve, so
    it is refused: update tensorhub_verl on that replica."""

    worker: WorkerId
    model: Name
    serving: Version | None = None
    pull: Version | None = None
    """The version of the replica's last staged pull (None: nothing to report)."""
    outcome: PullOutcome | None = None
    """How that pull ended; given exactly when ``pull`` is."""
    min_replica_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0

    @model_validator(mode="before")
    @classmethod
    def _older_client(cls, data):
        if not isinstance(data, dict) or not ({"staged", "failed"} & data.keys()):
            return data
        if data.get("failed") is not None:
            raise ValueError("'failed' does not say whether the version failed its check or could not be read; "
                             "report 'pull' with 'outcome' (check_failed or unavailable): update tensorhub_verl "
                             "on this replica")
        staged = data.get("staged")
        data = {k: v for k, v in data.items() if k not in ("staged", "failed")}
        if staged is not None:
            if data.get("pull") is not None:
                raise ValueError("give 'pull' and 'outcome', not 'staged' too")
            data.update(pull=staged, outcome="staged")
        return data

    @model_validator(mode="after")
    def _outcome_with_pull(self):
        if (self.pull is None) != (self.outcome is None):
            raise ValueError("'pull' and 'outcome' go together: the version of the last staged pull and how it "
                             "ended (staged, check_failed or unavailable)")
        return self


class FlipReply(Reply):
    committed: int | None
    """The version the fleet flips to; ``previous`` the commit before it (replicas behind catch up to it first)."""
    previous: int | None = None
    flip_to: int | None = None
    """The version this replica flips to now (None: it keeps serving what it serves)."""
    wave: int | None = None
    """1: a catch-up to ``previous``, flipped before every flip to ``committed`` (2)."""
    blocked: str = ""
    """Why a newer staged version is not committed yet."""
    failed: list[int] = []
    """Versions whose check failed on some replica (``check_failed``): no replica flips to them."""
    fetchable: list[int] | None = None
    """The model's versions that some holder has now (None: a hub that does not say)."""


class ReplicaFlipStatus(Reply):
    serving: int | None
    pull: int | None = None
    """The version of the replica's last staged pull; ``outcome`` how it ended (``PullOutcome``)."""
    outcome: PullOutcome | None = None


class FlipStatus(Reply):
    """One model's fleet flip in ``/v1/status``: its commits and each replica's serving and staged version."""

    committed: int | None
    previous: int | None
    failed: list[int]
    blocked: str
    replicas: dict[str, ReplicaFlipStatus]


class VersionsReply(Reply):
    model: str
    versions: dict[int, list[str]]


class WaitReply(Reply):
    """Reply of the ``/v1/wait`` long-poll: the newest version newer than asked, None when none came in time."""

    version: int | None


class HolderStatus(Reply):
    holder: str
    worker: str
    state: str
    quarantined: bool
    chunks: int
    served_bytes: int


class VersionStatus(Reply):
    version: int
    layout: str
    bytes: int
    chunks: int
    holders: list[HolderStatus]


class WorkerStatus(Reply):
    location: dict[str, str]
    """``Location.as_dict()``: dc, rack, node, and gpu only when set."""
    spot: bool
    bytes_served: int
    last_seen_s: float


class StatusReply(Reply):
    """Reply of ``/v1/status`` (``tensorhub status``)."""

    hub_instance: str
    workers: dict[str, WorkerStatus]
    models: dict[str, list[VersionStatus]]
    leases_in_flight: int
    leases_revoked: int
    sweeps: int = 0
    """Upkeep passes (silent workers, overdue leases) the hub has made since it started."""
    flips: dict[str, FlipStatus] = {}
    """model -> its fleet flip, for models whose rollout replicas report to one (``FlipReport``)."""


class ErrorReply(Reply):
    """Body of every error reply. ``tensor``: set by a ManifestMismatch that names one (absent otherwise)."""

    error: str = ""
    detail: str
    tensor: str | None = None

    def body(self) -> dict:
        """The JSON object sent: ``tensor`` only when set."""
        return self.model_dump(exclude_none=True)
