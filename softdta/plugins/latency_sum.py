"""Latency-Sum: report a flow when the SUM of its per-hop latencies exceeds a threshold T.

The paper's Discussion names this as a query-enhancing primitive: with Postcarding the collector gets every
hop's value and must add them up itself; here the translator adds them and writes only the flows that are
slow end to end. Each hop on a flow's path sends one report (flow key, hop, path length, its latency in ns).
When all hops of a path have arrived and their sum exceeds `threshold_ns`, the translator writes the flow into
the collector's Key-Write store at the report's destination: key -> the sum (big-endian, the store's data
length), as one Key-Write copy. Queries then ask that store for the flows they care about.

`translate_batch` is the same primitive for the batch translator (core/batch.py): it shows how a plug-in
vectorizes its fields, checks and frames, and keeps to the oracle's order where its state needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from softdta.core.primitives import BatchResult, KeyWrites, Output, PluginReport, PluginRows, Primitive, write_key
from softdta.core.tables import Structure
from softdta.spec import MAX_KEY_LEN, MAX_POSTCARD_HOPS, DtaOpcode, Field, Header, TranslatorCounter, Var
from softdta.wire.columns import gather
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
            return t.drop(TranslatorCounter.DROP_BAD_LENGTH)
        if not 1 <= fields["hop"] <= fields["path_length"] <= MAX_POSTCARD_HOPS:
            return t.drop(TranslatorCounter.DROP_BAD_HOP)
        return t.structure(udp, DtaOpcode.KEY_WRITE, report, key=fields["key"])

    def apply(self, udp: UdpFrame, report: PluginReport, target: Structure, now_ns: int) -> Output:
        fields, structure = report.fields, target
        total = self._add_hop(fields["key"], fields["hop"], fields["path_length"], fields["latency_ns"])
        if total is None:
            return Output()
        data = min(total, (1 << 8 * structure.data_len) - 1).to_bytes(structure.data_len, "big")
        return Output(frames=write_key(self.translator, [structure], fields["key"], data, report))

    def translate_batch(self, rows: PluginRows, now_ns: int) -> BatchResult:
        """`translate` for a batch of reports. The fields, the checks and the frames are vectorized; each
        report's path is one dictionary update, in order, since paths share the flow table and its limit."""
        t, frames, at = self.translator, rows.frames, rows.at
        hops, path_lengths, key_lens = (gather(frames, at, LATENCY_SUM_EXT, name).astype(np.int64)
                                        for name in ("hop", "path_length", "key_len"))
        latencies = gather(frames, at, LATENCY_SUM_EXT, "latency_ns").tolist()
        # target()'s checks, in its order, each a counted drop
        go = (key_lens >= 1) & (key_lens <= MAX_KEY_LEN)
        t.counters[TranslatorCounter.DROP_BAD_LENGTH] += int((~go).sum())
        hop_ok = (hops >= 1) & (hops <= path_lengths) & (path_lengths <= MAX_POSTCARD_HOPS)
        t.counters[TranslatorCounter.DROP_BAD_HOP] += int((go & ~hop_ok).sum())
        go &= hop_ok
        result = BatchResult()
        deferred = []
        targets: list[tuple[Structure, np.ndarray]] = []
        for address in np.unique(rows.collector_ips[go]).tolist():
            mine = go & (rows.collector_ips == address)
            structure = t.tables.structure(int(address).to_bytes(4, "big"), DtaOpcode.KEY_WRITE)
            if structure is None:
                t.counters[TranslatorCounter.DROP_UNKNOWN_COLLECTOR] += int(mine.sum())
                continue
            fits = mine & (key_lens == structure.key_len)
            t.counters[TranslatorCounter.DROP_BAD_LENGTH] += int((mine & ~fits).sum())
            if structure.qp_on(t.queue) is None:
                t.counters[TranslatorCounter.DROP_NO_QUEUE_QP] += int(fits.sum())
                continue
            ready, waiting = t.gate(t.sender(structure), rows.essential[fits], now_ns)
            deferred.append(np.flatnonzero(fits)[waiting])
            targets.append((structure, np.flatnonzero(fits)[ready]))
        # the paths, report by report in arrival order, whichever structure each goes to
        structure_of = {row: structure for structure, chosen in targets for row in chosen.tolist()}
        written: dict[int, list[tuple[int, bytes, int]]] = {}
        key_at = at + LATENCY_SUM_EXT.size
        for row in sorted(structure_of):
            key = frames[row, key_at:key_at + int(key_lens[row])].tobytes()
            total = self._add_hop(key, int(hops[row]), int(path_lengths[row]), latencies[row])
            if total is not None:
                structure = structure_of[row]
                written.setdefault(id(structure), []).append((row, key, min(total, (1 << 8 * structure.data_len) - 1)))
        for structure, _ in targets:
            writes = written.get(id(structure))
            if writes:
                width = structure.data_len
                result.writes.append(KeyWrites(
                    structure, np.array([row for row, _, _ in writes], dtype=np.int64),
                    np.frombuffer(b"".join(key for _, key, _ in writes), dtype=np.uint8).reshape(len(writes), -1),
                    np.frombuffer(b"".join(total.to_bytes(width, "big") for _, _, total in writes),
                                  dtype=np.uint8).reshape(len(writes), width)))
        result.deferred = np.sort(np.concatenate([np.empty(0, dtype=np.int64), *deferred]))
        return result

    def _add_hop(self, key: bytes, hop: int, path_length: int, latency_ns: int) -> int | None:
        """Counts one hop of a flow's path; the latency sum when this completes a path above the threshold."""
        path = self.state.get(key)
        if path is None:
            if len(self.state) >= self.max_flows:
                del self.state[next(iter(self.state))]
                self.forgotten += 1
            path = self.state[key] = PathSum()
        if not path.hop_mask & 1 << (hop - 1):
            path.hop_mask |= 1 << (hop - 1)
            path.total_ns += latency_ns
        if path.hop_mask.bit_count() < path_length:
            return None
        del self.state[key]
        if path.total_ns <= self.threshold_ns:
            self.below_threshold += 1
            return None
        self.reported += 1
        total: int = path.total_ns
        return total

    @classmethod
    def report(cls, key: bytes, hop: int, path_length: int, latency_ns: int, *, seqnum: int = 0,
               immediate: bool = False, essential: bool = False, retransmit: bool = False) -> bytes:
        """The UDP payload one hop sends."""
        return cls.encode({"hop": hop, "path_length": path_length, "key_len": len(key), "latency_ns": latency_ns,
                           "key": key}, seqnum=seqnum, immediate=immediate, essential=essential, retransmit=retransmit)
