"""Postcarding: the hops of a flow's path gathered in a cache and written as one slot once complete or idle."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, cast

import numpy as np

from softdta.core import workload as generators
from softdta.core.primitives.base import (
    Output,
    Primitive,
    SnapshotColumns,
    Target,
    built_in,
    is_power_of_two,
    power_of_two_at_least,
)
from softdta.core.primitives.postcarding.batch import PostcardingPath
from softdta.core.primitives.postcarding.demo import PostcardingDemo
from softdta.core.primitives.postcarding.queries import PathLookup, postcard_snapshot
from softdta.core.primitives.postcarding.region import PostcardRegion
from softdta.core.primitives.postcarding.state import PostcardCache, key_words
from softdta.core.primitives.postcarding.state import PostcardEntry as PostcardEntry  # its state, re-exported
from softdta.core.regions import Buffer, Region
from softdta.core.settings import TableError
from softdta.core.tables import Shape, Structure
from softdta.spec import MAX_POSTCARD_HOPS, TNA_POSTCARD_CACHE_ENTRIES, DtaOpcode, TranslatorCounter
from softdta.wire.dta import Report
from softdta.wire.frames import UdpFrame
from softdta.wire.hashing import key_checksum, postcard_hop_hash, postcard_slot_hash


class Postcarding(Primitive):
    """State: QP index -> the structure's cache (`PostcardCache`): the paths being gathered."""

    opcode, name, subheader, v1_subheader, has_structure, rx_counter = built_in(DtaOpcode.POSTCARDING)
    bpf_header: ClassVar[str | None] = "postcard.h"
    p4_header: ClassVar[str | None] = "postcard"
    vector = PostcardingPath
    demo = PostcardingDemo
    query = PathLookup
    state_map: ClassVar[str | None] = "postcard_cache"
    state_limit: ClassVar[tuple[str, str]] = ("Postcarding cache entries", "lower cache_entries")

    @classmethod
    def workload(cls, params: generators.WorkloadParams) -> list[Report]:
        return generators.postcards(params.count, params.seed, params.hops, params.switch_ids)

    @classmethod
    def state_size(cls, fields: Mapping[str, int]) -> int:
        return fields["cache_entries"]

    @classmethod
    def write_lengths(cls, structure: Structure) -> tuple[int, ...]:
        return (4 * structure.hops,)

    @classmethod
    def slot_size(cls, structure: Shape) -> int:
        return power_of_two_at_least(4 * structure.hops)

    @classmethod
    def check_structure(cls, structure: Structure, where: str) -> None:
        if not 1 <= structure.hops <= MAX_POSTCARD_HOPS:
            raise TableError(f"{where}: hops {structure.hops} must be 1..{MAX_POSTCARD_HOPS}")
        if not is_power_of_two(structure.cache_entries):
            raise TableError(f"{where}: cache_entries {structure.cache_entries} must be a power of two")
        super().check_structure(structure, where)

    @classmethod
    def region(cls, buffer: Buffer, structure: Structure) -> PostcardRegion:
        return PostcardRegion.for_structure(buffer, structure)

    @classmethod
    def describe(cls, structure: Structure) -> dict[str, Any]:
        return {**super().describe(structure), "hops": structure.hops}

    @classmethod
    def snapshot(cls, region: Region, structure: Structure, rows: int) -> Iterator[SnapshotColumns]:
        return postcard_snapshot(cast(PostcardRegion, region), rows)

    @classmethod
    def p4_state_problems(cls, state: Mapping[tuple[bytes, int], int], architecture: str) -> list[str]:
        cache_end = max((first + size for (_, size), first in state.items()), default=0)
        if architecture == "tna" and cache_end > TNA_POSTCARD_CACHE_ENTRIES:
            return [f"Postcarding caches of {cache_end} entries in all: the tna build holds "
                    f"TNA_POSTCARD_CACHE_ENTRIES ({TNA_POSTCARD_CACHE_ENTRIES})"]
        return []

    def new_state(self) -> dict[int, PostcardCache]:
        return {}

    def cache(self, structure: Structure) -> PostcardCache:
        """The structure's cache (made on first use; made afresh if new tables reshaped the structure)."""
        cache = self.state.get(structure.qp.index)
        if cache is None or not cache.fits(structure):
            cache = self.state[structure.qp.index] = PostcardCache(structure)
        return cast(PostcardCache, cache)

    def target(self, udp: UdpFrame, report: Report, now_ns: int) -> Structure | Output:
        structure = self.translator.structure(udp, self.opcode, report)
        if isinstance(structure, Output):
            return structure
        path_length = report.path_length or structure.hops
        if report.hop > path_length or path_length > structure.hops:
            return self.translator.drop(TranslatorCounter.DROP_BAD_HOP)
        return structure

    def apply(self, udp: UdpFrame, report: Report, target: Structure, now_ns: int) -> Output:
        t, structure = self.translator, target
        path_length = report.path_length or structure.hops
        cache = self.cache(structure)
        slot_hash = postcard_slot_hash(report.key)
        index = slot_hash & (structure.cache_entries - 1)
        encoded = int.from_bytes(report.data, "big") ^ postcard_hop_hash(report.key, report.hop)
        out = Output()
        if cache.live[index] and cache.key(index) != report.key:
            if path_length == 1:
                # A one-hop path is complete on arrival: write it without evicting another flow's path.
                values = [0] * structure.hops
                values[report.hop - 1] = encoded
                return Output(frames=self.write_path(structure, report.key, values, report))
            t.counters[TranslatorCounter.POSTCARD_EVICTIONS] += 1
            out.frames += self.write_path(structure, cache.key(index), cache.values[index].tolist(), None)
            cache.live[index] = False
        if not cache.live[index]:
            cache.begin(index, key_words(np.frombuffer(report.key, dtype=np.uint8)[None])[0], slot_hash,
                        key_checksum(report.key), path_length, now_ns, t.flush_later(self, now_ns, index, structure))
        cache.values[index, report.hop - 1] = encoded
        cache.masks[index] |= 1 << (report.hop - 1)
        if int(cache.masks[index]).bit_count() >= cache.path_lengths[index]:
            cache.live[index] = False
            out.frames += self.write_path(structure, report.key, cache.values[index].tolist(), report)
        elif not out.frames:
            t.counters[TranslatorCounter.POSTCARD_CACHED] += 1
        return out

    def write_path(self, structure: Structure, key: bytes, values: list[int], report: Report | None) -> list[bytes]:
        offset = (postcard_slot_hash(key) & (structure.slot_count - 1)) * structure.slot_size
        payload = b"".join(value.to_bytes(4, "big") for value in values)
        return [self.translator.write(self.translator.sender(structure), offset, payload, report, key_checksum(key))]

    def pending(self, token: int, index: int, target: Target) -> PostcardEntry | None:
        assert isinstance(target, Structure)
        cache: PostcardCache | None = self.state.get(target.qp.index)
        entry = None if cache is None or not cache.fits(target) else cache.get(index)
        return entry if entry and entry.token == token else None

    def flush(self, target: Target, index: int, pending: PostcardEntry) -> list[bytes]:
        """A cached path, written with the hops it has, and its cache entry freed."""
        assert isinstance(target, Structure)
        self.state[target.qp.index].live[index] = False
        self.translator.counters[TranslatorCounter.POSTCARD_FLUSHES] += 1
        return self.write_path(target, pending.key, pending.values, None)
