"""Header fields as columns: gather and scatter one field of a header across every row of a (rows, bytes) uint8
array, at the spec's offsets (sans-IO). The vectorized counterpart of `wire.codec`, for batch translators."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np
import numpy.typing as npt

from softdta.spec import ETHERNET, IPV4, UDP, Header
from softdta.wire.codec import codec

Rows = npt.NDArray[np.uint8]
Column = npt.NDArray[np.uint64]


class FrameRows(Sequence[bytes]):
    """Frames as the rows of a (frames, longest) uint8 array, with their lengths: what packet I/O takes from its
    ring in bulk, and what a batch translator reads columns from. Bytes past a frame's length are unspecified.
    Indexing gives a frame's bytes."""

    def __init__(self, rows: Rows, lengths: npt.NDArray[np.int64]):
        self.rows, self.lengths = rows, lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[bytes]:
        width = self.rows.shape[1]
        if width and len(self.lengths) and (self.lengths == width).all():  # each row whole: bytes made in numpy
            return iter(np.ascontiguousarray(self.rows).view(f"V{width}").reshape(-1).tolist())
        blob, width = self.rows.tobytes(), max(width, 1)  # no frames: no columns either
        return (blob[at:at + length] for at, length in zip(range(0, len(blob), width), self.lengths.tolist()))

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> FrameRows: ...

    def __getitem__(self, index: int | slice) -> bytes | FrameRows:
        if isinstance(index, slice):
            return FrameRows(self.rows[index], self.lengths[index])
        return self.rows[index, :self.lengths[index]].tobytes()


def frame_lengths(frames: Sequence[bytes]) -> npt.NDArray[np.int64]:
    """The length of every frame, whether they come as rows or as bytes."""
    if isinstance(frames, FrameRows):
        return frames.lengths
    return np.fromiter(map(len, frames), dtype=np.int64, count=len(frames))


def stack(runs: Sequence[Sequence[bytes]]) -> FrameRows:
    """The frames of every run, in order, as the rows of one array as long as the longest frame."""
    lengths = np.concatenate([frame_lengths(run) for run in runs]) if runs else np.empty(0, dtype=np.int64)
    width = int(lengths.max(initial=0))
    rows = np.zeros((len(lengths), width), dtype=np.uint8)
    at = 0
    for run in runs:
        if isinstance(run, FrameRows):
            used = min(run.rows.shape[1], width)
            rows[at:at + len(run), :used] = run.rows[:, :used]
        elif len(run):
            longest = max(map(len, run))
            rows[at:at + len(run), :longest] = np.frombuffer(
                b"".join(frame.ljust(longest, b"\0") for frame in run), dtype=np.uint8).reshape(len(run), longest)
        at += len(run)
    return FrameRows(rows, lengths)


def gather(rows: Rows, at: int, header: Header, name: str) -> Column:
    """Field `name` of the `header` that starts at byte `at` of every row, as unsigned integers."""
    start, bits = _span(header, name)
    first, end = at + start // 8, at + (start + bits + 7) // 8
    width = end - first
    if width in (1, 2, 4, 8):  # the covering bytes as one big-endian word each
        value = np.ascontiguousarray(rows[:, first:end]).view(f">u{width}").reshape(-1).astype(np.uint64)
    else:
        value = np.zeros(rows.shape[0], dtype=np.uint64)
        for byte in range(first, end):
            value = (value << np.uint64(8)) | rows[:, byte]
    unused = width * 8 - start % 8 - bits  # bits after the field in its last byte
    if unused:
        value >>= np.uint64(unused)
    if bits < width * 8:
        value &= np.uint64((1 << bits) - 1)
    return value


