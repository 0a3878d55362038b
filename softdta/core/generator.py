"""The kernel report generator's plan (bpf/reporter.bpf.c): one template report, and where in its frame the
generator writes the key, data and seqnum of report i. `report_at(i)` predicts every report it sends, so that
what it sent can be replayed through the reference translator.

Report i carries, in the last 4 bytes of its key, key_base + i % key_span; in the last 4 bytes of its data,
data_base + i; and seqnum seq_base + i (all modulo their width). The bases are the template's own values.

In a fleet (a slot map), each report goes to its slot's collector (core.fleet_reporter): a primitive partitioned
by the report's key gets one destination per key, computed here for all key_span keys at once, which the generator
looks up by i % key_span with the IPv4 header checksum that goes with it; any other (Append's list, Sketch-Merge's
sketch) has one destination, written into the template.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from softdta.core import registry
from softdta.core.fleet import SlotMap
from softdta.core.fleet_reporter import primary_ips_rows
from softdta.errors import SoftdtaError
from softdta.spec import GENERATOR_FRAME_MAX, IPV4
from softdta.wire import dta
from softdta.wire.codec import codec
from softdta.wire.dta import Profile, Report
from softdta.wire.frames import UdpFrame, ip_bytes, ipv4_checksum, parse_udp_frame
from softdta.wire.hashing import keys_to_rows

_VARIED = 4  # bytes of key and data the generator varies: their last four
MAX_ADDRESSED_KEYS = 1 << 20  # keys with a destination each: 8 MB of map `report_destinations`


class GeneratorError(SoftdtaError, ValueError):
    """A template the kernel generator cannot send; the message says why and what to change."""


@dataclass(frozen=True)
class GeneratorPlan:
    """A template frame and where the generator writes each report's varying fields (offsets in the frame,
    0 = the template has no such field)."""

    template: Report
    profile: Profile
    frame: bytes
    key_span: int
    key_offset: int
    data_offset: int
    seq_offset: int
    destination_offset: int = 0  # where the IPv4 destination is, when it varies by key; 0: the template's
    checksum_offset: int = 0
    # with destination_offset, by key index (i % key_span): the destination (a big-endian number), and the IPv4
    # header checksum with it
    destinations: npt.NDArray[np.uint32] = field(default_factory=lambda: np.zeros(0, np.uint32), compare=False,
                                                 repr=False)
    checksums: npt.NDArray[np.uint16] = field(default_factory=lambda: np.zeros(0, np.uint16), compare=False,
                                              repr=False)

    @property
    def key_base(self) -> int:
        return _last_word(self.template.key) if self.key_offset else 0

    @property
    def data_base(self) -> int:
        return _last_word(self.template.data) if self.data_offset else 0

    def report_at(self, index: int) -> Report:
        """Report `index` as the generator sends it."""
        report = self.template
        if self.key_offset:
            report = replace(report, key=_with_last_word(report.key, self.key_base + index % self.key_span))
        if self.data_offset:
            report = replace(report, data=_with_last_word(report.data, self.data_base + index))
        if self.seq_offset:
            report = report.with_seqnum(self.template.seqnum + index)
        return report

    def frame_at(self, index: int) -> bytes:
        """The frame of report `index`: the template with the report's fields written in, as the generator does."""
        report, frame = self.report_at(index), bytearray(self.frame)
        for offset, value in ((self.key_offset, report.key), (self.data_offset, report.data)):
            if offset:
                frame[offset:offset + _VARIED] = value[-_VARIED:]
        if self.seq_offset:
            frame[self.seq_offset] = report.seqnum
        if self.destination_offset:
            frame[self.destination_offset:self.destination_offset + 4] = self.destination_at(index)
            checksum = int(self.checksums[index % self.key_span])
            frame[self.checksum_offset:self.checksum_offset + 2] = checksum.to_bytes(2, "big")
        return bytes(frame)

    def destination_at(self, index: int) -> bytes:
        """The collector IP report `index` goes to."""
        if self.destination_offset:
            return int(self.destinations[index % self.key_span]).to_bytes(4, "big")
        return parse_udp_frame(self.frame).dst_ip

    def config(self) -> dict[str, int | bytes]:
        """The fields of the generator's map value (spec record `report_generator_value`), next_index 0."""
        return {"frame_len": len(self.frame), "key_span": self.key_span, "key_base": self.key_base,
                "data_base": self.data_base, "key_offset": self.key_offset,
                "data_offset": self.data_offset, "seq_offset": self.seq_offset, "seq_base": self.template.seqnum,
                "destination_offset": self.destination_offset, "checksum_offset": self.checksum_offset,
                "frame": self.frame}


