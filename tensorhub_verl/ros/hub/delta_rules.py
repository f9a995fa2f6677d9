"""What the hub requires of a delta (``delta_form.py``) before it creates one: a delta is a layout of version N
named after its base, and it is taken only while that base is retained and N itself is published in the base's
layout (a row shard's part: by that rank at least). Copies of a delta the hub already shows (readers that fetched it) follow the rules of every copy.

A delta whose payloads do not build its version (its publisher's base bytes were not its published base, or a
codec fault) has the same bytes in every copy, each passing its chunk digests: only readers that apply it see
it. Their reports (``report_bad_delta``) count as corruption evidence against the delta form itself, by the rules
of ``corruption.py``: a report by a reader of the model's owning job (the job that vouched for the delta) makes
the hub stop listing it for the quarantine's time, and readers then read the version in full; a report by
another job withholds nothing from anyone else. Withholding a delta never loses data: the version stays."""

from __future__ import annotations

from tensorhub_verl.errors import DeltaRefused, DeltaWithheld
from tensorhub_verl.ros.wire import messages as msg
from tensorhub_verl.ros.wire.delta_form import is_delta_layout, parse_delta_layout
from tensorhub_verl.ros.hub.quarantine import Quarantine
from tensorhub_verl.ros.hub.records import Key, VersionRecord
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


FORM = "*delta-form"
"""The evidence entry of a delta form as a whole (no holder can be named so: ``*`` is not in a worker id)."""


def report_bad_delta(quarantine: Quarantine, key: Key, reader: str, reader_job: str, owner_job: str,
                     now: float) -> bool:
    """Books ``reader``'s (of ``reader_job``) report against the delta ``key``, vouched for by ``owner_job`` (the
    model's owning job; "" when the reader's job does not own it); True when it is withheld from every reader
    now."""
    if parse_delta_layout(key[2]) is None:
        raise DeltaRefused(f"layout {key[2]!r} is not a delta: report corrupt chunks of a version through the fetch")
    return quarantine.evidence.report(key, FORM, reader, reader_job, owner_job, False, now)


def check_delta_listed(quarantine: Quarantine, key: Key, now: float) -> None:
    """Raises DeltaWithheld for a delta withheld on readers' reports: its readers read the version in full."""
    if is_delta_layout(key[2]) and quarantine.quarantined(key, FORM, now):
        raise DeltaWithheld(f"the delta {key[2]!r} of {key[0]!r} v{key[1]} is withheld: readers reported that it "
                              f"does not build the version; read v{key[1]} in full")
