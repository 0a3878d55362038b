"""The xdp collector backend: an XDP program (bpf/responder.bpf.c) is the collector's RDMA NIC.

It checks and executes RoCEv2 requests exactly like the reference responder (`softdta.core.responder`). It writes
into `arena`, an mmapable BPF array that this process maps as one buffer, so queries read the collector's
memory directly and the collector's CPU does nothing per report.
"""

from __future__ import annotations

import socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from softdta.core.responder import Completion, ResponderOutput
from softdta.kernel.bpf import BpfError, BpfObject, Map, RingBuffer, attach_xdp, detach_xdp, xdp_md
from softdta.kernel.maps import map_layout, record
from softdta.kernel.programs import XDP_DROP, XDP_PASS, XDP_TX, EngineError, build_object
from softdta.kernel.resources import BPF_DIR
from softdta.spec import ARENA_PAGE, PSN_MASK, RESPONDER_MAPS, Access, ResponderCounter, Transport

SOURCE = BPF_DIR / "responder.bpf.c"
DEFAULT_UDP_SPORT = 49153
RESPONDER_QP_CAPACITY = next(t.max_entries for t in RESPONDER_MAPS if t.name == "responder_qp")


class QpEntry(NamedTuple):
    """A queue pair of the responder's table (spec map responder_qp)."""

    remote_qpn: int
    remote_ip: int  # network order, as the kernel compares it
    remote_mac: bytes
    transport: int
    access: int
    rkey: int
    qpn: int
    base_va: int
    length: int
    arena_offset: int
    start_psn: int
    ring_bytes: int
    ring_index: int


class QpState(NamedTuple):
    """A queue pair's responder state (spec map responder_qp_state)."""

    expected_psn: int
    msn: int
    error: int
    nak_sent: int
    atomic_valid: int
    atomic_psn: int
    atomic_original: int


@dataclass(frozen=True)
class ArenaRegion:
    """A page-aligned slice of the arena: `view` is live memory that the XDP program writes."""

    offset: int
    view: np.ndarray

    @property
    def length(self) -> int:
        return self.view.size


