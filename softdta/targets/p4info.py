"""The P4Info of the P4 translator (p4/), built from the spec: the names and IDs P4Runtime addresses.

p4/softdta.p4info.txtpb is this P4Info in text format (`softdta codegen`); the P4 sources carry the same
@name and @id annotations, so a compiler's P4Info agrees with it on every object the control plane writes.
"""

from __future__ import annotations

import os

from softdta.errors import SoftdtaError


class ProtobufRuntimeError(SoftdtaError, ImportError):
    """protobuf was imported with a runtime that refuses the p4runtime wheel's code before this module."""


# The `p4runtime` wheels on PyPI hold code from an old protoc, which protobuf's default (upb) runtime refuses;
# its pure-Python runtime accepts it. protobuf reads this variable when it is first imported: every module that
# uses the p4runtime protos imports this one first, and nothing in softdta imports protobuf without it.
os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"

from google.protobuf import message, text_format  # noqa: E402

try:
    from p4.config.v1 import p4info_pb2  # noqa: E402
except TypeError as error:  # protobuf was imported with its upb runtime before this module
    raise ProtobufRuntimeError(
        "the p4runtime protos need protobuf's pure-Python runtime, but protobuf was imported before "
        f"softdta.targets.p4info ({str(error).splitlines()[0]})",
        hint="import softdta.targets.p4info before anything that imports google.protobuf, or set "
             "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python") from None

from softdta.targets.p4names import (  # noqa: E402
    P4_MISS_ACTION,
    P4_MISS_ACTION_ID,
    p4_action_id,
    p4_action_params,
    p4_control_tables,
    p4_registers,
    p4_table_id,
)

ARCHITECTURES = ("v1model", "tna")


def build_p4info() -> p4info_pb2.P4Info:
    info = p4info_pb2.P4Info()
    info.pkg_info.name = "softdta"
    info.pkg_info.doc.brief = "softdta translator: DTA reports to RoCEv2, tables generated from softdta/spec/"
    miss = info.actions.add()
    miss.preamble.id, miss.preamble.name, miss.preamble.alias = P4_MISS_ACTION_ID, P4_MISS_ACTION, P4_MISS_ACTION
    for index, table in enumerate(p4_control_tables()):
        action = info.actions.add()
        action.preamble.id = p4_action_id(index)
        action.preamble.name = action.preamble.alias = f"set_{table.name}"
        for number, f in enumerate(p4_action_params(table), start=1):
            param = action.params.add()
            param.id, param.name, param.bitwidth = number, f.name, f.bits
        entry = info.tables.add()
        entry.preamble.id = p4_table_id(index)
        entry.preamble.name = entry.preamble.alias = table.name
        for number, f in enumerate(table.key, start=1):
            match = entry.match_fields.add()
            match.id, match.name, match.bitwidth = number, f.name, f.bits
            match.match_type = p4info_pb2.MatchField.EXACT
        entry.action_refs.add().id = action.preamble.id
        default = entry.action_refs.add()
        default.id, default.scope = P4_MISS_ACTION_ID, p4info_pb2.ActionRef.DEFAULT_ONLY
        entry.const_default_action_id = P4_MISS_ACTION_ID
        entry.size = table.max_entries
    for register in p4_registers():
        entry = info.registers.add()
        entry.preamble.id = register.id
        entry.preamble.name = entry.preamble.alias = register.name
        entry.type_spec.bitstring.bit.bitwidth = register.bits
        entry.size = register.size
    return info


def p4info_text() -> str:
    text: str = text_format.MessageToString(build_p4info())
    return text


def one_line_text(update: message.Message) -> str:
    """A P4Runtime message in protobuf's text format, on one line."""
    text: str = text_format.MessageToString(update, as_one_line=True)
    return text


def parse_p4info(text: str) -> p4info_pb2.P4Info:
    return text_format.Parse(text, p4info_pb2.P4Info())
