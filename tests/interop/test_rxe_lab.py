"""The QEMU soft-RoCE lab: the guest boots with rxe0, runs commands and softdta, and its rxe takes host-made frames.

One guest serves the whole session (boot about 10 s; the first run on a machine also builds the image, about 1 min).
"""

import json
import os
import secrets
import subprocess
import time

import pytest

from softdta.collector.verbs import ipv4_mapped_gid
from softdta.kernel.netns import NETNS_DIR, Namespace
from softdta.lab import rxe as rxe_lab
from softdta.spec import ROCE_PORT, RoceOpcode
from softdta.wire.frames import UdpEndpoints, ip_bytes, mac_bytes
from softdta.wire.roce import build_roce_frame, transport_payload
from tests.common import eventually

pytestmark = [pytest.mark.interop, pytest.mark.privileged]

REGION, REGION_SIZE = "/dev/shm/uc.region", 4096
HOST_QPN, FIRST_PSN = 0x1F0, 0x100

# A UC responder QP at RTR on rxe0 whose MR is a tmpfs file, so that other commands can read what rxe wrote. It
# prints {"qpn", "va", "rkey"} and keeps the QP until killed.
UC_RESPONDER = f"""
import ctypes, json, mmap, os, signal, sys
from pyverbs import enums
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

host_gid, host_qpn, psn = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open("{REGION}", os.O_RDWR | os.O_CREAT)
os.ftruncate(fd, {REGION_SIZE})
memory = mmap.mmap(fd, {REGION_SIZE})
context = Context(name="rxe0")
pd = PD(context)
mr = MR(pd, {REGION_SIZE}, enums.IBV_ACCESS_LOCAL_WRITE | enums.IBV_ACCESS_REMOTE_WRITE,
        address=ctypes.addressof(ctypes.c_char.from_buffer(memory)))
cq = CQ(context, 1)
cap = QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
qp = QP(pd, QPInitAttr(qp_type=enums.IBV_QPT_UC, scq=cq, rcq=cq, cap=cap))
attr = QPAttr(port_num=1, path_mtu=enums.IBV_MTU_1024)
attr.qp_access_flags = enums.IBV_ACCESS_REMOTE_WRITE
attr.dest_qp_num, attr.rq_psn = host_qpn, psn
attr.ah_attr = AHAttr(is_global=1, port_num=1, gr=GlobalRoute(dgid=GID(host_gid), sgid_index=1))
qp.to_rtr(attr)
print(json.dumps({{"qpn": qp.qp_num, "va": mr.buf, "rkey": mr.rkey}}), flush=True)
signal.pause()
"""


def checked(guest, command, timeout=60.0):
    status, output = guest.run(command, timeout)
    assert status == 0, f"{command!r} exited {status}:\n{output}"
    return output


def test_the_image_is_cached_under_a_hash_of_its_package_versions(guest):
    started = time.monotonic()
    image = rxe_lab.ensure_image()
    assert time.monotonic() - started < 10
    assert image.parent == rxe_lab.CACHE_DIR and {"vmlinuz", "rootfs.cpio"} <= {p.name for p in image.iterdir()}
    assert json.loads((image / "versions.json").read_text()) == rxe_lab.image_versions()


def test_the_guest_has_rxe0_and_its_counters(guest):
    assert "rxe0" in checked(guest, "ibv_devices")
    assert checked(guest, "cat /sys/class/infiniband/rxe0/ports/1/gids/1").strip() == ipv4_mapped_gid(
        ip_bytes(guest.guest_ip))  # the RoCEv2 GID of the guest's IPv4 address, at index 1
    counters = guest.hw_counters()
    assert {"rcvd_pkts", "sent_pkts", "out_of_seq_request", "duplicate_request"} <= counters.keys()
    assert all(isinstance(value, int) for value in counters.values())


def test_run_returns_status_and_output_and_stops_at_the_timeout(guest):
    assert guest.run("echo out; echo err >&2; exit 3") == (3, "out\nerr\n")
    started = time.monotonic()
    assert guest.run("sleep 30", timeout=1)[0] == 124
    assert time.monotonic() - started < 5


