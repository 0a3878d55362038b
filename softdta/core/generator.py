"""The kernel report generator's plan (bpf/reporter.bpf.c): one template report, and where in its frame the
generator writes the key, data and seqnum of report i. `report_at(i)` predicts every report it sends, so that
what it sent can be replayed through the reference translator.

Report i carries, in the last 4 bytes of its key, key_base + i % key_span; in the last 4 bytes of its data,
data_base + i; and seqnum seq_base + i (all modulo their width). The bases are the template's own values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from softdta.errors import SoftdtaError
from softdta.spec import GENERATOR_FRAME_MAX
from softdta.wire import dta
from softdta.wire.dta import Profile, Report
from softdta.wire.frames import parse_udp_frame

_VARIED = 4  # bytes of key and data the generator varies: their last four


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
        return bytes(frame)

    def config(self) -> dict[str, int | bytes]:
        """The fields of the generator's map value (spec record `report_generator_value`), next_index 0."""
        return {"frame_len": len(self.frame), "key_span": self.key_span, "key_base": self.key_base,
                "data_base": self.data_base, "key_offset": self.key_offset,
                "data_offset": self.data_offset, "seq_offset": self.seq_offset, "seq_base": self.template.seqnum,
                "frame": self.frame}


def plan(template: Report, frame: bytes, profile: Profile = Profile.DTA_V1, key_span: int = 1) -> GeneratorPlan:
    """The plan for sending `template` (whose frame is `frame`, an IPv4 UDP datagram) with `key_span` distinct
    keys. Offsets come from the codec itself: the bytes that change when only that field does."""
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
    return GeneratorPlan(template, profile, frame, key_span if key_offset else 1, key_offset, data_offset,
                         seq_offset)


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
