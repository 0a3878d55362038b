"""softdta.kernel.netns against real namespaces: what it reports about their links."""

import errno
import socket

import pytest

from softdta.kernel.netns import Namespace, cleanup_prefix, in_netns, link_drops, veth_pair
from softdta.kernel.owner import interface_lock

pytestmark = pytest.mark.privileged

PREFIX = "sdta-netns-"


@pytest.fixture
def link():
    cleanup_prefix(PREFIX)
    near, far = Namespace.create(PREFIX + "a"), Namespace.create(PREFIX + "b")
    veth_pair(near, "a0", far, "b0")
    yield near, far
    cleanup_prefix(PREFIX)


def test_link_drops_count_what_a_queueing_discipline_dropped(link):
    """A frame a qdisc drops never reaches the device, whose own counters miss it: the lab's pfifo on a switch port
    drops that way once full."""
    near, far = link
    assert link_drops([near.name, far.name]) == {}
    near.run("tc", "qdisc", "replace", "dev", "a0", "root", "pfifo", "limit", "0")  # room for none
    with in_netns(near.name):
        sender = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        sender.bind(("a0", 0))
    with sender:
        for _ in range(10):
            with pytest.raises(OSError) as dropped:
                sender.send(bytes(6) + bytes.fromhex("025d7a000001") + b"\x88\xb5" + bytes(50))
            assert dropped.value.errno == errno.ENOBUFS  # the qdisc's verdict, passed back to the sender
    assert link_drops([near.name, far.name]) == {f"{near.name}/a0": 10}


def test_an_interface_lock_names_the_namespace_the_index_is_in(link):
    """Indexes repeat across namespaces (every namespace's lo is 1): two translators on two namespaces' a0 and b0
    with the same index must not refuse each other, and one namespace's interface has one lock."""
    near, far = link
    with in_netns(near.name):
        near_lo = interface_lock(socket.if_nametoindex("lo"))
        assert interface_lock(1) == near_lo
    with in_netns(far.name):
        far_lo = interface_lock(socket.if_nametoindex("lo"))
    assert near_lo != far_lo != interface_lock(1)
