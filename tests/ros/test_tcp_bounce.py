"""The TCP plane's bounce path (planes/tcp_bounce.py), the one GPU memory takes: run here on CPU memory by a
plane that bounces every kind of memory (``BounceAllPlane``), real sockets and real planes on both sides. The same code runs on CUDA tensors in
tests/gpu/test_tcp_vram.py."""

import threading

import pytest
import torch

from tensorhub_verl import errors
from tensorhub_verl.ros.client.config import ClientConfig
from tensorhub_verl.ros.planes import grants
from tensorhub_verl.ros.planes.base import Copy, Grant, ReadError, ReadState
from tensorhub_verl.ros.planes.tcp import TcpPlane
from tensorhub_verl.ros.planes.tcp_bounce import Bounces
from tests.waits import wait_until

BOUNCE = 64 << 10
NBYTES = (1 << 20) + 123  # not a multiple of the buffer: the last piece is short


class BounceAllPlane(TcpPlane):
    """The real TCP plane, except that CPU memory crosses the socket through the bounce buffers too, as GPU memory
    does: the GPU path runs on a host without a GPU (reads then land only in registered memory)."""

    def _bounced(self, mem: str) -> bool:
        return True


@pytest.fixture
def planes():
    holder = BounceAllPlane("bounce-holder", "127.0.0.1", bounce_bytes=BOUNCE)
    reader = BounceAllPlane("bounce-reader", "127.0.0.1", bounce_bytes=BOUNCE)
    reader.load_peer("bounce-holder", holder.metadata())
    yield holder, reader
    reader.close()
    holder.close()


def _read(reader: TcpPlane, copies: list[Copy], token: str, granted=()) -> ReadState:
    wake = threading.Event()
    handle = reader.start_read("bounce-holder", copies, Grant(token, tuple(granted)), wake=wake)
    assert wake.wait(30), "the read neither landed nor failed within 30 s"
    state = reader.poll(handle)
    assert state is ReadState.DONE, reader.failure(handle)
    reader.release(handle)
    return state


