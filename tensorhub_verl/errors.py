"""Typed errors of TensorHub. Every failure a caller can act on has its own class.

Each message names the problem and, where there is one, the fix.
"""

from __future__ import annotations


class TensorHubError(Exception):
    """Base class of every error raised by tensorhub_verl."""


class VersionNotFound(TensorHubError):
    """The model, version or layout asked for is not held by any worker."""


class ManifestMismatch(TensorHubError):
    """Buffers or bytes do not match a version's manifest; the message names the first tensor that differs."""

    def __init__(self, message: str, tensor: str | None = None):
        super().__init__(message)
        self.tensor = tensor


class DtypeMismatch(ManifestMismatch):
    """Buffers match a version's tensors in everything but dtype: the publisher must publish in the readers'
    dtype (a verl job: ``actor_rollout_ref.rollout.dtype``, passed as ``tensorhub.rollout_dtype``), or the
    reader must read into buffers of the published dtype."""

    def __init__(self, message: str, tensor: str | None = None, buffer_dtype: str = "", published_dtype: str = ""):
        super().__init__(message, tensor=tensor)
        self.buffer_dtype = buffer_dtype
        self.published_dtype = published_dtype


class BaseMismatch(ManifestMismatch):
    """A form of a version that applies on top of a base (a LoRA adapter) names a base version the engine does
    not hold: applying it would serve weights nobody trained. Bring the engine's base to that version first."""

    def __init__(self, message: str, base_version: int | None = None, held_version: int | None = None):
        super().__init__(message)
        self.base_version = base_version
        self.held_version = held_version


class Unauthorized(TensorHubError):
    """The hub refused the request: token missing or wrong."""


class NotOwner(Unauthorized):
    """The call acts for a worker (or its holder, or its id) without that worker's credential.

    The shared token only admits a worker to register; registration returns a credential bound to the
    worker id, and every later call for that worker must present it."""


class NotModelOwner(NotOwner):
    """A publish would create a version, layout or shard of a model that belongs to another job (or to the
    workers a hub rule names). ``model``: the model asked for."""

    def __init__(self, message: str, model: str = ""):
        super().__init__(message)
        self.model = model


class JobKeyRequired(Unauthorized):
    """A hub with a token admits only workers that register with a job key (``ClientConfig.job_key``), unless it
    was started with ``allow_keyless``; the message says how to give one."""


class HubAddressInUse(TensorHubError):
    """The hub cannot listen on its address: another process holds the port. The message names the address."""


class UnverifiedVersion(TensorHubError):
    """A version's manifest lacks chunk digests, so its bytes cannot be checked as they land; a reader refuses
    it unless configured not to (``ClientConfig.require_digests``, for trusted tests only)."""


class TransferFailed(TensorHubError):
    """No holder could serve a chunk (all sources failed, or the fetch timed out)."""


class DigestMismatch(TransferFailed):
    """Bytes of a version were read and do not match its publisher's digests: every holder that could serve a chunk
    served bytes that fail the chunk's digest, or the weights an engine serves differ from the published version
    (``verify_digests``). The version's check failed (a corrupt or wrong version), unlike its parent
    ``TransferFailed``'s other cases (no holder, a dead holder, a timeout), where the bytes were never read."""


class HubUnavailable(TensorHubError):
    """The hub did not answer within the client's retry budget."""


class HubNotProven(HubUnavailable):
    """The process at the hub's address could not prove that it holds the hub's token (``hub_proof``): an
    impostor on the hub's port, a hub with another token, or no hub at all. Nothing secret was sent to it."""


class PlainHttpToTls(HubUnavailable):
    """An ``http://`` hub URL names a server that answers in TLS: use its ``https://`` URL. Nothing secret was
    sent."""


class InvalidRequest(TensorHubError):
    """The hub rejected a malformed, oversized or contradictory request; nothing was changed."""


class OverBudget(InvalidRequest):
    """A worker asked the hub to keep more than its share (e.g. pending shards, ``HubLimits``); the message
    names the limit and the setting. Nothing was changed."""


class UnknownWorker(InvalidRequest):
    """The hub does not know this worker (it restarted, or the worker expired); the client re-registers."""


class UnknownFetch(InvalidRequest):
    """The hub has no record of this fetch (it restarted); the client begins it again with what has landed."""


class PlaneMismatch(InvalidRequest):
    """A worker registered with a data plane other than the hub's (a reader can read only from holders on its
    own plane; the hub's configuration chooses the plane). ``plane``: the worker's; ``hub_plane``: the hub's.
    The message names the setting that fixes it."""

    def __init__(self, message: str, plane: str = "", hub_plane: str = ""):
        super().__init__(message)
        self.plane = plane
        self.hub_plane = hub_plane


class Cancelled(TensorHubError):
    """The caller stopped the operation before it produced anything (e.g. an attached node asked to stop
    before it served a first version)."""


class ConfigError(TensorHubError, ValueError):
    """A configuration value is invalid; the message names the field and the accepted values."""


class DeltaCorrupt(TensorHubError):
    """A chunk's delta payload is malformed (wrong header, lengths, positions out of range or out of order, a
    stream that does not decompress): nothing was written. The fix is to read the chunk of the target version
    in full from a verified holder. ``encoding``: the payload's declared encoding; ``reason``: what was wrong."""

    def __init__(self, message: str, encoding: str = "", reason: str = ""):
        super().__init__(message)
        self.encoding = encoding
        self.reason = reason


class DeltaRefused(InvalidRequest):
    """A delta was not published or not applied: its declared base is not the version the reader (or the hub)
    holds, its base is no longer retained, or it does not describe the version's chunks and digests. Nothing was
    written; the message names the mismatch. A reader that gets it from ``fetch(have=...)`` reads the version in
    full instead (``FetchStats.delta``)."""


class DeltaWithheld(VersionNotFound):
    """The hub withholds a delta: readers reported that it does not build its version. Its readers read the version
    in full (``fetch(have=...)`` does so by itself)."""


__all__ = [
    "TensorHubError",
    "VersionNotFound",
    "ManifestMismatch",
    "DtypeMismatch",
    "BaseMismatch",
    "Unauthorized",
    "NotOwner",
    "NotModelOwner",
    "JobKeyRequired",
    "UnverifiedVersion",
    "TransferFailed",
    "DigestMismatch",
    "HubUnavailable",
    "HubNotProven",
    "PlainHttpToTls",
    "HubAddressInUse",
    "InvalidRequest",
    "DeltaRefused",
    "DeltaWithheld",
    "UnknownWorker",
    "UnknownFetch",
    "PlaneMismatch",
    "DeltaCorrupt",
    "Cancelled",
    "ConfigError",
]
