"""The verbs collector backend: pyverbs on an RDMA device (soft-RoCE rdma_rxe, or a RoCEv2 NIC).

The device executes the translators' WRITEs and Fetch&Adds itself. This process registers the memory, brings
queue pairs up to receive and, for WRITE with Immediate, keeps receive WRs posted and polls their completions.

Region memory is a shared mapping of the file `data_dir/<name>.region`, so a restarted collector finds its
data again; without a data_dir it is anonymous memory that ends with the process. Since Linux 6.5 the kernel
refuses to pin shared mappings of files that need writeback (ext4, xfs, ...) for as long as an MR does; only
tmpfs and hugetlbfs files can be registered there. So put `data_dir` on tmpfs (/dev/shm, /run), or with
`huge_pages=True` on a hugetlbfs mount: regions are then made of huge pages and still outlive the process.

pyverbs is imported when a backend is made, never at module import: other backends must work without it.
"""

from __future__ import annotations

import importlib
import ipaddress
import mmap
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Protocol

import numpy as np

from softdta.collector.backend import BackendError, Peer, QpInfo, Region
from softdta.core.responder import Completion
from softdta.spec import PSN_MASK, Access, Transport

DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"  # python3-pyverbs installs here, for the system python3
PYVERBS_MODULES = ("addr", "cq", "device", "enums", "mr", "pd", "pyverbs_error", "qp", "wr")
SYSFS_INFINIBAND = Path("/sys/class/infiniband")
PORT = 1
RECV_DEPTH = 1024  # receive WRs kept posted per QP; each WRITE with Immediate consumes one
HOP_LIMIT = 64
MIN_RNR_TIMER = 12  # 0.64 ms: how long an RC translator waits after an RNR NAK (no receive posted)
# Requester settings for RTS: this QP sends no requests, but an RC QP goes on to RTS as connected QPs usually do,
# so that every device sends its ACKs and atomic responses (rxe already answers in RTR).
TIMEOUT, RETRY_COUNT, RNR_RETRY, MAX_RD_ATOMIC = 14, 7, 7, 1
REMOTE_ACCESS = Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC

NO_DEVICE = ("no RDMA device on this machine: load soft-RoCE (`rdma link add rxe0 type rxe netdev <interface>`, "
             "which needs a kernel built with CONFIG_RDMA_RXE; see the QEMU soft-RoCE lab) or use the xdp "
             "backend (--backend xdp), which needs no RDMA support")


# What this module uses of pyverbs' objects (pyverbs has no type information)

class GidEntry(Protocol):  # pyverbs.device.GIDEntry
    port_num: int
    gid_type: int
    gid_index: int

    def gid_str(self) -> str: ...


class QpAttr(Protocol):  # pyverbs.qp.QPAttr, as QP.query fills it
    rq_psn: int
    qp_state: int


class QueuePair(Protocol):  # pyverbs.qp.QP
    qp_num: int

    def to_rtr(self, attr: object) -> None: ...

    def to_rts(self, attr: object) -> None: ...

    def query(self, attr_mask: int) -> tuple[QpAttr, object]: ...

    def post_recv(self, wr: object) -> None: ...

    def close(self) -> None: ...


class WorkCompletion(Protocol):  # pyverbs.cq.WC
    status: int
    opcode: int
    qp_num: int
    imm_data: int
    byte_len: int


class CompletionQueue(Protocol):  # pyverbs.cq.CQ
    def poll(self, num_entries: int) -> tuple[int, list[WorkCompletion]]: ...

    def close(self) -> None: ...


class MemoryRegion(Protocol):  # pyverbs.mr.MR
    buf: int
    lkey: int
    rkey: int

    def close(self) -> None: ...


def import_pyverbs() -> SimpleNamespace:
    """pyverbs' modules by short name (`pv.qp.QP`, `pv.enums.IBV_QPT_RC`, ...).

    Debian's python3-pyverbs is built for the system python3; any other CPython 3.11 loads it too (same ABI), so
    its dist-packages directory is borrowed for this import only, behind this interpreter's own paths.
    """
    borrowed = DEBIAN_DIST_PACKAGES not in sys.path
    if borrowed:
        sys.path.append(DEBIAN_DIST_PACKAGES)
    try:
        return SimpleNamespace(**{name: importlib.import_module(f"pyverbs.{name}") for name in PYVERBS_MODULES})
    except ImportError as error:
        raise BackendError(f"cannot import pyverbs ({error}): install python3-pyverbs (`make setup` does) or "
                           "use --backend xdp") from None
    finally:
        if borrowed:
            sys.path.remove(DEBIAN_DIST_PACKAGES)


