"""Registers an engine shard's live parameters as the holder of the version they serve, and drops it.

It owns the publication of the parameters: a publish now (the bytes arrived in the engine's layout and their
digests are reused), or off the stall on a thread (they arrived as 'hf' and need one digest pass in the
engine's layout; the engine generates meanwhile, the parameters are only read). Whatever writes the parameters
next first waits for that thread (``unpublish``). At TP>1 the ranks publish as one shard group: no rank's
layout of a version is visible before every rank holds it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.wire.manifest import Manifest
from tensorhub_verl.vllm.holder_config import HolderConfig

logger = logging.getLogger("tensorhub_verl.vllm.registration")


class Registration:
    def __init__(self, client, config: HolderConfig, params: Mapping[str, torch.Tensor]):
        self._client = client
        self._config = config
        self._params = params
        self._thread: threading.Thread | None = None
        self._version: int | None = None
        self.error: BaseException | None = None
        """Why the last publication off the stall failed (None: it did not, or none ran)."""

    @property
    def publishing(self) -> bool:
        """A publication off the stall was started and not yet waited for."""
        return self._thread is not None

    def publish(self, version: int, verified: Manifest | None = None) -> None:
        """Holds the parameters as ``version`` in the engine's layout, as one shard of the engine's group.
        ``verified``: the manifest the parameters' bytes were fetched and checked against in this very layout;
        its digests are reused, so that no pass over the model runs again."""
        cfg = self._config
        kw = {} if cfg.shard_count == 1 else {"shard_group": cfg.shard_group, "shard_count": cfg.shard_count}
        self._client.publish(cfg.model, version, self._params, layout=cfg.layout, verified=verified, **kw)

    def publish_off_the_stall(self, version: int) -> None:
        """Digests and publishes the parameters as ``version`` on a thread, so that ``apply`` returns (and the
        engine generates) during the digest pass. A failure leaves the engine serving ``version`` without holding
        it (``error``)."""
        worker = self._client.worker

        def publish() -> None:
            try:
                self.publish(version)
            except Exception as e:  # noqa: BLE001 - reported by wait_published; the engine still serves version
                self.error = e
                logger.warning("%s: publishing v%d in %s failed (%r): peers read it elsewhere", worker, version,
                               self._config.layout, e)

        self.error = None
        self._version = version
        self._thread = threading.Thread(target=publish, name=f"th-publish-{worker}-v{version}", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Waits for the publication off the stall, if one runs. Raises TransferFailed after ``timeout``."""
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            raise errors.TransferFailed(f"{self._client.worker}: publishing v{self._version} is still running after "
                                        f"{timeout:.0f} s; the parameters must not change meanwhile (raise "
                                        f"unpublish_timeout_s)")
        self._thread = None

    def unpublish(self, version: int | None) -> None:
        """Stops holding ``version`` in every layout the parameters serve it in (the engine's, and 'hf' after an
        in-place 'hf' pull), waiting for in-flight reads; first waits for a publication off the stall, whose
        digest pass reads the parameters."""
        self.join(self._config.unpublish_timeout_s)
        if version is None:
            return
        try:
            self._client.unpublish(self._config.model, version, layout=None,
                                   timeout=self._config.unpublish_timeout_s)
        except errors.VersionNotFound:
            pass  # the hub or a retention policy dropped it already: nobody reads it


__all__ = ["Registration"]
