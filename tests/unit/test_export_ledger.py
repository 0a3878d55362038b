"""The export's account, sans-IO: the ledger's numbering, its bound and its journal, and the Append poller that a
restarted collector starts where the unread entries begin."""

import numpy as np
import pytest

from softdta.core.export import (
    MAX_MESSAGE_ENTRIES,
    ExportError,
    Kind,
    Ledger,
    Naming,
    ack_record,
    encode_record,
    journal_header,
    read_journal,
)
from softdta.core.primitives.append.queries import AppendPoller
from softdta.core.primitives.append.region import AppendRegion
from softdta.core.tables import Tables
from tests.common import EXAMPLE_TABLES


def entries(count: int, start: int = 1) -> np.ndarray:
    return np.arange(start, start + count, dtype="<u4")


def test_entries_are_numbered_per_list_after_the_entries_lost_before_them():
    ledger = Ledger()
    first = ledger.take(3, 0, entries(10), 0, epoch=7, now_ns=1)
    second = ledger.take(3, 0, entries(5, 100), 8, epoch=7, now_ns=2)
    other = ledger.take(4, 0, entries(2), 0, epoch=7, now_ns=2)
    assert [(m.kind, m.sequence, m.count) for m in first + second + other] == [
        (Kind.ENTRIES, 0, 10), (Kind.GAP, 10, 8), (Kind.ENTRIES, 18, 5), (Kind.ENTRIES, 0, 2)]
    assert second[1].payload == np.arange(100, 105, dtype=">u4").tobytes()  # network byte order
    assert (ledger.taken, ledger.lost, ledger.backlog_entries) == (17, 8, 17)


def test_a_big_take_is_cut_into_messages_of_at_most_the_limit():
    messages = Ledger().take(0, 0, entries(2 * MAX_MESSAGE_ENTRIES + 1), 0, epoch=0, now_ns=0)
    assert [m.count for m in messages] == [MAX_MESSAGE_ENTRIES, MAX_MESSAGE_ENTRIES, 1]
    assert [m.sequence for m in messages] == [0, MAX_MESSAGE_ENTRIES, 2 * MAX_MESSAGE_ENTRIES]


def test_the_bound_turns_the_oldest_waiting_messages_into_gaps_and_spares_those_in_flight():
    ledger = Ledger(limit=10)
    ledger.take(0, 0, entries(6), 0, epoch=0, now_ns=0)
    ledger.take(1, 0, entries(6), 0, epoch=0, now_ns=0)
    ledger.take(0, 0, entries(6), 0, epoch=0, now_ns=0)
    in_flight = ledger.ready(1)[0]
    gaps = ledger.bounded()
    assert [(g.list_id, g.sequence, g.count, g.payload) for g in gaps] == [(1, 0, 6, b""), (0, 6, 6, b"")]
    assert ledger.backlog_entries == 6 and ledger.dropped == 12  # the one in flight is kept
    ledger.acknowledged_message(in_flight)
    assert ledger.backlog_entries == 0 and ledger.acknowledged == 6
    assert [m.kind for m in ledger.ready(5)] == [Kind.GAP, Kind.GAP]


def test_acknowledgements_out_of_order_mark_the_lowest_waiting_sequence():
    ledger = Ledger()
    messages = ledger.take(0, 0, entries(3 * MAX_MESSAGE_ENTRIES), 0, epoch=0, now_ns=0)
    ledger.ready(3)
    ledger.acknowledged_message(messages[2])
    assert ledger.acknowledged_below() == {(0, "", b""): 0}
    ledger.acknowledged_message(messages[0])
    assert ledger.acknowledged_below() == {(0, "", b""): MAX_MESSAGE_ENTRIES}
    ledger.failed(messages[1])
    assert ledger.ready(5) == [messages[1]]  # sent again


