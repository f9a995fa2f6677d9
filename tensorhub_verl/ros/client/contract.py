"""What every client form does: the one contract of ``Client`` (one hub), ``ShardedClient`` (a hub run as several
processes) and ``RegionalClient`` (a hub process per region), whichever ``connect`` returns.

One return type per call, whatever the form: ``publish`` and ``manifest`` return one ``Manifest`` of the whole
version (a sharded hub's per-share manifests are its ``shares``), ``publish_delta`` one ``DeltaPublished`` of the
whole version's delta (a sharded hub's per-share results are its ``shares``; a hub of regions refuses deltas with
``ConfigError``), ``fetch`` one ``FetchStats``, ``status`` one hub status (``messages.StatusReply`` as JSON data; several hub processes' merged). Code written against this protocol
(the vLLM holder, the verl backend) runs on every form; ``tests/ros/test_client_contract.py`` runs the same tests
against each.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import torch

from tensorhub_verl.ros.client.delta import DeltaPublished
from tensorhub_verl.ros.client.fetcher import FetchStats
from tensorhub_verl.ros.wire.manifest import Manifest
from tensorhub_verl.ros.wire.topology import Location


@runtime_checkable
class WorkerClient(Protocol):
    """A worker's handle on the hub: publish, fetch and unpublish versions, and ask what is held where."""

    worker: str
    """This worker's id (identity passed in: every call acts as this worker)."""
    location: Location
    """Where this worker is (its location labels)."""

    @property
    def preserved_bytes(self) -> int:
        """Bytes this worker copied to CPU memory over its life, because it held a retained version's last
        reliable copy when it unpublished (``ClientConfig.preserve_on_unpublish``)."""

    def publish(self, model: str, version: int, tensors: Mapping[str, torch.Tensor], layout: str = "hf",
                chunk_bytes: int | None = None, shard_group: str | None = None, shard_count: int = 1,
                verified: Manifest | None = None) -> Manifest:
        """Holds ``tensors`` live as (model, version, layout); returns the version's manifest."""

    def publish_shard(self, model: str, version: int, pieces: Mapping[str, torch.Tensor], *,
                      specs: Mapping[str, tuple[Sequence[int], torch.dtype | str]], rank: int, ranks: int,
                      layout: str = "hf", group: str = "shards", chunk_bytes: int | None = None) -> Manifest:
        """Holds this rank's rows of a version ``ranks`` workers hold together."""

    def publish_delta(self, model: str, version: int, base_version: int, layout: str = "hf", mode: str = "auto",
                      chunk_bytes: int | None = None) -> DeltaPublished:
        """Publishes the delta ``base_version`` -> ``version`` beside ``version`` (both held by this worker)."""

    def unpublish(self, model: str, version: int, layout: str | None = None, timeout: float | None = None) -> None:
        """Returns once no read of this worker's copy is in flight."""

    def manifest(self, model: str, version: int | str = "latest", layout: str = "hf") -> Manifest:
        """The version's manifest; ``VersionNotFound`` when it is not visible."""

    def fetch(self, model: str, version: int | str = "latest", into: Mapping[str, torch.Tensor] | None = None,
              layout: str = "hf", hold: bool = True, timeout: float | None = None) -> FetchStats:
        """Fills ``into`` (or new buffers) with the version; holds it after (``hold``)."""

    def fetch_slices(self, model: str, version: int | str = "latest", *, into: Mapping[str, torch.Tensor],
                     slices: Mapping[str, Any] | None = None, layout: str = "hf",
                     timeout: float | None = None) -> FetchStats:
        """Reads the tensors named in ``into``, each whole or the slice ``slices`` names."""

    def versions(self, model: str, layout: str = "hf") -> dict[int, list[str]]:
        """Visible versions -> the workers holding them."""

    def latest(self, model: str, layout: str = "hf") -> int | None:
        """The newest visible version (None: none)."""

    def wait_for_version(self, model: str, newer_than: int | None = None, layout: str = "hf",
                         timeout: float = 30.0) -> int:
        """Blocks until a version newer than ``newer_than`` is visible; ``TimeoutError`` after ``timeout``."""

    def holdings(self) -> list[tuple[str, int, str]]:
        """(model, version, layout) of what this worker holds."""

    def status(self) -> dict:
        """The hub's status (``messages.StatusReply`` as JSON data)."""

    def close(self, timeout: float = 30.0) -> None:
        """Unpublishes everything (waiting for in-flight reads), then stops."""


CONTRACT_METHODS = ("publish", "publish_shard", "publish_delta", "unpublish", "manifest", "fetch", "fetch_slices",
                    "versions", "latest", "wait_for_version", "holdings", "status", "close")
"""The calls of ``WorkerClient``, in the order above."""
