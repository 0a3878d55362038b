"""The DTA report protocol: profiles, reports, NACKs; encode and decode UDP payloads (sans-IO).

Profiles fix the dta-v1 base header, which cannot be told apart on the wire:
  * ``dta-v1``       3-byte base header with seqnum (the original generators and evaluation traffic);
  * ``dta-v1-short`` 2-byte base header (the original Reporter P4).
Extended reports (see docs/protocol.md) start with a marker byte no dta-v1 opcode can take, so a translator
accepts them beside either dta-v1 variant without ambiguity.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, cast

from softdta.spec import (
    DTA_BASE_EXT,
    DTA_BASE_V1_SEQ,
    DTA_BASE_V1_SHORT,
    DTA_V1_OPCODES,
    EXTENDED_FIRST_BYTE,
    EXTENDED_MARKER,
    MAX_DATA_LEN,
    MAX_KEY_LEN,
    MAX_POSTCARD_HOPS,
    MAX_REDUNDANCY,
    MAX_SKETCH_ROWS,
    NACK_EXT,
    NACK_V1,
    PRIMITIVES,
    DtaOpcode,
    Header,
    NackKind,
    Raw,
)
from softdta.wire.codec import WireError, codec


class Profile(str, Enum):
    DTA_V1 = "dta-v1"
    DTA_V1_SHORT = "dta-v1-short"

    @property
    def base_header(self) -> Header:
        return DTA_BASE_V1_SEQ if self is Profile.DTA_V1 else DTA_BASE_V1_SHORT





@dataclass(frozen=True)
class Report:
    """One DTA report. Fields that an opcode does not use keep their defaults."""

    opcode: DtaOpcode
    key: bytes = b""
    data: bytes = b""
    redundancy: int = 1
    counter: int = 0
    list_id: int = 0
    hop: int = 0
    path_length: int = 0
    reporter: int = 0
    column: int = 0
    counters: tuple[int, ...] = ()
    seqnum: int = 0
    immediate: bool = False
    essential: bool = False
    retransmit: bool = False
    extended: bool = False

    def with_seqnum(self, seqnum: int) -> "Report":
        return replace(self, seqnum=seqnum & 0xFF)


def key_write(key: bytes | int, data: bytes | int, redundancy: int = 1, **flags: Any) -> Report:
    return Report(DtaOpcode.KEY_WRITE, key=_as_bytes(key), data=_as_bytes(data), redundancy=redundancy, **flags)


def key_increment(key: bytes | int, counter: int, redundancy: int = 1, **flags: Any) -> Report:
    return Report(DtaOpcode.KEY_INCREMENT, key=_as_bytes(key), counter=counter, redundancy=redundancy, **flags)


def append(list_id: int, data: bytes | int, **flags: Any) -> Report:
    return Report(DtaOpcode.APPEND, list_id=list_id, data=_as_bytes(data), **flags)


def postcard(key: bytes | int, hop: int, data: bytes | int, path_length: int = 0, **flags: Any) -> Report:
    return Report(DtaOpcode.POSTCARDING, key=_as_bytes(key), hop=hop, data=_as_bytes(data),
                  path_length=path_length, **flags)


def sketch_column(reporter: int, column: int, counters: list[int] | tuple[int, ...], **flags: Any) -> Report:
    return Report(DtaOpcode.SKETCH_MERGE, reporter=reporter, column=column, counters=tuple(counters),
                  extended=True, **flags)


def _as_bytes(value: bytes | int) -> bytes:
    return value.to_bytes(4, "big") if isinstance(value, int) else bytes(value)


def needs_extended(report: Report) -> bool:
    """True when a report cannot be expressed in dta-v1 (sizes, opcode or flags beyond the original)."""
    if report.opcode not in DTA_V1_OPCODES or report.essential or report.path_length:
        return True
    v1 = _sized_fields(cast(Header, PRIMITIVES[report.opcode].v1_subheader))
    return any(len(getattr(report, name)) != size for name, size in v1.items())


def _sized_fields(header: Header) -> dict[str, int]:
    """A dta-v1 sub-header's fixed-size byte fields (key, data) and their sizes."""
    return {f.name: f.size for f in header.fields if isinstance(f, Raw)}


