"""Header fields as columns agree with the codec: every field of every wire header, gathered and scattered over
random rows, reads back as `codec.unpack` reads it."""

import random
from dataclasses import replace

import numpy as np
import pytest

from softdta.spec import BTH, DTA_HEADERS, DTA_PORT, IPV4, ROCE_HEADERS, ROCE_PORT, UDP, Field, Header
from softdta.spec import ETHERNET as ETH
from softdta.wire.codec import codec
from softdta.wire.columns import FrameRows, byte_offset, gather, matches, scatter, stack, udp_dports
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_bytes

# the fixed parts: columns cover those (a Var tail's place depends on each row's lengths)
HEADERS = [Header(h.name, h.fields, h.doc) for h in (ETH, IPV4, UDP, *DTA_HEADERS, *ROCE_HEADERS)]
OFFSET = 3  # a header that does not start at byte 0


def random_rows(header: Header, count: int, seed: int) -> np.ndarray:
    rng = random.Random(seed)
    return np.frombuffer(rng.randbytes(count * (header.size + OFFSET + 2)), dtype=np.uint8).reshape(count, -1).copy()


def integer_fields(header: Header):
    return [f for f in header.fields if isinstance(f, Field) and f.bits <= 64]


@pytest.mark.parametrize("header", HEADERS, ids=lambda h: h.name)
def test_gather_reads_every_field_as_the_codec_does(header):
    rows = random_rows(header, 50, 1)
    unpacked = [codec(header).unpack(bytes(row), OFFSET)[0] for row in rows]
    for spec_field in (f for f in header.fields if f.bits <= 64):
        column = gather(rows, OFFSET, header, spec_field.name)
        expected = [int.from_bytes(u[spec_field.name], "big") if isinstance(u[spec_field.name], bytes)
                    else u[spec_field.name] for u in unpacked]
        assert column.tolist() == expected, spec_field.name


@pytest.mark.parametrize("header", HEADERS, ids=lambda h: h.name)
def test_scatter_writes_what_the_codec_reads_and_nothing_else(header):
    rng = np.random.default_rng(2)
    for spec_field in integer_fields(header):
        start, bits = header.span(spec_field.name)
        if not (start % 8 == 0 and bits % 8 == 0) and start // 8 != (start + bits - 1) // 8:
            with pytest.raises(ValueError, match="spans bytes"):
                scatter(random_rows(header, 2, 3), OFFSET, header, spec_field.name, [0, 0])
            continue
        rows = random_rows(header, 40, 3)
        before = [codec(header).unpack(bytes(row), OFFSET)[0] for row in rows]
        values = rng.integers(0, 1 << min(bits, 63), size=40, dtype=np.uint64)
        scatter(rows, OFFSET, header, spec_field.name, values)
        for row, old, value in zip(rows, before, values.tolist()):
            fields = codec(header).unpack(bytes(row), OFFSET)[0]
            assert fields[spec_field.name] == value
            assert {k: v for k, v in fields.items() if k != spec_field.name} == \
                {k: v for k, v in old.items() if k != spec_field.name}


def test_matches_compares_only_the_named_fields():
    rows = random_rows(IPV4, 64, 4)
    rows[::2, OFFSET] = 0x45  # version 4, IHL 5 in every other row
    rows[::4, OFFSET + byte_offset(IPV4, "protocol")] = 17
    got = matches(rows, OFFSET, IPV4, version=4, ihl=5, protocol=17)
    expected = [fields["version"] == 4 and fields["ihl"] == 5 and fields["protocol"] == 17
                for fields in (codec(IPV4).unpack(bytes(row), OFFSET)[0] for row in rows)]
    assert got.tolist() == expected and any(expected) and not all(expected)
    with pytest.raises(ValueError, match="does not fit"):
        matches(rows, OFFSET, IPV4, ihl=16)


def test_byte_offset_refuses_a_field_inside_a_byte():
    assert byte_offset(BTH, "psn") == 9
    with pytest.raises(ValueError, match="not byte-aligned"):
        byte_offset(BTH, "migreq")


