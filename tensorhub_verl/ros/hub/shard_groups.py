"""Shard groups: the k shards of one engine (TP ranks in their own layouts, or the row shards of an FSDP trainer)
that turn ``active`` together once all k are published.

Until then each shard is ``pending``: neither visible nor read. Row shards of one version are the k holders of one
key, with k distinct ranks. A member whose holding is gone (``alive`` says so) leaves room for its replacement.
"""

from __future__ import annotations

import logging
from typing import Callable

from tensorhub_verl.errors import InvalidRequest
from tensorhub_verl.ros.hub.records import GroupKey, Member

logger = logging.getLogger("tensorhub_verl.ros.hub")

Alive = Callable[[Member], bool]


class ShardGroups:
    def __init__(self) -> None:
        self._members: dict[GroupKey, dict[Member, int | None]] = {}
        """group -> its members and their row shard rank (None: a shard in its own layout, e.g. a TP rank)."""
        self._counts: dict[GroupKey, int] = {}

    def __len__(self) -> int:
        return len(self._members)

    def check(self, group: GroupKey, count: int, member: Member, rank: int | None, alive: Alive) -> None:
        """Refuses a shard that contradicts its group (count, rank, layout): changes nothing."""
        known = self._counts.get(group, count)
        if known != count:
            raise InvalidRequest(f"shard group {group[2]!r} of {group[0]} v{group[1]} has {known} shards, not {count}")
        others = {m: r for m, r in self._live(group, alive).items() if m != member}
        if len(others) >= count:
            raise InvalidRequest(f"shard group {group[2]!r} of {group[0]} v{group[1]} has more than {count} shards")
        if any((r is None) != (rank is None) for r in others.values()):
            raise InvalidRequest(f"shard group {group[2]!r} of {group[0]} v{group[1]} mixes row shards (shard_rank "
                                 f"set) with shards in their own layouts; use one group for each")
        if rank is not None and any(r == rank for r in others.values()):
            holder = next(m[1] for m, r in others.items() if r == rank)
            raise InvalidRequest(f"row shard {rank} of {group[0]} v{group[1]} (group {group[2]!r}) is already "
                                 f"published by {holder!r}; each rank publishes once")
        if rank is not None and any(m[0] != member[0] for m in others):
            raise InvalidRequest(f"the row shards of group {group[2]!r} of {group[0]} v{group[1]} are one layout, "
                                 f"{next(iter(others))[0][2]!r}, not {member[0][2]!r}")

    def commit(self, group: GroupKey, count: int, member: Member, rank: int | None, alive: Alive) -> list[Member]:
        """Adds a member; returns every member once the group is complete (they turn active), else []."""
        members = self._live(group, alive)
        members[member] = rank
        self._members[group] = members
        self._counts[group] = count
        if len(members) < count:
            return []
        logger.info("%s v%d: all %d shards of %s committed", group[0], group[1], count, group[2])
        return list(members)

    def forget_version(self, model: str, version: int) -> None:
        """No layout of this version is held any more: its groups go."""
        for group in [g for g in self._members if g[:2] == (model, version)]:
            del self._members[group]
            self._counts.pop(group, None)

    def _live(self, group: GroupKey, alive: Alive) -> dict[Member, int | None]:
        return {m: r for m, r in self._members.get(group, {}).items() if alive(m)}