class XdpResponder:
    """One collector port served by the XDP responder. `arena_bytes` is the memory for all its regions and
    `qp_capacity` how many queue pairs it holds; `source` may name a program that includes bpf/responder.bpf.c
    and adds to it (the benchmarks do).

    The queue-pair tables are arrays of `qp_slots` entries, the capacity rounded up to a power of two: QP `qpn`
    lives in slot `qpn & (qp_slots - 1)`, so the data path finds it without hashing, and two queue pairs whose
    QPNs share a slot cannot both be up (`slot_free`).

    With `pin_dir` (on a bpffs) every map is pinned there. Pinned maps outlive the process: after a kill -9 the
    attached program keeps executing into them, and the next XdpResponder on the same `pin_dir` adopts them
    (`adopted`), provided its `layout` (a hash of the regions, see XdpBackend) and sizes are the same.
    """

    def __init__(self, mac: bytes, ip: bytes, *, arena_bytes: int, qp_capacity: int = RESPONDER_QP_CAPACITY,
                 pin_dir: str | Path | None = None, layout: int = 0, udp_sport: int = DEFAULT_UDP_SPORT,
                 source: Path = SOURCE) -> None:
        if len(ip) != 4:
            raise EngineError("the xdp responder serves RoCEv2 over IPv4; give the collector an IPv4 address")
        self.qp_slots = 1 << (max(1, qp_capacity) - 1).bit_length()
        sizes = {"arena": max(1, -(-arena_bytes // ARENA_PAGE)), "responder_qp": self.qp_slots,
                 "responder_qp_state": self.qp_slots}
        self.pin_dir = None if pin_dir is None else Path(pin_dir)
        self.adopted = self.pin_dir is not None and (self.pin_dir / "arena").exists()
        if self.pin_dir is not None and self.adopted:
            self._check_pinned(self.pin_dir, sizes, layout)
        try:
            self.object = BpfObject(build_object(source), pin_dir=pin_dir, map_sizes=sizes)
        except BpfError as error:
            raise EngineError(f"cannot load the xdp responder: {error}") from None
        self.maps = self.object.maps
        self.program = self.object.programs["softdta_responder"]
        self.ring = RingBuffer(self.maps["completions"])
        self._mapping = self.maps["arena"].mmap()
        self.memory = np.frombuffer(self._mapping, dtype=np.uint8)
        self._next_page = 0
        self._rings_mapping = self.maps["ring_writes"].mmap()
        self.ring_writes = np.frombuffer(self._rings_mapping, dtype=np.uint64)
        self._next_ring = 0
        self.attached: list[int] = []
        # a collector killed while translating locally leaves its program in the pinned program array: only a
        # LocalTranslator of this process may be there (softdta.engines.local)
        self.maps["responder_local"].delete(bytes(4))
        self._write("responder_config", {"index": 0}, mac=mac, udp_sport=udp_sport, ip=int.from_bytes(ip, "little"),
                    layout=layout, qp_slot_mask=self.qp_slots - 1)

    @staticmethod
    def _check_pinned(pin_dir: Path, sizes: dict[str, int], layout: int) -> None:
        """Refuse pinned maps of another configuration, before libbpf would with a page of log."""
        versions, differs = [], []
        try:
            for table in RESPONDER_MAPS:
                value = map_layout(table.name).value
                with Map.from_pinned(pin_dir / table.name) as pinned:
                    if pinned.value_size != value.size:
                        versions.append(f"{table.name} holds {pinned.value_size}-byte values, not {value.size}")
                    elif table.name in sizes and pinned.max_entries != sizes[table.name]:
                        differs.append(f"{table.name} holds {pinned.max_entries} entries, not {sizes[table.name]}")
                    elif table.name == "responder_config":
                        config = pinned.lookup(bytes(4))
                        if config is None:
                            differs.append("its responder_config holds no entry")
                        elif value.unpack(config)["layout"] != layout:
                            differs.append("its regions are laid out differently")
        except BpfError as error:
            differs.append(f"its pins are incomplete: {error}")
        discard = f"or delete {pin_dir} to discard what it wrote since its last save"
        if versions:
            raise EngineError(f"{pin_dir} holds the memory of a collector of another softdta version "
                              f"({'; '.join(versions)}), left by one that was killed: start that version with this "
                              f"configuration and stop it (the regions are then saved), {discard}")
        if differs:
            raise EngineError(f"{pin_dir} holds the memory of a collector configured differently "
                              f"({'; '.join(differs)}), left by one that was killed: start it with its old "
                              f"configuration and stop it (the regions are then saved), {discard}")

    def unpin(self) -> None:
        """Remove the pins: the maps then end with this process (a clean stop, after saving the regions)."""
        if self.pin_dir is None:
            return
        for name in self.maps:
            if "." not in name:  # global-data maps are never pinned
                (self.pin_dir / name).unlink(missing_ok=True)
        try:
            self.pin_dir.rmdir()
        except OSError:
            pass  # something else was pinned there: leave it

    def close(self) -> None:
        self.detach()
        self.ring.close()
        self.object.close()  # region views keep the arena mapped (and the map alive) for as long as they exist

    def __enter__(self) -> XdpResponder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------
    # regions and queue pairs

    def allocate(self, length: int) -> ArenaRegion:
        """A fresh page-aligned region of the arena."""
        pages = max(1, -(-length // ARENA_PAGE))
        offset = self._next_page * ARENA_PAGE
        if offset + length > self.memory.size:
            raise EngineError(f"the arena holds {self.memory.size} bytes; {length} more do not fit after "
                              f"{offset}; give the responder a larger arena")
        self._next_page += pages
        return ArenaRegion(offset, self.memory[offset:offset + length])

    def allocate_rings(self, count: int) -> int:
        """`count` fresh counters of WRITEs per Append ring; returns the first one's index in `ring_writes`."""
        if self._next_ring + count > self.ring_writes.size:
            raise EngineError(f"the responder counts the writes of {self.ring_writes.size} Append lists; "
                              f"{count} more do not fit after {self._next_ring}")
        self._next_ring += count
        return self._next_ring - count

    def add_qp(self, qpn: int, transport: Transport, *, remote_ip: bytes, remote_mac: bytes, remote_qpn: int,
               region: ArenaRegion, base_va: int, rkey: int, expected_psn: int = 0,
               access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC,
               ring_bytes: int = 0, ring_index: int = 0) -> None:
        """Bring a queue pair up (what a NIC's RTR transition does): it accepts requests from `remote_ip`.
        `ring_bytes` marks an Append region of rings that long, counted from `ring_index` in `ring_writes`."""
        if access & Access.REMOTE_ATOMIC and base_va % 8:
            raise EngineError(f"QP {qpn:#x}: atomics need an 8-byte aligned region, base 0x{base_va:x} is not")
        if not 0 < qpn < 1 << 24:
            raise EngineError(f"QP {qpn:#x}: a QPN is 24 bits and not 0")
        holder = self._slot_qpn(qpn)
        if holder == qpn:
            raise EngineError(f"QP {qpn:#x} is already up; remove_qp it first")
        if holder:
            raise EngineError(f"QP {qpn:#x}: its slot {self._slot(qpn)} holds QP {holder:#x}; bring the queue pair "
                              "up under a QPN whose slot is free (slot_free)")
        entry: dict[str, int | bytes] = {
            "remote_qpn": remote_qpn, "remote_ip": int.from_bytes(remote_ip, "little"), "remote_mac": remote_mac,
            "transport": int(transport), "access": int(access), "rkey": rkey, "base_va": base_va,
            "length": region.length, "arena_offset": region.offset, "start_psn": expected_psn & PSN_MASK,
            "ring_bytes": ring_bytes, "ring_index": ring_index}
        try:
            # The state first, then the entry, whole but with no QPN, then the QPN: the data path, which takes
            # an entry by its QPN, never meets a queue pair half written or with its slot's last state.
            self._write_state(qpn, expected_psn)
            self._write("responder_qp", {"slot": self._slot(qpn)}, qpn=0, **entry)
            self._write("responder_qp", {"slot": self._slot(qpn)}, qpn=qpn, **entry)
        except BpfError as error:
            self.remove_qp(qpn)
            raise EngineError(f"cannot add QP {qpn:#x}: {error}") from None

    def remove_qp(self, qpn: int) -> None:
        """Take a queue pair down: its requests are then dropped as unknown_qpn."""
        if self._slot_qpn(qpn) == qpn:
            for name in ("responder_qp", "responder_qp_state"):  # the entry first: requests stop finding it
                layout = map_layout(name)
                self.maps[name].update(layout.key.pack(slot=self._slot(qpn)), bytes(layout.value.size))

    def slot_free(self, qpn: int) -> bool:
        """Whether queue pair `qpn` can be brought up: no queue pair holds its slot."""
        return self._slot_qpn(qpn) == 0

    def _slot(self, qpn: int) -> int:
        return qpn & (self.qp_slots - 1)

    def _slot_qpn(self, qpn: int) -> int:
        layout = map_layout("responder_qp")
        raw = self.maps["responder_qp"].lookup(layout.key.pack(slot=self._slot(qpn)))
        return 0 if raw is None else layout.value.unpack(raw)["qpn"]

    def qp_entries(self) -> dict[int, QpEntry]:
        """The queue pairs in the table (those of an adopted table too), by QPN."""
        layout = map_layout("responder_qp").value
        rows = np.frombuffer(b"".join(self.maps["responder_qp"].values()), dtype=np.uint8).reshape(-1, layout.size)
        at = layout.offsets["qpn"]
        entries: dict[int, QpEntry] = {}
        for slot in np.flatnonzero(rows[:, at:at + 4].any(axis=1)).tolist():  # the slots whose QPN is not 0
            fields = layout.unpack(rows[slot].tobytes())
            entries[fields["qpn"]] = QpEntry._make(fields[name] for name in QpEntry._fields)
        return entries

    def reset_qp(self, qpn: int, expected_psn: int) -> None:
        """Start a QP over at `expected_psn`, out of ERROR (re-creating it, for the translator)."""
        if self._slot_qpn(qpn) != qpn:
            raise EngineError(f"no QP {qpn:#x} is up to reset")
        self._write_state(qpn, expected_psn)

    def _write_state(self, qpn: int, expected_psn: int) -> None:
        self._write("responder_qp_state", {"slot": self._slot(qpn)}, expected_psn=expected_psn & PSN_MASK)

    def qp_state(self, qpn: int) -> QpState | None:
        if self._slot_qpn(qpn) != qpn:
            return None
        raw = self.maps["responder_qp_state"].lookup(map_layout("responder_qp_state").key.pack(slot=self._slot(qpn)))
        if raw is None:
            return None
        fields = map_layout("responder_qp_state").value.unpack(raw)
        return QpState._make(fields[name] for name in QpState._fields)

    def counters(self) -> Counter[ResponderCounter]:
        tally: Counter[ResponderCounter] = Counter()
        for counter in ResponderCounter:
            total = self.maps["responder_counters"].counter_total(counter)
            if total:
                tally[counter] = total
        return tally

    def completions(self) -> list[Completion]:
        """WRITE with Immediate completions since the last call, oldest first."""
        layout = record("completion")
        done = [layout.unpack(raw[:layout.size]) for raw in self.ring.consume()]
        return [Completion(d["qpn"], d["immediate"], d["byte_len"]) for d in done]

    def _write(self, name: str, key: dict[str, int], **value: int | bytes) -> None:
        layout = map_layout(name)
        self.maps[name].update(layout.key.pack(**key), layout.value.pack(**value))

    # ----------------------------------------------------------------------------------------------
    # frames

    def process(self, frame: bytes) -> ResponderOutput:
        """Run one frame through the XDP program (BPF_PROG_TEST_RUN): its reply and completions."""
        run = self.program.test_run(frame, ctx=xdp_md())
        if run.retval not in (XDP_DROP, XDP_PASS, XDP_TX):
            raise EngineError(f"the xdp responder returned action {run.retval}")
        return ResponderOutput(replies=[run.data] if run.retval == XDP_TX else [], completions=self.completions(),
                               passed=run.retval == XDP_PASS)

    def attach(self, interface: str, mode: str = "native") -> None:
        try:
            ifindex = socket.if_nametoindex(interface)
        except OSError:
            raise EngineError(f"interface {interface!r} does not exist in this network namespace; check `ip link`") \
                from None
        attach_xdp(ifindex, self.program.fd, mode=mode)
        self.attached.append(ifindex)

    def detach(self) -> None:
        while self.attached:
            detach_xdp(self.attached.pop())