def plan(template: Report, frame: bytes, profile: Profile = Profile.DTA_V1, key_span: int = 1,
         slot_map: SlotMap | None = None) -> GeneratorPlan:
    """The plan for sending `template` (whose frame is `frame`, an IPv4 UDP datagram) with `key_span` distinct
    keys; with `slot_map`, each report to its slot's collector. Offsets come from the codec itself: the bytes that
    change when only that field does."""
    if not 1 <= key_span <= 0xFFFFFFFF:
        raise GeneratorError(f"key span {key_span} is out of range; give 1 to {0xFFFFFFFF} distinct keys")
    if len(frame) > GENERATOR_FRAME_MAX:
        raise GeneratorError(f"the report frame is {len(frame)} bytes, the kernel generator sends at most "
                             f"{GENERATOR_FRAME_MAX}; use shorter keys and data, or --engine python")
    udp = parse_udp_frame(frame)
    if len(udp.src_ip) != 4 or udp.udp["checksum"]:
        raise GeneratorError("the kernel generator sends IPv4 reports without a UDP checksum only (a checksum "
                             "covers the fields it varies); use IPv4 addresses, or --engine python")
    payload = dta.encode(template, profile)
    at = len(frame) - len(payload)
    if frame[at:] != payload:
        raise GeneratorError("the frame does not carry the template report; build it from the same report")
    key_offset = data_offset = seq_offset = 0
    if len(template.key) >= _VARIED:
        key_offset = at + _changed_at(template, replace(template, key=_flipped(template.key)), profile)
    if len(template.data) >= _VARIED:
        data_offset = at + _changed_at(template, replace(template, data=_flipped(template.data)), profile)
    if profile is Profile.DTA_V1 or template.extended:
        seq_offset = at + _changed_at(template, template.with_seqnum(template.seqnum ^ 0xFF), profile)
    unaddressed = GeneratorPlan(template, profile, frame, key_span if key_offset else 1, key_offset, data_offset,
                                seq_offset)
    return unaddressed if slot_map is None else _addressed(unaddressed, udp, slot_map)


def _addressed(plan: GeneratorPlan, udp: UdpFrame, slot_map: SlotMap) -> GeneratorPlan:
    """`plan` with each report sent to its slot's first replica under `slot_map`."""
    header = udp.frame[udp.ip_offset:udp.ip_offset + udp.ip["ihl"] * 4]
    destination_offset = udp.ip_offset + _ipv4_field_at(udp, "dst")
    checksum_offset = udp.ip_offset + _ipv4_field_at(udp, "checksum")
    partition_key = registry.by_opcode(plan.template.opcode).partition_key
    probes = [plan.report_at(index) for index in (0, 1, 2)]
    if all(partition_key(report) == partition_key(plan.template) for report in probes):
        destination = ip_bytes(slot_map.members[slot_map.owners(partition_key(plan.template))[0]])
        frame = bytearray(plan.frame)
        frame[destination_offset:destination_offset + 4] = destination
        checksum = _checksum(header, destination_offset - udp.ip_offset, checksum_offset - udp.ip_offset,
                             destination)
        frame[checksum_offset:checksum_offset + 2] = checksum.to_bytes(2, "big")
        return replace(plan, frame=bytes(frame))
    if not all(partition_key(report) == report.key for report in probes):
        raise GeneratorError(f"{registry.by_opcode(plan.template.opcode).name} reports are partitioned by more than "
                             "their key, which the kernel generator varies; use --engine python with a fleet map")
    if plan.key_span > MAX_ADDRESSED_KEYS:
        raise GeneratorError(f"key span {plan.key_span}: in a fleet the kernel generator keeps a destination per "
                             f"key, for at most {MAX_ADDRESSED_KEYS} keys; give fewer keys")
    key = plan.template.key
    rows = np.empty((plan.key_span, len(key)), dtype=np.uint8)
    rows[:, :-_VARIED] = np.frombuffer(key[:-_VARIED], dtype=np.uint8)
    words = (plan.key_base + np.arange(plan.key_span, dtype=np.uint64)) & np.uint64(0xFFFFFFFF)
    rows[:, -_VARIED:] = keys_to_rows(words, _VARIED)
    destinations = primary_ips_rows(slot_map, rows)
    checksums = _checksums(header, destination_offset - udp.ip_offset, checksum_offset - udp.ip_offset,
                           destinations)
    return replace(plan, destination_offset=destination_offset, checksum_offset=checksum_offset,
                   destinations=destinations, checksums=checksums)


def _ipv4_field_at(udp: UdpFrame, name: str) -> int:
    """Where field `name` starts in the frame's IPv4 header: the first byte that changes when only it does."""
    value = udp.ip[name]
    bits = next(spec_field.bits for spec_field in IPV4.fields if spec_field.name == name)
    flipped = bytes(b ^ 0xFF for b in value) if isinstance(value, bytes) else value ^ ((1 << bits) - 1)
    before, after = codec(IPV4).pack(udp.ip), codec(IPV4).pack({**udp.ip, name: flipped})
    return next(i for i, (a, b) in enumerate(zip(before, after)) if a != b)


def _checksums(header: bytes, destination_at: int, checksum_at: int,
               destinations: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint16]:
    """The IPv4 header checksum of `header` with each of `destinations` (one computation per distinct one)."""
    distinct, which = np.unique(destinations, return_inverse=True)
    sums = [_checksum(header, destination_at, checksum_at, int(ip).to_bytes(4, "big")) for ip in distinct.tolist()]
    return np.array(sums, dtype=np.uint16)[which]


def _checksum(header: bytes, destination_at: int, checksum_at: int, destination: bytes) -> int:
    patched = bytearray(header)
    patched[destination_at:destination_at + 4] = destination
    patched[checksum_at:checksum_at + 2] = bytes(2)
    return ipv4_checksum(bytes(patched))


def _changed_at(report: Report, changed: Report, profile: Profile) -> int:
    """The first byte at which the two reports' payloads differ."""
    before, after = dta.encode(report, profile), dta.encode(changed, profile)
    return next(i for i, (a, b) in enumerate(zip(before, after)) if a != b)


def _flipped(value: bytes) -> bytes:
    return value[:-_VARIED] + bytes(b ^ 0xFF for b in value[-_VARIED:])


def _last_word(value: bytes) -> int:
    return int.from_bytes(value[-_VARIED:], "big")


def _with_last_word(value: bytes, word: int) -> bytes:
    return value[:-_VARIED] + (word & 0xFFFFFFFF).to_bytes(_VARIED, "big")
