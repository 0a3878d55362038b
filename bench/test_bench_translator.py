"""The reference (pure-Python) translator per report and primitive, and its wire-format building blocks."""

import math

import pytest

from softdta.core import workload
from softdta.core.batch import BatchTranslator
from softdta.core.translator import Translator
from softdta.lab.benchmarks.workloads import COLLECTOR_IP
from softdta.spec import ROCE_PORT, DtaOpcode, KeyHash, RoceOpcode
from softdta.wire import dta
from softdta.wire.frames import UdpEndpoints, ip_bytes
from softdta.wire.roce import build_roce_frame, icrc, parse_roce, transport_payload


def _key_write(tables, count):
    return workload.key_write(count, seed=1, redundancy=2)


def _key_write_dta_v1(tables, count):
    tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).key_hash = KeyHash.DTA_V1
    return workload.key_write(count, seed=1, redundancy=2)


def _key_increment(tables, count):
    return workload.key_increment(count, seed=2, redundancy=2)


def _append(tables, count):
    lists = tables.append_lists[0]
    assert lists.batch == 4
    return workload.append(count, seed=3, lists=lists.lists, first_list=lists.first_list)


def _postcards(tables, count):
    assert tables.structure(COLLECTOR_IP, DtaOpcode.POSTCARDING).hops == 5
    return workload.postcards(count // 5, seed=4, hops=5)


def _sketch(tables, count):
    sk = tables.structure(COLLECTOR_IP, DtaOpcode.SKETCH_MERGE)
    epochs = math.ceil(count / (sk.reporters * sk.columns))
    return [r for epoch in range(epochs) for r in workload.sketch_epoch(sk.reporters, sk.columns, sk.rows, seed=epoch)]


def _expected_frames(tables, reports):
    """Frames the translator must emit for `reports` (None: checked separately)."""
    opcode = reports[0].opcode
    if opcode in (DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT):
        return sum(r.redundancy for r in reports)
    if opcode is DtaOpcode.APPEND:
        batch = tables.append_lists[0].batch
        per_list: dict[int, int] = {}
        for r in reports:
            per_list[r.list_id] = per_list.get(r.list_id, 0) + 1
        return sum(n // batch for n in per_list.values())
    if opcode is DtaOpcode.SKETCH_MERGE:
        sk = tables.structure(COLLECTOR_IP, DtaOpcode.SKETCH_MERGE)
        return len(reports) // (sk.reporters * sk.columns) * (sk.columns // sk.batch)
    return None


TRANSLATOR_CASES = [
    pytest.param(_key_write, id="key-write-N2"),
    pytest.param(_key_write_dta_v1, id="key-write-N2-dta-v1-hash"),
    pytest.param(_key_increment, id="key-increment-N2"),
    pytest.param(_append, id="append-batch4"),
    pytest.param(_postcards, id="postcarding-5hops"),
    pytest.param(_sketch, id="sketch-merge"),
]


def _process_all(translator, frames):
    process = translator.process
    return [process(frame, 0) for frame in frames]


@pytest.mark.benchmark(group="translator-per-report")
@pytest.mark.parametrize("make_reports", TRANSLATOR_CASES)
def test_translator_process(benchmark, tables, reporter, sizes, record_rate, make_reports):
    """`Translator.process` over a list of pre-built report frames, a fresh Translator (untimed) per round.

    Key-Write and Key-Increment use the example tables' independent hash (a pure-Python CRC per copy) unless
    the case says dta-v1 (zlib). Append, Postcarding and Sketch-Merge emit one write per batch, path or column
    group, so their per-report cost includes the amortized frame building.
    """
    reports = make_reports(tables, sizes.translator_reports)
    frames = [reporter.frame(report) for report in reports]

    outputs = benchmark.pedantic(_process_all, setup=lambda: ((Translator(tables), frames), {}),
                                 rounds=10, warmup_rounds=1)

    assert all(out.drop is None and not out.deferred and not out.passed for out in outputs)
    emitted = sum(len(out.frames) for out in outputs)
    expected = _expected_frames(tables, reports)
    if expected is not None:
        assert emitted == expected
    else:  # postcards: one write per completed path, plus partial paths evicted by cache collisions
        flows = len(reports) // 5
        assert flows * 0.95 <= emitted <= flows * 1.05
    benchmark.extra_info.update(reports=len(reports), frames_out=emitted)
    record_rate(benchmark, len(reports), "reports_per_s", "ns_per_report")


def _process_batches(batch, frames, size):
    return [batch.process_batch(frames[first:first + size]) for first in range(0, len(frames), size)]


@pytest.mark.benchmark(group="translator-per-report")
@pytest.mark.parametrize("size", [64, 1024])
@pytest.mark.parametrize("make_reports", [_key_write, _key_increment], ids=["key-write", "key-increment"])
def test_batch_translator(benchmark, tables, reporter, sizes, record_rate, make_reports, size):
    """`BatchTranslator.process_batch` over the same frames as `test_translator_process`, in batches of `size`:
    compare the two groups' reports_per_s in one run."""
    reports = make_reports(tables, sizes.translator_reports)
    frames = [reporter.frame(report) for report in reports]

    outputs = benchmark.pedantic(_process_batches, setup=lambda: ((BatchTranslator(Translator(tables)), frames, size),
                                                                  {}), rounds=10, warmup_rounds=1)

    assert sum(len(out.frames) for out in outputs) == _expected_frames(tables, reports)
    assert not any(out.deferred or out.to_reporter for out in outputs)
    record_rate(benchmark, len(reports), "reports_per_s", "ns_per_report")


# --------------------------------------------------------------------------------------------------
# wire format


def _roce_write_frame(payload_len: int) -> bytes:
    ends = UdpEndpoints(src_mac=b"\x02\x5d\x7a\x00\x00\x01", dst_mac=b"\x02\x5d\x7a\x00\x01\x01",
                        src_ip=ip_bytes("10.77.0.1"), dst_ip=COLLECTOR_IP, sport=49152, dport=ROCE_PORT)
    reth = {"va": 0x7F0000000000, "rkey": 0x1001, "dma_length": payload_len}
    transport = transport_payload(RoceOpcode.UC_WRITE_ONLY, 0x101, 17, {"reth": reth}, bytes(range(payload_len)))
    return build_roce_frame(ends, transport)


def _repeat(benchmark, function, argument):
    """Time `function(argument)` in rounds of 1000 calls: sub-microsecond calls, few rounds, a small JSON."""
    return benchmark.pedantic(function, args=(argument,), iterations=1000, rounds=20, warmup_rounds=1)


@pytest.mark.benchmark(group="wire")
def test_icrc_80_byte_ip_packet(benchmark, record_rate):
    """`roce.icrc` over an 80-byte IPv4 packet (IP 20 + UDP 8 + BTH 12 + RETH 16 + 24 bytes of payload)."""
    frame = _roce_write_frame(24)
    ip_packet = frame[14:-4]
    assert len(ip_packet) == 80
    assert _repeat(benchmark, icrc, ip_packet) == frame[-4:]
    record_rate(benchmark, 1, "calls_per_s", "ns_per_call")


@pytest.mark.benchmark(group="wire")
def test_parse_roce_key_write_frame(benchmark, tables, reporter, record_rate):
    """`roce.parse_roce` (Ethernet/IP/UDP, BTH, RETH, payload, iCRC check) of a translator Key-Write frame."""
    report = dta.key_write(0x0A000001, 0xDEADBEEF, redundancy=1)
    frame = Translator(tables).process(reporter.frame(report)).frames[0]
    parsed = _repeat(benchmark, parse_roce, frame)
    assert parsed.icrc_ok and parsed.opcode == RoceOpcode.UC_WRITE_ONLY
    assert parsed.payload[4:] == report.data and parsed.headers["reth"]["dma_length"] == 8
    record_rate(benchmark, 1, "calls_per_s", "ns_per_call")


@pytest.mark.benchmark(group="wire")
def test_dta_decode_key_write(benchmark, record_rate):
    """`dta.decode` of a dta-v1 Key-Write payload (base header with seqnum, N=2)."""
    report = dta.key_write(0x0A000001, 0xDEADBEEF, redundancy=2).with_seqnum(9)
    payload = dta.encode(report)
    assert _repeat(benchmark, dta.decode, payload) == report
    record_rate(benchmark, 1, "calls_per_s", "ns_per_call")

