"""The version store alone: visibility, per-model lookups, forgetting empty versions, change counts."""

from tensorhub_verl.ros.hub.versions import VersionStore
from tensorhub_verl.ros.wire.topology import Location

from tests.ros.hub.parts import holding, manifest, record_of


def _store_with(*specs):
    store = VersionStore()
    for model, version, layout, holdings in specs:
        record = record_of(manifest(model, version, layout=layout, row_shards=2 if layout == "rows" else 1))
        for h in holdings:
            record.put(h, Location())
        store.add((model, version, layout), record)
    return store


def test_a_version_is_visible_only_while_its_active_holdings_have_every_chunk():
    store = _store_with(("m", 1, "hf", [holding("a", state="filling", chunks=[0, 1])]),
                        ("m", 2, "hf", [holding("b")]),
                        ("m", 3, "rows", [holding("r0", shard_rank=0, chunks=frozenset({0, 1}))]))
    assert store.visible_versions("m") == [2]
    rows = store.get(("m", 3, "rows"))
    rows.put(holding("r1", shard_rank=1, chunks=frozenset({2, 3})), Location())
    assert store.visible_versions("m") == [3, 2]
    rows.holdings["r1"].state = "pending"
    assert not store.visible(rows)


def test_per_model_lookups_and_forgetting_the_last_holding():
    store = _store_with(("m", 1, "hf", [holding("a")]), ("m", 1, "tp", [holding("a~tp", "a")]),
                        ("other", 1, "hf", [holding("b")]))
    assert [k for k, _ in store.records_of("m")] == [("m", 1, "hf"), ("m", 1, "tp")]
    assert [h.holder for h in store.holdings_of("a")] == ["a", "a~tp"]
    store.get(("m", 1, "hf")).pop("a")
    assert store.forget_if_empty(("m", 1, "hf")) is False, "layout tp of version 1 is still held"
    store.get(("m", 1, "tp")).pop("a~tp")
    assert store.forget_if_empty(("m", 1, "tp")) is True and store.records_of("m") == []
    assert store.get(("other", 1, "hf")) is not None


def test_changes_are_counted_per_model():
    store = VersionStore()
    store.changed("m", "n")
    store.changed("m")
    assert store.model_seq == {"m": 2, "n": 1}
