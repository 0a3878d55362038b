"""The verbs backend without an RDMA device: lazy pyverbs import, the no-device error, region files, and the
pyverbs objects it builds. Tests that need a device run in the QEMU soft-RoCE lab (interop)."""

import mmap
import subprocess
import sys
from pathlib import Path

import pytest

from softdta.collector.backend import BackendError, Peer
from softdta.collector.verbs import (
    DEBIAN_DIST_PACKAGES,
    HOP_LIMIT,
    NO_DEVICE,
    RegionFiles,
    VerbsBackend,
    import_pyverbs,
    ipv4_mapped_gid,
    qp_attr,
    read_hw_counters,
    roce_v2_ipv4_gid,
)
from softdta.spec import Access, Transport
from tests.common import ROOT

HAS_RDMA_DEVICE = Path("/sys/class/infiniband").is_dir() and any(Path("/sys/class/infiniband").iterdir())
PAGE = mmap.PAGESIZE
PEER = Peer(ip=bytes([10, 77, 0, 1]), mac=bytes.fromhex("525400123456"), qpn=0x1F0, psn=0x1234567)


@pytest.fixture(scope="module")
def pv():
    return import_pyverbs()


def test_importing_the_module_leaves_pyverbs_alone():
    check = ("import sys, softdta.collector.verbs; assert not [m for m in sys.modules if m.startswith('pyverbs')]; "
             f"assert {DEBIAN_DIST_PACKAGES!r} not in sys.path")
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_pyverbs_imports_through_the_loader_and_the_path_is_restored():
    before = list(sys.path)
    pv = import_pyverbs()
    assert sys.path == before
    assert pv.qp.QP and pv.mr.MR and pv.device.Context


def test_access_flags_are_ibv_access_flags(pv):
    assert [Access.LOCAL_WRITE, Access.REMOTE_WRITE, Access.REMOTE_READ, Access.REMOTE_ATOMIC] == [
        pv.enums.IBV_ACCESS_LOCAL_WRITE, pv.enums.IBV_ACCESS_REMOTE_WRITE, pv.enums.IBV_ACCESS_REMOTE_READ,
        pv.enums.IBV_ACCESS_REMOTE_ATOMIC]


@pytest.mark.skipif(HAS_RDMA_DEVICE, reason="this machine has an RDMA device")
@pytest.mark.parametrize("device", [None, "rxe0"])
def test_without_a_device_the_error_names_both_fixes(tmp_path, device):
    with pytest.raises(BackendError) as raised:
        VerbsBackend(device, data_dir=tmp_path)
    message = str(raised.value)
    assert message == NO_DEVICE
    assert message.startswith("no RDMA device on this machine")
    assert "rdma link add rxe0 type rxe netdev" in message and "CONFIG_RDMA_RXE" in message
    assert "--backend xdp" in message


def test_region_files_round_up_and_keep_data_across_instances(tmp_path):
    file = tmp_path / "key-write@10.77.1.1.region"
    mapping = RegionFiles(tmp_path).map("key-write@10.77.1.1", PAGE + 1)
    assert len(mapping) == file.stat().st_size == 2 * PAGE
    mapping[PAGE - 5:PAGE + 1] = b"012345"
    mapping.close()

    reopened = RegionFiles(tmp_path).map("key-write@10.77.1.1", PAGE + 1)
    assert reopened[PAGE - 5:PAGE + 1] == b"012345"
    grown = RegionFiles(tmp_path).map("key-write@10.77.1.1", 3 * PAGE + 1)
    assert len(grown) == file.stat().st_size == 4 * PAGE
    assert grown[PAGE - 5:PAGE + 1] == b"012345" and grown[-1] == 0
    assert len(RegionFiles(tmp_path).map("key-write@10.77.1.1", 1)) == PAGE
    assert file.stat().st_size == 4 * PAGE  # a smaller mapping does not shrink the file


def test_a_fresh_region_file_is_zeroed_and_names_must_be_file_names(tmp_path):
    assert RegionFiles(tmp_path / "new").map("sketch", 100)[:] == bytes(PAGE)
    for name in ["", "../escape", ".hidden"]:
        with pytest.raises(BackendError, match="cannot be a file name"):
            RegionFiles(tmp_path).map(name, 100)


