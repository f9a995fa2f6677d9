"""The hub's registry of workers: who is registered, the hash of each one's credential, and which job each worker
id belongs to.

A worker acts only as itself: registration binds a random credential to the worker id (the registry keeps only
its hash), and every call for a worker is checked against it (``authenticate``). A worker id is bound to the job
of its first registration for the hub's lifetime, so an id freed by a worker that left or timed out never changes
hands between jobs (an ``--owner`` rule names ids).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Iterator

from tensorhub_verl.errors import NotOwner, UnknownWorker
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.records import WorkerRecord
from tensorhub_verl.ros.hub.ownership import job_of
from tensorhub_verl.ros.planes.one_plane import check_hub_plane


@dataclass(frozen=True, slots=True)
class Admission:
    """A registration the registry accepts: the secret to hand back, the job, and the live record it replaces."""
    secret: str
    job: str
    old: WorkerRecord | None
    restarted: bool
    """A new process took over a live id (another agent name): its old holdings are gone with its memory."""


class Registry:
    def __init__(self, instance: str, worker_timeout_s: float, plane: str = "nixl"):
        self.instance = instance
        self.plane = plane
        """The hub's data plane: every worker registers with it (``planes/one_plane.py``)."""
        self.worker_timeout_s = worker_timeout_s
        self._workers: dict[str, WorkerRecord] = {}
        self._id_jobs: dict[str, str] = {}
        """worker id -> the job of its first registration."""

    def __contains__(self, worker: object) -> bool:
        return worker in self._workers

    def __len__(self) -> int:
        return len(self._workers)

    def __iter__(self) -> Iterator[WorkerRecord]:
        return iter(list(self._workers.values()))

    def get(self, worker: str) -> WorkerRecord | None:
        return self._workers.get(worker)

    def require(self, worker: str) -> WorkerRecord:
        record = self._workers.get(worker)
        if record is None:
            raise UnknownWorker(f"worker {worker!r} is not registered with hub {self.instance}; register first")
        return record

    def admit(self, req: msg.RegisterWorker, credential: str, job_key: str) -> Admission:
        """Checks a registration (the hub's data plane, the live id's credential, the id's job) and returns
        what to record; changes nothing but the id's job binding on its first registration.

        A live id is re-registered only with its credential (a worker refreshing its data-plane metadata);
        anyone else gets NotOwner until that worker leaves or misses its heartbeats."""
        old = self._workers.get(req.worker)
        check_hub_plane(req.worker, req.plane, self.plane)
        if old is not None and not same_secret(old.credential_hash, credential):
            raise NotOwner(f"worker id {req.worker!r} is held by a live worker; re-registering it needs "
                           f"that worker's credential (the id frees {self.worker_timeout_s:g} s after "
                           f"its last heartbeat, or when it leaves)")
        job = job_of(job_key)
        if old is not None and old.job != job:
            raise NotOwner(f"worker {req.worker!r} is registered in job {old.job!r}; a live worker keeps its "
                           f"job (leave, then register with the other job key)")
        first_job = self._id_jobs.setdefault(req.worker, job)
        if first_job != job:
            raise NotOwner(f"worker id {req.worker!r} belongs to job {first_job!r}, whose worker first registered "
                           f"it on hub {self.instance}; a freed id is never given to another job. Register "
                           f"with that job's key (ClientConfig.job_key), or under another worker id")
        secret = credential if old is not None else secrets.token_urlsafe(32)
        restarted = old is not None and old.agent_name != req.agent_name
        return Admission(secret, job, old, restarted)

    def put(self, record: WorkerRecord) -> None:
        self._workers[record.worker] = record

    def remove(self, worker: str) -> WorkerRecord | None:
        """Forgets a worker (it left or timed out); its id stays bound to its job."""
        return self._workers.pop(worker, None)

    def authenticate(self, worker: str, credential: str) -> WorkerRecord:
        """The registered ``worker``, when ``credential`` is its own; NotOwner otherwise."""
        record = self.require(worker)
        if not same_secret(record.credential_hash, credential):
            raise NotOwner(f"this call acts for worker {worker!r} without its credential; only that worker "
                           f"may publish, unpublish, fetch or heartbeat as itself")
        return record

    def touch(self, worker: str, now: float, stalled: float) -> WorkerRecord:
        """Records that ``worker`` was heard at ``now`` (the hub's stall total then: see ``silence``)."""
        return heard(self.require(worker), now, stalled)

    @staticmethod
    def silence(record: WorkerRecord, now: float, stalled: float) -> float:
        """How long the worker was silent while the hub was awake (``liveness``): heartbeats that queued while
        the hub's own event loop stalled do not count against the worker that sent them."""
        return now - stalled - record.awake_at_seen

    def silent(self, now: float, stalled: float) -> list[tuple[WorkerRecord, float]]:
        """The workers silent past the timeout, with their silence."""
        return [(r, s) for r in self._workers.values()
                if (s := self.silence(r, now, stalled)) > self.worker_timeout_s]

    def alive(self, record: WorkerRecord, now: float, stalled: float) -> bool:
        return self.silence(record, now, stalled) <= self.worker_timeout_s


def heard(record: WorkerRecord, now: float, stalled: float) -> WorkerRecord:
    """Records that the worker was heard at ``now``, when the hub had been stalled ``stalled`` seconds in all.
    Safe without the state lock (a heartbeat on the event loop): liveness reads only ``awake_at_seen``, written
    in one store; ``last_seen`` is for display. A record the sweeper dropped meanwhile is written to and
    forgotten: its worker's next call finds it unknown and registers again."""
    record.last_seen = now
    record.awake_at_seen = now - stalled
    return record


def hash_secret(secret: str) -> bytes:
    """sha256 of a credential: a leaked status dump or core file does not leak the secret."""
    return hashlib.sha256(secret.encode()).digest()


def same_secret(expected_hash: bytes, presented: str) -> bool:
    return bool(presented) and hmac.compare_digest(expected_hash, hash_secret(presented))