def encode(report: Report, profile: Profile = Profile.DTA_V1) -> bytes:
    """The UDP payload of `report`. Extended encoding is used when `report.extended` is set."""
    if report.extended:
        base = codec(DTA_BASE_EXT).pack(marker=EXTENDED_FIRST_BYTE, opcode=int(report.opcode),
                                        immediate=int(report.immediate), essential=int(report.essential),
                                        retransmit=int(report.retransmit), seqnum=report.seqnum)
        return base + codec(PRIMITIVES[report.opcode].ext_subheader).pack(_ext_fields(report))
    if needs_extended(report):
        raise ValueError(f"this {report.opcode.name} report needs the extended format (extended=True): "
                         "dta-v1 carries only 32-bit keys and data, no essential flag and no Sketch-Merge")
    if profile is Profile.DTA_V1:
        base = codec(DTA_BASE_V1_SEQ).pack(opcode=int(report.opcode), seqnum=report.seqnum,
                                           immediate=int(report.immediate), retransmit=int(report.retransmit))
    else:
        if report.retransmit:
            raise ValueError("the dta-v1-short base header has no seqnum, so it cannot carry retransmit")
        base = codec(DTA_BASE_V1_SHORT).pack(opcode=int(report.opcode), immediate=int(report.immediate))
    sub = cast(Header, PRIMITIVES[report.opcode].v1_subheader)  # a dta-v1 opcode
    return base + codec(sub).pack({name: getattr(report, name) for name in codec(sub).names})


def _ext_fields(report: Report) -> dict[str, Any]:
    fields = {"redundancy": report.redundancy, "key_len": len(report.key), "data_len": len(report.data),
              "key": report.key, "data": report.data, "counter": report.counter, "list_id": report.list_id,
              "hop": report.hop, "path_length": report.path_length, "reporter": report.reporter,
              "column": report.column, "rows": len(report.counters),
              "counters": b"".join(c.to_bytes(4, "big") for c in report.counters)}
    return {name: fields[name] for name in codec(PRIMITIVES[report.opcode].ext_subheader).names}


def decode(payload: bytes, profile: Profile = Profile.DTA_V1) -> Report:
    """Parse and validate one report; raises WireError with a drop reason for malformed input."""
    if not payload:
        raise WireError("TRUNCATED", "empty DTA payload")
    if payload[0] & EXTENDED_MARKER:
        return _decode_extended(payload)
    base, offset = codec(profile.base_header).unpack(payload)
    try:
        opcode = DtaOpcode(base["opcode"])
    except ValueError:
        raise WireError("UNKNOWN_OPCODE", f"DTA opcode {base['opcode']} is not a dta-v1 opcode") from None
    if opcode not in DTA_V1_OPCODES:
        raise WireError("UNKNOWN_OPCODE", f"DTA opcode {opcode.name} exists only in the extended format")
    fields, end = codec(cast(Header, PRIMITIVES[opcode].v1_subheader)).unpack(payload, offset)
    _expect_end(payload, end, opcode)
    report = Report(opcode, seqnum=base.get("seqnum", 0), immediate=bool(base["immediate"]),
                    retransmit=bool(base.get("retransmit", 0)), **_report_fields(fields))
    return _validate(report)


def _decode_extended(payload: bytes) -> Report:
    base, offset = codec(DTA_BASE_EXT).unpack(payload)
    if base["marker"] != EXTENDED_FIRST_BYTE:
        raise WireError("BAD_PROFILE", f"extended DTA version {base['marker'] & 0x7F} is not supported "
                                       f"(this translator speaks version {EXTENDED_FIRST_BYTE & 0x7F})")
    try:
        opcode = DtaOpcode(base["opcode"])
    except ValueError:
        raise WireError("UNKNOWN_OPCODE", f"extended DTA opcode {base['opcode']} is unknown") from None
    fields, end = codec(PRIMITIVES[opcode].ext_subheader).unpack(payload, offset)
    _expect_end(payload, end, opcode)
    report = Report(opcode, seqnum=base["seqnum"], immediate=bool(base["immediate"]),
                    essential=bool(base["essential"]), retransmit=bool(base["retransmit"]), extended=True,
                    **_report_fields(fields))
    return _validate(report)