def test_a_region_file_that_cannot_be_made_is_a_backend_error(tmp_path):
    (tmp_path / "taken.region").mkdir()
    with pytest.raises(BackendError, match=f"cannot map {PAGE} bytes of .*taken.region: Is a directory"):
        RegionFiles(tmp_path).map("taken", 10)


def test_without_a_directory_regions_are_anonymous_memory():
    mapping = RegionFiles(None).map("sketch", PAGE + 1)
    assert mapping[:] == bytes(2 * PAGE)


@pytest.mark.parametrize("directory", ["tmp", None])
def test_huge_pages_need_a_hugetlbfs_data_dir(tmp_path, directory):
    with pytest.raises(BackendError, match="huge pages need data_dir on a hugetlbfs mount"):
        RegionFiles(directory and tmp_path, huge_pages=True)


def _gid_entry(pv, gid: str, index: int, gid_type: int, port: int = 1):
    raw = bytes.fromhex(gid.replace(":", ""))  # pyverbs keeps the two halves as stored: big-endian bytes
    return pv.device.GIDEntry(int.from_bytes(raw[:8], sys.byteorder), int.from_bytes(raw[8:], sys.byteorder),
                              index, port, gid_type, 2)


def test_the_gid_is_the_first_roce_v2_ipv4_one_of_port_1(pv):
    e = pv.enums
    ipv4 = ipv4_mapped_gid(bytes([10, 77, 0, 2]))
    assert ipv4 == "0000:0000:0000:0000:0000:ffff:0a4d:0002"
    entries = [_gid_entry(pv, "fe80:0000:0000:0000:5054:00ff:fe12:3456", 0, e.IBV_GID_TYPE_ROCE_V2),
               _gid_entry(pv, ipv4, 1, e.IBV_GID_TYPE_ROCE_V1),
               _gid_entry(pv, ipv4, 2, e.IBV_GID_TYPE_ROCE_V2, port=2),
               _gid_entry(pv, ipv4, 3, e.IBV_GID_TYPE_ROCE_V2)]
    assert roce_v2_ipv4_gid(entries, e.IBV_GID_TYPE_ROCE_V2) == (3, bytes([10, 77, 0, 2]))
    with pytest.raises(BackendError, match="no RoCEv2 GID of an IPv4 address"):
        roce_v2_ipv4_gid(entries[:3], e.IBV_GID_TYPE_ROCE_V2)


@pytest.mark.parametrize("transport, access", [(Transport.RC, Access.REMOTE_WRITE | Access.REMOTE_ATOMIC),
                                               (Transport.UC, Access.REMOTE_WRITE)])
def test_qp_attributes_address_the_translator(pv, transport, access):
    e = pv.enums
    attr = qp_attr(pv, access=Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC, transport=transport,
                   peer=PEER, path_mtu=e.IBV_MTU_1024, sgid_index=1, max_dest_rd_atomic=16)
    assert (attr.port_num, attr.pkey_index, attr.path_mtu) == (1, 0, e.IBV_MTU_1024)
    assert attr.qp_access_flags == access
    assert (attr.dest_qp_num, attr.rq_psn) == (0x1F0, 0x234567)
    assert (attr.max_dest_rd_atomic, attr.min_rnr_timer) == (16, 12)
    ah = attr.ah_attr
    assert (ah.is_global, ah.port_num, ah.sgid_index, ah.hop_limit) == (1, 1, 1, HOP_LIMIT)
    assert ah.dgid == "0000:0000:0000:0000:0000:ffff:0a4d:0001"


def test_hw_counters_are_read_by_file_name(tmp_path):
    (tmp_path / "rcvd_pkts").write_text("12\n")
    (tmp_path / "out_of_seq_request").write_text("3\n")
    assert read_hw_counters(tmp_path) == {"out_of_seq_request": 3, "rcvd_pkts": 12}
    assert read_hw_counters(tmp_path / "missing") == {}
