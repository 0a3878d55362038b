"""Latency-Sum: report a flow when the SUM of its per-hop latencies exceeds a threshold T.

The paper's Discussion names this as a query-enhancing primitive: with Postcarding the collector gets every
hop's value and must add them up itself; here the translator adds them and writes only the flows that are
slow end to end. Each hop on a flow's path sends one report (flow key, hop, path length, its latency in ns).
When all hops of a path have arrived and their sum exceeds `threshold_ns`, the translator writes the flow into
the collector's Key-Write store at the report's destination: key -> the sum (big-endian, the store's data
length), as one Key-Write copy. Queries then ask that store for the flows they care about.
"""

from __future__ import annotations

from dataclasses import dataclass

from softdta.core.primitives import Output, PluginReport, Primitive, write_key
from softdta.core.tables import Structure
from softdta.spec import MAX_KEY_LEN, MAX_POSTCARD_HOPS, Counter, DtaOpcode, Field, Header, Var
from softdta.wire.frames import UdpFrame

LATENCY_SUM_EXT = Header("latency_sum_ext", (
    Field("hop", 8, "1-based hop index"), Field("path_length", 8, "hops on this flow's path"),
    Field("key_len", 8), Field("latency_ns", 32, "this hop's latency"),
), "Latency-Sum (plug-in): one hop's latency for a flow", (Var("key", "key_len"),))


@dataclass
class PathSum:
    hop_mask: int = 0
    total_ns: int = 0


class LatencySum(Primitive):
    """State: flow key -> the hops seen so far and their latency sum, for paths still being gathered (at most
    `max_flows`; the oldest path is forgotten first, counted in `forgotten`)."""

    opcode, name, subheader = 0x20, "latency-sum", LATENCY_SUM_EXT
    threshold_ns = 1_000_000
    max_flows = 65536

    def new_state(self) -> dict[bytes, PathSum]:
        self.reported = self.below_threshold = self.forgotten = 0
        return {}

    def target(self, udp: UdpFrame, report: PluginReport, now_ns: int) -> Structure | Output:
        t, fields = self.translator, report.fields
        if not 1 <= len(fields["key"]) <= MAX_KEY_LEN:
            return t.drop(Counter.DROP_BAD_LENGTH)
        if not 1 <= fields["hop"] <= fields["path_length"] <= MAX_POSTCARD_HOPS:
            return t.drop(Counter.DROP_BAD_HOP)
        return t.structure(udp, DtaOpcode.KEY_WRITE, report, key=fields["key"])

    def apply(self, udp: UdpFrame, report: PluginReport, target: Structure, now_ns: int) -> Output:
        t, fields, structure = self.translator, report.fields, target
        key, hop, path_length = fields["key"], fields["hop"], fields["path_length"]
        path = self.state.get(key)
        if path is None:
            if len(self.state) >= self.max_flows:
                del self.state[next(iter(self.state))]
                self.forgotten += 1
            path = self.state[key] = PathSum()
        if not path.hop_mask & 1 << (hop - 1):
            path.hop_mask |= 1 << (hop - 1)
            path.total_ns += fields["latency_ns"]
        if path.hop_mask.bit_count() < path_length:
            return Output()
        del self.state[key]
        if path.total_ns <= self.threshold_ns:
            self.below_threshold += 1
            return Output()
        self.reported += 1
        total = min(path.total_ns, (1 << 8 * structure.data_len) - 1)
        return Output(frames=write_key(t, structure, key, total.to_bytes(structure.data_len, "big"), 1, report))

    @classmethod
    def report(cls, key: bytes, hop: int, path_length: int, latency_ns: int, **flags) -> bytes:
        """The UDP payload one hop sends."""
        return cls.encode({"hop": hop, "path_length": path_length, "key_len": len(key), "latency_ns": latency_ns,
                           "key": key}, **flags)