def _report_fields(fields: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in fields.items() if k in Report.__dataclass_fields__}
    if "counters" in fields:
        raw = fields["counters"]
        out["counters"] = tuple(int.from_bytes(raw[i:i + 4], "big") for i in range(0, len(raw), 4))
    return out


def _expect_end(payload: bytes, end: int, opcode: DtaOpcode) -> None:
    if end != len(payload):
        raise WireError("BAD_LENGTH", f"{opcode.name} report is {end} bytes but the UDP payload is {len(payload)}")


def _validate(report: Report) -> Report:
    """Check what the sub-header's fields carry against the spec's limits (each field means the same wherever
    it appears)."""
    names = codec(PRIMITIVES[report.opcode].ext_subheader).names
    if "redundancy" in names and not 1 <= report.redundancy <= MAX_REDUNDANCY:
        raise WireError("BAD_REDUNDANCY", f"redundancy N={report.redundancy} is outside 1..{MAX_REDUNDANCY}")
    if "key" in names and not 1 <= len(report.key) <= MAX_KEY_LEN:
        raise WireError("BAD_LENGTH", f"key length {len(report.key)} is outside 1..{MAX_KEY_LEN}")
    if "data_len" in names and not 1 <= len(report.data) <= MAX_DATA_LEN:
        raise WireError("BAD_LENGTH", f"data length {len(report.data)} is outside 1..{MAX_DATA_LEN}")
    if "hop" in names and (not 1 <= report.hop <= MAX_POSTCARD_HOPS or report.path_length > MAX_POSTCARD_HOPS
                           or (report.path_length and report.hop > report.path_length)):
        raise WireError("BAD_HOP", f"hop {report.hop} of path length {report.path_length} is outside "
                                   f"1..{MAX_POSTCARD_HOPS}")
    if "counters" in names and not 1 <= len(report.counters) <= MAX_SKETCH_ROWS:
        raise WireError("BAD_LENGTH", f"a sketch column has 1..{MAX_SKETCH_ROWS} rows, got {len(report.counters)}")
    return report


# --------------------------------------------------------------------------------------------------
# NACKs (translator -> reporter, UDP 40044)

@dataclass(frozen=True)
class Nack:
    kind: NackKind
    value: int
    reporter: int = 0
    extended: bool = False


def encode_nack(nack: Nack) -> bytes:
    if nack.extended:
        return codec(NACK_EXT).pack(marker=EXTENDED_FIRST_BYTE, kind=int(nack.kind), reporter=nack.reporter,
                                    value=nack.value)
    if nack.kind is not NackKind.SEQUENCE:
        raise ValueError("dta-v1 NACKs carry only sequence numbers")
    return codec(NACK_V1).pack(seqnum=nack.value & 0xFF, nack=1)


def decode_nack(payload: bytes) -> Nack:
    """Parse a NACK; the two formats differ in length (2 bytes dta-v1, 8 bytes extended)."""
    if len(payload) == NACK_EXT.size:
        fields, _ = codec(NACK_EXT).unpack(payload)
        if fields["marker"] != EXTENDED_FIRST_BYTE:
            raise WireError("BAD_PROFILE", f"extended NACK version byte 0x{fields['marker']:02x} is not supported")
        try:
            kind = NackKind(fields["kind"])
        except ValueError:
            raise WireError("UNKNOWN_OPCODE", f"NACK kind {fields['kind']} is unknown") from None
        return Nack(kind, fields["value"], fields["reporter"], True)
    if len(payload) == NACK_V1.size:
        fields, _ = codec(NACK_V1).unpack(payload)
        if not fields["nack"]:
            raise WireError("BAD_LENGTH", "dta-v1 NACK without its nack bit")
        return Nack(NackKind.SEQUENCE, fields["seqnum"])
    raise WireError("BAD_LENGTH", f"a NACK is {NACK_V1.size} (dta-v1) or {NACK_EXT.size} (extended) bytes, "
                                  f"got {len(payload)}")
