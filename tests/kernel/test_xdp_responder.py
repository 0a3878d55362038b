"""The XDP responder against the reference responder, frame for frame, through BPF_PROG_TEST_RUN.

Frames come from the reference translator (every primitive, UC and RC) and then meet faults on the way: loss,
duplication, reordering, corruption, a stranger's source address, wrong keys and addresses.
"""

import os
import random
import shutil
import uuid
from dataclasses import replace

import numpy as np
import pytest

from softdta.collector.backend import BackendError, Peer
from softdta.collector.xdp_backend import XdpBackend
from softdta.collector.xdp_responder import XdpResponder
from softdta.core import workload
from softdta.core.responder import MemoryRegion, Responder, ResponderQp
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.kernel.bpf import BPF_MAP_TYPE_ARRAY, Map, ensure_bpffs, pin
from softdta.kernel.programs import EngineError
from softdta.spec import RESPONDER_IP_LIMIT, ROCE_PORT, Access, ResponderCounter, RoceOpcode, Transport
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_bytes, mac_bytes, parse_udp_frame
from softdta.wire.roce import build_roce_frame, parse_roce, transport_payload
from tests.common import COLLECTOR_IP, EXAMPLE_TABLES

pytestmark = pytest.mark.privileged


class Pair:
    """The reference responder and the XDP responder, set up with the same queue pairs over the same tables."""

    def __init__(self, tables: Tables, rc: bool):
        self.tables = tables
        qps = [qp for qp in tables.qps if qp.collector_ip == COLLECTOR_IP]
        mac = qps[0].collector_mac
        self.reference = Responder(mac, COLLECTOR_IP)
        self.kernel = XdpResponder(mac, COLLECTOR_IP, arena_bytes=sum(-(-qp.length // 4096) * 4096 for qp in qps))
        self.memory = {}
        self.rings = {}  # Append QPs: (the reference's WRITE counts per ring, the kernel's)
        rings = {lists.qp.remote_qpn: lists for lists in tables.append_lists}
        for qp in qps:
            if rc:
                qp.transport = Transport.RC
            self.memory[qp.remote_qpn] = bytearray(qp.length)
            lists = rings.get(qp.remote_qpn)
            ring_bytes = lists.entries * lists.data_len if lists else 0
            counted = np.zeros(lists.lists if lists else 0, dtype=np.uint64)
            self.reference.add_qp(ResponderQp(
                qpn=qp.remote_qpn, transport=qp.transport, remote_ip=tables.ip, remote_mac=tables.mac,
                region=MemoryRegion(qp.base_va, qp.rkey, self.memory[qp.remote_qpn], ring_bytes=ring_bytes,
                                    ring_writes=counted), expected_psn=qp.start_psn, remote_qpn=qp.local_qpn))
            region = self.kernel.allocate(qp.length)
            first_ring = self.kernel.allocate_rings(counted.size) if lists else 0
            self.kernel.add_qp(qp.remote_qpn, qp.transport, remote_ip=tables.ip, remote_mac=tables.mac,
                               remote_qpn=qp.local_qpn, region=region, base_va=qp.base_va, rkey=qp.rkey,
                               expected_psn=qp.start_psn, ring_bytes=ring_bytes, ring_index=first_ring)
            if lists:
                self.rings[qp.remote_qpn] = (counted, self.kernel.ring_writes[first_ring:first_ring + counted.size])
            self.memory[qp.remote_qpn] = (self.memory[qp.remote_qpn], region)

    def deliver(self, frame: bytes, what: str = "") -> list[bytes]:
        expected, got = self.reference.process(frame), self.kernel.process(frame)
        assert got.replies == expected.replies, f"{what}: replies differ"
        assert got.completions == expected.completions, what
        assert got.passed == expected.passed, what
        for reply in got.replies:
            assert parse_roce(reply).icrc_ok
        return got.replies

    def assert_same_state(self) -> None:
        assert dict(self.kernel.counters()) == {k: v for k, v in self.reference.counters.items() if v}
        for qpn, (buffer, region) in self.memory.items():
            assert region.view.tobytes() == bytes(buffer), f"memory of QP {qpn:#x}"
            state, reference = self.kernel.qp_state(qpn), self.reference.qps[qpn]
            assert (state.expected_psn, state.msn, bool(state.error)) == \
                   (reference.expected_psn, reference.msn, reference.error), f"QP {qpn:#x}"
        for qpn, (reference, kernel) in self.rings.items():
            assert kernel.tolist() == reference.tolist(), f"WRITEs per Append ring of QP {qpn:#x}"


def reports(seed: int) -> list:
    reports = (workload.key_write(150, seed, redundancy=2) + workload.key_increment(60, seed)
               + workload.append(120, seed) + workload.postcards(40, seed) + workload.sketch_epoch(2, 64, 4, seed))
    random.Random(seed).shuffle(reports)
    return [replace(report, immediate=index % 7 == 0) for index, report in enumerate(reports)]


def reporter_of(tables: Tables) -> ReporterAddress:
    return ReporterAddress(mac=mac_bytes("02:00:00:00:09:01"), ip=ip_bytes("10.77.9.1"), translator_mac=tables.mac,
                           collector_ip=COLLECTOR_IP)


def faulty_link(rng: random.Random):
    """Loses, duplicates, corrupts and reorders frames; call it with each frame, it returns what arrives."""
    held: list[bytes] = []

    def carry(frame: bytes) -> list[bytes]:
        fault = rng.random()
        if fault < 0.03:
            return []
        if fault < 0.06:
            return [frame, frame]
        if fault < 0.09 and not held:
            held.append(frame)  # overtaken by the next frame
            return []
        if fault < 0.11:
            corrupted = bytearray(frame)
            corrupted[rng.randrange(14, len(frame))] ^= 1 << rng.randrange(8)
            frame = bytes(corrupted)
        arriving = [frame] + held
        held.clear()
        return arriving

    return carry


@pytest.mark.parametrize("rc", [False, True], ids=["as-configured", "all-rc"])
@pytest.mark.parametrize("seed", range(3))
def test_translated_frames_with_faults_match_the_reference(seed, rc):
    """A closed loop: the translator's frames cross a faulty link, and the replies go back to the translator, which
    resyncs after a sequence NAK, so RC keeps going after losses."""
    tables = Tables.from_toml(EXAMPLE_TABLES)
    tables.ack_request_interval = 3 if rc else 0
    pair = Pair(tables, rc)
    translator, reporter, link = Translator(tables), reporter_of(tables), faulty_link(random.Random(seed))
    with pair.kernel:
        now = 0
        for index, report in enumerate(reports(seed)):
            now += 100_000
            for frame in translator.process(reporter.frame(report), now).frames:
                for arriving in link(frame):
                    for reply in pair.deliver(arriving, f"seed {seed} report {index}"):
                        translator.process(reply, now)
        for frame in translator.flush_idle(now + 10**9):
            pair.deliver(frame, "flush")
        pair.assert_same_state()
        assert pair.kernel.counters()[ResponderCounter.EXECUTED] > 200  # traffic goes on well past the first loss
        assert all(kernel.sum() > 0 for _, kernel in pair.rings.values())  # Append writes were counted


def request(tables, qp, opcode, psn, *, va=None, rkey=None, payload=b"", src_ip=None, dma_length=None,
            ack_req=False):
    ends = UdpEndpoints(src_mac=tables.mac, dst_mac=qp.collector_mac, src_ip=src_ip or tables.ip,
                        dst_ip=qp.collector_ip, sport=49152, dport=ROCE_PORT)
    va = qp.base_va if va is None else va
    rkey = qp.rkey if rkey is None else rkey
    headers = {"reth": {"va": va, "rkey": rkey, "dma_length": len(payload) if dma_length is None else dma_length},
               "immdt": {"immediate": 0xABCD}, "atomic_eth": {"va": va, "rkey": rkey, "swap_add": 5}}
    return build_roce_frame(ends, transport_payload(opcode, qp.remote_qpn, psn, headers, payload, ack_req=ack_req))


def test_access_violations_and_strangers_are_refused_like_the_reference():
    tables = Tables.from_toml(EXAMPLE_TABLES)
    pair = Pair(tables, rc=True)
    with pair.kernel:
        kw, ki = tables.qps[0], tables.qps[1]
        cases = [
            request(tables, kw, RoceOpcode.RC_WRITE_ONLY_IMM, kw.start_psn, payload=b"12345678", ack_req=True),
            request(tables, kw, RoceOpcode.RC_WRITE_ONLY, kw.start_psn + 1, va=kw.base_va + kw.length - 4,
                    payload=b"12345678"),  # past the end of the region: NAK, QP in error
            request(tables, kw, RoceOpcode.RC_WRITE_ONLY, kw.start_psn + 1, payload=b"x"),  # QP now in error
            request(tables, ki, RoceOpcode.RC_FETCH_ADD, ki.start_psn, va=ki.base_va + 8),
            request(tables, ki, RoceOpcode.RC_FETCH_ADD, ki.start_psn),  # duplicate: repeats the Atomic ACK
            request(tables, ki, RoceOpcode.RC_FETCH_ADD, ki.start_psn + 5),  # gap: one NAK
            request(tables, ki, RoceOpcode.RC_FETCH_ADD, ki.start_psn + 6),  # gap again: silently dropped
            request(tables, ki, RoceOpcode.RC_FETCH_ADD, ki.start_psn + 1, rkey=7),  # wrong key: fatal
            request(tables, tables.qps[2], RoceOpcode.RC_FETCH_ADD, tables.qps[2].start_psn,
                    va=tables.qps[2].base_va + 4),
            request(tables, tables.qps[3], RoceOpcode.RC_WRITE_ONLY, tables.qps[3].start_psn, payload=b"ab",
                    src_ip=ip_bytes("10.77.0.99")),
            request(tables, tables.qps[3], RoceOpcode.UC_WRITE_ONLY, tables.qps[3].start_psn, payload=b"ab"),
            request(tables, tables.qps[4], RoceOpcode.RC_WRITE_ONLY, tables.qps[4].start_psn, payload=b"abcd",
                    dma_length=8),
        ]
        for frame in cases:
            pair.deliver(frame, str(parse_roce(frame).bth))
        pair.assert_same_state()
        counters = pair.kernel.counters()
        for reason in (ResponderCounter.REMOTE_ACCESS_ERRORS, ResponderCounter.QP_IN_ERROR,
                       ResponderCounter.DUPLICATE_REQUEST, ResponderCounter.OUT_OF_SEQ_REQUEST,
                       ResponderCounter.OUT_OF_SEQUENCE_AFTER_NAK, ResponderCounter.MISALIGNED_ATOMIC,
                       ResponderCounter.SOURCE_GID_MISMATCH, ResponderCounter.OPCODE_NOT_VALID,
                       ResponderCounter.COMPLETIONS):
            assert counters[reason] >= 1, reason


def test_malformed_frames_never_touch_memory():
    tables = Tables.from_toml(EXAMPLE_TABLES)
    pair = Pair(tables, rc=False)
    rng = random.Random(9)
    with pair.kernel:
        translator, reporter = Translator(tables), reporter_of(tables)
        frames = [f for report in reports(4)[:60] for f in translator.process(reporter.frame(report)).frames]
        for frame in frames:
            udp = parse_udp_frame(frame)
            body = udp.payload
            for cut in (0, 1, 11, 12, 15, 16, 20, len(body) - 5, len(body) - 1):
                truncated = body[:cut]
                ends = UdpEndpoints(src_mac=tables.mac, dst_mac=udp.eth["dst"], src_ip=udp.src_ip, dst_ip=udp.dst_ip,
                                    sport=udp.udp["sport"], dport=ROCE_PORT)
                pair.deliver(build_udp_frame(ends, truncated), f"cut {cut}")
            mutated = bytearray(frame)
            for _ in range(3):
                mutated[rng.randrange(42, len(mutated))] = rng.randrange(256)
            pair.deliver(bytes(mutated), "mutated")
            pair.deliver(frame, "intact")
        other_port = bytearray(frames[0])
        other_port[36:38] = (4792).to_bytes(2, "big")
        assert not pair.kernel.process(bytes(other_port)).replies
        pair.assert_same_state()


def test_a_changed_header_byte_after_a_kept_icrc_prefix_is_judged_like_the_reference():
    """Each CPU keeps the iCRC state over the last request's headers (up to the BTH's PSN): a request that differs
    from the last one in any one header byte or bit, masked or not, is judged like the reference, and so is the
    intact request after it."""
    tables = Tables.from_toml(EXAMPLE_TABLES)
    pair = Pair(tables, rc=False)
    with pair.kernel:
        qp = next(qp for qp in tables.qps if qp.collector_ip == COLLECTOR_IP and qp.transport is Transport.UC
                  and qp.length >= 16)
        for opcode in (RoceOpcode.UC_WRITE_ONLY, RoceOpcode.UC_WRITE_ONLY_IMM):
            intact = request(tables, qp, opcode, qp.start_psn, payload=b"abcdefgh")
            pair.deliver(intact, "intact")
            for at in range(14, 14 + 20 + 8 + 12):  # IPv4, UDP, BTH: the first ones are in the kept prefix
                for bit in (0x01, 0x80):
                    changed = bytearray(intact)
                    changed[at] ^= bit
                    pair.deliver(bytes(changed), f"byte {at} ^ {bit:#x}")
                    pair.deliver(intact, f"intact after byte {at}")
        pair.assert_same_state()
        assert pair.kernel.counters()[ResponderCounter.ICRC_ERRORS] > 0


def test_replies_follow_a_changed_queue_pair_like_the_reference():
    """Each CPU keeps the last reply's headers with what they were built from: ACKs and Atomic ACKs after the
    QP's remote MAC, IP or QPN changed, in turns, carry the new ones, as the reference's do."""
    mac, ip = mac_bytes("02:5d:7a:00:01:01"), ip_bytes("10.77.1.1")
    kernel, reference = XdpResponder(mac, ip, arena_bytes=4096), Responder(mac, ip)
    memory, qpn, base, rkey = bytearray(4096), 0x11, 0x10000, 0x77
    remotes = [(mac_bytes("02:5d:7a:00:00:01"), ip_bytes("10.77.0.1"), 0x201),
               (mac_bytes("02:5d:7a:00:00:02"), ip_bytes("10.77.0.1"), 0x201),
               (mac_bytes("02:5d:7a:00:00:02"), ip_bytes("10.77.0.2"), 0x201),
               (mac_bytes("02:5d:7a:00:00:02"), ip_bytes("10.77.0.2"), 0x202),
               (mac_bytes("02:5d:7a:00:00:01"), ip_bytes("10.77.0.1"), 0x201)]
    with kernel:
        region = kernel.allocate(4096)
        for turn, (remote_mac, remote_ip, remote_qpn) in enumerate(remotes):
            psn = 100 * turn
            kernel.remove_qp(qpn)
            kernel.add_qp(qpn, Transport.RC, remote_ip=remote_ip, remote_mac=remote_mac, remote_qpn=remote_qpn,
                          region=region, base_va=base, rkey=rkey, expected_psn=psn)
            reference.add_qp(ResponderQp(qpn, Transport.RC, remote_ip, remote_mac, MemoryRegion(base, rkey, memory),
                                         expected_psn=psn, remote_qpn=remote_qpn))
            ends = UdpEndpoints(remote_mac, mac, remote_ip, ip, 49152, ROCE_PORT)
            headers = {"reth": {"va": base + 8 * turn, "rkey": rkey, "dma_length": 8},
                       "atomic_eth": {"va": base + 64, "rkey": rkey, "swap_add": turn + 1}}
            write, fetch_add = RoceOpcode.RC_WRITE_ONLY, RoceOpcode.RC_FETCH_ADD
            for step, opcode in enumerate((write, fetch_add, write)):
                payload = b"abcdefgh" if opcode is write else b""
                frame = build_roce_frame(ends, transport_payload(opcode, qpn, psn + step, headers, payload,
                                                                 ack_req=True))
                expected, got = reference.process(frame), kernel.process(frame)
                assert got.replies and got.replies == expected.replies, f"turn {turn}, {opcode.name}"
                assert parse_roce(got.replies[0]).icrc_ok
        assert region.view.tobytes() == bytes(memory)


def test_every_request_size_up_to_the_ip_limit_matches_the_reference():
    """Every WRITE and WRITE-with-immediate payload length, on RC and UC, from empty to the largest the responder
    accepts (IP packets of RESPONDER_IP_LIMIT bytes), at offsets that cross pages; Fetch&Adds at every aligned
    cell; then one byte more than the limit, which both count as malformed. Memory is compared at the end."""
    tables = Tables.from_toml(EXAMPLE_TABLES)
    pair = Pair(tables, rc=True)
    uc_pair = Pair(Tables.from_toml(EXAMPLE_TABLES), rc=False)
    rng = random.Random(14)
    with pair.kernel, uc_pair.kernel:
        for this, transport in ((pair, "rc"), (uc_pair, "uc")):
            qps = [qp for qp in this.tables.qps if qp.collector_ip == COLLECTOR_IP]
            target = max(qps, key=lambda qp: qp.length if qp.transport is Transport[transport.upper()] else 0)
            assert target.length >= 3 * RESPONDER_IP_LIMIT
            opcodes = ((RoceOpcode.RC_WRITE_ONLY, RoceOpcode.RC_WRITE_ONLY_IMM) if transport == "rc"
                       else (RoceOpcode.UC_WRITE_ONLY, RoceOpcode.UC_WRITE_ONLY_IMM))
            psn = target.start_psn
            for opcode in opcodes:
                headers = len(request(this.tables, target, opcode, 0)) - 14  # the IP packet of an empty WRITE
                for size in range(RESPONDER_IP_LIMIT - headers + 2):  # up to one byte past the limit
                    payload = rng.randbytes(size)
                    offset = rng.randrange(target.length - size + 1)
                    frame = request(this.tables, target, opcode, psn, va=target.base_va + offset, payload=payload,
                                    ack_req=True)
                    replies = this.deliver(frame, f"{opcode.name} payload {size}")
                    if headers + size <= RESPONDER_IP_LIMIT:
                        assert replies or transport == "uc", f"{opcode.name} payload {size} not acknowledged"
                        psn += 1
            this.assert_same_state()
            assert this.kernel.counters()[ResponderCounter.MALFORMED] == len(opcodes), "one past the limit, each"
        counter = next(qp for qp in pair.tables.qps if qp.collector_ip == COLLECTOR_IP
                       and qp.transport is Transport.RC and qp.length >= 8)
        psn = pair.reference.qps[counter.remote_qpn].expected_psn
        for cell in range(0, counter.length, 8):
            replies = pair.deliver(request(pair.tables, counter, RoceOpcode.RC_FETCH_ADD, psn,
                                           va=counter.base_va + cell), f"fetch&add at {cell}")
            assert replies
            psn += 1
        pair.assert_same_state()


def test_a_qpn_of_no_live_queue_pair_is_unknown_whatever_slot_it_names_like_the_reference():
    """The queue-pair tables are arrays indexed by qpn & (slots - 1), each entry naming its QPN: a request to
    another QPN of a live queue pair's slot, to an empty slot, or to QPN 0 must meet no queue pair."""
    tables = Tables.from_toml(EXAMPLE_TABLES)
    pair = Pair(tables, rc=False)
    with pair.kernel:
        slots, kw = pair.kernel.qp_slots, tables.qps[0]
        live = {qp.remote_qpn & (slots - 1) for qp in tables.qps}
        empty = next(slot for slot in range(1, slots) if slot not in live)
        strangers = [kw.remote_qpn + slots, kw.remote_qpn ^ 1 << 23, empty, 0]
        for qpn in strangers:
            forged = replace(kw, remote_qpn=qpn)
            pair.deliver(request(tables, forged, RoceOpcode.UC_WRITE_ONLY, kw.start_psn, payload=b"12345678"), hex(qpn))
        pair.assert_same_state()
        assert pair.kernel.counters()[ResponderCounter.UNKNOWN_QPN] == len(strangers)
        assert not pair.kernel.counters()[ResponderCounter.EXECUTED]


def test_two_queue_pairs_never_share_a_slot():
    mac, ip = mac_bytes("02:5d:7a:00:01:01"), ip_bytes("10.77.1.1")
    with XdpResponder(mac, ip, arena_bytes=4096, qp_capacity=5) as responder:
        assert responder.qp_slots == 8
        region = responder.allocate(4096)

        def add(qpn: int) -> None:
            responder.add_qp(qpn, Transport.UC, remote_ip=ip_bytes("10.77.0.1"), remote_mac=mac, remote_qpn=0x201,
                             region=region, base_va=0x1000, rkey=7, expected_psn=qpn)

        add(0x101)
        assert not responder.slot_free(0x109) and not responder.slot_free(0x101) and responder.slot_free(0x102)
        with pytest.raises(EngineError, match=r"QP 0x109: its slot 1 holds QP 0x101"):
            add(0x109)
        with pytest.raises(EngineError, match=r"QP 0x101 is already up"):
            add(0x101)
        with pytest.raises(EngineError, match=r"no QP 0x109 is up to reset"):
            responder.reset_qp(0x109, 5)  # the slot's queue pair keeps its state
        responder.remove_qp(0x109)  # not up: the queue pair in its slot stays
        assert set(responder.qp_entries()) == {0x101} and responder.qp_state(0x101).expected_psn == 0x101
        assert responder.qp_state(0x109) is None
        responder.remove_qp(0x101)
        add(0x109)
        assert set(responder.qp_entries()) == {0x109} and responder.qp_state(0x101) is None
        assert responder.qp_state(0x109).expected_psn == 0x109
        for qpn in (0, 1 << 24):
            with pytest.raises(EngineError, match="a QPN is 24 bits and not 0"):
                add(qpn)


def test_the_backend_gives_queue_pairs_free_slots_through_any_churn():
    rng = random.Random(34)
    backend = XdpBackend(mac_bytes("02:5d:7a:00:01:01"), ip_bytes("10.77.1.1"), regions=[("r", 4096)], qp_capacity=3)
    try:
        region = backend.register("r", 4096, Access.REMOTE_WRITE)
        peer = Peer(ip_bytes("10.77.0.1"), mac_bytes("02:5d:7a:00:00:01"), 0x201, 0)
        for _ in range(200):
            if len(backend.qps) == 3 or (backend.qps and rng.random() < 0.4):
                backend.release(rng.choice(sorted(backend.qps)))
            else:
                backend.connect(region, Transport.UC, peer)
            assert set(backend.responder.qp_entries()) == set(backend.qps)
            assert len({qpn & (backend.responder.qp_slots - 1) for qpn in backend.qps}) == len(backend.qps)
        while len(backend.qps) < 3:
            backend.connect(region, Transport.UC, peer)
        with pytest.raises(BackendError, match=r"the queue-pair table is full \(3 queue pairs\)"):
            backend.connect(region, Transport.UC, peer)
    finally:
        backend.discard()


@pytest.fixture
def bpffs_dir():
    path = ensure_bpffs() / f"sdta-t-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_pins_of_another_softdta_version_are_refused_in_one_line(bpffs_dir):
    mac, ip = mac_bytes("02:5d:7a:00:01:01"), ip_bytes("10.77.1.1")
    XdpResponder(mac, ip, arena_bytes=4096, pin_dir=bpffs_dir).close()  # a kill -9 leaves the pins
    (bpffs_dir / "responder_config").unlink()
    with Map.create("responder_config", BPF_MAP_TYPE_ARRAY, 4, 24, 1) as older:  # its value before qp_slot_mask
        pin(older.fd, bpffs_dir / "responder_config")
    with pytest.raises(EngineError, match=r"holds the memory of a collector of another softdta version \(responder_"
                                          r"config holds 24-byte values, not 32\), .*start that version"):
        XdpResponder(mac, ip, arena_bytes=4096, pin_dir=bpffs_dir)
