"""Flush requests: the P4 translators' idle flush of Append batches and Postcarding paths (not a built-in)."""

from __future__ import annotations

from softdta.core.primitives.append import Append, AppendRuntime
from softdta.core.primitives.base import Output, PluginReport, Primitive, Target
from softdta.core.primitives.postcarding import PostcardEntry, Postcarding
from softdta.core.tables import AppendLists
from softdta.spec import FLUSH_EXT, FLUSH_OPCODE, FlushTarget, TranslatorCounter
from softdta.wire.frames import UdpFrame


class FlushRequest(Primitive):
    """The P4 translators' idle flush, which a switch cannot run from a timer: a flush request names an Append
    list or a Postcarding cache entry, and what waits there is written out if it has waited `idle_ns` (the
    `flush_idle_ns` of translator_config). Not a built-in: software translators flush by their clock, and
    this is how the reference models the switch (`Translator(tables, plugins=[FlushRequest.after(ns)])`).
    Anything not yet due stays, uncounted; an unknown target is a counted drop."""

    opcode, name, subheader = FLUSH_OPCODE, "flush-request", FLUSH_EXT
    idle_ns = 0

    @classmethod
    def after(cls, idle_ns: int) -> type[FlushRequest]:
        return type(cls.__name__, (cls,), {"idle_ns": idle_ns})

    @classmethod
    def request(cls, target: FlushTarget, index: int) -> bytes:
        """The UDP payload of a flush request, sent to the DTA port of the structure's collector address."""
        return cls.encode({"target": target, "index": index})

    def target(self, udp: UdpFrame, report: PluginReport, now_ns: int) -> Target | Output:
        t = self.translator
        kind, index = report.fields["target"], report.fields["index"]
        if kind == FlushTarget.APPEND_LIST:
            lists = t.tables.append_range(index)
            return t.drop(TranslatorCounter.DROP_UNKNOWN_LIST) if lists is None else lists
        if kind != FlushTarget.POSTCARD_ENTRY:
            return t.drop(TranslatorCounter.DROP_BAD_FLUSH)
        structure = t.tables.structure(udp.dst_ip, Postcarding.opcode)
        return t.drop(TranslatorCounter.DROP_UNKNOWN_COLLECTOR) if structure is None else structure

    def apply(self, udp: UdpFrame, report: PluginReport, target: Target, now_ns: int) -> Output:
        t, index = self.translator, report.fields["index"]
        if isinstance(target, AppendLists):
            append = t.primitive(Append.opcode)
            batch: AppendRuntime | None = append.state.get(index)
            if batch is None or not batch.pending or now_ns - batch.first_pending_ns < self.idle_ns:
                return Output()
            return Output(frames=append.flush(target, index, batch))
        if index >= target.cache_entries:
            return t.drop(TranslatorCounter.DROP_BAD_FLUSH)
        postcarding = t.primitive(Postcarding.opcode)
        entry: PostcardEntry | None = postcarding.state.get(target.qp.index, {}).get(index)
        if entry is None or now_ns - entry.first_ns < self.idle_ns:
            return Output()
        return Output(frames=postcarding.flush(target, index, entry))

