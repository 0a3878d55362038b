"""Classic pcap files (Ethernet link type), read and written without dependencies."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from softdta.errors import SoftdtaError

LINKTYPE_ETHERNET = 1
_MAGIC_USEC = 0xA1B2C3D4
_MAGIC_NSEC = 0xA1B23C4D
_PCAPNG_MAGIC = 0x0A0D0D0A


class PcapError(SoftdtaError, ValueError):
    pass


@dataclass(frozen=True)
class Packet:
    timestamp_ns: int
    frame: bytes


def write_pcap(path: str | Path, packets: Iterable[Packet | bytes]) -> int:
    """Write nanosecond-resolution pcap; plain bytes get timestamp 0. Returns the packet count."""
    count = 0
    with open(path, "wb") as handle:
        handle.write(struct.pack("<IHHiIII", _MAGIC_NSEC, 2, 4, 0, 0, 65535, LINKTYPE_ETHERNET))
        for packet in packets:
            if isinstance(packet, (bytes, bytearray)):
                packet = Packet(0, bytes(packet))
            seconds, nanoseconds = divmod(packet.timestamp_ns, 1_000_000_000)
            handle.write(struct.pack("<IIII", seconds, nanoseconds, len(packet.frame), len(packet.frame)))
            handle.write(packet.frame)
            count += 1
    return count


def read_pcap(path: str | Path) -> Iterator[Packet]:
    with open(path, "rb") as handle:
        yield from _read(handle, str(path))


def _read(handle: BinaryIO, name: str) -> Iterator[Packet]:
    header = handle.read(24)
    if len(header) < 24:
        raise PcapError(f"{name}: too short to be a pcap file")
    magic_le = struct.unpack("<I", header[:4])[0]
    if magic_le == _PCAPNG_MAGIC:
        raise PcapError(f"{name} is pcapng; convert it with `editcap -F pcap {name} out.pcap`")
    for endian in "<>":
        magic = struct.unpack(endian + "I", header[:4])[0]
        if magic in (_MAGIC_USEC, _MAGIC_NSEC):
            break
    else:
        raise PcapError(f"{name}: not a pcap file (magic 0x{magic_le:08x})")
    scale = 1 if magic == _MAGIC_NSEC else 1000
    linktype = struct.unpack(endian + "I", header[20:24])[0] & 0x0FFFFFFF
    if linktype != LINKTYPE_ETHERNET:
        raise PcapError(f"{name}: link type {linktype} is not Ethernet (1); capture on an Ethernet interface")
    while True:
        record = handle.read(16)
        if not record:
            return
        if len(record) < 16:
            raise PcapError(f"{name}: truncated record header")
        seconds, fraction, captured, _ = struct.unpack(endian + "IIII", record)
        frame = handle.read(captured)
        if len(frame) < captured:
            raise PcapError(f"{name}: truncated packet data")
        yield Packet(seconds * 1_000_000_000 + fraction * scale, frame)