def test_bounced_reads_land_the_exact_bytes_through_buffers_made_once_and_reused(planes):
    holder, reader = planes
    served = torch.randint(0, 256, (NBYTES,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    into = torch.zeros(NBYTES, dtype=torch.uint8)
    holder.register([served])
    reader.register([into])
    ranges = [(served.data_ptr(), NBYTES)]
    token = grants.sign(holder.grant_key, 1, grants.expiry_ms(30), ranges)
    rounds = 3
    for _ in range(rounds):
        into.zero_()
        _read(reader, [Copy(into.data_ptr(), 0, "DRAM", served.data_ptr(), 0, "DRAM", NBYTES)], token)
        assert torch.equal(into, served)
    pieces = rounds * -(-NBYTES // BOUNCE)
    # One buffer per serving connection and per reader stream (2 streams), made at its first read, reused after.
    assert 1 <= holder.bounces.made <= 2 and 1 <= reader.bounces.made <= 2
    assert reader.bounces.pieces == pieces
    # The holder counts a piece after its send returns, which may be after the reader has the bytes.
    wait_until(lambda: holder.bounces.pieces >= pieces, 10, f"the holder to count {pieces} pieces sent")
    assert holder.bounces.pieces == pieces
    assert holder.bounces.nbytes == reader.bounces.nbytes == BOUNCE


def test_bounced_parts_of_a_storage_land_at_their_offsets_and_nowhere_else(planes):
    """Ranges inside a registered storage (a view that starts past the storage's first byte) map to the right
    offsets of the tensor views on both sides; bytes around the wanted parts stay untouched."""
    holder, reader = planes
    storage = torch.arange(4 * BOUNCE, dtype=torch.int64).to(torch.uint8)
    served = storage[1000:]
    into_storage = torch.full((4 * BOUNCE,), 0xEE, dtype=torch.uint8)
    into = into_storage[500:]
    holder.register([served])
    reader.register([into])
    granted = [(served.data_ptr(), 3 * BOUNCE + 64)]
    token = grants.sign(holder.grant_key, 1, grants.expiry_ms(30), granted)
    a, b = (BOUNCE + 17, 5), (2 * BOUNCE - 3, BOUNCE + 9)  # (offset, length) in served; b spans two pieces
    _read(reader, [Copy(into.data_ptr() + a[0], 0, "DRAM", served.data_ptr() + a[0], 0, "DRAM", a[1]),
                   Copy(into.data_ptr() + b[0], 0, "DRAM", served.data_ptr() + b[0], 0, "DRAM", b[1])],
          token, granted)
    expected = torch.full_like(into, 0xEE)
    for off, n in (a, b):
        expected[off:off + n] = served[off:off + n]
    assert torch.equal(into, expected)
    assert torch.equal(into_storage[:500], torch.full((500,), 0xEE, dtype=torch.uint8))


def test_a_bounced_read_into_unregistered_memory_is_refused_before_it_is_sent(planes):
    holder, reader = planes
    served = torch.ones(4096, dtype=torch.uint8)
    holder.register([served])
    into = torch.zeros(4096, dtype=torch.uint8)  # never registered with the reader's plane
    token = grants.sign(holder.grant_key, 1, grants.expiry_ms(30), [(served.data_ptr(), 4096)])
    with pytest.raises(ReadError, match="not in memory registered with the TCP plane"):
        reader.start_read("bounce-holder", [Copy(into.data_ptr(), 0, "DRAM", served.data_ptr(), 0, "DRAM", 4096)],
                          Grant(token))
    assert reader.bounces.made == 0 and holder.bounces.made == 0


def test_a_freed_bounced_storage_is_no_longer_served(planes):
    holder, reader = planes
    served = torch.ones(4096, dtype=torch.uint8)
    holder.register([served])
    addr = served.data_ptr()
    assert holder._resolve(addr, 4096) is not None
    del served
    assert holder._resolve(addr, 4096) is None


def test_bounce_buffer_sizes_are_checked():
    with pytest.raises(ValueError, match="at least one byte"):
        Bounces(0)
    with pytest.raises(errors.ConfigError, match="bounce_bytes"):
        ClientConfig.from_fields(transport="tcp", tcp_bounce_bytes=16)
    config = ClientConfig.from_fields(transport="tcp", tcp_bounce_bytes=1 << 20)
    assert config.plane.tcp.bounce_bytes == 1 << 20


def test_a_storage_that_shrank_after_registration_serves_no_range_past_its_live_end(planes):
    """FSDP frees a parameter's storage with ``resize_(0)`` between steps: a read granted on the size the storage
    had at registration must be refused, not served by a view that grows the storage again."""
    holder, reader = planes
    served = torch.ones(4096, dtype=torch.uint8)
    holder.register([served])
    addr = served.data_ptr()
    storage = served.untyped_storage()
    assert holder._resolve(addr, 4096) is not None
    storage.resize_(0)
    assert holder._resolve(addr, 4096) is None and holder._resolve(addr, 1) is None
    assert storage.nbytes() == 0, "resolving the range must not grow the storage back"
    into = torch.zeros(4096, dtype=torch.uint8)
    reader.register([into])
    token = grants.sign(holder.grant_key, 1, grants.expiry_ms(30), [(addr, 4096)])
    wake = threading.Event()
    handle = reader.start_read("bounce-holder", [Copy(into.data_ptr(), 0, "DRAM", addr, 0, "DRAM", 4096)],
                               Grant(token), wake=wake)
    assert wake.wait(30)
    assert reader.poll(handle) is ReadState.FAILED and storage.nbytes() == 0
    assert torch.equal(into, torch.zeros(4096, dtype=torch.uint8))
    reader.release(handle)


def test_the_bounce_view_refuses_ranges_outside_the_live_storage():
    from torch.multiprocessing.reductions import StorageWeakRef

    from tensorhub_verl.ros.planes.tcp_bounce import view

    tensor = torch.arange(64, dtype=torch.uint8)
    storage = tensor.untyped_storage()
    ref, base = StorageWeakRef(storage), storage.data_ptr()
    assert torch.equal(view(ref, base, base + 8, 8), tensor[8:16])
    assert view(ref, base, base + 60, 8) is None and view(ref, base, base - 1, 2) is None
    storage.resize_(16)
    assert view(ref, base, base + 8, 8) is None or storage.data_ptr() == base  # moved: refused
    assert view(ref, base, base + 16, 1) is None and storage.nbytes() == 16
