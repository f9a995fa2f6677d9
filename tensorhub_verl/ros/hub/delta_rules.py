"""What the hub requires of a delta (``delta_form.py``) before it creates one: a delta is a layout of version N
named after its base, and it is taken only while that base is retained and N itself is published in the base's
layout (a row shard's part: by that rank at least). Copies of a delta the hub already shows (readers that fetched it) follow the rules of every copy."""

from __future__ import annotations

from tensorhub_verl.errors import DeltaRefused
from tensorhub_verl.ros import messages as msg
from tensorhub_verl.ros.delta_form import parse_delta_layout
from tensorhub_verl.ros.hub.records import VersionRecord
from tensorhub_verl.ros.hub.versions import VersionStore


def check_delta_publish(req: msg.Publish, record: VersionRecord | None, store: VersionStore) -> None:
    """Raises DeltaRefused for a publish that would create a delta whose base is gone or not older than its
    target, or the delta of a version not published in the base's layout. Any other publish passes (a malformed
    delta name raises too)."""
    m = req.manifest
    parsed = parse_delta_layout(m.layout)
    if parsed is None or (record is not None and store.visible(record)):
        return
    base_layout, base_version = parsed
    if base_version >= m.version:
        raise DeltaRefused(f"a delta of {m.model!r} v{m.version} from v{base_version}: the base must be older")
    base = store.get((m.model, base_version, base_layout))
    if base is None or not store.visible(base):
        raise DeltaRefused(f"the delta of {m.model!r} v{m.version} from v{base_version} ({base_layout}) is refused: "
                           f"v{base_version} is not retained by this hub, so no reader can hold it as a base; "
                           f"readers read v{m.version} in full")
    if store.get((m.model, m.version, base_layout)) is None:  # a row shard's part may come before its peers
        raise DeltaRefused(f"the delta of {m.model!r} v{m.version} ({base_layout}) is refused: publish "
                           f"v{m.version} in {base_layout!r} first, then its delta")
