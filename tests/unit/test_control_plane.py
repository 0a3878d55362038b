"""The control plane's plan (sans-IO): the QPs of every RX queue, and the generation it ends with."""

from softdta.core.control_plane import Entry, Slots, apply_plan, plan
from softdta.core.tables import Tables, with_queue_qps
from softdta.spec import MAX_RX_QUEUES, DtaOpcode
from tests.common import EXAMPLE_TABLES


def _plan(tables: Tables):
    return plan(tables, Slots(), flush_idle_ns=1_000_000, egress=lambda qp: 0)


class Recorder:
    """A target that holds every table and records what it is given, in order."""

    tables = frozenset({"translator_config", "structure", "qp", "tables_generation"})

    def __init__(self):
        self.written: list[Entry] = []

    def write(self, entry: Entry) -> None:
        self.written.append(entry)

    def delete(self, entry: Entry) -> None:
        self.written.append(entry)

    def installed(self, table: str) -> list[Entry]:
        return []


def test_the_generation_changes_with_the_entries_and_only_with_them():
    first, again = _plan(Tables.from_toml(EXAMPLE_TABLES)), _plan(Tables.from_toml(EXAMPLE_TABLES))
    assert first.generation == again.generation
    assert first.generation.value["generation"] != 0  # 0 is a data plane's "no generation yet"
    changed = Tables.from_toml(EXAMPLE_TABLES)
    next(s for s in changed.structures if s.primitive is DtaOpcode.KEY_WRITE).slot_count //= 2
    assert _plan(changed).generation != first.generation
    changed = Tables.from_toml(EXAMPLE_TABLES)
    changed.ttl -= 1
    assert _plan(changed).generation != first.generation


def test_the_generation_is_written_last_and_only_to_a_target_that_has_the_table():
    planned = _plan(Tables.from_toml(EXAMPLE_TABLES))
    recorder = Recorder()
    apply_plan(recorder, planned)
    assert recorder.written[-1] == planned.generation
    assert [e for e in recorder.written if e.table == "tables_generation"] == [planned.generation]
    without = Recorder()
    without.tables = frozenset({"translator_config", "structure", "qp"})
    apply_plan(without, planned)
    assert all(e.table != "tables_generation" for e in without.written)


def test_every_rx_queue_after_the_first_finds_its_qp_in_queue_qp():
    tables = with_queue_qps(Tables.from_toml(EXAMPLE_TABLES), 3)
    entries = _plan(tables).entries
    index = {e.value["local_qpn"]: e.key["qp_index"] for e in entries if e.table == "qp"}
    queue_qp = {e.key["slot"]: e.value["qp_index"] for e in entries if e.table == "queue_qp"}
    owners = [*tables.structures, *tables.append_lists]
    assert len(queue_qp) == 2 * len(owners)
    for owner in owners:
        first = index[owner.qp.local_qpn]
        for queue, qp in enumerate(owner.qps[1:], 1):
            assert queue_qp[first * MAX_RX_QUEUES + queue] == index[qp.local_qpn]
    for entry in entries:
        if entry.table in ("structure", "append_list"):
            assert entry.value["queues"] == 3
    # a structure's entry leads traffic to its queues' QPs: it comes after them
    order = [entry.table for entry in entries]
    assert max(i for i, name in enumerate(order) if name in ("qp", "queue_qp")) < \
        min(i for i, name in enumerate(order) if name in ("structure", "append_list"))
