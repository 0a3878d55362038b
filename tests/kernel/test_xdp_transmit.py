"""The python engine's transmit from XDP (softdta.kernel.xdp_transmit) on a veth pair the test creates: frames
arrive whole and in order, from any thread and namespace, and what does not fit a slot is refused."""

import os
import socket
import time

import pytest

from softdta.engines.python import STEER_SOURCE
from softdta.kernel.bpf import BpfObject, attach_xdp
from softdta.kernel.netns import Namespace, cleanup_prefix, in_netns, veth_pair
from softdta.kernel.programs import VETH_PEER_SOURCE, EngineError, build_object
from softdta.kernel.xdp_transmit import XdpTransmitter
from softdta.spec import TRANSMIT_FRAME_MAX, TRANSMIT_SLOTS
from tests.common import capture_on, signals_meanwhile

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-xt{os.getpid()}-"
ETHERTYPE = b"\x88\xb5"  # IEEE local experimental: the far end's stack drops it


@pytest.fixture
def transmitter():
    """A transmitter on t0 (namespace t) whose peer r0 (namespace r) runs XDP, and a capture on r0."""
    cleanup_prefix(PREFIX)
    far, near = Namespace.create(PREFIX + "r"), Namespace.create(PREFIX + "t")
    veth_pair(far, "r0", near, "t0")
    with BpfObject(build_object(VETH_PEER_SOURCE)) as passer, in_netns(far.name):
        attach_xdp(socket.if_nametoindex("r0"), passer.programs["softdta_pass"].fd)
    steer = BpfObject(build_object(STEER_SOURCE))
    with in_netns(near.name):
        ifindex = socket.if_nametoindex("t0")
        attach_xdp(ifindex, steer.programs["softdta_xsk"].fd)
        sender = XdpTransmitter(steer, ifindex)
    capture = capture_on(far.name, "r0")
    yield sender, capture
    capture.close()
    sender.close()
    steer.close()
    cleanup_prefix(PREFIX)


def frame(index: int, length: int) -> bytes:
    head = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + ETHERTYPE + index.to_bytes(4, "big")
    return head + bytes((index + at) & 0xFF for at in range(length - len(head)))


def arrived(capture: socket.socket, count: int) -> list[bytes]:
    frames = []
    while len(frames) < count:
        try:
            received = capture.recv(4096)
        except TimeoutError:
            break
        if received[12:14] == ETHERTYPE:
            frames.append(received)
    return frames


def test_frames_of_every_length_arrive_whole_and_in_order_from_another_namespace(transmitter):
    sender, capture = transmitter
    lengths = [60, 82, TRANSMIT_FRAME_MAX, 98, 60, 334]
    # more than a call's slots: the second call continues the order
    frames = [frame(index, lengths[index % len(lengths)]) for index in range(TRANSMIT_SLOTS + 100)]
    affinity, netns = os.sched_getaffinity(0), os.stat("/proc/thread-self/ns/net").st_ino
    sender.send(frames)  # from the test's own namespace, not t's
    assert os.sched_getaffinity(0) == affinity and os.stat("/proc/thread-self/ns/net").st_ino == netns
    assert sender.sent == len(frames)
    assert arrived(capture, len(frames)) == frames


def test_a_frame_that_fits_no_slot_is_refused_and_nothing_of_its_call_is_sent(transmitter):
    sender, capture = transmitter
    for wrong in (TRANSMIT_FRAME_MAX + 1, 13):
        with pytest.raises(EngineError, match="does not fit a transmit slot"):
            sender.send([frame(0, 60), (frame(1, 60) * 9)[:wrong]])
    assert sender.sent == 0 and arrived(capture, 1) == []


def test_a_call_that_signals_interrupt_resumes_where_the_kernel_stopped(transmitter):
    """A signal (the daemon's SIGHUP reload, SIGTERM stop) makes the kernel end a live-frames run between two
    bursts with EINTR; the call goes on from the first frame not sent, so every frame leaves once, in order."""
    sender, capture = transmitter
    frames = [frame(index, 60) for index in range(TRANSMIT_SLOTS)]
    calls, deadline = 0, time.monotonic() + 10
    with signals_meanwhile() as handled:
        while sender.resumed == 0 and time.monotonic() < deadline:  # until a signal came inside a run
            sender.send(frames)
            calls += 1
    assert sender.resumed > 0 and handled, "no signal came during a run: the test proved nothing"
    assert sender.sent == calls * len(frames)
    assert arrived(capture, calls * len(frames)) == frames * calls
