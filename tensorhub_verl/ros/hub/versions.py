"""The hub's versions: each version's manifest, chunk map and holdings, found by key and by model.

A version is visible (``versions``/``latest``, retention, ``/v1/wait``) only while its ``active`` holdings together
have every chunk (``visible``): one full holder, or row shards that add up. ``model_seq`` counts, per model, the
changes that may have changed what is visible; parked long-polls compare it.
"""

from __future__ import annotations

from typing import Iterator

from tensorhub_verl.ros.hub.records import Holding, HoldingState, Key, VersionRecord


class VersionStore:
    def __init__(self) -> None:
        self._versions: dict[Key, VersionRecord] = {}
        self._model_keys: dict[str, set[Key]] = {}
        """model -> keys of its version records: per-model queries never scan every version."""
        self.model_seq: dict[str, int] = {}
        """model -> bumped whenever its active holdings may have changed."""

    def __len__(self) -> int:
        return len(self._versions)

    def get(self, key: Key) -> VersionRecord | None:
        return self._versions.get(key)

    def holding(self, key: Key, holder: str) -> Holding | None:
        record = self._versions.get(key)
        return record.holdings.get(holder) if record is not None else None

    def items(self) -> Iterator[tuple[Key, VersionRecord]]:
        return iter(list(self._versions.items()))

    def add(self, key: Key, record: VersionRecord) -> None:
        self._versions[key] = record
        self._model_keys.setdefault(key[0], set()).add(key)

    def records_of(self, model: str) -> list[tuple[Key, VersionRecord]]:
        """(key, record) of one model's versions, in key order: O(its versions), not O(all versions)."""
        return [(k, self._versions[k]) for k in sorted(self._model_keys.get(model, ()))]

    def visible_versions(self, model: str) -> list[int]:
        """The model's visible version numbers (any layout), newest first."""
        return sorted({k[1] for k, r in self.records_of(model) if self.visible(r)}, reverse=True)

    def holdings_of(self, worker: str) -> list[Holding]:
        return [h for r in self._versions.values() for h in r.holdings.values() if h.worker == worker]

    def pending(self) -> list[tuple[Key, Holding]]:
        """Every holding that waits for the rest of its shard group."""
        return [(k, h) for k, r in self._versions.items() for h in r.holdings.values()
                if h.state == HoldingState.PENDING]

    def pending_of(self, worker: str) -> list[tuple[Key, Holding]]:
        """The worker's holdings that wait for the rest of their shard group."""
        return [(k, h) for k, r in self._versions.items() for h in r.holdings.values()
                if h.worker == worker and h.state == HoldingState.PENDING]

    def forget_if_empty(self, key: Key) -> bool:
        """Drops the record of ``key`` when no holding is left; True when no layout of that version is left (its
        shard groups can go too)."""
        record = self._versions.get(key)
        if record is None or record.holdings:
            return False
        del self._versions[key]
        keys = self._model_keys.get(key[0], set())
        keys.discard(key)
        if not keys:
            self._model_keys.pop(key[0], None)
        return not any(k[1] == key[1] for k in keys)

    def changed(self, *models: str) -> None:
        for model in models:
            self.model_seq[model] = self.model_seq.get(model, 0) + 1

    @staticmethod
    def visible(record: VersionRecord) -> bool:
        """Its active holdings together have every chunk: a full holder, or one row shard of every rank (an
        active holding is one or the other). A row shard that died without a stand-in hides the version again.
        O(holdings), not O(chunks): it runs for every version of a model on each query."""
        ranks = set()
        for h in record.holdings.values():
            if h.state == HoldingState.ACTIVE and h.chunks is None:
                return True
            if h.state == HoldingState.ACTIVE:
                ranks.add(h.shard_rank)
        return len(ranks) == record.manifest.row_shards