def scatter(rows: Rows, at: int, header: Header, name: str, values: npt.ArrayLike) -> None:
    """Write field `name` into every row: a byte-aligned field whole, a field inside one byte by its bits."""
    start, bits = _span(header, name)
    column = np.asarray(values, dtype=np.uint64)
    if start % 8 == 0 and bits % 8 == 0:
        first, width = at + start // 8, bits // 8
        if width in (1, 2, 4, 8):
            rows[:, first:first + width] = column.astype(f">u{width}").view(np.uint8).reshape(-1, width)
        else:
            for index in range(width):
                rows[:, first + index] = (column >> np.uint64(bits - 8 * (index + 1))) & np.uint64(0xFF)
        return
    if start // 8 != (start + bits - 1) // 8:
        raise ValueError(f"{header.name}.{name} spans bytes without being byte-aligned")
    shift = 8 - (start % 8) - bits
    mask = ((1 << bits) - 1) << shift
    byte = at + start // 8
    rows[:, byte] = (rows[:, byte] & np.uint8(~mask & 0xFF)) | ((column << np.uint64(shift)) & np.uint64(mask))


def matches(rows: Rows, at: int, header: Header, **fields: int) -> npt.NDArray[np.bool_]:
    """Which rows hold exactly these values in these fields of the header at `at`: one masked compare."""
    key = (id(header), tuple(sorted(fields.items())))
    pattern = _PATTERNS.get(key)
    if pattern is None:
        pattern = _PATTERNS[key] = _pattern(header, key[1])
    lo, hi, mask, want = pattern
    equal: npt.NDArray[np.bool_] = ((rows[:, at + lo:at + hi] & mask) == want).all(axis=1)
    return equal


def udp_dports(frames: FrameRows) -> Column:
    """The UDP destination port of every Ethernet/IPv4/UDP frame, wherever its IPv4 header's length (IHL) puts
    it; 0 for a frame too short to hold one."""
    rows, width = frames.rows, frames.rows.shape[1]
    if width <= ETHERNET.size:
        return np.zeros(len(frames), dtype=np.uint64)
    at = ETHERNET.size + gather(rows, ETHERNET.size, IPV4, "ihl").astype(np.int64) * 4 + byte_offset(UDP, "dport")
    inside = at + 2 <= np.minimum(frames.lengths, width)
    at = np.where(inside, at, 0)
    row = np.arange(len(frames))
    ports: Column = (rows[row, at].astype(np.uint64) << np.uint64(8)) | rows[row, at + 1]
    return np.where(inside, ports, np.uint64(0))


def byte_offset(header: Header, name: str) -> int:
    """Offset in bytes of a byte-aligned field from the header's start."""
    start, _ = header.span(name)
    if start % 8:
        raise ValueError(f"{header.name}.{name} is not byte-aligned")
    return start // 8


# Keyed by the header's identity: the spec's headers live as long as the process, and hashing a frozen
# dataclass of fields on every lookup cost more than the lookup saved.
_SPANS: dict[tuple[int, str], tuple[int, int]] = {}
_PATTERNS: dict[tuple[int, tuple[tuple[str, int], ...]], tuple[int, int, Rows, Rows]] = {}


def _span(header: Header, name: str) -> tuple[int, int]:
    key = (id(header), name)
    span = _SPANS.get(key)
    if span is None:
        span = _SPANS[key] = header.span(name)
    return span


def _pattern(header: Header, fields: tuple[tuple[str, int], ...]) -> tuple[int, int, Rows, Rows]:
    """The bytes [lo, hi) of the header that `fields` cover, with the mask of their bits and their values: the
    codec packs both (it also refuses a value that does not fit)."""
    packer = codec(Header(header.name, header.fields, header.doc))  # the fixed part: no Var tail to pack
    want = np.frombuffer(packer.pack(dict(fields)), dtype=np.uint8)
    mask = np.frombuffer(packer.pack({name: (1 << header.span(name)[1]) - 1 for name, _ in fields}), dtype=np.uint8)
    covered = np.flatnonzero(mask)
    lo, hi = int(covered[0]), int(covered[-1]) + 1
    return lo, hi, mask[lo:hi], want[lo:hi]