def test_a_journal_replays_to_the_same_account_and_ignores_a_torn_last_record():
    ledger = Ledger()
    records = [journal_header("0123456789abcdef")]
    made = ledger.take(2, 0, entries(5), 0, epoch=3, now_ns=9) + ledger.take(2, 0, entries(4), 2, epoch=3, now_ns=9)
    state = ledger.state("postcarding", b"\x0a\x00\x00\x01", b'{"path":[1]}', epoch=3, now_ns=9)
    assert state is not None
    records += [encode_record(message) for message in made + [state]]
    ledger.ready(1)
    ledger.acknowledged_message(made[0])
    records.append(ack_record((2, "", b""), ledger.acknowledged_below()[(2, "", b"")]))
    data = b"".join(records)
    journal = read_journal(data + encode_record(made[0])[:-3])
    assert journal.incarnation == "0123456789abcdef" and journal.valid_bytes == len(data)
    replayed = Ledger.replayed(journal.messages)
    assert list(replayed.backlog) == [((2, "", b""), 5), ((2, "", b""), 7), ((0, "postcarding", b"\x0a\0\0\x01"), 0)]
    assert replayed.next_sequence == ledger.next_sequence
    assert replayed.backlog_entries == ledger.backlog_entries == 5
    assert replayed.state("postcarding", b"\x0a\x00\x00\x01", b'{"path":[1]}', epoch=3, now_ns=10) is None
    with pytest.raises(ExportError, match="not a softdta export journal"):
        read_journal(b"something else")


def test_a_gap_in_the_journal_supersedes_the_entries_it_replaced_in_their_place():
    ledger = Ledger(limit=4)
    made = ledger.take(0, 0, entries(4), 0, epoch=0, now_ns=0) + ledger.take(0, 0, entries(4), 0, epoch=0, now_ns=0)
    gaps = ledger.bounded()
    replayed = Ledger.replayed(made + gaps)
    assert [(m.kind, m.sequence) for m in replayed.backlog.values()] == [(Kind.GAP, 0), (Kind.ENTRIES, 4)]
    assert replayed.backlog_entries == 4


@pytest.mark.parametrize("name,setting", [("a.b", "collector"), ("c1", "prefix"), ("c1", "stream")])
def test_names_that_are_not_nats_tokens_are_refused(name, setting):
    bad = {"collector": {}, "prefix": {"prefix": "a..b"}, "stream": {"stream": "SOFT.DTA"}}[setting]
    with pytest.raises(ExportError, match="NATS subject|stream name"):
        Naming(name, **bad)


def test_a_new_poller_starts_where_the_unread_batches_start():
    """A restarted collector's poller: batches 5..7 of a ring were written and never taken (0..4 were taken and
    zeroed); it must read them, oldest first, and then what the writer adds at 8."""
    lists = Tables.from_toml(EXAMPLE_TABLES).append_lists[0]
    region = AppendRegion(bytearray(lists.qp.length), lists)
    ring = region.ring(lists.first_list)
    batch = lists.batch
    ring[5 * batch:8 * batch] = np.arange(1, 3 * batch + 1)
    writes = np.zeros(lists.lists, dtype=np.uint64)
    writes[0] = 8
    poller = AppendPoller(region, writes)
    assert poller.poll()[lists.first_list].tolist() == list(range(1, 3 * batch + 1))
    ring[8 * batch:9 * batch] = 99
    writes[0] = 9
    assert poller.poll()[lists.first_list].tolist() == [99] * batch


def test_forgetting_what_the_journal_could_not_keep_leaves_the_ledger_as_it_was():
    ledger = Ledger()
    ledger.take(1, 0, entries(3), 0, epoch=0, now_ns=0)
    before = (dict(ledger.next_sequence), ledger.acknowledged_below(), ledger.taken, ledger.backlog_entries)
    ledger.forget(ledger.take(1, 0, entries(2), 4, epoch=0, now_ns=0) + ledger.take(2, 0, entries(5), 0, epoch=0,
                                                                                    now_ns=0))
    state = ledger.state("postcarding", b"\x01", b"{}", epoch=0, now_ns=0)
    ledger.forget([state])
    assert (dict(ledger.next_sequence), ledger.acknowledged_below(), ledger.taken, ledger.backlog_entries) == before
    assert ledger.lost == 0 and ledger.states == 0
    assert ledger.state("postcarding", b"\x01", b"{}", epoch=0, now_ns=0) is not None  # made again
