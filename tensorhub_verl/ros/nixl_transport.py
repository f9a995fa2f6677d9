"""Transport over NIXL with its UCX backend: one-sided READs from registered DRAM or VRAM.

UCX picks the wire: TCP or shared memory on a plain host; RDMA, GPUDirect or CUDA IPC on a GPU cluster.
Set UCX_TLS / UCX_NET_DEVICES in the environment to force one (the network lab forces TCP).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from dataclasses import dataclass
from collections import defaultdict
from typing import Iterable

import numpy as np
import torch

from torch.multiprocessing.reductions import StorageWeakRef

from tensorhub_verl.ros.transport import Copy, ReadError, Region

logger = logging.getLogger("tensorhub_verl.ros.nixl")


@dataclass(slots=True)
class _Registration:
    region: Region
    storage: StorageWeakRef
    descs: object


_PUMPED: "weakref.WeakSet[NixlTransport]" = weakref.WeakSet()


@atexit.register
def _stop_pumps() -> None:
    """Stops every UCX pump before the interpreter finalizes. A daemon thread caught inside a NIXL call
    then would be unwound through C++ frames when it retakes the GIL, and the process would abort."""
    for transport in list(_PUMPED):
        transport.stop_pump()


class NixlTransport:
    def __init__(self, agent_name: str, backends: tuple[str, ...] = ("UCX",), progress: str = "pump",
                 pump_interval_s: float = 0.0005):
        """``progress`` decides who drives UCX when this process serves reads over TCP (one-sided
        reads over RDMA need no help from the holder's CPU):

        - ``"thread"``: NIXL's own progress thread. Lowest latency, but it spins: ~12% of a core per
          idle process was measured here, which adds up on a small host with many workers.
        - ``"pump"``: a thread of ours that drives UCX every ``pump_interval_s`` and sleeps between.
        """
        if progress not in ("thread", "pump"):
            raise ValueError(f"progress must be 'thread' or 'pump', got {progress!r}")
        try:
            from nixl_cu12 import nixl_agent, nixl_agent_config
        except ImportError as e:  # surface the real reason: a broken NIXL install is not "no backend"
            raise ImportError(f"NIXL is required for TensorHub's data plane ({e}); pip install nixl-cu12") from e
        if "NIXL_LOG_LEVEL" not in os.environ:  # NIXL logs every agent creation at INFO by default
            logging.getLogger("nixl").setLevel(logging.WARNING)
        self.agent_name = agent_name
        self._agent = nixl_agent(agent_name, nixl_agent_config(enable_prog_thread=progress == "thread",
                                                               backends=list(backends)))
        self._lock = threading.Lock()
        self._registered: list[_Registration] = []
        self._peers: dict[str, bytes] = {}
        self._stop = threading.Event()
        self._pump: threading.Thread | None = None
        if progress == "pump":
            self._pump = threading.Thread(target=self._drive, args=(pump_interval_s,),
                                          name=f"tensorhub-ucx-{agent_name}", daemon=True)
            self._pump.start()
            _PUMPED.add(self)

    def stop_pump(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join(timeout)

    def _drive(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            with self._lock:
                try:
                    self._agent.get_new_notifs()  # progresses the UCX workers: serves peers' reads
                except Exception as e:  # keep serving; a broken agent shows up in reads instead
                    logger.debug("UCX progress failed: %s", e)

    def register(self, tensors: Iterable[torch.Tensor]) -> bool:
        """Registers each tensor's whole storage once, for as long as that storage lives.

        Holdings keep their tensors alive, so registered memory is never freed under a read; a storage
        that has been freed is deregistered at the next call, before its address can be reused.
        """
        with self._lock:
            self._prune_expired()
            new: list[tuple[Region, StorageWeakRef]] = []
            for tensor in tensors:
                if tensor.numel() == 0:
                    continue
                storage = tensor.untyped_storage()
                kind = Region.of_tensor(tensor)
                whole = Region(storage.data_ptr(), storage.nbytes(), kind.device, kind.mem)
                if not any(self._covers(r.region, whole) for r in self._registered) and \
                        not any(self._covers(r, whole) for r, _ in new):
                    new.append((whole, StorageWeakRef(storage)))
            for region, ref in new:
                descs = self._agent.register_memory([(region.addr, region.nbytes, region.device, "")],
                                                    mem_type=region.mem)
                self._registered.append(_Registration(region, ref, descs))
        if new:
            logger.debug("%s registered %d regions (%d bytes)", self.agent_name, len(new),
                         sum(r.nbytes for r, _ in new))
        return bool(new)

    def _prune_expired(self) -> None:
        alive = []
        for reg in self._registered:
            if reg.storage.expired():
                self._deregister(reg)
            else:
                alive.append(reg)
        self._registered = alive

    def _deregister(self, reg: "_Registration") -> None:
        try:
            self._agent.deregister_memory(reg.descs)
        except Exception as e:  # the agent may already be shutting down
            logger.debug("deregister failed: %s", e)

    @staticmethod
    def _covers(outer: Region, inner: Region) -> bool:
        return (outer.mem == inner.mem and outer.device == inner.device and outer.addr <= inner.addr
                and inner.addr + inner.nbytes <= outer.addr + outer.nbytes)

    def metadata(self) -> bytes:
        with self._lock:
            return self._agent.get_agent_metadata()

    def load_peer(self, agent_name: str, metadata: bytes) -> None:
        with self._lock:
            if self._peers.get(agent_name) == metadata:
                return
            self._agent.add_remote_agent(metadata)
            self._peers[agent_name] = metadata

    def start_read(self, peer: str, copies: list[Copy]) -> list[object]:
        groups: dict[tuple[str, str], list[Copy]] = defaultdict(list)
        for c in copies:
            groups[(c.local_mem, c.remote_mem)].append(c)
        handles = []
        with self._lock:
            try:
                for (local_mem, remote_mem), group in groups.items():
                    local = np.array([(c.local_addr, c.length, c.local_device) for c in group], dtype=np.uint64)
                    remote = np.array([(c.remote_addr, c.length, c.remote_device) for c in group], dtype=np.uint64)
                    handle = self._agent.initialize_xfer(
                        "READ", self._agent.get_xfer_descs(local, local_mem),
                        self._agent.get_xfer_descs(remote, remote_mem), peer)
                    handles.append(handle)
                    if self._agent.transfer(handle) == "ERR":
                        raise ReadError(f"posting a read from {peer} failed")
            except ReadError:
                self._release_all(handles)
                raise
            except Exception as e:  # NIXL raises its own classes (e.g. nixlRemoteDisconnectError)
                self._release_all(handles)
                raise ReadError(f"read from {peer} failed: {type(e).__name__}: {e}") from e
        return handles

    def poll(self, handle: list[object]) -> str:
        with self._lock:
            states = []
            for h in handle:
                try:
                    states.append(self._agent.check_xfer_state(h))
                except Exception:
                    states.append("ERR")
        if "ERR" in states:
            return "ERR"
        return "DONE" if all(s == "DONE" for s in states) else "PROC"

    def release(self, handle: list[object]) -> None:
        with self._lock:
            self._release_all(handle)

    def _release_all(self, handles: list[object]) -> None:
        for h in handles:
            try:
                self._agent.release_xfer_handle(h)
            except Exception as e:  # an in-flight read that cannot be cancelled is leaked, not fatal
                logger.debug("releasing a NIXL handle failed: %s", e)

    def close(self) -> None:
        self.stop_pump()
        with self._lock:
            for reg in self._registered:
                self._deregister(reg)
            self._registered.clear()
