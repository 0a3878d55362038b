"""Any frames from XDP (softdta.kernel.frame_sender), as the demo's reporters send them to the python engine, on a
veth pair the test creates: frames of any length arrive whole and in order, as rows or as bytes, the sender's
interface still passes what arrives on it, and the sender leaves nothing attached behind."""

import json
import os
import socket
import subprocess

import pytest

from softdta.kernel.bpf import BpfObject, attach_xdp
from softdta.kernel.frame_sender import FrameSender, as_rows
from softdta.kernel.netns import Namespace, cleanup_prefix, in_netns, veth_pair
from softdta.kernel.programs import VETH_PEER_SOURCE, EngineError, build_object
from softdta.spec import TRANSMIT_FRAME_MAX
from tests.common import capture_on
from tests.kernel.test_xdp_transmit import ETHERTYPE, arrived, frame

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-fs{os.getpid()}-"


@pytest.fixture
def pair():
    """r0 (namespace r, the sender's) and t0 (namespace t, which runs XDP so that r0 takes frames from XDP)."""
    cleanup_prefix(PREFIX)
    sender_ns, far = Namespace.create(PREFIX + "r"), Namespace.create(PREFIX + "t")
    veth_pair(sender_ns, "r0", far, "t0")
    with BpfObject(build_object(VETH_PEER_SOURCE)) as passer, in_netns(far.name):
        attach_xdp(socket.if_nametoindex("t0"), passer.programs["softdta_pass"].fd)
    capture = capture_on(far.name, "t0")
    yield sender_ns, far, capture
    capture.close()
    cleanup_prefix(PREFIX)


def xdp_of(namespace: Namespace, interface: str) -> dict:
    shown = json.loads(subprocess.run(["ip", "-n", namespace.name, "-j", "link", "show", "dev", interface],
                                      capture_output=True, text=True, check=True).stdout)[0]
    return shown.get("xdp", {})


@pytest.mark.parametrize("rows", [True, False])
def test_frames_of_every_length_arrive_whole_and_in_order(pair, rows):
    sender_ns, far, capture = pair
    lengths = [60, 82, TRANSMIT_FRAME_MAX, 98, 60, 334]
    frames = [frame(index, lengths[index % len(lengths)]) for index in range(600)]
    with FrameSender("r0", sender_ns.name) as sender:
        assert xdp_of(sender_ns, "r0")  # linked where it sends from
        with sender.pinned():
            for first in range(0, len(frames), 100):  # within the veth's ring
                sender.send(as_rows(frames[first:first + 100]) if rows else frames[first:first + 100])
        assert sender.sent == len(frames)
    assert arrived(capture, len(frames)) == frames
    assert not xdp_of(sender_ns, "r0")  # the link ended with the sender


def test_what_arrives_on_the_senders_interface_still_reaches_its_stack(pair):
    sender_ns, far, _ = pair
    with in_netns(sender_ns.name):
        listener = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88B5))
        listener.bind(("r0", 0))
        listener.settimeout(2)
    with in_netns(far.name):
        back = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        back.bind(("t0", 0))
    with listener, back, FrameSender("r0", sender_ns.name):
        back.send(frame(7, 60))
        received = listener.recv(4096)
    assert received[12:14] == ETHERTYPE and received == frame(7, 60)


def test_a_sender_on_a_missing_interface_names_it():
    with pytest.raises(EngineError, match="'nowhere0' does not exist"):
        FrameSender("nowhere0")
