"""The NIXL data plane, with its UCX backend: one-sided READs from registered DRAM or VRAM.

UCX picks the wire: TCP or shared memory on a plain host; RDMA, GPUDirect or CUDA IPC on a GPU cluster.
Set UCX_TLS / UCX_NET_DEVICES in the environment to force one (the network lab forces TCP).

Exposure. UCX's TCP transport listens on every network device unless UCX_NET_DEVICES names some:
``net_devices`` sets it for this agent only (with nixl 1.5: NIXL's own ``ucx_devices``
backend parameter does not narrow the TCP listeners; the environment variable, read when UCX builds the
agent's context, does). Registered memory is mapped with UCX's default protection, which includes remote
WRITE: NIXL's ``memReg`` calls ``ucp_mem_map`` without ``UCP_MEM_MAP_PARAM_FIELD_PROT`` and offers no
option to pass ``UCP_MEM_MAP_PROT_REMOTE_READ`` alone, so a peer holding the agent metadata can write as
well as read. TensorHub therefore hands metadata and addresses only to readers holding a lease (the hub),
and checks every chunk's digest on arrival (integrity.py); read-only registration needs a NIXL change.
"""

from __future__ import annotations

import atexit
import contextlib
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

from tensorhub_verl import errors
from tensorhub_verl.ros.planes.config import PROGRESS_MODES, NixlConfig
from tensorhub_verl.ros.planes.host import net_devices
from tensorhub_verl.ros.planes.base import Copy, DataPlane, Grant, ReadError, ReadHandle, ReadState, Region

logger = logging.getLogger("tensorhub_verl.ros.nixl")


@dataclass(slots=True)
class _Registration:
    region: Region
    storage: StorageWeakRef
    descs: object


_PUMPED: "weakref.WeakSet[NixlPlane]" = weakref.WeakSet()


@atexit.register
def _stop_pumps() -> None:
    """Stops every UCX pump before the interpreter finalizes. A daemon thread caught inside a NIXL call
    then would be unwound through C++ frames when it retakes the GIL, and the process would abort."""
    for transport in list(_PUMPED):
        transport.stop_pump()


_EVENTS_WAKEUP_US = 100_000
"""NIXL's progress thread waits this long in poll() when no UCX event comes (events mode)."""
_AGENT_CONFIG_LOCK = threading.Lock()
_nixl_logger_quieted = False


def _quiet_nixl_logger() -> None:
    """Once per process, before its first agent: NIXL's import configures its own ``nixl`` logger (INFO, a
    stdout handler of its own, no propagation) and then logs every agent creation on stdout. Unless
    ``NIXL_LOG_LEVEL`` chooses a level (NIXL honours it), that logger is lowered to WARNING here: the one
    logging setting this library makes, on NIXL's logger only, and only once, so that an application that
    sets the level itself afterwards keeps it. Callers hold _AGENT_CONFIG_LOCK."""
    global _nixl_logger_quieted
    if _nixl_logger_quieted:
        return
    _nixl_logger_quieted = True
    if "NIXL_LOG_LEVEL" not in os.environ:
        logging.getLogger("nixl").setLevel(logging.WARNING)


def _new_agent(agent_name: str, backends: tuple[str, ...], progress: str, net_devices: str | None = None):
    """A nixl_agent whose progress thread is off ("pump"), spinning ("thread") or event-driven ("events").

    NIXL's UCX progress thread arms the UCX worker and sleeps in poll() on its event fd, for at most its
    `pthrDelay`. The Python binding (nixl-cu12 1.5) hard-codes pthrDelay = 0, which makes that poll return
    at once: the thread spins. For "events", the config class is swapped, only while this agent is built,
    for one that keeps a nonzero pthrDelay."""
    from tensorhub_verl.ros.planes.nixl_build import nixl_api as load_nixl_api

    nixl_api = load_nixl_api()  # raises with the real reason: a broken NIXL install is not "no backend"
    config = nixl_api.nixl_agent_config(enable_prog_thread=progress != "pump", backends=list(backends))
    with _AGENT_CONFIG_LOCK, ucx_env(ucx_environment(net_devices)):
        _quiet_nixl_logger()
        if progress != "events":
            return nixl_api.nixl_agent(agent_name, config)
        # The binding's config class is swapped for this one construction and restored in `finally`; the lock
        # keeps this package's other agents from being built meanwhile (every agent here is built in this function).
        binding_config = nixl_api.nixlBind.nixlAgentConfig

        class _SleepingThreadConfig(binding_config):  # type: ignore[misc, valid-type]
            def __setattr__(self, name, value):
                super().__setattr__(name, _EVENTS_WAKEUP_US if name == "pthrDelay" and not value else value)

        nixl_api.nixlBind.nixlAgentConfig = _SleepingThreadConfig
        try:
            return nixl_api.nixl_agent(agent_name, config)
        finally:
            nixl_api.nixlBind.nixlAgentConfig = binding_config


