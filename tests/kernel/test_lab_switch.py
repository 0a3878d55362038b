"""The live lab's switch program (bpf/lab_switch.bpf.c) under BPF_PROG_TEST_RUN: it redirects exactly the data
plane's datagrams to the stations in its map, and passes everything else to the bridge (root only)."""

import pytest

from softdta.kernel.bpf import BpfObject, xdp_md
from softdta.kernel.maps import map_layout
from softdta.kernel.programs import LAB_SWITCH_SOURCE, XDP_PASS, XDP_REDIRECT, build_object
from softdta.lab.topology import COLLECTOR_MAC, TRANSLATOR_MAC
from softdta.spec import DTA_NACK_PORT, DTA_PORT, ROCE_PORT
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_bytes, mac_bytes

pytestmark = pytest.mark.privileged

TRANSLATOR_PORT, REPORTER_MAC = 7, "02:5d:7a:00:09:01"
LOOPBACK = 1  # a port that exists in every namespace, for a frame that must come in on one


@pytest.fixture(scope="module")
def switch():
    with BpfObject(build_object(LAB_SWITCH_SOURCE)) as obj:
        layout = map_layout("switch_port")
        for mac, port in ((TRANSLATOR_MAC, TRANSLATOR_PORT), (REPORTER_MAC, LOOPBACK)):
            obj.maps["switch_port"].update(layout.key.pack(mac=mac_bytes(mac), pad=0), layout.value.pack(ifindex=port))
        yield obj.programs["softdta_switch"]


def datagram(dst_mac: str, dport: int, payload: bytes = bytes(32)) -> bytes:
    return build_udp_frame(UdpEndpoints(src_mac=mac_bytes(REPORTER_MAC), dst_mac=mac_bytes(dst_mac),
                                        src_ip=ip_bytes("10.77.9.1"), dst_ip=ip_bytes("10.77.0.1"),
                                        sport=DTA_PORT, dport=dport), payload)


@pytest.mark.parametrize("dport", [DTA_PORT, ROCE_PORT])
def test_data_plane_datagrams_to_a_station_in_the_map_leave_by_redirect(switch, dport):
    run = switch.test_run(datagram(TRANSLATOR_MAC, dport))
    assert run.retval == XDP_REDIRECT
    assert run.data == datagram(TRANSLATOR_MAC, dport)  # forwarded as it came


@pytest.mark.parametrize("frame", [
    pytest.param(datagram(COLLECTOR_MAC, ROCE_PORT), id="station-not-in-the-map"),
    pytest.param(datagram(TRANSLATOR_MAC, DTA_NACK_PORT), id="not-the-data-plane"),
    pytest.param(datagram(TRANSLATOR_MAC, DTA_PORT)[:40], id="truncated"),
    pytest.param(mac_bytes("ff:ff:ff:ff:ff:ff") + mac_bytes(REPORTER_MAC) + b"\x08\x06" + bytes(28), id="arp"),
])
def test_everything_else_goes_to_the_bridge(switch, frame):
    assert switch.test_run(frame).retval == XDP_PASS


def test_a_frame_for_the_port_it_came_in_on_goes_to_the_bridge(switch):
    assert switch.test_run(datagram(REPORTER_MAC, DTA_PORT), ctx=xdp_md(ingress_ifindex=LOOPBACK)).retval == XDP_PASS
    assert switch.test_run(datagram(TRANSLATOR_MAC, DTA_PORT), ctx=xdp_md(ingress_ifindex=LOOPBACK)).retval == \
        XDP_REDIRECT
