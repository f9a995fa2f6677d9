"""Retention alone, over a version store: release lists, the newest holders, rebuilt only for changed models."""

from tensorhub_verl.ros.hub.retention import Retention
from tensorhub_verl.ros.hub.versions import VersionStore
from tensorhub_verl.ros.wire.topology import Location

from tests.ros.hub.parts import holding, manifest, record_of


def _publish(store, retention, model, version, holder):
    key = (model, version, "hf")
    record = store.get(key)
    if record is None:
        record = record_of(manifest(model, version))
        store.add(key, record)
    record.put(holding(holder), Location())
    retention.changed(model)


def test_holdings_outside_the_newest_versions_are_released():
    store, retention = VersionStore(), Retention(keep_versions=2)
    for v in (1, 2, 3):
        _publish(store, retention, "m", v, "a")
    _publish(store, retention, "m", 3, "b")
    assert [(k.model, k.version) for k in retention.release_for("a", store)] == [("m", 1)]
    assert retention.release_for("b", store) == []
    assert retention.retained("m", store) == [3, 2]


def test_only_changed_models_are_looked_at_again(monkeypatch):
    store, retention = VersionStore(), Retention(keep_versions=1)
    for model in ("m", "n"):
        for v in (1, 2):
            _publish(store, retention, model, v, "a")
    assert len(retention.release_for("a", store)) == 2
    rebuilt = []
    original = Retention._rebuild
    monkeypatch.setattr(Retention, "_rebuild", lambda self, model, versions: (rebuilt.append(model),
                                                                              original(self, model, versions)))
    retention.release_for("a", store)
    assert rebuilt == []
    _publish(store, retention, "n", 3, "a")
    assert {(k.model, k.version) for k in retention.release_for("a", store)} == {("m", 1), ("n", 1), ("n", 2)}
    assert rebuilt == ["n"]


def test_newest_holders_follow_each_models_newest_visible_version():
    store, retention = VersionStore(), Retention(keep_versions=2)
    _publish(store, retention, "m", 1, "old")
    _publish(store, retention, "m", 2, "new")
    _publish(store, retention, "n", 1, "other")
    assert retention.newest_holders(store) == {"new", "other"}
    store.get(("m", 2, "hf")).pop("new")
    retention.changed("m")
    assert retention.newest_holders(store) == {"old", "other"}
