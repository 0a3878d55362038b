"""Report generators for the offline tools, the demo and tests: realistic shapes, deterministic seeds."""

from __future__ import annotations

import random
from dataclasses import dataclass

from softdta.spec import DTA_PORT, DtaOpcode
from softdta.wire import dta
from softdta.wire.dta import Profile, Report
from softdta.wire.frames import UdpEndpoints, build_udp_frame


@dataclass(frozen=True)
class ReporterAddress:
    """Where reports come from and go to: the reporter, the translator's MAC (next hop), the collector IP."""

    mac: bytes
    ip: bytes
    translator_mac: bytes
    collector_ip: bytes
    sport: int = 40041

    def frame(self, report: Report, profile: Profile = Profile.DTA_V1) -> bytes:
        ends = UdpEndpoints(src_mac=self.mac, dst_mac=self.translator_mac, src_ip=self.ip,
                            dst_ip=self.collector_ip, sport=self.sport, dport=DTA_PORT)
        return build_udp_frame(ends, dta.encode(report, profile))


def key_write(count: int, seed: int = 0, redundancy: int = 2, key_len: int = 4, data_len: int = 4) -> list[Report]:
    """INT-style path reports: distinct flow keys, each with its data (e.g. a path of switch IDs)."""
    rng = random.Random(seed)
    extended = key_len != 4 or data_len != 4
    keys = _distinct_keys(rng, count, key_len)
    return [Report(DtaOpcode.KEY_WRITE, key=key, data=rng.randbytes(data_len), redundancy=redundancy,
                   extended=extended) for key in keys]


def key_increment(count: int, seed: int = 0, redundancy: int = 2, flows: int = 64) -> list[Report]:
    """Marple-style counters: many increments over a small set of flows."""
    rng = random.Random(seed)
    keys = _distinct_keys(rng, flows, 4)
    return [dta.key_increment(rng.choice(keys), rng.randint(1, 1500), redundancy) for _ in range(count)]


def append(count: int, seed: int = 0, lists: int = 4, first_list: int = 0) -> list[Report]:
    """Loss or congestion events spread over lists; values are never 0 (0 marks an empty entry)."""
    rng = random.Random(seed)
    return [dta.append(first_list + rng.randrange(lists), rng.randint(1, 0xFFFFFFFF)) for _ in range(count)]


def postcards(flows: int, seed: int = 0, hops: int = 5, switch_ids: list[int] | None = None) -> list[Report]:
    """INT postcards: every flow crosses `hops` switches, one postcard per hop, flows interleaved."""
    rng = random.Random(seed)
    switch_ids = switch_ids or list(range(1, 1025))
    reports: list[Report] = []
    for key in _distinct_keys(rng, flows, 4):
        path = rng.sample(switch_ids, hops)
        reports.extend(dta.postcard(key, hop + 1, path[hop]) for hop in range(hops))
    rng.shuffle(reports)
    return reports


def sketch_epoch(reporters: int, columns: int, rows: int, seed: int = 0) -> list[Report]:
    """One epoch of per-switch Count-Min sketches, each switch sending its columns in order, interleaved."""
    rng = random.Random(seed)
    streams = [[dta.sketch_column(r, c, [rng.randint(0, 1000) for _ in range(rows)]) for c in range(columns)]
               for r in range(reporters)]
    reports = []
    while any(streams):
        stream = rng.choice([s for s in streams if s])
        reports.append(stream.pop(0))
    return reports


def interleave(streams: list[list[Report]], seed: int = 0) -> list[Report]:
    """The streams merged in a random order that keeps each stream's own (sketch columns stay sequential)."""
    rng = random.Random(seed)
    pending = [list(reversed(stream)) for stream in streams]
    order = [index for index, stream in enumerate(pending) for _ in stream]
    rng.shuffle(order)
    return [pending[index].pop() for index in order]


def _distinct_keys(rng: random.Random, count: int, key_len: int) -> list[bytes]:
    """In the order drawn: a set's order depends on the process's hash seed, and a seed must give one workload."""
    keys: dict[bytes, None] = {}
    while len(keys) < count:
        keys[rng.randbytes(key_len)] = None
    return list(keys)
