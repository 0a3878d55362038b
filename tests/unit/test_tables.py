"""Translator table validation: tables that cannot work are refused with a message naming the fix."""

import tomllib

import pytest

from softdta.core.tables import TableError, Tables
from tests.common import EXAMPLE_TABLES


def document():
    with open(EXAMPLE_TABLES, "rb") as handle:
        return tomllib.load(handle)


def refused(change) -> str:
    doc = document()
    change(doc)
    with pytest.raises(TableError) as error:
        Tables.from_dict(doc)
    return str(error.value)


@pytest.mark.parametrize("qpn", [0, 1, 1 << 24])
def test_reserved_or_oversized_remote_qpns_are_refused(qpn):
    assert "remote_qpn" in refused(lambda d: d["structures"][0]["qp"].update(remote_qpn=qpn))


def test_hashed_structures_need_a_power_of_two_slot_count():
    message = refused(lambda d: d["structures"][0]["qp"].update(length=1000))
    assert "power of two" in message and "length" in message


def test_append_rings_must_hold_whole_batches_and_fit_the_region():
    assert "multiple of the batch" in refused(lambda d: d["append"][0].update(entries=250))
    assert "need" in refused(lambda d: d["append"][0].update(lists=1000))


def test_overlapping_append_ranges_and_shared_local_qpns_are_refused():
    def overlap(d):
        d["append"].append({**d["append"][0], "first_list": 10,
                            "qp": {**d["append"][0]["qp"], "local_qpn": 0x999, "remote_qpn": 0x999,
                                   "base": 0x7f00f0000000}})
    assert "overlap" in refused(overlap)
    assert "already used" in refused(lambda d: d["structures"][1]["qp"].update(local_qpn=0x201))


def test_key_increment_needs_an_aligned_rc_region():
    assert "8-byte aligned" in refused(lambda d: d["structures"][1]["qp"].update(base=0x7f0010000004))


def test_unknown_names_and_missing_settings_say_what_to_do():
    assert "[[append]]" in refused(lambda d: d["structures"][0].update(primitive="append"))
    assert "hash" in refused(lambda d: d["structures"][0].update(hash="md5"))
    assert "missing required setting 'mac'" in refused(lambda d: d["translator"].pop("mac"))
    assert "ttl" in refused(lambda d: d["translator"].update(ttl=300))


@pytest.mark.parametrize("change, words", [
    (lambda d: d["append"][0].update(batch=0), "batch = 0 is out of range"),
    (lambda d: d["structures"][0].update(collector=5), "collector = 5 must be a string"),
    (lambda d: d["structures"][0].update(qp=5), "must be a table"),
    (lambda d: d["translator"].update(ack_request_interval=-1), "ack_request_interval = -1 is out of range"),
    (lambda d: d["translator"].update(ip=12), "ip = 12 must be a string"),
    (lambda d: d["translator"].update(ip="10.77.0.300"), "not a valid address"),
    (lambda d: d["structures"][0].update(key_len=4.5), "key_len = 4.5 must be a whole number"),
    (lambda d: d["translator"].update(grace_ms=float("inf")), "grace_ms"),
    (lambda d: d["translator"].update(ack_requst_interval=2), "did you mean 'ack_request_interval'"),
    (lambda d: d["structures"][0]["qp"].update(rkye=1), "did you mean 'rkey'"),
    (lambda d: d["structures"][1]["qp"].update(remote_qpn=0x101), "remote_qpn 0x101 is already"),
    (lambda d: d["structures"][1]["qp"].update(base=0x7f0000000100, rkey=0x1001), "overlaps"),
    (lambda d: d["structures"][0].update(redundancy=0), "redundancy = 0 is out of range; give a whole number from 1 "
                                                         "to 4"),
    (lambda d: d["structures"][0].update(redundancy=5), "redundancy = 5 is out of range"),
])
def test_careless_settings_are_refused_naming_the_setting(change, words):
    assert words in refused(change)


def _queue_qp(qp: dict, queue: int) -> dict:
    return {**qp, "remote_qpn": qp["remote_qpn"] + 0x100 * queue, "local_qpn": qp["local_qpn"] + 0x100 * queue}


def test_a_qp_array_gives_a_structure_one_qp_per_rx_queue_into_its_region():
    doc = document()
    qp = doc["structures"][0]["qp"]
    doc["structures"][0]["qp"] = [qp, _queue_qp(qp, 1), _queue_qp(qp, 2)]
    tables = Tables.from_dict(doc)
    structure = tables.structures[0]
    assert [q.remote_qpn for q in structure.qps] == [qp["remote_qpn"] + 0x100 * n for n in range(3)]
    assert structure.qps[1].name.endswith("/q1") and structure.qp_on(2) is structure.qps[2]
    assert structure.qp_on(3) is None
    assert all(q in tables.qps for q in structure.qps)
    assert tables.queue_limit() == (1, f"structure {tables.structures[1].name}")


@pytest.mark.parametrize("change, words", [
    (lambda qp: {**qp, "rkey": qp["rkey"] + 1}, "must write queue 0's region"),
    (lambda qp: {**qp, "base": qp["base"] + 4096}, "must write queue 0's region"),
    (lambda qp: {**qp, "transport": "rc"}, "must write queue 0's region"),
    (lambda qp: {**qp, "remote_qpn": qp["remote_qpn"] - 0x100}, "remote_qpn"),
    (lambda qp: {**qp, "local_qpn": qp["local_qpn"] - 0x100}, "already used"),
    (lambda qp: 5, "qp of RX queue 1 must be a table"),
])
def test_the_qps_of_one_structure_differ_only_in_qpns_and_psns(change, words):
    def two_queues(d):
        qp = d["structures"][0]["qp"]
        d["structures"][0]["qp"] = [qp, change(_queue_qp(qp, 1))]
    assert words in refused(two_queues)


def test_more_qps_than_rx_queues_can_have_are_refused():
    def many(d):
        qp = d["append"][0]["qp"]
        d["append"][0]["qp"] = [_queue_qp(qp, n) for n in range(65)]
    assert "65 qps, one per RX queue, exceed 64" in refused(many)
