"""Packet I/O for the python engine: AF_XDP through libxdp's `xsk_*` API (ctypes), or an AF_PACKET TPACKET_V3
receive ring when AF_XDP is unavailable. Both move frames in batches: one call returns every frame the kernel
has placed in the ring, and one call transmits a list of frames.

libxdp creates the UMEM and the socket and maps the four rings; its ring accessors are inline functions in
<xdp/xsk.h>, so this module does their work on the mapped memory itself (on x86 the kernel's acquire/release
pairs need no extra fences for a single producer and consumer).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import select
import socket
import struct
import time

import numpy as np

from softdta.errors import SoftdtaError
from softdta.kernel.tx_ring import SLOT_SIZE, TX_DATA_OFFSET, RingReporter
from softdta.wire.columns import FrameRows

XDP_COPY, XDP_ZEROCOPY = 1 << 1, 1 << 2
XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD = 1
FRAME_SIZE = 2048
_DESC = np.dtype([("addr", "<u8"), ("len", "<u4"), ("options", "<u4")])  # struct xdp_desc
_ADDR = np.dtype("<u8")  # a fill or completion ring entry: a UMEM address
MSG_DONTWAIT = 0x40
BUSY_RETRIES = 40
RX_RING = 16384  # receive descriptors (and UMEM frames to fill them) per socket: 32 MiB of UMEM
TX_FRAMES = 4096  # transmit descriptors and UMEM frames, for frames sent through the socket (not from XDP)
# How long `send` waits for the kernel to take what the TX ring holds while it takes nothing: an interface with a
# queueing discipline whose ring on the way is full makes it wait for room (a veth's peer behind), rather than
# drop. What is left then waits for the next send or `transmit_pending`.
TX_STALL_S = 1.0
TX_WAIT_S = 0.00005


class XskError(SoftdtaError, OSError):
    """AF_XDP cannot be used here; the message says why (the engine then falls back to AF_PACKET)."""


class _Ring(ctypes.Structure):
    _fields_ = [("cached_prod", ctypes.c_uint32), ("cached_cons", ctypes.c_uint32), ("mask", ctypes.c_uint32),
                ("size", ctypes.c_uint32), ("producer", ctypes.c_void_p), ("consumer", ctypes.c_void_p),
                ("ring", ctypes.c_void_p), ("flags", ctypes.c_void_p)]


class _UmemConfig(ctypes.Structure):
    _fields_ = [("fill_size", ctypes.c_uint32), ("comp_size", ctypes.c_uint32), ("frame_size", ctypes.c_uint32),
                ("frame_headroom", ctypes.c_uint32), ("flags", ctypes.c_uint32)]


class _SocketConfig(ctypes.Structure):
    _fields_ = [("rx_size", ctypes.c_uint32), ("tx_size", ctypes.c_uint32), ("libxdp_flags", ctypes.c_uint32),
                ("xdp_flags", ctypes.c_uint32), ("bind_flags", ctypes.c_uint16)]


def _libxdp() -> ctypes.CDLL:
    name = ctypes.util.find_library("xdp") or "libxdp.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise XskError(errno.ENOENT, "libxdp is not installed (apt-get install libxdp1 libxdp-dev; make setup)") \
            from None
    lib.xsk_umem__create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_uint64,
                                     ctypes.POINTER(_Ring), ctypes.POINTER(_Ring), ctypes.POINTER(_UmemConfig)]
    lib.xsk_socket__create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_uint32,
                                       ctypes.c_void_p, ctypes.POINTER(_Ring), ctypes.POINTER(_Ring),
                                       ctypes.POINTER(_SocketConfig)]
    lib.xsk_socket__fd.argtypes = [ctypes.c_void_p]
    lib.xsk_socket__delete.argtypes = [ctypes.c_void_p]
    lib.xsk_socket__delete.restype = None
    lib.xsk_umem__delete.argtypes = [ctypes.c_void_p]
    return lib


class _Cursor:
    """One side of an AF_XDP ring: the kernel's producer and consumer indices, and the entries as a numpy array
    over the mapped memory, so that a batch of descriptors is read or written in one operation."""

    def __init__(self, ring: _Ring, entry: np.dtype):
        self.producer = ctypes.c_uint32.from_address(ring.producer)
        self.consumer = ctypes.c_uint32.from_address(ring.consumer)
        self.mask: int = ring.mask
        self.size: int = ring.size
        self.entries = np.frombuffer((ctypes.c_char * (ring.size * entry.itemsize)).from_address(ring.ring),
                                     dtype=entry)

    def available(self) -> int:
        return (self.producer.value - self.consumer.value) & 0xFFFFFFFF

    def free(self) -> int:
        return self.size - self.available()

    def slots(self, start: int, count: int) -> np.ndarray:
        """The entry indices of `count` ring positions from `start` (positions wrap at 2^32, entries at size)."""
        return (start + np.arange(count, dtype=np.int64)) & self.mask


class XskSocket:
    """An AF_XDP socket on one RX queue of an interface, with its own UMEM: `rx_ring` frames keep the fill ring
    stocked for receiving (the RX ring is as large), TX_FRAMES more carry frames sent through the socket. Zero-copy
    when the driver supports it, else copy mode (veth). An XDP program must redirect into an XSKMAP entry for `fd`
    (see bpf/xsk_steer.bpf.c).

    The receive side is what the engine has not taken yet: a step of the engine's (up to 4096 frames) takes
    tens of milliseconds, and while it runs, and while the engine gathers its next step or waits for its CPU,
    frames queue here. With rings of 4096, the fill ring ran dry at 28 k reports/s of the demo's mix (1,410
    frames dropped as `rx_fill_ring_empty_descs`, on the translator's link); RX_RING holds four steps."""

    def __init__(self, interface: str, queue: int = 0, rx_ring: int = 0, tx_ring: int = TX_FRAMES):
        rx_ring = rx_ring or RX_RING
        self.lib = _libxdp()
        frames = rx_ring + tx_ring
        self.umem_area = mmap.mmap(-1, frames * FRAME_SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._area = ctypes.c_char.from_buffer(self.umem_area)
        self.fill, self.comp, self.rx, self.tx = _Ring(), _Ring(), _Ring(), _Ring()
        self.umem, self.xsk = ctypes.c_void_p(), ctypes.c_void_p()
        config = _UmemConfig(rx_ring, tx_ring, FRAME_SIZE, 0, 0)
        ret = self.lib.xsk_umem__create(ctypes.byref(self.umem), ctypes.addressof(self._area), frames * FRAME_SIZE,
                                        ctypes.byref(self.fill), ctypes.byref(self.comp), ctypes.byref(config))
        if ret:
            self._release()
            raise XskError(-ret, f"AF_XDP UMEM on {interface}: {os.strerror(-ret)}")
        self.mode = ""
        for mode, bind in (("zero-copy", XDP_ZEROCOPY), ("copy", XDP_COPY)):
            socket_config = _SocketConfig(rx_ring, tx_ring, XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD, 0, bind)
            for _ in range(BUSY_RETRIES):  # a socket closed just before frees its queue asynchronously
                ret = self.lib.xsk_socket__create(ctypes.byref(self.xsk), interface.encode(), queue, self.umem,
                                                  ctypes.byref(self.rx), ctypes.byref(self.tx),
                                                  ctypes.byref(socket_config))
                if ret != -errno.EBUSY:
                    break
                time.sleep(0.05)
            if ret == 0:
                self.mode = mode
                break
        if not self.mode:
            self._release()
            raise XskError(-ret, f"AF_XDP socket on {interface} queue {queue}: {os.strerror(-ret)}")
        self.fd = self.lib.xsk_socket__fd(self.xsk)
        self.fill_ring, self.comp_ring = _Cursor(self.fill, _ADDR), _Cursor(self.comp, _ADDR)
        self.rx_ring, self.tx_ring = _Cursor(self.rx, _DESC), _Cursor(self.tx, _DESC)
        self.umem_view = memoryview(self.umem_area)
        self.umem_rows = np.frombuffer(self.umem_area, dtype=np.uint8).reshape(frames, FRAME_SIZE)
        self.tx_free = [i * FRAME_SIZE for i in range(rx_ring, frames)]
        self._refill([i * FRAME_SIZE for i in range(min(rx_ring, self.fill_ring.size))])
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)

    def _release(self) -> None:
        if self.xsk:
            self.lib.xsk_socket__delete(self.xsk)
            self.xsk = ctypes.c_void_p()
        if self.umem:
            self.lib.xsk_umem__delete(self.umem)
            self.umem = ctypes.c_void_p()
        del self._area
        self.umem_area.close()

    def close(self) -> None:
        if hasattr(self, "_area"):
            del self.umem_rows
            self.umem_view.release()
            self._release()

    def _refill(self, addrs: np.ndarray | list[int]) -> None:
        ring, index = self.fill_ring, self.fill_ring.producer.value
        ring.entries[ring.slots(index, len(addrs))] = addrs
        ring.producer.value = (index + len(addrs)) & 0xFFFFFFFF

    def wait(self, timeout_ms: int) -> bool:
        """Block until frames are waiting or `timeout_ms` passes."""
        return self.rx_ring.available() > 0 or bool(self.poller.poll(timeout_ms))

    def available(self) -> int:
        """Frames waiting in the RX ring."""
        return self.rx_ring.available()

    def receive(self, limit: int = 256) -> FrameRows:
        """Every frame waiting in the RX ring (at most `limit`), copied out in one gather; their UMEM frames go
        back to fill."""
        ring = self.rx_ring
        count = min(ring.available(), limit)
        if not count:
            return FrameRows(np.empty((0, 0), dtype=np.uint8), np.empty(0, dtype=np.int64))
        start = ring.consumer.value
        descriptors = ring.entries[ring.slots(start, count)]
        addrs = descriptors["addr"]
        frames = gather_frames(self.umem_rows, addrs.astype(np.int64), descriptors["len"].astype(np.int64))
        ring.consumer.value = (start + count) & 0xFFFFFFFF
        self._refill(addrs)
        return frames

    def _reclaim(self) -> None:
        ring = self.comp_ring
        count = ring.available()
        start = ring.consumer.value
        self.tx_free += ring.entries[ring.slots(start, count)].tolist()
        ring.consumer.value = (start + count) & 0xFFFFFFFF

    def send(self, frames: list[bytes]) -> None:
        """Queue every frame on the TX ring, a ring's worth of descriptors at a time, and kick the kernel."""
        ring, view = self.tx_ring, self.umem_view
        sent = 0
        while sent < len(frames):
            room = min(len(self.tx_free), ring.free(), len(frames) - sent)
            if not room:  # wait for the kernel, which a full ring on the way may hold up (TX_STALL_S at a time)
                self.transmit_pending()
                continue
            addrs = self.tx_free[-room:]
            del self.tx_free[-room:]
            batch = frames[sent:sent + room]
            for addr, frame in zip(addrs, batch):
                view[addr:addr + len(frame)] = frame
            index = ring.producer.value
            slots = ring.slots(index, room)
            ring.entries["addr"][slots] = addrs
            ring.entries["len"][slots] = list(map(len, batch))
            ring.producer.value = (index + room) & 0xFFFFFFFF
            sent += room
        self.transmit_pending()

    def transmit_pending(self) -> int:
        """Kick until the kernel has taken every queued descriptor (copy mode sends at most 32 per kick), or has
        taken none for TX_STALL_S; returns how many are still queued."""
        ring = self.tx_ring
        waiting = ring.available()
        stalled_since = time.monotonic()
        while waiting:
            self._kick()
            now_waiting = ring.available()
            if now_waiting < waiting:
                waiting, stalled_since = now_waiting, time.monotonic()
            elif time.monotonic() - stalled_since > TX_STALL_S:
                break
            else:
                time.sleep(TX_WAIT_S)
        self._reclaim()
        return waiting

    def statistics(self) -> dict[str, int]:
        """The kernel's XDP_STATISTICS for this socket: frames dropped because a ring was full or empty."""
        raw = ctypes.create_string_buffer(_XDP_STATISTICS.size)
        size = ctypes.c_uint32(_XDP_STATISTICS.size)
        if _libc.getsockopt(self.fd, SOL_XDP, XDP_STATISTICS, raw, ctypes.byref(size)) < 0:
            error = ctypes.get_errno()
            raise XskError(error, f"AF_XDP statistics: {os.strerror(error)}")
        names = ("rx_dropped", "rx_invalid_descs", "tx_invalid_descs", "rx_ring_full", "rx_fill_ring_empty_descs",
                 "tx_ring_empty_descs")
        return dict(zip(names, _XDP_STATISTICS.unpack(raw.raw)))

    def _kick(self) -> None:
        """sendto() makes the kernel transmit what the TX ring holds (copy mode needs it on every batch)."""
        if _libc.sendto(self.fd, None, 0, MSG_DONTWAIT, None, 0) < 0:
            error = ctypes.get_errno()
            if error not in (errno.EAGAIN, errno.EBUSY, errno.ENOBUFS, errno.ENETDOWN):
                raise XskError(error, f"AF_XDP transmit: {os.strerror(error)}")