class RegionFiles:
    """Region memory as shared mappings of `<directory>/<name>.region`. An existing file is reused, so its
    data survives a collector restart. With `huge_pages`, `directory` must be on a hugetlbfs mount. Without a
    directory, regions are anonymous memory (as the xdp backend's are without a data_dir)."""

    def __init__(self, directory: Path | None, *, huge_pages: bool = False) -> None:
        self.directory = None if directory is None else Path(directory)
        self.page_size = mmap.PAGESIZE
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            if huge_pages:
                self.page_size = _hugetlbfs_page_size(self.directory)
        elif huge_pages:
            raise BackendError("huge pages need data_dir on a hugetlbfs mount (mount -t hugetlbfs none /dev/hugepages)")

    def map(self, name: str, length: int) -> mmap.mmap:
        """At least `length` bytes, rounded up to whole pages; the file grows to that size, never shrinks."""
        if not name or "/" in name or name.startswith("."):
            raise BackendError(f"region name {name!r} cannot be a file name")
        size = max(1, -(-length // self.page_size)) * self.page_size
        if self.directory is None:
            return mmap.mmap(-1, size)  # anonymous and shared: zeroed, and never copied on write
        path = self.directory / f"{name}.region"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
                return mmap.mmap(fd, size)  # shared and writable: what the device writes reaches the file
            finally:
                os.close(fd)  # the mapping holds its own reference to the file
        except OSError as error:  # full disk, permissions, no huge pages reserved (ENOMEM)
            raise BackendError(f"cannot map {size} bytes of {path}: {error.strerror}") from None


def _hugetlbfs_page_size(directory: Path) -> int:
    mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    path = directory.resolve()
    point, fstype = max(((p, t) for p, t in mounts if Path(p) == path or Path(p) in path.parents),
                        key=lambda mount: len(mount[0]))
    if fstype != "hugetlbfs":
        raise BackendError(f"huge pages need data_dir on a hugetlbfs mount; {directory} is on {fstype} ({point}). "
                           "Mount one (mount -t hugetlbfs none /dev/hugepages) and reserve pages "
                           "(sysctl vm.nr_hugepages=N)")
    return os.statvfs(directory).f_bsize  # hugetlbfs reports its huge page size as the block size


def ipv4_mapped_gid(ip: bytes) -> str:
    """The RoCEv2 GID of an IPv4 address (::ffff:a.b.c.d), in the eight-group form pyverbs' GID takes."""
    return ipaddress.IPv6Address(bytes(10) + b"\xff\xff" + ip).exploded


def _ipv4_of_gid(gid: str) -> bytes | None:
    mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    return mapped.packed if mapped else None


def roce_v2_ipv4_gid(entries: Iterable[GidEntry], roce_v2: int, port: int = PORT) -> tuple[int, bytes]:
    """(index, IPv4 address) of the first RoCEv2 GID of an IPv4 address on `port`, from pyverbs GIDEntry objects
    (`Context.query_gid_table`); `roce_v2` is pyverbs' IBV_GID_TYPE_ROCE_V2."""
    for entry in entries:
        ip = _ipv4_of_gid(entry.gid_str())
        if entry.port_num == port and entry.gid_type == roce_v2 and ip:
            return entry.gid_index, ip
    raise BackendError(f"port {port} has no RoCEv2 GID of an IPv4 address: give the device's network interface an "
                       "IPv4 address, or pass gid_index")


def qp_attr(pv: SimpleNamespace, *, access: Access, transport: Transport, peer: Peer, path_mtu: int,
            sgid_index: int, max_dest_rd_atomic: int) -> object:
    """The pyverbs QPAttr for INIT, RTR and (RC) RTS: pyverbs' to_init/to_rtr/to_rts pick the fields each
    transition needs for the QP's type, so the RC-only ones are ignored for UC."""
    attr = pv.qp.QPAttr(port_num=PORT, path_mtu=path_mtu)
    attr.pkey_index = 0
    # a UC responder executes only WRITEs; READ and atomics are RC operations
    attr.qp_access_flags = int(access & (Access.REMOTE_WRITE if transport == Transport.UC else REMOTE_ACCESS))
    attr.dest_qp_num = peer.qpn
    attr.rq_psn = peer.psn & PSN_MASK
    route = pv.addr.GlobalRoute(dgid=pv.addr.GID(ipv4_mapped_gid(peer.ip)), sgid_index=sgid_index,
                                hop_limit=HOP_LIMIT)
    attr.ah_attr = pv.addr.AHAttr(is_global=1, port_num=PORT, gr=route)
    attr.max_dest_rd_atomic = max_dest_rd_atomic
    attr.min_rnr_timer = MIN_RNR_TIMER
    attr.sq_psn = 0
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = TIMEOUT, RETRY_COUNT, RNR_RETRY, MAX_RD_ATOMIC
    return attr


def read_hw_counters(directory: Path) -> dict[str, int]:
    """RDMA drivers publish one integer per file in ports/<n>/hw_counters; drivers without them publish none."""
    if not directory.is_dir():
        return {}
    return {path.name: int(path.read_text()) for path in sorted(directory.iterdir())
            if path.is_file() and path.name != "lifespan"}  # lifespan is a setting: how long values are cached


@dataclass
class _Connection:
    qp: QueuePair
    cq: CompletionQueue
    recv: object  # the RecvWR posted again for every receive a WRITE with Immediate consumes
    region: Region
    transport: Transport
    peer: Peer


class VerbsBackend:
    """The `Backend` on an RDMA device: `device` by name, or the first one. `gid_index` defaults to port 1's
    RoCEv2 GID of an IPv4 address; `ip` is that address (None for an explicit GID that is not IPv4-mapped)."""

    name = "verbs"

    def __init__(self, device: str | None = None, *, gid_index: int | None = None, data_dir: Path | None = None,
                 huge_pages: bool = False) -> None:
        self.files = RegionFiles(data_dir, huge_pages=huge_pages)
        self.pv = pv = import_pyverbs()
        devices = self._device_names()
        if not devices:
            raise BackendError(NO_DEVICE)
        if device is not None and device not in devices:
            raise BackendError(f"no RDMA device {device}; this machine has {', '.join(devices)}")
        self.device = device or devices[0]
        self.ip: bytes | None
        try:
            self.context = pv.device.Context(name=self.device)
            device_attr = self.context.query_device()
            self.port = self.context.query_port(PORT)
            if gid_index is None:
                table = self.context.query_gid_table(device_attr.phys_port_cnt * self.port.gid_tbl_len)
                gid_index, self.ip = roce_v2_ipv4_gid(table, pv.enums.IBV_GID_TYPE_ROCE_V2)
            else:
                self.ip = _ipv4_of_gid(self.context.query_gid(PORT, gid_index).gid)
            self.pd = pv.pd.PD(self.context)
        except pv.pyverbs_error.PyverbsError as error:
            raise BackendError(f"cannot open RDMA device {self.device}: {error}") from None
        self.gid_index = gid_index
        self.max_dest_rd_atomic = device_attr.max_qp_rd_atom  # Fetch&Adds a translator may have in flight
        self.registrations: dict[str, tuple[MemoryRegion, mmap.mmap]] = {}  # (MR, mapping): mapped while registered
        self.connections: dict[int, _Connection] = {}

    def _device_names(self) -> list[str]:
        try:
            return [device.name.decode() for device in self.pv.device.get_device_list()]
        except self.pv.pyverbs_error.PyverbsError:  # the kernel has no RDMA subsystem at all
            return []

    def __enter__(self) -> VerbsBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, name: str, length: int, access: Access, ring_bytes: int = 0) -> Region:
        if name in self.registrations:
            raise BackendError(f"region {name} is already registered")
        mapping = self.files.map(name, length)
        view = np.frombuffer(mapping, dtype=np.uint8, count=length)
        # verbs refuse remote write and atomic access to memory the device may not write locally
        flags = access | Access.LOCAL_WRITE if access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) else access
        try:
            mr: MemoryRegion = self.pv.mr.MR(self.pd, length, int(flags), address=view.ctypes.data)
        except self.pv.pyverbs_error.PyverbsError as error:
            hint = "" if self.files.directory is None else (
                f" (from {self.files.directory}: since Linux 6.5 only files on tmpfs or hugetlbfs can be registered; "
                "put data_dir on /dev/shm)")
            raise BackendError(f"cannot register region {name} ({length} bytes){hint}: {error}") from None
        self.registrations[name] = (mr, mapping)
        return Region(name, view, base_va=mr.buf, rkey=mr.rkey, access=access)

    def connect(self, region: Region, transport: Transport, peer: Peer) -> QpInfo:
        pv = self.pv
        if region.name not in self.registrations:
            raise BackendError(f"region {region.name} is not registered with this backend")
        mr, _ = self.registrations[region.name]
        qp_type = pv.enums.IBV_QPT_RC if transport == Transport.RC else pv.enums.IBV_QPT_UC
        attr = qp_attr(pv, access=region.access, transport=transport, peer=peer, path_mtu=self.port.active_mtu,
                       sgid_index=self.gid_index, max_dest_rd_atomic=self.max_dest_rd_atomic)
        cq: CompletionQueue | None = None
        qp: QueuePair | None = None
        try:
            cq = pv.cq.CQ(self.context, RECV_DEPTH)  # receive completions only: the QP sends no requests
            cap = pv.qp.QPCap(max_send_wr=1, max_recv_wr=RECV_DEPTH, max_send_sge=1, max_recv_sge=1)
            qp = pv.qp.QP(self.pd, pv.qp.QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, cap=cap))
            if transport == Transport.RC:
                qp.to_rts(attr)
            else:
                qp.to_rtr(attr)
            # WRITE with Immediate writes through the RETH, not into the receive: an empty SGE is enough
            recv = pv.wr.RecvWR(wr_id=0, num_sge=1, sg=[pv.wr.SGE(mr.buf, 0, mr.lkey)])
            for _ in range(RECV_DEPTH):
                qp.post_recv(recv)
        except pv.pyverbs_error.PyverbsError as error:
            for resource in (qp, cq):
                if resource is not None:
                    resource.close()
            ip = ipaddress.IPv4Address(peer.ip)
            raise BackendError(f"cannot bring up a {transport.name} queue pair towards {ip}: {error}. RoCE looks "
                               f"the translator's MAC up in the neighbour table at RTR (ip neigh replace {ip} "
                               f"lladdr {peer.mac.hex(':')} dev <interface>)") from None
        self.connections[qp.qp_num] = _Connection(qp, cq, recv, region, transport, peer)
        return QpInfo(qp.qp_num, peer.psn, transport, region.name)

    def release(self, qpn: int) -> None:
        connection = self.connections.pop(qpn, None)
        if connection is not None:
            connection.qp.close()
            connection.cq.close()

    def adopted(self) -> list[tuple[Peer, QpInfo]]:
        return []  # queue pairs end with the process; the regions (files) outlive it

    def expected_psn(self, qpn: int) -> int:
        connection = self.connections.get(qpn)
        if connection is None:
            raise BackendError(f"no queue pair {qpn:#x} on this collector")
        return connection.qp.query(self.pv.enums.IBV_QP_RQ_PSN)[0].rq_psn

    def failed(self) -> list[int]:
        state, error = self.pv.enums.IBV_QP_STATE, self.pv.enums.IBV_QPS_ERR
        # query the device: the state pyverbs caches changes only with our own modify calls
        return [qpn for qpn, connection in self.connections.items()
                if connection.qp.query(state)[0].qp_state == error]

    def reconnect(self, qpn: int) -> QpInfo:
        connection = self.connections.pop(qpn, None)
        if connection is None:
            raise BackendError(f"no queue pair {qpn:#x} on this collector")
        connection.qp.close()
        connection.cq.close()
        return self.connect(connection.region, connection.transport, connection.peer)

    def completions(self) -> list[Completion]:
        """WRITE with Immediate completions since the last call, oldest first per QP; each consumed receive is
        posted again."""
        enums = self.pv.enums
        completions = []
        for connection in self.connections.values():
            _, work_completions = connection.cq.poll(RECV_DEPTH)
            for wc in work_completions:
                if wc.status != enums.IBV_WC_SUCCESS:
                    continue  # flushed by a QP in ERROR; reconnect() replaces it with fresh receives
                connection.qp.post_recv(connection.recv)
                if wc.opcode == enums.IBV_WC_RECV_RDMA_WITH_IMM:
                    # imm_data is big-endian
                    completions.append(Completion(wc.qp_num, socket.ntohl(wc.imm_data), wc.byte_len))
        return completions

    def counters(self) -> dict[str, int]:
        return read_hw_counters(SYSFS_INFINIBAND / self.device / "ports" / str(PORT) / "hw_counters")

    def close(self) -> None:
        """Region views stay readable: each keeps its mapping, and the file keeps the data."""
        for connection in self.connections.values():
            connection.qp.close()
            connection.cq.close()
        for mr, _ in self.registrations.values():
            mr.close()
        self.connections.clear()
        self.registrations.clear()
        self.pd.close()
        self.context.close()