def test_softdta_imports_in_the_guest(guest):
    output = checked(guest, f"PYTHONPATH={rxe_lab.GUEST_PYTHONPATH} python3 -c "
                            "'import softdta.collector.verbs, softdta.collector.daemon; print(softdta.__file__)'")
    assert output.strip() == f"{rxe_lab.GUEST_PYTHONPATH}/softdta/__init__.py"


def test_rxe_executes_a_host_made_write_and_drops_one_with_a_bad_icrc(guest):
    checked(guest, f"cat > /tmp/uc.py <<'EOF'\n{UC_RESPONDER}\nEOF")
    host_gid = ipv4_mapped_gid(ip_bytes(guest.host_ip))
    checked(guest, f"python3 /tmp/uc.py {host_gid} {HOST_QPN} {FIRST_PSN} >/tmp/uc.json 2>/tmp/uc.err & "
                   "echo $! >/tmp/uc.pid")
    try:
        responder = eventually(lambda: responder_info(guest))
        ends = UdpEndpoints(mac_bytes(guest.host_mac), mac_bytes(rxe_lab.GUEST_MAC), ip_bytes(guest.host_ip),
                            ip_bytes(guest.guest_ip), 49152, ROCE_PORT)

        def write(psn, offset, payload):
            headers = {"reth": {"va": responder["va"] + offset, "rkey": responder["rkey"],
                                "dma_length": len(payload)}}
            return build_roce_frame(ends, transport_payload(RoceOpcode.UC_WRITE_ONLY, responder["qpn"], psn, headers,
                                                            payload))

        def memory(offset, length):
            output = checked(guest, f"od -An -tx1 -v -j {offset} -N {length} {REGION}")
            return bytes.fromhex("".join(output.split()))

        first, corrupted, fence = (secrets.token_bytes(32) for _ in range(3))
        received_before = guest.hw_counters()["rcvd_pkts"]
        guest.send(write(FIRST_PSN, 0, first))
        eventually(lambda: memory(0, 32) == first)

        bad = write(FIRST_PSN + 1, 0, corrupted)
        guest.send(bad[:-4] + bytes(byte ^ 0xFF for byte in bad[-4:]))
        # rxe handles a QP's frames in order: once the next frame has landed, the bad one has been dropped. It
        # consumed no PSN, so the next frame carries the same one.
        guest.send(write(FIRST_PSN + 1, 512, fence))
        eventually(lambda: memory(512, 32) == fence)
        assert memory(0, 32) == first
        assert guest.hw_counters()["rcvd_pkts"] == received_before + 2  # rxe counts the frames it accepted
    finally:
        guest.run(f"kill $(cat /tmp/uc.pid); rm -f {REGION}")


def responder_info(guest):
    """The UC responder's {"qpn", "va", "rkey"} once it printed them; its traceback fails the test."""
    output = checked(guest, "cat /tmp/uc.json /tmp/uc.err")
    assert "Error" not in output, output
    return json.loads(output) if output.strip() else None


def test_cleanup_removes_what_a_dead_process_left_and_spares_the_living():
    dead_pid = finished_process_id()
    stale, living = f"{rxe_lab.NAMESPACE_PREFIX}{dead_pid}", f"{rxe_lab.NAMESPACE_PREFIX}{os.getppid()}"
    for name in (stale, living):
        Namespace.create(name)
        (rxe_lab.RUN_DIR / name).mkdir(parents=True)
        (rxe_lab.RUN_DIR / name / "qemu.pid").write_text(f"{dead_pid}\n")
    try:
        assert stale in rxe_lab.cleanup()
        assert not (NETNS_DIR / stale).exists() and not (rxe_lab.RUN_DIR / stale).exists()
        assert (NETNS_DIR / living).exists() and (rxe_lab.RUN_DIR / living).exists()
    finally:
        Namespace(living).delete()
        (rxe_lab.RUN_DIR / living / "qemu.pid").unlink()
        (rxe_lab.RUN_DIR / living).rmdir()


def finished_process_id():
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
