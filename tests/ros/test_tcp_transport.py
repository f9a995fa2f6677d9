"""The TCP data plane (planes/tcp.py): real processes, real sockets, the hub's grants, dead and silent peers."""

import base64
import os
import select
import signal
import socket
import threading
import time

import psutil
import pytest
import torch

import tensorhub_verl as th
from tensorhub_verl import errors
from tensorhub_verl.ros.planes import grants
from tensorhub_verl.ros.client.client import Client
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.planes.tcp import TcpPlane
from tensorhub_verl.ros.planes.base import Copy, DataPlane, Grant, ReadError, ReadState
from tensorhub_verl.ros.planes import factory, host

from tests.ros.roles import digest, make_weights
from tests.waits import wait_until

CHUNK = 256 << 10
NBYTES = 1 << 20


def tcp_holder(results, control, hub_url, worker, seed, size_mb):
    client = th.connect(hub_url, worker, chunk_bytes=CHUNK, transport="tcp", hub_retry_s=60.0)
    weights = make_weights(seed, size_mb)
    client.publish("policy", 1, weights)
    results.put(("ok", {"pid": os.getpid(), "digest": digest(weights)}))
    control.get(timeout=600)
    client.close()


def bare_holder(results, control):
    """A TcpPlane serving one registered 1 MiB tensor; hands the test its key so it can sign grants."""
    transport = TcpPlane("bare-holder", "127.0.0.1")
    tensor = torch.arange(NBYTES, dtype=torch.uint8)
    transport.register([tensor])
    results.put(("ok", {"metadata": transport.metadata(), "key": transport.grant_key, "addr": tensor.data_ptr(),
                        "pid": os.getpid()}))
    control.get(timeout=600)
    transport.close()


def _read(transport: TcpPlane, peer: str, into: torch.Tensor, remote: int, nbytes: int, grant: str,
          timeout: float = 30.0, granted=()) -> str:
    return _poll_read(transport, peer, [Copy(into.data_ptr(), 0, "DRAM", remote, 0, "DRAM", nbytes)], grant,
                      granted, timeout)


@pytest.fixture
def bare(roles):
    info = roles(bare_holder).result(60)
    reader = TcpPlane("bare-reader", "127.0.0.1")
    reader.load_peer("bare-holder", info["metadata"])
    yield info, reader
    reader.close()


def test_the_tcp_plane_declares_what_it_needs():
    plane = TcpPlane("protocol-check-tcp", "127.0.0.1")
    try:
        assert isinstance(plane, DataPlane) and plane.name == "tcp"
        assert plane.needs_grant and plane.lands_on_own_threads and len(plane.grant_key) == grants.KEY_BYTES
        with pytest.raises(ReadError, match="grant"):
            plane.start_read("nobody", [Copy(0, 0, "DRAM", 0, 0, "DRAM", 1)], None)
    finally:
        plane.close()


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_fetch_over_tcp_moves_the_same_bytes_from_every_holder(hub, roles):
    published = roles(tcp_holder, hub.url, "trainer", 3, 4.0).result(120)
    with th.connect(hub.url, "reader-1", transport="tcp", window=4) as first:
        stats = first.fetch("policy", 1)
        assert digest(stats.buffers) == published["digest"]
        assert stats.sources == {"trainer": stats.bytes} and stats.failed_reads == 0
        with th.connect(hub.url, "reader-2", transport="tcp", window=4) as second:
            again = second.fetch("policy", 1)  # now from the trainer and reader-1
            assert digest(again.buffers) == published["digest"]


