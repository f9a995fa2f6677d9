"""Shard groups alone: a group commits when all k members are published; contradicting shards are refused."""

import pytest

from tensorhub_verl.errors import InvalidRequest
from tensorhub_verl.ros.hub.shard_groups import ShardGroups

GROUP = ("m", 1, "engine")
KEY = ("m", 1, "rows")


def test_a_group_commits_when_its_last_member_arrives():
    groups, alive = ShardGroups(), (lambda member: True)
    first = ((("m", 1, "tp/rank0")), "w0")
    groups.check(GROUP, 2, first, None, alive)
    assert groups.commit(GROUP, 2, first, None, alive) == []
    second = ((("m", 1, "tp/rank1")), "w1")
    groups.check(GROUP, 2, second, None, alive)
    assert sorted(groups.commit(GROUP, 2, second, None, alive)) == sorted([first, second])


def test_contradicting_shards_are_refused():
    groups, alive = ShardGroups(), (lambda member: True)
    groups.commit(GROUP, 2, (KEY, "w0"), 0, alive)
    with pytest.raises(InvalidRequest, match="has 2 shards, not 3"):
        groups.check(GROUP, 3, (KEY, "w1"), 1, alive)
    with pytest.raises(InvalidRequest, match="already published"):
        groups.check(GROUP, 2, (KEY, "w1"), 0, alive)
    with pytest.raises(InvalidRequest, match="mixes row shards"):
        groups.check(GROUP, 2, (KEY, "w1"), None, alive)
    with pytest.raises(InvalidRequest, match="one layout"):
        groups.check(GROUP, 2, (("m", 1, "other"), "w1"), 1, alive)


def test_a_dead_member_leaves_room_and_a_version_gone_forgets_its_groups():
    groups = ShardGroups()
    groups.commit(GROUP, 2, (KEY, "w0"), 0, lambda member: True)
    groups.check(GROUP, 2, (KEY, "w0b"), 0, lambda member: member[1] != "w0")  # w0's holding is gone
    groups.forget_version("m", 1)
    assert len(groups) == 0
