"""Who may create versions of a model: its owner. Pure bookkeeping, no I/O; the hub calls it under its lock.

A *job* is the set of workers that registered with the same job key (``ClientConfig.job_key``, a secret the
hub keeps only a hash of); workers without a key share the hub's default job, which a hub with a token admits
only when told to (``HubConfig.allow_keyless``). A model's owner is either
configured (``HubConfig.owners``: model glob -> worker-id glob, ``tensorhub hub --owner policy=trainer-*``)
or, for a model no rule names, the job of the worker that first published it. Only an owner creates:
publishes a version (or a layout of one) the hub does not have yet, or a shard of a shard group. Anyone else
may only hold a copy of a version that is already visible, with the same digests, and such a copy is never
counted as a reliable one (see ``HubState.must_preserve``).

Bindings are soft state like the rest of the hub: a restarted hub binds each unconfigured model to whichever
job re-publishes it first. Configure owners where that race matters.
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


@dataclass(frozen=True, slots=True)
class OwnerRule:
    """Models matching ``models`` (a glob) may be created only by workers whose id matches ``workers``."""

    models: str
    workers: str

    @classmethod
    def parse(cls, text: str) -> "OwnerRule":
        """``MODEL_GLOB=WORKER_GLOB``, e.g. ``policy=trainer-*``."""
        models, sep, workers = text.partition("=")
        if not sep or not models.strip() or not workers.strip():
            raise ConfigError(f"an owner rule is MODEL_GLOB=WORKER_GLOB (e.g. policy=trainer-*), "
                              f"got {text!r}")
        return cls(models.strip(), workers.strip())


class Owners:
    """The owner of each model: the first configured rule that matches, else the job of its first publish."""

    def __init__(self, rules: tuple[OwnerRule, ...] = ()):
        self._rules = rules
        self._bound: dict[str, str] = {}
        """model -> the job that first published it (models no rule names)."""

    def _rule_for(self, model: str) -> OwnerRule | None:
        return next((r for r in self._rules if fnmatch.fnmatchcase(model, r.models)), None)

    def owns(self, model: str, worker: str, job: str) -> bool:
        """Whether ``worker`` (of ``job``) may create versions of ``model``; an unbound model: anyone may."""
        rule = self._rule_for(model)
        if rule is not None:
            return fnmatch.fnmatchcase(worker, rule.workers)
        return self._bound.get(model, job) == job

    def check_create(self, model: str, worker: str, job: str, what: str) -> None:
        """Raises NotModelOwner unless ``worker`` may create ``what`` (a version, layout or shards) of
        ``model``."""
        if self.owns(model, worker, job):
            return
        rule = self._rule_for(model)
        owner = f"workers matching {rule.workers!r} (hub rule {rule.models}={rule.workers})" if rule else \
            f"job {self._bound[model]!r}, its first publisher's"
        raise NotModelOwner(
            f"model {model!r} belongs to {owner}; worker {worker!r} (job {job!r}) may not create {what}. It "
            f"may only hold a copy of a version already published, fetched through the hub. Publish under "
            f"another model name, or connect with the owner job's key (ClientConfig.job_key)", model=model)

    def bind(self, model: str, job: str) -> None:
        """Records ``job`` as the owner of a model no rule names, at its first accepted publish."""
        if self._rule_for(model) is None:
            self._bound.setdefault(model, job)