def gather_frames(umem_rows: np.ndarray, addrs: np.ndarray, lengths: np.ndarray) -> FrameRows:
    """Copies of the frames at UMEM addresses `addrs` as rows of one array: `umem_rows` is the UMEM, a row per
    chunk. One gather per distinct offset in the chunk; copy mode puts every frame at the same one."""
    chunks, offsets = addrs // umem_rows.shape[1], addrs % umem_rows.shape[1]
    longest = int(lengths.max())
    if (offsets == offsets[0]).all():
        first = int(offsets[0])
        return FrameRows(umem_rows[chunks, first:first + longest], lengths)
    rows = np.zeros((len(addrs), longest), dtype=np.uint8)
    for offset in np.unique(offsets).tolist():
        mine = offsets == offset
        width = int(lengths[mine].max())
        rows[mine, :width] = umem_rows[chunks[mine], offset:offset + width]
    return FrameRows(rows, lengths)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.sendto.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                         ctypes.c_uint32]
_libc.sendto.restype = ctypes.c_ssize_t
SOL_XDP, XDP_STATISTICS = 283, 7
_XDP_STATISTICS = struct.Struct("<6Q")

# --------------------------------------------------------------------------------------------------------------
# AF_PACKET TPACKET_V3: the fallback

SOL_PACKET, PACKET_RX_RING, PACKET_STATISTICS, PACKET_VERSION, PACKET_IGNORE_OUTGOING, TPACKET_V3 = 263, 5, 6, 10, 23, 2
_PACKET_STATS = struct.Struct("<III")  # struct tpacket_stats_v3: packets, drops, freeze_q_cnt
ETH_P_ALL = 0x0003
TP_STATUS_KERNEL, TP_STATUS_USER = 0, 1
_BLOCK_SIZE, _BLOCKS = 1 << 16, 64
_BLOCK_HEADER = struct.Struct("<III")  # block_status, num_pkts, offset_to_first_pkt (after version, priv offset)
TX_SLOT_PAYLOAD = SLOT_SIZE - TX_DATA_OFFSET
_PACKET_HEADER = struct.Struct("<IIIIIIHH")  # next_offset, sec, nsec, snaplen, len, status, mac, net


