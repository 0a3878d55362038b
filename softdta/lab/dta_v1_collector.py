"""A collector that behaves like the original DTA's `collector.cpp`, for testing drop-in compatibility.

Per structure, one rdma_cm listener on its own port (pyverbs' synchronous `CMID`): accept the translator's
connection, register the region for remote write and atomic access, SEND the 16-byte metadata
{address, length, key} (little-endian) on the new QP, then only let the region be written. Unlike the original
it advertises the R_Key (dta-v1.md §7.9), keeps the metadata out of the region (§7.10) and accepts with
responder resources 1, so Fetch&Add works (§7.11). Regions are files (`<port>.region` in the data directory), so
tests read them from outside the process. A new connection on a port replaces the previous one.

    python3 -m softdta.lab.dta_v1_collector --ip 10.77.2.2 --data-dir /dev/shm/dta 1337:2048 1340:1024 ...
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import signal
import sys
import traceback
from pathlib import Path

from softdta.core.cm import Metadata

RESPONDER_RESOURCES = 1
PR_SET_PDEATHSIG = 1


def serve_port(ip: str, port: int, length: int, data_dir: Path) -> None:
    import pyverbs.cm_enums as cm_enums
    from pyverbs.cmid import CMID, AddrInfo, ConnParam
    from pyverbs.enums import (
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_REMOTE_ATOMIC,
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_WRITE,
    )
    from pyverbs.mr import MR
    from pyverbs.qp import QPCap, QPInitAttr

    path = data_dir / f"{port}.region"
    with path.open("wb") as region_file:
        region_file.truncate(length)
    descriptor = os.open(path, os.O_RDWR)
    region = mmap.mmap(descriptor, length)
    os.close(descriptor)
    address = AddrInfo(src=ip, src_service=str(port), port_space=cm_enums.RDMA_PS_TCP, flags=cm_enums.RAI_PASSIVE)
    listener = CMID(creator=address, qp_init_attr=QPInitAttr(cap=QPCap(max_send_wr=4, max_recv_wr=4)))
    listener.listen()
    print(f"listening on {ip}:{port} ({length} bytes in {path})", flush=True)
    connections: list[object] = []  # the current connection's objects stay referenced: closing them would end it
    while True:
        connection = listener.get_request()
        access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
        base = memoryview(region)
        storage = MR(listener.pd, length, access, address=_address_of(base))
        connection.accept(ConnParam(resources=RESPONDER_RESOURCES, depth=0, retry=7, rnr_retry=7))
        metadata = MR(listener.pd, 16, IBV_ACCESS_LOCAL_WRITE)
        metadata.write(Metadata(storage.buf, length, storage.rkey).pack(), 16)
        connection.post_send(metadata)
        completion = connection.get_send_comp()
        print(f"port {port}: connected, metadata sent (status {completion.status}); region at {storage.buf:#x}, "
              f"rkey {storage.rkey:#x}", flush=True)
        connections[:] = [connection, storage, metadata]


def _address_of(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ip", required=True, help="the RoCE address to listen on (rxe0's IPv4 address)")
    parser.add_argument("--data-dir", type=Path, required=True, help="where the region files go (tmpfs)")
    parser.add_argument("listeners", nargs="+", metavar="PORT:BYTES", help="one rdma_cm port per structure")
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    children = []
    for listener in args.listeners:
        port, _, length = listener.partition(":")
        child = os.fork()
        if child == 0:
            _serve_until_parent_dies(args.ip, int(port), int(length), args.data_dir)
        children.append(child)
    os.wait()  # one listener failed: the collector fails, as a crash of the original would
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sys.exit(1)


def _serve_until_parent_dies(ip: str, port: int, length: int, data_dir: Path) -> None:
    """One process per listener: pyverbs holds the GIL in a blocking get_request, so threads would take turns.
    A killed parent takes its listeners with it, and the kernel then disconnects their connections (DREQ)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        serve_port(ip, port, length, data_dir)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
