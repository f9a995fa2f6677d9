"""Retention and the newest-holders cache: what each worker is asked to release, and who holds each model's newest
version.

Retention keeps the newest ``keep_versions`` visible versions of each model; every worker is told, with each
heartbeat ack, its active holdings outside that window. Both answers are kept per model and brought up to date only
for the models whose holdings changed since (``changed``): a heartbeat costs O(1) in models and versions, and after
a hub restart, when every worker re-registers at once, a registration does not walk every model's versions.

``settled_release`` answers a worker's list without the state lock (a heartbeat on the event loop): ``seq`` moves
before any change of the lists, so a read that saw no change from start to end read lists nobody was changing.
"""

from __future__ import annotations

from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.hub.records import HoldingState, Key
from tensorhub_verl.ros.hub.versions import VersionStore


class Retention:
    def __init__(self, keep_versions: int):
        self.keep_versions = keep_versions
        self._release_of: dict[str, dict[Key, msg.HoldingKey]] = {}
        """worker -> its active holdings outside the retention window."""
        self._release_workers: dict[str, set[str]] = {}
        """model -> the workers with an entry of it in ``_release_of``."""
        self._stale_models: set[str] = set()
        self._newest_by_model: dict[str, frozenset[str]] = {}
        """model -> the workers actively holding its newest visible version(s): whom a joiner likely reads from."""
        self._newest_dirty: set[str] = set()
        self._newest_union: frozenset[str] | None = None
        self.seq = 0
        """Bumped before the release lists may change (``changed``): readers without the lock compare it."""

    def changed(self, *models: str) -> None:
        """A holding of these models appeared, turned active, or went: both answers look at them again."""
        self.seq += 1
        self._stale_models.update(models)
        self._newest_dirty.update(models)

    def release_for(self, worker: str, versions: VersionStore) -> list[msg.HoldingKey]:
        """The worker's active holdings outside the retention window."""
        while self._stale_models:
            model = next(iter(self._stale_models))
            self._rebuild(model, versions)
            self._stale_models.discard(model)  # only once rebuilt: a reader without the lock sees it stale till then
        return list(self._release_of.get(worker, {}).values())

    def settled_release(self, worker: str) -> list[msg.HoldingKey] | None:
        """``release_for`` without the state lock, when the lists are up to date and nobody changed them while
        this read them; None otherwise (the caller asks ``release_for`` under the lock)."""
        seen = self.seq
        if self._stale_models:
            return None
        try:
            release = list(self._release_of.get(worker, {}).values())
        except RuntimeError:  # a list changed size under the read: changed() moved seq first
            return None
        return release if self.seq == seen and not self._stale_models else None

    def retained(self, model: str, versions: VersionStore) -> list[int]:
        """The version numbers inside the model's retention window, newest first."""
        return versions.visible_versions(model)[: self.keep_versions]

    def _rebuild(self, model: str, versions: VersionStore) -> None:
        for worker in self._release_workers.pop(model, set()):
            entries = self._release_of.get(worker, {})
            for key in [k for k in entries if k[0] == model]:
                del entries[key]
            if not entries:
                self._release_of.pop(worker, None)
        visible = versions.visible_versions(model)
        if not visible:
            return
        retained = set(visible[:self.keep_versions])
        for key, record in versions.records_of(model):
            if key[1] in retained or key[1] > visible[0]:
                continue
            for holding in record.holdings.values():
                if holding.state in (HoldingState.ACTIVE, HoldingState.HELD):
                    self._release_of.setdefault(holding.worker, {})[key] = msg.HoldingKey(
                        model=key[0], version=key[1], layout=key[2])
                    self._release_workers.setdefault(model, set()).add(holding.worker)

    def newest_holders(self, versions: VersionStore) -> frozenset[str]:
        """Workers with an active holding of some model's newest visible version (in any layout)."""
        if self._newest_dirty:
            for model in self._newest_dirty:
                self._newest_by_model[model] = holders = _newest_holders_of(model, versions)
                if not holders:
                    del self._newest_by_model[model]  # a model with no version left costs nothing
            self._newest_dirty.clear()
            self._newest_union = None
        if self._newest_union is None:
            self._newest_union = frozenset().union(*self._newest_by_model.values())
        return self._newest_union


def _newest_holders_of(model: str, versions: VersionStore) -> frozenset[str]:
    found: set[str] = set()
    done_layouts: set[str] = set()
    for key, record in sorted(versions.records_of(model), key=lambda kr: -kr[0][1]):  # newest first
        if key[2] in done_layouts or not versions.visible(record):
            continue
        done_layouts.add(key[2])
        found.update(h.worker for h in record.holdings.values() if h.state == HoldingState.ACTIVE)
    return frozenset(found)