def test_frame_rows_index_to_each_frames_own_bytes():
    frames = [b"\x01" * 20, b"\x02" * 14, b"\x03" * 31]
    rows = np.full((3, 31), 0xEE, dtype=np.uint8)  # bytes past a frame's end are not the frame's
    for row, frame in enumerate(frames):
        rows[row, :len(frame)] = np.frombuffer(frame, dtype=np.uint8)
    batch = FrameRows(rows, np.array([20, 14, 31]))
    assert len(batch) == 3 and list(batch) == frames and batch[-1] == frames[-1]
    assert list(batch[1:]) == frames[1:]
    assert list(FrameRows(np.empty((0, 0), dtype=np.uint8), np.empty(0, dtype=np.int64))) == []


def test_frame_rows_of_whole_rows_keep_every_byte_of_each_frame():
    """Rows all as long as their frames (a vector run) become bytes in numpy: trailing zero bytes, which an iCRC
    may end with, stay, and a slice of the columns is still cut at the frames' lengths."""
    frames = [b"\x01\x00\x00", b"\x00\x00\x00", b"\x00\x07\x00"]
    rows = np.frombuffer(b"".join(frames), dtype=np.uint8).reshape(3, 3)
    assert list(FrameRows(rows, np.full(3, 3))) == frames
    assert list(FrameRows(rows[:, :2], np.full(3, 2))) == [frame[:2] for frame in frames]  # not contiguous
    assert list(FrameRows(rows, np.array([3, 2, 3]))) == [frames[0], frames[1][:2], frames[2]]


def test_stack_keeps_every_runs_frames_in_order_whatever_they_come_as():
    """Runs of rows (some wider than their frames) and of bytes (of one length or several), and empty runs."""
    wide = _frame_rows([b"\x01" * 9, b"\x02" * 40])
    narrow = FrameRows(np.full((2, 5), 3, dtype=np.uint8), np.array([5, 4]))
    padded = FrameRows(np.full((1, 80), 8, dtype=np.uint8), np.array([7]))
    runs = [wide, [], [b"\x04" * 12, b"\x05" * 12], narrow, [b"\x06" * 3, b"\x07" * 60, b""], wide[:0], padded]
    stacked = stack(runs)
    assert list(stacked) == [frame for run in runs for frame in run]
    assert stacked.rows.shape == (10, 60)
    assert list(stack([])) == []


def _frame_rows(frames: list[bytes], fill: int = 0xEE) -> FrameRows:
    rows = np.full((len(frames), max(map(len, frames))), fill, dtype=np.uint8)
    for row, frame in enumerate(frames):
        rows[row, :len(frame)] = np.frombuffer(frame, dtype=np.uint8)
    return FrameRows(rows, np.array([len(frame) for frame in frames]))


def test_udp_dports_finds_the_port_wherever_the_ipv4_header_ends():
    ends = UdpEndpoints(src_mac=b"\x02" * 6, dst_mac=b"\x04" * 6, src_ip=ip_bytes("10.0.0.1"),
                        dst_ip=ip_bytes("10.0.0.2"), sport=5000, dport=DTA_PORT)
    plain = build_udp_frame(ends, b"report")
    ip_at, udp_at = ETH.size, ETH.size + IPV4.size
    # the same datagram behind an IPv4 header with one word of options (IHL 6); its checksum is not read
    options = bytearray(plain[:udp_at] + bytes(4) + plain[udp_at:])
    options[ip_at] = 0x46
    options[ip_at + 2:ip_at + 4] = (len(options) - ip_at).to_bytes(2, "big")
    roce = build_udp_frame(replace(ends, dport=ROCE_PORT), b"ack")
    cut = plain[:udp_at + 3]  # ends inside the port
    ports = udp_dports(_frame_rows([plain, bytes(options), roce, cut]))
    assert ports.tolist() == [DTA_PORT, DTA_PORT, ROCE_PORT, 0]
    assert udp_dports(_frame_rows([plain[:ETH.size]])).tolist() == [0]  # no IPv4 header at all