def _connections_to(pid: int) -> int:
    """This process's established TCP connections to ports that process ``pid`` listens on."""
    listening = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port in listening)


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_joiner_connects_to_the_newest_versions_holder_at_registration_before_its_first_fetch(hub, roles):
    """The hub names likely sources in the registration's reply (the TCP plane's metadata is only an address),
    so a joiner's first fetch does not wait for its connections (bench transport's first read). Only a holder
    that already served good reads at its address is named (test_trust_peers.py): a first reader makes it one."""
    published = roles(tcp_holder, hub.url, "trainer", 3, 1.0).result(120)
    with th.connect(hub.url, "first", transport="tcp") as first:
        assert digest(first.fetch("policy", 1, hold=False).buffers) == published["digest"]
    wait_until(lambda: _connections_to(published["pid"]) == 0, 10, "the first reader's connections end with it")
    # The cold joiner registers first; the joiner's own connections, made from its registration's reply, mark
    # the moment by which the cold one would have connected too: no sleep decides the negative.
    with th.connect(hub.url, "late-joiner", transport="tcp", preconnect_peers=0) as cold, \
            th.connect(hub.url, "joiner", transport="tcp", tcp_streams=2) as joiner:
        wait_until(lambda: _connections_to(published["pid"]) >= 2, 10, "two connections before any fetch")
        assert _connections_to(published["pid"]) == 2, \
            "one connection per stream of the joiner, opened before any fetch; none of the cold joiner's " \
            "(preconnect_peers=0 connects at the first lease only)"
        stats = joiner.fetch("policy", 1)
        assert digest(stats.buffers) == published["digest"] and _connections_to(published["pid"]) == 2


def _streams_to(agent: str) -> int:
    return sum(t.name.startswith(f"tensorhub-tcp-{agent}-") and t.is_alive() for t in threading.enumerate())


def test_idle_streams_end_and_the_next_read_starts_them_again(roles):
    """Workers come and go: a reader must not keep threads and sockets for every peer it ever read from. Streams
    idle for ``idle_close_s`` close; the next read to that peer opens them again."""
    info = roles(bare_holder).result(60)
    reader = TcpPlane("idle-reader", "127.0.0.1", idle_close_s=0.5)
    try:
        reader.load_peer("bare-holder", info["metadata"])
        wait_until(lambda: _connections_to(info["pid"]) == 2, 10, "two streams connect before any read")
        wait_until(lambda: _streams_to("bare-holder") == 0 and _connections_to(info["pid"]) == 0, 10,
                   "idle streams must end and close their connections")
        into = torch.zeros(4096, dtype=torch.uint8)
        ranges = [(info["addr"] + 4096, 4096)]
        grant = grants.sign(info["key"], 1, grants.expiry_ms(30), ranges)
        assert _read(reader, "bare-holder", into, *ranges[0], grant) == "DONE"
        assert torch.equal(into, torch.arange(4096, 8192, dtype=torch.int64).to(torch.uint8))
        assert _streams_to("bare-holder") == 2
    finally:
        reader.close()


def test_a_granted_read_gets_exactly_the_granted_bytes(bare):
    info, reader = bare
    into = torch.zeros(4096, dtype=torch.uint8)
    ranges = [(info["addr"] + 8192, 4096)]
    grant = grants.sign(info["key"], 1, grants.expiry_ms(30), ranges)
    assert _read(reader, "bare-holder", into, *ranges[0], grant) == "DONE"
    assert torch.equal(into, torch.arange(8192, 8192 + 4096, dtype=torch.int64).to(torch.uint8))