UCX_DEFAULTS = {"UCX_TCP_TX_SEG_SIZE": "512k", "UCX_TCP_RX_SEG_SIZE": "512k",
                "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
"""UCX settings unless the environment sets them, whatever wire UCX picks (each touches one transport).
TCP: UCX emulates a GET over TCP with active messages of one segment each (8 KiB by default), copied on both
sides; 512 KiB segments move a chunk in 64x fewer messages (the throughput of each segment size against a raw
socket: docs/design.md, "Data plane without RDMA"). CUDA IPC: UCX 1.23 turns cuda_ipc's GET off on a node whose
GPUs have no NVLink ("auto"), and a READ of another process's GPU memory then falls back to TCP through host
memory; every read here is a GET, so it is turned on (on one H200 without NVLink: docs/gpu.md)."""


def ucx_environment(net_devices: str | None, cuda: bool | None = None) -> dict[str, str]:
    """What to set while an agent is built: UCX_DEFAULTS the environment leaves unset, and the devices. The CUDA
    settings only where ``cuda`` (None: torch sees a GPU): UCX without its CUDA module warns of each unused one."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    settings = {name: value for name, value in UCX_DEFAULTS.items()
                if name not in os.environ and (cuda or not name.startswith("UCX_CUDA_"))}
    if net_devices is not None:
        settings["UCX_NET_DEVICES"] = net_devices
    return settings


@contextlib.contextmanager
def ucx_env(settings: dict[str, str]):
    """Sets ``settings`` for the agents built inside (UCX reads its variables when it builds a context), then
    restores the environment. The plane's callers hold _AGENT_CONFIG_LOCK, so this process's agents never see
    each other's settings."""
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _NixlRead(ReadHandle):
    """A read's NIXL transfer handles: one per (local, remote) memory kind of its copies."""

    __slots__ = ("xfers",)

    def __init__(self, xfers: list[object]):
        self.xfers = xfers


_STATES = {"DONE": ReadState.DONE, "PROC": ReadState.IN_PROGRESS, "ERR": ReadState.FAILED}


class NixlPlane(DataPlane[_NixlRead]):
    """One-sided READs through a NIXL agent. No grants: a reader can address only memory whose metadata the
    hub handed it with a lease. UCX lands reads; the fetch loop polls them and hashes landed chunks itself."""

    name = "nixl"
    needs_grant = False
    lands_on_own_threads = False

    @classmethod
    def from_config(cls, agent_name: str, config: NixlConfig, hub_url: str, io_timeout_s: float) -> "NixlPlane":
        return cls(agent_name, progress=config.progress, net_devices=net_devices(config.net_devices, hub_url))

    def __init__(self, agent_name: str, backends: tuple[str, ...] = ("UCX",), progress: str = "events",
                 pump_interval_s: float = 0.0005, net_devices: str | None = None):
        """``progress`` decides who drives UCX when this process serves reads over TCP (one-sided
        reads over RDMA need no help from the holder's CPU):

        - ``"events"``: NIXL's progress thread, asleep in poll() until UCX has work. No GIL, no spin:
          nearly no CPU when idle, and it serves peers while Python is busy.
        - ``"pump"``: a Python thread that drives UCX every ``pump_interval_s`` and sleeps between
          (it costs CPU when idle and needs the GIL, so a busy interpreter slows what it serves).
        - ``"thread"``: NIXL's progress thread as the binding configures it: it spins on a core.

        ``net_devices`` (UCX_NET_DEVICES syntax, e.g. ``"lo"``, ``"eth0"``, ``"mlx5_0:1"``) limits the network
        devices UCX uses and listens on; None leaves UCX's environment and defaults alone.
        """
        if progress not in PROGRESS_MODES:
            raise errors.ConfigError(f"progress must be one of {PROGRESS_MODES}, got {progress!r}")
        super().__init__(agent_name)
        self._agent = _new_agent(agent_name, backends, progress, net_devices)
        self._lock = threading.Lock()
        self._registered: list[_Registration] = []
        self._cuda_checked = False
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

    def unregister(self, tensors: Iterable[torch.Tensor]) -> None:
        """Keeps the registration (see ``DataPlane.unregister``): a freed storage is deregistered by the next
        ``register``, before its address can be reused."""

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
            if any(region.mem == "VRAM" for region, _ in new):
                self._check_cuda_memory()
            for region, ref in new:
                descs = self._agent.register_memory([(region.addr, region.nbytes, region.device, "")],
                                                    mem_type=region.mem)
                self._registered.append(_Registration(region, ref, descs))
        if new:
            logger.debug("%s registered %d regions (%d bytes)", self.agent_name, len(new),
                         sum(r.nbytes for r, _ in new))
        return bool(new)

    def _check_cuda_memory(self) -> None:
        """Raises ConfigError, before anything is registered, when UCX cannot move CUDA memory here
        (``ucx_cuda.py``: the transport list, the driver's libraries); checked once per plane."""
        if self._cuda_checked:
            return
        from tensorhub_verl.ros.planes.ucx_cuda import cuda_memory_problems

        if problems := cuda_memory_problems(os.environ.get("UCX_TLS")):
            raise errors.ConfigError(f"the NIXL plane of {self.agent_name} cannot register CUDA memory: "
                                     + " | ".join(problems))
        self._cuda_checked = True

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
        """Raises ReadError when the metadata is unusable (garbage, truncated, or naming another agent):
        a bad or dead peer must cost its reader a re-plan, not a raw NIXL exception."""
        with self._lock:
            if self._peers.get(agent_name) == metadata:
                return
            try:
                loaded = self._agent.add_remote_agent(metadata)
            except Exception as e:  # nixlMismatchError for metadata NIXL cannot parse, and its kin
                raise ReadError(f"metadata of peer {agent_name} is unusable: {type(e).__name__}: {e}") from e
            loaded = loaded.decode(errors="replace") if isinstance(loaded, bytes) else str(loaded)
            if loaded != agent_name:
                # The metadata describes another agent: reads addressed to agent_name would go nowhere, and
                # a peer must not be able to redirect reads meant for someone else.
                raise ReadError(f"metadata registered as agent {agent_name!r} describes agent {loaded!r}")
            self._peers[agent_name] = metadata
            try:  # starts UCX's wire-up now (it returns at once), not inside the first read of this peer
                self._agent.make_connection(agent_name)
            except Exception as e:  # the first read connects instead, and reports what is wrong
                logger.debug("connecting to %s ahead of its first read failed: %s", agent_name, e)

    def _start_read(self, peer: str, copies: list[Copy], grant: Grant | None,
                    wake: threading.Event | None) -> _NixlRead:
        """``grant`` and ``wake`` are None here (``DataPlane.start_read`` checks it)."""
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
        return _NixlRead(handles)

    def poll(self, handle: _NixlRead) -> ReadState:
        with self._lock:
            states = []
            for h in handle.xfers:
                try:
                    states.append(_STATES.get(self._agent.check_xfer_state(h), ReadState.FAILED))
                except Exception:
                    states.append(ReadState.FAILED)
        if ReadState.FAILED in states:
            return ReadState.FAILED
        return ReadState.DONE if all(s is ReadState.DONE for s in states) else ReadState.IN_PROGRESS

    def release(self, handle: _NixlRead) -> None:
        with self._lock:
            self._release_all(handle.xfers)

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
