"""Records a BPF program and userspace exchange outside the tables."""

from __future__ import annotations

from softdta.spec.model import Field, Raw, Record

# --------------------------------------------------------------------------------------------------
# Records a BPF program and userspace exchange outside the tables: ring-buffer entries, XDP metadata, and a map
# value only userspace writes. Each becomes a C struct in host order and a Python layout (softdta.kernel.maps).


DEFERRED_FRAME_MAX = 256  # the longest essential report frame the XDP translator parks for userspace

RECORDS = (
    Record("deferred_report", (
        Field("qp_index", 32), Field("len", 32), Field("ingress_ifindex", 32), Field("pad", 32),
        Raw("frame", DEFERRED_FRAME_MAX),
    ), "an essential report parked while its QP cannot send (ring buffer `deferred`); userspace re-injects it"),
    Record("completion", (
        Field("qpn", 32), Field("immediate", 32), Field("byte_len", 32), Field("pad", 32),
    ), "a WRITE with Immediate the XDP responder executed (ring buffer `completions`)"),
    Record("fanout_meta", (Field("magic", 32), Field("cpu", 32), Field("sequence", 32)),
           "XDP metadata of the first frame of a redundant report: where the tc stage finds the others"),
    Record("python_engine_value", (
        Field("run_time_ns", 64), Field("runs", 64), Field("io", 32, "1 AF_XDP copy, 2 zero-copy, 3 AF_PACKET"),
        Field("pad", 32),
    ), "the python engine's CPU time and frames, and its packet I/O (map `python_engine`, written by userspace)"),
)