def test_a_finished_read_wakes_its_waiter_with_the_bytes_landed(bare):
    info, reader = bare
    into = torch.zeros(NBYTES // 2, dtype=torch.uint8)
    ranges = [(info["addr"] + 4096, NBYTES // 2)]
    grant = grants.sign(info["key"], 1, grants.expiry_ms(30), ranges)
    wake = threading.Event()
    remote, nbytes = ranges[0]
    handle = reader.start_read("bare-holder", [Copy(into.data_ptr(), 0, "DRAM", remote, 0, "DRAM", nbytes)],
                               Grant(grant), wake=wake)
    assert wake.wait(30), "a finished read must set the event the fetch loop sleeps on"
    assert reader.poll(handle) is ReadState.DONE
    assert torch.equal(into, (torch.arange(4096, 4096 + NBYTES // 2, dtype=torch.int64) % 256).to(torch.uint8))
    reader.release(handle)


def test_a_read_of_several_ranges_reports_its_bytes_landed_in_order(bare):
    """A run's merged ranges are one request: the reply fills the copies in order, and the plane counts the bytes
    in as they land (the fetch checks each chunk once its bytes are in)."""
    info, reader = bare
    into = torch.zeros(3 * 4096, dtype=torch.uint8)
    ranges = [(info["addr"] + 8192, 4096), (info["addr"] + 4096, 4096), (info["addr"] + 65536, 4096)]
    grant = grants.sign(info["key"], 1, grants.expiry_ms(30), ranges)
    copies = [Copy(into.data_ptr() + k * 4096, 0, "DRAM", addr, 0, "DRAM", n) for k, (addr, n) in enumerate(ranges)]
    wake = threading.Event()
    handle = reader.start_read("bare-holder", copies, Grant(grant), wake=wake)
    assert reader.reports_progress and wake.wait(30) and reader.poll(handle) is ReadState.DONE
    assert reader.landed_bytes(handle) == 3 * 4096
    expected = torch.cat([torch.arange(a - info["addr"], a - info["addr"] + n, dtype=torch.int64) % 256
                          for a, n in ranges]).to(torch.uint8)
    assert torch.equal(into, expected)
    reader.release(handle)


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_fetch_over_tcp_is_driven_by_its_reads_not_by_polling(hub, roles):
    """The fetch loop sleeps until a read lands or an exchange returns: with a poll interval longer than the
    fetch's timeout, it can only finish if its reads wake it."""
    published = roles(tcp_holder, hub.url, "trainer", 3, 4.0).result(120)
    config = ClientConfig.from_fields(window=4, transport="tcp", poll_interval_s=60.0, fetch_timeout_s=30.0)
    with Client(hub.url, "woken-reader", config=config) as reader:
        stats = reader.fetch("policy", 1)
        assert digest(stats.buffers) == published["digest"] and stats.failed_reads == 0


def test_a_read_of_part_of_a_granted_range_gets_only_that_part_and_nothing_outside_it(bare):
    """A ranged reader (a TP rank's slice) reads part of a chunk: it sends the ranges the grant signs and the
    part it wants; a wanted range reaching outside them is refused, and nothing is written."""
    info, reader = bare
    granted = [(info["addr"] + 8192, 4096)]
    grant = grants.sign(info["key"], 1, grants.expiry_ms(30), granted)
    into = torch.zeros(1000, dtype=torch.uint8)
    assert _read(reader, "bare-holder", into, info["addr"] + 8192 + 100, 1000, grant, granted=granted) == "DONE"
    assert torch.equal(into, torch.arange(8292, 8292 + 1000, dtype=torch.int64).to(torch.uint8))
    outside = torch.zeros(1000, dtype=torch.uint8)
    state = _read(reader, "bare-holder", outside, info["addr"] + 8192 + 3500, 1000, grant, granted=granted)
    assert state.startswith("ERR") and "outside the ranges its grant signs" in state, state
    assert not outside.any(), "a refused read wrote bytes"


@pytest.mark.parametrize("case", ["no grant", "forged", "other range", "expired", "outside memory"])
def test_a_read_without_a_valid_grant_is_refused(bare, case):
    info, reader = bare
    into = torch.zeros(4096, dtype=torch.uint8)
    addr, key = info["addr"], info["key"]
    grant = {
        "no grant": "",
        "forged": grants.sign(os.urandom(32), 1, grants.expiry_ms(30), [(addr, 4096)]),
        "other range": grants.sign(key, 1, grants.expiry_ms(30), [(addr + 4096, 4096)]),
        "expired": grants.sign(key, 1, grants.expiry_ms(-grants.CLOCK_SKEW_S - 1), [(addr, 4096)]),
        "outside memory": grants.sign(key, 1, grants.expiry_ms(30), [(addr + NBYTES, 4096)]),
    }[case]
    remote = addr + NBYTES if case == "outside memory" else addr
    state = _read(reader, "bare-holder", into, remote, 4096, grant)
    assert state.startswith("ERR") and "refused" in state, state
    assert not into.any(), "a refused read wrote bytes"
    # The refusal closed only that connection: a granted read still works.
    good = grants.sign(key, 2, grants.expiry_ms(30), [(addr, 4096)])
    assert _read(reader, "bare-holder", into, addr, 4096, good) == "DONE"


def test_grants_cover_exact_ranges_until_they_expire():
    key = grants.new_key()
    grant = grants.sign(key, 7, 1_000_000, [(4096, 10), (8192, 20)])
    assert grants.check(key, grant, [(4096, 10), (8192, 20)], now=999.0) is None
    assert "does not cover" in grants.check(key, grant, [(4096, 10), (8192, 21)], now=999.0)
    assert "does not cover" in grants.check(key, grant, [(4096, 10)], now=999.0)
    assert "expired" in grants.check(key, grant, [(4096, 10), (8192, 20)], now=1000.0 + grants.CLOCK_SKEW_S + 1)
    assert grants.check(key, "7.1000000.zz", [(4096, 10)], now=0) is not None
    assert grants.check(key, "garbage", [], now=0) == "malformed grant"


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_the_hub_signs_grants_only_for_holders_that_gave_it_a_key(hub, roles):
    roles(tcp_holder, hub.url, "tcp-trainer", 1, 1.0).result(120)
    reader = TcpPlane("grant-reader", "127.0.0.1")
    try:
        client = Client(hub.url, "reader", plane=reader, config=ClientConfig.from_fields(window=2))
        stats = client.fetch("policy", 1)
        assert stats.failed_reads == 0 and stats.sources == {"tcp-trainer": stats.bytes}
        client.close()
    finally:
        reader.close()
    nixl_hub = th.start_hub()  # one plane per hub: the NIXL workers get a hub of their own
    try:
        with th.connect(nixl_hub.url, "nixl-trainer", transport="nixl") as nixl:  # no key: no grant
            nixl.publish("other", 1, make_weights(2, 1.0))
            with th.connect(nixl_hub.url, "nixl-reader", transport="nixl") as nixl_reader:
                assert nixl_reader.fetch("other", 1).failed_reads == 0
    finally:
        nixl_hub.stop()


def test_a_dead_peer_fails_reads_with_read_error(bare, roles):
    info, reader = bare
    os.kill(info["pid"], signal.SIGKILL)
    into = torch.zeros(4096, dtype=torch.uint8)
    grant = grants.sign(info["key"], 1, grants.expiry_ms(30), [(info["addr"], 4096)])
    deadline = time.monotonic() + 30
    while True:  # a read posted before the kill is noticed fails; once noticed, start_read raises at once
        try:
            state = _read(reader, "bare-holder", into, info["addr"], 4096, grant)
        except ReadError as e:
            assert "unreachable" in str(e)
            break
        assert state.startswith("ERR"), state
        assert time.monotonic() < deadline


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_holder_killed_mid_fetch_costs_a_re_plan(hub, roles):
    doomed = roles(tcp_holder, hub.url, "h1", 5, 4.0).result(120)
    survivor = roles(tcp_holder, hub.url, "h2", 5, 4.0).result(120)
    killed = []

    class KillingTransport(TcpPlane):
        def _start_read(self, peer, copies, grant, wake):
            if not killed:
                os.kill(doomed["pid"], signal.SIGKILL)
                killed.append(peer)
            return super()._start_read(peer, copies, grant, wake)

    transport = KillingTransport("killing-reader", "127.0.0.1")
    client = Client(hub.url, "reader", plane=transport,
                    config=ClientConfig.from_fields(window=4, read_timeout_s=20, fetch_timeout_s=90))
    try:
        stats = client.fetch("policy", 1)
        assert digest(stats.buffers) == survivor["digest"]
        assert stats.sources.get("h1", 0) == 0 and stats.failed_reads >= 1
    finally:
        client.close()
        transport.close()


def test_a_silent_holder_times_out(roles):
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    # The holder never says hello: the reader gives up at its connect timeout (short here, as the I/O timeout).
    reader = TcpPlane("timeout-reader", "127.0.0.1", io_timeout_s=0.5, connect_timeout_s=0.5)
    try:
        from tensorhub_verl.ros.planes import tcp_wire

        reader.load_peer("silent", tcp_wire.encode_metadata("silent", "127.0.0.1", listener.getsockname()[1]))
        into = torch.zeros(4096, dtype=torch.uint8)
        state = _read(reader, "silent", into, 4096, 4096, "1.1.00", timeout=20)
        assert state.startswith("ERR") and "timed out" in state, state
    finally:
        reader.close()
        listener.close()


def test_metadata_of_another_plane_or_agent_is_unusable():
    from tensorhub_verl.ros.planes import tcp_wire
    from tensorhub_verl.ros.planes.nixl import NixlPlane

    reader = TcpPlane("meta-reader", "127.0.0.1")
    nixl = NixlPlane("a-nixl-agent")
    try:
        with pytest.raises(ReadError, match="another data plane"):
            reader.load_peer("a-nixl-agent", nixl.metadata())
        with pytest.raises(ReadError, match="describes agent"):
            reader.load_peer("liar", tcp_wire.encode_metadata("someone-else", "127.0.0.1", 9))
        with pytest.raises(ReadError):
            nixl.load_peer("meta-reader", reader.metadata())
    finally:
        reader.close()
        nixl.close()


def test_the_tcp_plane_registers_cpu_and_cuda_memory_without_new_metadata():
    reader = TcpPlane("cpu-and-cuda", "127.0.0.1")
    try:
        assert reader.register([torch.zeros(16)]) is False  # metadata never changes: nothing to re-send
        if torch.cuda.is_available():
            on_gpu = torch.zeros(16, device="cuda")
            assert reader.register([on_gpu]) is False
            assert isinstance(reader._resolve(on_gpu.data_ptr(), 64, "VRAM"), torch.Tensor)
        with pytest.raises(errors.ConfigError, match="CPU and CUDA memory"):
            reader.register([torch.zeros(16, device="meta")])
    finally:
        reader.close()


def test_auto_picks_tcp_only_where_the_wire_can_only_be_tcp(monkeypatch, tmp_path):
    monkeypatch.delenv("UCX_TLS", raising=False)
    assert factory.choose("auto", "http://127.0.0.1:7777")[0] == "nixl"  # one host: shared memory
    assert factory.choose("tcp", "http://127.0.0.1:7777")[0] == "tcp"  # configured wins
    assert factory.choose("nixl", "http://10.1.2.3:7777")[0] == "nixl"
    monkeypatch.setenv("UCX_TLS", "tcp")
    assert factory.choose("auto", "http://127.0.0.1:7777")[0] == "tcp"
    monkeypatch.setenv("UCX_TLS", "tcp,self")
    assert factory.choose("auto", "http://127.0.0.1:7777")[0] == "tcp"
    monkeypatch.setenv("UCX_TLS", "tcp,sm,self")
    assert factory.choose("auto", "http://127.0.0.1:7777")[0] == "nixl"
    monkeypatch.setenv("UCX_TLS", "^sm")
    assert factory.choose("auto", "http://127.0.0.1:7777")[0] == "nixl"
    monkeypatch.delenv("UCX_TLS")
    rdma = tmp_path / "infiniband"
    rdma.mkdir()
    monkeypatch.setattr(host, "_RDMA_SYSFS", rdma)
    remote = "http://10.1.2.3:7777"
    monkeypatch.setattr(host, "cuda_present", lambda: False)
    assert factory.choose("auto", remote)[0] == "tcp"
    monkeypatch.setattr(host, "cuda_present", lambda: True)  # simulated: no GPU here
    assert factory.choose("auto", remote)[0] == "tcp"  # CUDA memory goes through the TCP plane's bounce buffers
    assert factory.choose("auto", "http://127.0.0.1:7777")[0] == "nixl"  # one host: CUDA IPC
    (rdma / "mlx5_0").mkdir()
    assert factory.choose("auto", remote) == ("nixl", "RDMA devices present")
    with pytest.raises(errors.ConfigError):
        factory.choose("rdma", remote)
    with pytest.raises(errors.ConfigError):
        ClientConfig.from_fields(transport="udp")


def test_a_loopback_hub_confines_ucx_to_lo_only_where_there_is_no_cuda_and_no_rdma(monkeypatch, tmp_path):
    """CUDA is simulated (no GPU here): on a one-node GPU job UCX's best wires are CUDA IPC and the NIC's
    loopback, so no ``lo`` confinement there."""
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    rdma = tmp_path / "infiniband"
    rdma.mkdir()
    monkeypatch.setattr(host, "_RDMA_SYSFS", rdma)
    monkeypatch.setattr(host, "cuda_present", lambda: False)
    local, remote = "http://127.0.0.1:7777", "http://10.1.2.3:7777"
    assert host.net_devices(None, local) == "lo"
    assert host.net_devices(None, remote) is None
    assert host.net_devices("eth1", local) == "eth1"  # configured wins
    monkeypatch.setattr(host, "cuda_present", lambda: True)
    assert host.net_devices(None, local) is None
    monkeypatch.setattr(host, "cuda_present", lambda: False)
    (rdma / "mlx5_0").mkdir()
    assert host.net_devices(None, local) is None
    monkeypatch.setenv("UCX_NET_DEVICES", "mlx5_0:1")
    assert host.net_devices(None, local) is None  # UCX reads the environment itself


def _raw_request(grant: str, granted, wanted) -> bytes:
    from tensorhub_verl.ros.planes import tcp_wire as wire

    return (wire.REQUEST.pack(wire.MAGIC, len(grant), len(granted), len(wanted)) + grant.encode()
            + b"".join(wire.RANGE.pack(a, n) for a, n in granted) + b"".join(wire.RANGE.pack(a, n) for a, n in wanted))


def _holder_address(info) -> tuple[str, int]:
    from tensorhub_verl.ros.planes import tcp_wire as wire

    _, host, port = wire.decode_metadata(info["metadata"])
    return host, port


def test_one_grant_never_yields_more_bytes_than_it_signs(bare):
    """An attacker with one real 64 KiB grant repeats its wanted range 1,024 times (64 MiB asked): refused
    before a byte of memory is sent."""
    from tensorhub_verl.ros.planes import tcp_wire as wire

    info, _ = bare
    granted = [(info["addr"], 65536)]
    grant = grants.sign(info["key"], 1, grants.expiry_ms(30), granted)
    with socket.create_connection(_holder_address(info), timeout=10) as s:
        wire.expect_hello(s, "bare-holder", "the holder")
        s.sendall(_raw_request(grant, granted, granted * 1024))
        status, length = wire.REPLY.unpack(wire.recv_exact(s, wire.REPLY.size))
        assert status == wire.REFUSED and b"overlap" in wire.recv_exact(s, length)
    with socket.create_connection(_holder_address(info), timeout=10) as s:  # the honest form still works
        wire.expect_hello(s, "bare-holder", "the holder")
        s.sendall(_raw_request(grant, granted, []))
        status, length = wire.REPLY.unpack(wire.recv_exact(s, wire.REPLY.size))
        assert status == wire.OK and length == 65536


def test_idle_strangers_cannot_fill_a_holders_connection_slots(bare):
    """70 connections from one address that send 5 bytes and no valid request: the holder takes at most 64 from
    one address, drops each within its first-request deadline, and a granted reader is served throughout."""
    info, reader = bare
    address = _holder_address(info)
    strangers = [socket.create_connection(address, timeout=10) for _ in range(70)]
    try:
        for s in strangers:
            s.sendall(b"THR2\x00")
        addr, key = info["addr"], info["key"]
        into = torch.zeros(4096, dtype=torch.uint8)
        grant = grants.sign(key, 1, grants.expiry_ms(30), [(addr, 4096)])
        deadline = time.monotonic() + 20
        # The honest reader's pooled connections count against the same loopback address: it may have to wait
        # for the deadline that frees the strangers' slots, never longer.
        while (state := _read(reader, "bare-holder", into, addr, 4096, grant, timeout=15)) != "DONE" and \
                time.monotonic() < deadline:
            grant = grants.sign(key, 2, grants.expiry_ms(30), [(addr, 4096)])
        assert state == "DONE", state
        open_ = set(strangers)
        deadline = time.monotonic() + 15  # the first-request deadline is 5 s
        while open_ and time.monotonic() < deadline:
            for s in select.select(list(open_), [], [], 0.5)[0]:
                try:
                    if s.recv(1) == b"":
                        open_.discard(s)
                except ConnectionResetError:
                    open_.discard(s)
        assert not open_, f"{len(open_)} strangers kept a connection"
    finally:
        for s in strangers:
            s.close()


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_worker_cannot_advertise_another_hosts_address_to_joiners(hub):
    """A token holder registers with TCP-plane metadata naming some other host's port (here an SSH port
    elsewhere): the hub refuses it, so no joiner is ever told to connect there. Its own address passes."""
    from tensorhub_verl.ros.wire import messages as msg
    from tensorhub_verl.ros.planes import tcp_wire
    from tensorhub_verl.ros.client.hub_client import HubClient

    raw = HubClient(hub.url, retry_s=1.0)

    def register(worker: str, host: str):
        metadata = base64.b64encode(tcp_wire.encode_metadata(f"{worker}-agent", host, 22)).decode()
        return raw.post(msg.REGISTER_PATH, msg.RegisterWorker(
            worker=worker, location=msg.LocationMsg(), agent_name=f"{worker}-agent", agent_metadata_b64=metadata,
            grant_key_b64=base64.b64encode(grants.new_key()).decode(), preconnect=4, plane="tcp"), msg.WorkerAck)

    with pytest.raises(errors.InvalidRequest, match="not the address this worker registered from"):
        register("liar", "192.0.2.44")
    assert register("honest", "127.0.0.1").worker == "honest"
    raw.close()


class _RecordingTcp(TcpPlane):
    """A reader's TCP plane that keeps every read it posted (peer, copies, grant), to replay them later."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.posted: list[tuple] = []

    def _start_read(self, peer, copies, grant, wake):
        self.posted.append((peer, copies, grant.token, grant.ranges))
        return super()._start_read(peer, copies, grant, wake)


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_an_unpublished_holding_refuses_reads_whose_grants_have_not_expired(hub):
    """A reader keeps the grants of a fetch it completed and replays them after the holder unpublished that
    version (the grants' TTL has not run out): the holder serves none of those bytes any more."""
    holder = th.connect(hub.url, "unpub-holder", chunk_bytes=CHUNK, transport="tcp", preserve_on_unpublish=False)
    weights = make_weights(3, 1.0)
    holder.publish("policy", 1, weights)
    reader_plane = _RecordingTcp("replaying-reader", "127.0.0.1")
    try:
        reader = Client(hub.url, "replaying-reader", plane=reader_plane, config=ClientConfig.from_fields(window=2))
        assert reader.fetch("policy", 1).failed_reads == 0
        assert reader_plane.posted
        peer, copies, grant, granted = reader_plane.posted[0]
        scratch = torch.zeros(sum(c.length for c in copies), dtype=torch.uint8)
        replay = [Copy(scratch.data_ptr(), 0, "DRAM", c.remote_addr, c.remote_device, c.remote_mem, c.length)
                  for c in copies]
        assert _poll_read(reader_plane, peer, replay, grant, granted) == "DONE", "the grant is valid while held"
        holder.unpublish("policy", 1)
        assert _poll_read(reader_plane, peer, replay, grant, granted).startswith("ERR"), \
            "an unpublished holding served a read with a grant signed before the unpublish"
        reader.close()
    finally:
        reader_plane.close()
        holder.close()


def _poll_read(transport: TcpPlane, peer: str, copies, grant: str, granted, timeout: float = 30.0) -> str:
    """Posts one read and waits for it: "DONE", or "ERR <why>". An empty grant goes to the holder as it is
    (past the reader's own check), as a reader that skips that check would send it."""
    signed = Grant(grant, tuple(granted))
    handle = transport.start_read(peer, copies, signed) if grant else transport._start_read(peer, copies, signed,
                                                                                              None)
    deadline = time.monotonic() + timeout
    while transport.poll(handle) is ReadState.IN_PROGRESS and time.monotonic() < deadline:
        time.sleep(0.005)
    state = transport.poll(handle)
    transport.release(handle)
    return state.value if state is not ReadState.FAILED else f"ERR {transport.failure(handle)}"


def test_in_order_reads_to_a_peer_take_one_connection_one_after_another(bare):
    """In-order reads (a seed's WAN reads) posted together go on one stream of their own: each read's bytes follow
    the previous read's on the same connection, so every read has landed whole when the one after it lands."""
    info, reader = bare
    assert reader.in_order_reads
    reads = 4
    into = torch.zeros(reads, NBYTES, dtype=torch.uint8)
    ranges = [(info["addr"], NBYTES)]
    grant = Grant(grants.sign(info["key"], 1, grants.expiry_ms(30), ranges))
    wakes = [threading.Event() for _ in range(reads)]
    handles = [reader.start_read("bare-holder", [Copy(into[k].data_ptr(), 0, "DRAM", info["addr"], 0, "DRAM",
                                                      NBYTES)], grant, wake=wakes[k], in_order=True)
               for k in range(reads)]
    plain = reader.start_read("bare-holder", [Copy(into[0].data_ptr(), 0, "DRAM", info["addr"], 0, "DRAM", 4096)],
                              Grant(grant.token, tuple(ranges)), wake=threading.Event())
    try:
        for k, wake in enumerate(wakes):
            assert wake.wait(30), f"in-order read {k} did not land"
            assert reader.poll(handles[k]) is ReadState.DONE
            assert all(reader.poll(h) is ReadState.DONE for h in handles[:k]), "a later in-order read landed first"
        assert len({id(h.sock) for h in handles}) == 1, "in-order reads to one peer share one connection"
        wait_until(lambda: reader.poll(plain) is not ReadState.IN_PROGRESS, 30, "the plain read did not finish")
        assert reader.poll(plain) is ReadState.DONE, reader.failure(plain)
        assert plain.sock is not handles[0].sock, "plain reads stay on the shared streams"
        expected = (torch.arange(NBYTES, dtype=torch.int64) % 256).to(torch.uint8)
        assert all(torch.equal(into[k], expected) for k in range(1, reads))
        assert _streams_to("bare-holder") == 3 and \
            any(t.name == "tensorhub-tcp-bare-holder-lane" for t in threading.enumerate())
    finally:
        for h in [*handles, plain]:
            reader.release(h)


def test_a_plane_that_keeps_no_order_refuses_in_order_reads():
    from tests.ros.roles import GatedPlane

    plane = GatedPlane("no-order")
    try:
        assert not plane.in_order_reads
        with pytest.raises(ValueError, match="keeps no order"):
            plane.start_read("nobody", [Copy(0, 0, "DRAM", 0, 0, "DRAM", 1)], in_order=True)
    finally:
        plane.close()


class _CountingTcp(TcpPlane):
    """A reader's TCP plane that counts the in-order and plain reads it posts, and the most in flight at once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_order, self.plain, self.in_flight, self.most_in_flight = 0, 0, 0, 0

    def _start_read(self, peer, copies, grant, wake):
        self.plain += 1
        return super()._start_read(peer, copies, grant, wake)

    def _start_in_order(self, peer, copies, grant, wake):
        self.in_order += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return super()._start_in_order(peer, copies, grant, wake)

    def release(self, handle):
        if handle.in_order:
            self.in_flight -= 1
        super().release(handle)


@pytest.mark.parametrize("hub", ["tcp"], indirect=True)
def test_a_seed_over_tcp_posts_every_wan_lease_at_once_in_order(hub):
    """Over TCP a seed does not hold WAN leases back (``wan_reads_posted``): it posts all of them in order on one
    stream, which sends them back to back, and reads nothing across the WAN on the shared streams."""
    weights = make_weights(4, 2.0)
    with th.connect(hub.url, "trainer", "dc=dc0,rack=r0,node=t", chunk_bytes=CHUNK, transport="tcp") as trainer:
        trainer.publish("policy", 1, weights)
        plane = _CountingTcp("seed-tcp", "127.0.0.1")
        seed = Client(hub.url, "seed", "dc=dc1,rack=r0,node=s",
                      config=ClientConfig.from_fields(window=8, max_run_chunks=1), plane=plane)
        try:
            stats = seed.fetch("policy", 1)
        finally:
            seed.close()
        assert digest(stats.buffers) == digest(weights) and stats.sources == {"trainer": stats.bytes}
        assert plane.plain == 0 and plane.in_order == stats.chunks > 3
        assert plane.most_in_flight == 3, "the hub leases a seed 3 WAN reads (wan_reads_per_seed); all are posted"
