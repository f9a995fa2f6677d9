"""Who may create versions of a model: its owner. Pure bookkeeping, no I/O; the hub calls it under its lock.

A *job* is the set of workers that registered with the same job key (``ClientConfig.job_key``, a secret the
hub keeps only a hash of); workers without a key share the hub's default job, which a hub with a token admits only
when told to (``HubConfig.allow_keyless``). A model's owner is either
configured (``HubConfig.owners``: model glob -> the workers that own it, ``tensorhub hub --owner ...``) or, for a
model no rule names, the job of the worker that first published it. Only an owner creates: publishes a version
(or a layout of one) the hub does not have yet, or a shard of a shard group. Anyone else may only hold a copy of a
version that is already visible, with the same digests, and such a copy is never counted as a reliable one (see
``HubState.must_preserve``).

A rule names its owners one of two ways: ``policy=job:job-0123456789abcdef`` (the workers of one job, by its
public name ``job_of(key)``: no one without the key joins it, on this hub instance or a restarted one) or
``policy=trainer-*`` (workers whose id matches a glob: an id is bound to the job of its first registration, but a
restarted hub binds it afresh, so a token holder that registers a matching id first after a restart owns the
model there; prefer job rules where that matters). The verl hub actor sets a job rule for its job's model.

Forms of a model: an adapter (``<model>.lora``), a delta, or any other ``<model>.<form>`` name is a form of
``<model>`` and has ``<model>``'s owner: a rule whose glob matches ``<model>`` covers every ``<model>.*`` name,
and a model bound to the job of its first publisher binds its forms to that job too (in both orders: a form
published first binds its base name's family, so no other job creates ``<model>`` afterwards).

Rules are configuration: a restarted hub has them before it accepts its first publish. Bindings are soft state
like the rest of the hub: a restarted hub binds each unconfigured model to whichever job re-publishes it first.
Configure owners where that race matters.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass

from tensorhub_verl.errors import ConfigError, NotModelOwner

DEFAULT_JOB = "default"
"""The job of every worker that registered without a job key."""


def job_of(job_key: str) -> str:
    """The public name of the job a key admits to: a hash prefix, safe to show in errors and status."""
    return DEFAULT_JOB if not job_key else "job-" + hashlib.sha256(job_key.encode()).hexdigest()[:16]


JOB_PREFIX = "job:"
"""An owner rule's right-hand side that names a job (``policy=job:job-0123...``) rather than a worker-id glob."""


def family(model: str) -> list[str]:
    """``model`` and the base names it is a form of, longest first: ``policy.lora`` -> [``policy.lora``,
    ``policy``]; ``a.b.c`` -> [``a.b.c``, ``a.b``, ``a``]."""
    parts = model.split(".")
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


@dataclass(frozen=True, slots=True)
class OwnerRule:
    """Models matching ``models`` (a glob), and every ``<model>.*`` form of one, may be created only by the workers
    ``workers`` names: a worker-id glob, or ``job:<job name>`` (``job_of``)."""

    models: str
    workers: str

    @classmethod
    def parse(cls, text: str) -> "OwnerRule":
        """``MODEL_GLOB=WORKER_GLOB`` or ``MODEL_GLOB=job:JOB``, e.g. ``policy=trainer-*``."""
        models, sep, workers = text.partition("=")
        if not sep or not models.strip() or not workers.strip():
            raise ConfigError(f"an owner rule is MODEL_GLOB=WORKER_GLOB or MODEL_GLOB=job:JOB (e.g. "
                              f"policy=trainer-* or policy=job:job-0123456789abcdef), got {text!r}")
        workers = workers.strip()
        if workers.startswith(JOB_PREFIX) and not workers[len(JOB_PREFIX):]:
            raise ConfigError(f"owner rule {text!r} names no job after 'job:'; give the job's public name "
                              f"(tensorhub_verl.ros.hub.ownership.job_of(job_key), shown in the hub's errors)")
        return cls(models.strip(), workers)

    @classmethod
    def for_job(cls, model: str, job_key: str) -> "OwnerRule":
        """The rule that gives ``model`` (and its forms) to the job ``job_key`` admits to."""
        return cls(model, JOB_PREFIX + job_of(job_key))

    def covers(self, model: str) -> bool:
        """Whether this rule names ``model``: its glob matches ``model`` or a base name ``model`` is a form of."""
        return any(fnmatch.fnmatchcase(name, self.models) for name in family(model))

    def admits(self, worker: str, job: str) -> bool:
        if self.workers.startswith(JOB_PREFIX):
            return job == self.workers[len(JOB_PREFIX):]
        return fnmatch.fnmatchcase(worker, self.workers)

    def __str__(self) -> str:
        return f"{self.models}={self.workers}"


class Owners:
    """The owner of each model: the first configured rule that covers it, else the job of its family's first
    publish."""

    def __init__(self, rules: tuple[OwnerRule, ...] = ()):
        self._rules = rules
        self._bound: dict[str, str] = {}
        """root model name (before its first '.') -> the job that first published a model of that family
        (models no rule names)."""

    @property
    def rules(self) -> tuple[OwnerRule, ...]:
        return self._rules

    def _rule_for(self, model: str) -> OwnerRule | None:
        return next((r for r in self._rules if r.covers(model)), None)

    def owns(self, model: str, worker: str, job: str) -> bool:
        """Whether ``worker`` (of ``job``) may create versions of ``model``; an unbound model: anyone may."""
        rule = self._rule_for(model)
        if rule is not None:
            return rule.admits(worker, job)
        return self._bound.get(family(model)[-1], job) == job

    def check_create(self, model: str, worker: str, job: str, what: str) -> None:
        """Raises NotModelOwner unless ``worker`` may create ``what`` (a version, layout or shards) of
        ``model``."""
        if self.owns(model, worker, job):
            return
        rule = self._rule_for(model)
        if rule is None:
            owner = f"job {self._bound[family(model)[-1]]!r}, its first publisher's"
        elif rule.workers.startswith(JOB_PREFIX):
            owner = f"job {rule.workers[len(JOB_PREFIX):]!r} (hub rule {rule})"
        else:
            owner = f"workers matching {rule.workers!r} (hub rule {rule})"
        raise NotModelOwner(
            f"model {model!r} belongs to {owner}; worker {worker!r} (job {job!r}) may not create {what}. It "
            f"may only hold a copy of a version already published, fetched through the hub. Publish under "
            f"another model name, or connect with the owner job's key (ClientConfig.job_key)", model=model)

    def bind(self, model: str, job: str) -> None:
        """Records ``job`` as the owner of the family of a model no rule names, at its first accepted publish."""
        if self._rule_for(model) is None:
            self._bound.setdefault(family(model)[-1], job)
