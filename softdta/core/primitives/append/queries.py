"""Append's queries: `AppendPoller` drains a range's rings, `AppendFeed` keeps what it drained for the lists no
request has taken yet and shapes the query service's answers (`GET` and `POST /append/<range>`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.append import Append
from softdta.core.primitives.append.region import AppendRegion
from softdta.core.query import QueryError, hex_rows
from softdta.core.tables import AppendLists
from softdta.wire.frames import ip_str


def range_name(lists: AppendLists) -> str:
    """How the query service names a range: append<first list>@<collector ip>."""
    return f"{Append.name}{lists.first_list}@{ip_str(lists.qp.collector_ip)}"


Keep = Callable[[dict[int, np.ndarray], dict[int, int]], None]


class AppendPoller:
    """Drains Append rings with one tail pointer per list.

    The translator writes whole batches at batch-aligned positions, and the poller zeroes what it consumed,
    so a batch holding any non-zero entry is new. Entry value 0 therefore means "empty" (as in dta-v1).

    A writer that gets a whole ring ahead of the poller (a lap) overwrites batches nobody read. With `writes`,
    the WRITEs executed into each ring as the responder counts them (xdp backend, reference responder), the
    poller sees that: it counts the batches overwritten, and reads the ring from the writer's position, so the
    survivors still come oldest first. Without it (an RDMA NIC counts nothing) a lap goes unnoticed.
    """

    def __init__(self, region: AppendRegion, writes: np.ndarray | None = None):
        self.region = region
        self.batch = region.lists.batch
        self.batches_per_ring = region.lists.entries // self.batch
        shape = (region.lists.lists, self.batches_per_ring, self.batch) + region.rings.shape[2:]
        self._batches = region.rings.reshape(shape)
        self.writes = writes
        self.tails = self._oldest_unread()
        # WRITEs accounted for per ring: taken, or counted as overwritten; the batches in the rings now are not
        self.accounted: np.ndarray | None = None if writes is None else \
            writes.astype(np.int64) - self._runs(self.tails)[1]

    def poll(self) -> dict[int, np.ndarray]:
        """New entries of every list (oldest first), keyed by list id; lists with nothing new are left out.
        They are taken: zeroed in the ring, and the list's tail moves past them."""
        return self.poll_counting_laps()[0]

    def poll_counting_laps(self, keep: Keep | None = None) -> tuple[dict[int, np.ndarray], dict[int, int]]:
        """`poll`, and the entries that laps overwrote before they were read, by list id (lists with a loss).
        `keep`, if given, gets both before the rings are zeroed (a journal writes them there)."""
        return self._new(take=True, keep=keep)

    def peek(self) -> tuple[dict[int, np.ndarray], dict[int, int]]:
        """What `poll_counting_laps` would return, leaving the rings and tails as they are."""
        return self._new(take=False)

    def _new(self, take: bool, keep: Keep | None = None) -> tuple[dict[int, np.ndarray], dict[int, int]]:
        ring = self.batches_per_ring
        tails, overwritten = self.tails.copy(), np.zeros_like(self.tails)
        if self.writes is not None:
            unread = self.writes.astype(np.int64) - cast(np.ndarray, self.accounted)  # set whenever writes is
            lapped = unread > ring
            overwritten[lapped] = unread[lapped] - ring
            tails[lapped] = (tails[lapped] + unread[lapped]) % ring  # the writer's position: the oldest batch
        # with the WRITEs counted, only the batches written since the last poll need looking at
        order, run = self._runs(tails, None if self.writes is None else int(unread.clip(0, ring).max(initial=0)))
        first = self.region.lists.first_list
        new: dict[int, np.ndarray] = {}
        for index in np.nonzero(run)[0]:
            entries = self._batches[index, order[index, :run[index]]].reshape((-1,) + self._batches.shape[3:])
            nonzero = entries.reshape(entries.shape[0], -1).any(axis=1)
            new[first + int(index)] = entries[nonzero]  # fancy indexing: a copy
        lost = {first + int(index): int(overwritten[index]) * self.batch for index in np.nonzero(overwritten)[0]}
        if take:
            if keep is not None:
                keep(new, lost)
            for index in np.nonzero(run)[0]:
                self._batches[index, order[index, :run[index]]] = 0
            self.tails = (tails + run) % ring
            if self.accounted is not None:
                self.accounted += overwritten + run
        return new, lost

    def _oldest_unread(self) -> np.ndarray:
        """Per list, where its unread batches start: a new poller (a restarted collector's) reads on from there.
        The poller zeroes what it takes and the writer writes batches in ring order, so the unread batches are a
        circular run of written ones; an empty or full ring starts at 0. With `writes`, an empty ring starts where
        the writer writes next (a killed collector's successor reads on from there), and a ring with several runs
        (a lost WRITE leaves a hole) starts at the run that ends where the writer last wrote."""
        ring = self.batches_per_ring
        written = self._batches.reshape(self._batches.shape[0], ring, -1).any(axis=2)
        starts = written & ~np.roll(written, 1, axis=1)
        tails = np.zeros(written.shape[0], dtype=np.int64)
        if self.writes is not None:
            tails[:] = self.writes.astype(np.int64) % ring
        for index in np.nonzero(starts.any(axis=1))[0]:
            candidates = np.nonzero(starts[index])[0]
            tails[index] = candidates[0]
            if self.writes is not None and candidates.size > 1:
                last = (int(self.writes[index]) - 1) % ring
                tails[index] = candidates[candidates <= last][-1] if (candidates <= last).any() else candidates[-1]
        return tails

    def _runs(self, tails: np.ndarray, most: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per list, the ring's batch positions from its tail on (`most` of them, all if None), and how many of
        them in a row are written."""
        ring = self.batches_per_ring
        order = (tails[:, None] + np.arange(ring if most is None else min(most, ring))) % ring
        batches = self._batches[np.arange(order.shape[0])[:, None], order]
        # any() over an axis is an array (numpy's stubs also allow a scalar)
        written = cast(np.ndarray, batches.reshape(order.shape + (int(np.prod(self._batches.shape[2:])),)).any(axis=2))
        run = np.cumprod(written, axis=1).sum(axis=1)
        return order, run


class AppendFeed:
    """One Append range: its poller, and entries it drained for lists that no request has taken yet.

    A poll drains every list of the range, so entries of other lists wait here; at most one ring's worth per
    list (what the ring itself would have held), older ones are dropped and counted.
    """

    def __init__(self, lists: AppendLists, region: AppendRegion, writes: np.ndarray | None):
        self.lists = lists
        self.poller = AppendPoller(region, writes)
        self.unread: dict[int, np.ndarray] = {}
        self.dropped: dict[int, int] = {}

    def take(self, list_id: int | None) -> dict[int, tuple[np.ndarray, int]]:
        """(entries, dropped) of `list_id` (every list with news if None) since the last take."""
        self.unread, self.dropped = self._merged(*self.poller.poll_counting_laps())
        wanted = [list_id] if list_id is not None else sorted(self.unread)
        return {wanted_id: (self.unread.pop(wanted_id, self._empty), self.dropped.pop(wanted_id, 0))
                for wanted_id in wanted}

    def peek(self, list_id: int | None) -> dict[int, tuple[np.ndarray, int]]:
        """What `take` would return, taking nothing."""
        unread, dropped = self._merged(*self.poller.peek())
        wanted = [list_id] if list_id is not None else sorted(unread)
        return {wanted_id: (unread.get(wanted_id, self._empty), dropped.get(wanted_id, 0)) for wanted_id in wanted}

    @property
    def _empty(self) -> np.ndarray:
        return self.poller.region.rings[0, :0]

    def _merged(self, polled: dict[int, np.ndarray], overwritten: dict[int, int]
                ) -> tuple[dict[int, np.ndarray], dict[int, int]]:
        """The unread entries with `polled` after them, each list cut to one ring (the oldest dropped), and
        the drops: those cuts, and what laps overwrote in the rings."""
        unread, dropped = dict(self.unread), dict(self.dropped)
        for list_id, lost in overwritten.items():
            dropped[list_id] = dropped.get(list_id, 0) + lost
        for polled_id, entries in polled.items():
            backlog = np.concatenate([unread[polled_id], entries]) if polled_id in unread else entries
            excess = backlog.shape[0] - self.lists.entries
            if excess > 0:
                dropped[polled_id] = dropped.get(polled_id, 0) + excess
                backlog = backlog[excess:]
            unread[polled_id] = backlog
        return unread, dropped

    def entries_json(self, entries: np.ndarray) -> list[Any]:
        """4- and 8-byte entries as integers (the reported big-endian value); other sizes as hex."""
        values: list[Any] = entries.tolist() if entries.ndim == 1 else hex_rows(entries.tobytes(), self.lists.data_len)
        return values

    def list_id(self, text: str | None) -> int | None:
        """The list a request names (its `list` parameter, None for every list of the range)."""
        if text is None:
            return None
        lists = self.lists
        list_id = int(text) if text.isascii() and text.isdigit() and len(text) < 12 else -1
        if not lists.first_list <= list_id < lists.first_list + lists.lists:
            raise QueryError(f"list must be a list id in {lists.first_list}..{lists.first_list + lists.lists - 1}, "
                             f"got {text[:20]!r}{'...' if len(text) > 20 else ''}")
        return list_id

    def answer(self, name: str, list_id: int | None, taken: dict[int, tuple[np.ndarray, int]]) -> dict[str, Any]:
        """What `take` or `peek` returned, as the query service sends it: one list's entries and drops, or every
        list's by list id."""
        lists = {str(taken_id): {"entries": self.entries_json(values), "dropped": dropped}
                 for taken_id, (values, dropped) in taken.items()}
        if list_id is not None:
            return {"append": name, "list": list_id, **lists[str(list_id)]}
        return {"append": name, "lists": lists}

    def stream_lines(self, taken: dict[int, tuple[np.ndarray, int]]) -> list[dict[str, Any]]:
        """What `take` returned as the lines of a follow stream: one per list with news."""
        return [{"list": taken_id, "entries": self.entries_json(entries), "dropped": dropped}
                for taken_id, (entries, dropped) in taken.items() if entries.shape[0] or dropped]

    def stats(self, name: str) -> dict[str, Any]:
        """The range's sizes and fill, as `/structures` lists it."""
        lists = self.lists
        occupied = self.poller.region.occupied()
        return {"name": name, "primitive": Append.name, "collector_ip": ip_str(lists.qp.collector_ip),
                "region_bytes": lists.qp.length, "slot_size": lists.data_len, "slot_count": occupied.size,
                "fill": np.count_nonzero(occupied) / occupied.size, "load_factor": None,
                "first_list": lists.first_list, "lists": lists.lists, "entries": lists.entries,
                "data_len": lists.data_len, "batch": lists.batch}


def append_snapshot(feed: AppendFeed) -> dict[str, npt.NDArray[Any]]:
    """Every entry the range holds for requests to take (drained and not taken yet, then still in the rings), list
    by list, oldest first, taking none: list_id (u32), position (u32, 0 the oldest) and entry (u32 or u64, the
    reported big-endian value, for 4- and 8-byte entries; else the entry's bytes as rows)."""
    waiting = feed.peek(None)
    entries = [entries for entries, _ in waiting.values()]
    counts = np.array([len(listed) for listed in entries], dtype=np.int64)
    list_ids = np.repeat(np.array(list(waiting), dtype=np.uint32), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return {"list_id": list_ids, "position": (np.arange(int(counts.sum())) - starts).astype(np.uint32),
            "entry": np.concatenate(entries) if entries else feed.poller.region.rings[0, :0].copy()}