class PacketRing:
    """AF_PACKET fallback: a TPACKET_V3 mmap ring receives (a block of frames per look), a TPACKET_V2 TX ring
    sends. Unlike AF_XDP it taps frames rather than taking them, so the stack sees the reports too (and drops
    them: they are addressed to the collector)."""

    mode = "TPACKET_V3"

    def __init__(self, interface: str):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        try:
            self.sock.bind((interface, ETH_P_ALL))
        except OSError:
            self.sock.close()
            raise XskError(errno.ENODEV, f"interface {interface!r} does not exist; check `ip link`") from None
        self.sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
        self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        self.sock.setsockopt(SOL_PACKET, PACKET_RX_RING, struct.pack(
            "IIIIIII", _BLOCK_SIZE, _BLOCKS, FRAME_SIZE, _BLOCK_SIZE * _BLOCKS // FRAME_SIZE, 1, 0, 0))
        self.ring = mmap.mmap(self.sock.fileno(), _BLOCK_SIZE * _BLOCKS)
        self.block = 0
        self.poller = select.poll()
        self.poller.register(self.sock.fileno(), select.POLLIN)
        self.sender = RingReporter(interface, capacity=1024)
        self.fd = self.sock.fileno()
        self.dropped = 0  # frames the ring had no room for, so far (PACKET_STATISTICS counts since its last read)

    def close(self) -> None:
        self.sender.close()
        self.ring.close()
        self.sock.close()

    def statistics(self) -> dict[str, int]:
        """Frames dropped because the ring was full, in XskSocket.statistics' terms."""
        self.dropped += _PACKET_STATS.unpack(self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _PACKET_STATS.size))[1]
        return {"rx_dropped": self.dropped, "rx_ring_full": self.dropped}

    def _ready(self) -> bool:
        status: int = _BLOCK_HEADER.unpack_from(self.ring, self.block * _BLOCK_SIZE + 8)[0]
        return bool(status & TP_STATUS_USER)

    def wait(self, timeout_ms: int) -> bool:
        return bool(self._ready() or self.poller.poll(timeout_ms))

    def available(self) -> int:
        """Frames in the blocks the kernel has retired (it retires a block when full or after 1 ms)."""
        count, block = 0, self.block
        for _ in range(_BLOCKS):
            base = block * _BLOCK_SIZE
            status, frames = _BLOCK_HEADER.unpack_from(self.ring, base + 8)[:2]
            if not status & TP_STATUS_USER:
                break
            count += frames
            block = (block + 1) % _BLOCKS
        return count

    def receive(self, limit: int = 256) -> list[bytes]:
        """The frames of every block the kernel has retired (it retires a block when full or after 1 ms)."""
        frames: list[bytes] = []
        ring = self.ring
        while len(frames) < limit and self._ready():
            base = self.block * _BLOCK_SIZE
            _, count, offset = _BLOCK_HEADER.unpack_from(ring, base + 8)
            packet = base + offset
            for _ in range(count):
                next_offset, _, _, snaplen, _, _, mac, _ = _PACKET_HEADER.unpack_from(ring, packet)
                frames.append(ring[packet + mac:packet + mac + snaplen])
                packet += next_offset
            struct.pack_into("<I", ring, base + 8, TP_STATUS_KERNEL)
            self.block = (self.block + 1) % _BLOCKS
        return frames

    def send(self, frames: list[bytes]) -> None:
        if any(len(frame) > TX_SLOT_PAYLOAD for frame in frames):  # rare (long Append batches): keep the order
            for frame in frames:
                self.sock.send(frame)
            return
        capacity = self.sender.capacity
        for first in range(0, len(frames), capacity):
            self.sender.send(frames[first:first + capacity])
