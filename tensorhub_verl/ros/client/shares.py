"""How a version is split across several hub processes (``sharded_client.py``): K shares of whole tensors.

A hub of K shards is K ordinary hub processes. The publisher splits each version by whole tensors, in manifest
order, into K contiguous shares of about equal bytes, and publishes share i to shard i as its own version under
the layout ``<layout>@<i>/<K>``: every shard plans, leases, grants, drains and checks digests for its share alone,
and the control-plane work of an update splits K ways. The suffix keeps a share from being taken for the whole
version: a plain client asking a shard for ``hf`` finds nothing, and a client that assumes another shard count
finds nothing either. One shard (K = 1) is today's hub: the layout is left as it is.
"""

from __future__ import annotations

from typing import Sequence

from tensorhub_verl import errors

MAX_SHARDS = 64


def share_layout(layout: str, index: int, count: int) -> str:
    """The layout share ``index`` of ``count`` is published under; the layout itself with one shard."""
    return layout if count == 1 else f"{layout}@{index}/{count}"


def split(sizes: Sequence[tuple[str, int]], count: int) -> list[list[str]]:
    """``count`` contiguous groups of tensor names, in order, of about equal bytes, none empty: the first group
    ends at the first tensor that reaches 1/count of the bytes, and so on. The same sizes always give the same
    groups, so every rank and reader of a version agrees on them. Raises ConfigError with fewer tensors than
    shards (a share must hold at least one whole tensor)."""
    if not 1 <= count <= MAX_SHARDS:
        raise errors.ConfigError(f"a hub has 1 to {MAX_SHARDS} shards, got {count}")
    if len(sizes) < count:
        raise errors.ConfigError(f"a version of {len(sizes)} tensor(s) cannot be split across {count} hub shards "
                                 f"(each shard holds whole tensors): use at most {len(sizes)} shard(s) for it")
    total = sum(nbytes for _, nbytes in sizes)
    groups: list[list[str]] = [[] for _ in range(count)]
    done, group = 0, 0
    for position, (name, nbytes) in enumerate(sizes):
        later_groups = count - 1 - group
        # Move on once this group has its share of the bytes, or when every later group needs a tensor that is left.
        if groups[group] and later_groups and (done >= total * (group + 1) / count
                                               or len(sizes) - position == later_groups):
            group += 1
        groups[group].append(name)
        done += nbytes
    return groups
