"""What an interface's driver can do with XDP, from the kernel's `netdev` generic netlink family (Linux 6.3+).

The python engine asks whether an interface takes frames from XDP (`ndo_xdp_xmit`): a veth does only while its
peer runs an XDP program (or has GRO on), and the kernel keeps this bit current as the peer changes.
"""

from __future__ import annotations

import os
import socket
import struct

NETLINK_GENERIC = 16
GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 0x10, 3, 1, 2
NETDEV_CMD_DEV_GET, NETDEV_A_DEV_IFINDEX, NETDEV_A_DEV_XDP_FEATURES = 1, 1, 3
XDP_ACT_NDO_XMIT = 1 << 2  # enum netdev_xdp_act: the device takes frames redirected from XDP
NLM_F_REQUEST, NLMSG_ERROR = 1, 2
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_GENL = struct.Struct("=BBH")  # struct genlmsghdr
_ATTR = struct.Struct("=HH")  # struct nlattr


class NetdevError(OSError):
    """The kernel did not answer the question (too old for the netdev family, or no such interface)."""


def xdp_features(ifindex: int) -> int:
    """The `enum netdev_xdp_act` bits of interface `ifindex` in the calling thread's network namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC) as sock:
        sock.bind((0, 0))
        family = _attributes(_ask(sock, GENL_ID_CTRL, CTRL_CMD_GETFAMILY,
                                  _attribute(CTRL_ATTR_FAMILY_NAME, b"netdev\0"), "the netdev netlink family"))
        if CTRL_ATTR_FAMILY_ID not in family:
            raise NetdevError(0, "the kernel has no netdev netlink family (Linux 6.3 or later has it)")
        (family_id,) = struct.unpack_from("=H", family[CTRL_ATTR_FAMILY_ID])
        device = _attributes(_ask(sock, family_id, NETDEV_CMD_DEV_GET,
                                  _attribute(NETDEV_A_DEV_IFINDEX, struct.pack("=I", ifindex)),
                                  f"interface {ifindex}"))
    if NETDEV_A_DEV_XDP_FEATURES not in device:
        return 0
    return int.from_bytes(device[NETDEV_A_DEV_XDP_FEATURES][:8], "little")


def _attribute(kind: int, value: bytes) -> bytes:
    padded = value + bytes(-len(value) % 4)
    return _ATTR.pack(_ATTR.size + len(value), kind) + padded


def _ask(sock: socket.socket, family: int, command: int, attributes: bytes, what: str) -> bytes:
    body = _GENL.pack(command, 1, 0) + attributes
    sock.send(_HEADER.pack(_HEADER.size + len(body), family, NLM_F_REQUEST, 1, 0) + body)
    reply = sock.recv(65536)
    length, kind, _, _, _ = _HEADER.unpack_from(reply)
    if kind == NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, _HEADER.size)
        raise NetdevError(-error, f"netlink query of {what}: {os.strerror(-error)}")
    return reply[_HEADER.size + _GENL.size:length]


def _attributes(data: bytes) -> dict[int, bytes]:
    found, at = {}, 0
    while at + _ATTR.size <= len(data):
        length, kind = _ATTR.unpack_from(data, at)
        if length < _ATTR.size:
            break
        found[kind & 0x3FFF] = data[at + _ATTR.size:at + length]  # without the nested and byte-order flags
        at += (length + 3) & ~3
    return found
