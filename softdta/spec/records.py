"""Records a BPF program and userspace exchange outside the tables."""

from __future__ import annotations

from softdta.spec.model import Field, Raw, Record

# --------------------------------------------------------------------------------------------------
# Records a BPF program and userspace exchange outside the tables: ring-buffer entries, XDP metadata, and a map
# value only userspace writes. Each becomes a C struct in host order and a Python layout (softdta.kernel.maps).


DEFERRED_FRAME_MAX = 256  # the longest essential report frame the XDP translator parks for userspace
GENERATOR_FRAME_MAX = 256  # the longest report frame the kernel report generator sends
# The python engine's transmit slots (map `transmit_frames`): a slot of 512 bytes holds any frame the built-in
# primitives build (at most 334: a WRITE with immediate of MAX_WRITE_PAYLOAD bytes); a call sends up to a
# step's worth of Key-Writes of four copies.
TRANSMIT_FRAME_MAX = 508
TRANSMIT_SLOTS = 4096
# The loopback's ifindex in every network namespace: the python engine's transmit test runs come in on it.
LOOPBACK_IFINDEX = 1

RECORDS = (
    Record("deferred_report", (
        Field("qp_index", 32), Field("len", 32), Field("ingress_ifindex", 32),
        Field("rx_queue", 32, "re-injected on it, so that it writes through the same QP"),
        Raw("frame", DEFERRED_FRAME_MAX),
    ), "an essential report parked while its QP cannot send (ring buffer `deferred`); userspace re-injects it"),
    Record("completion", (
        Field("qpn", 32), Field("immediate", 32), Field("byte_len", 32), Field("pad", 32),
    ), "a WRITE with Immediate the XDP responder executed (ring buffer `completions`)"),
    Record("fanout_meta", (
        Field("magic", 32), Field("count", 32, "frames of the report: 1 = this one alone, nothing parked"),
        Field("ifindex", 32, "egress interface, 0 = the ingress one"), Field("cpu", 32), Field("sequence", 32),
    ), "XDP metadata of the first frame of a Key-Write or Key-Increment report: where it goes, and where the tc "
       "stage finds the others"),
    Record("python_engine_value", (
        Field("run_time_ns", 64), Field("runs", 64), Field("io", 32, "1 AF_XDP copy, 2 zero-copy, 3 AF_PACKET"),
        Field("transmit", 32, "0 through the packet I/O, 1 from XDP (test runs of its program)"),
    ), "the python engine's CPU time and frames, and its packet I/O (map `python_engine`, written by userspace)"),
    Record("xsk_io_value", (
        Field("rx_dropped", 64, "no free frame in the fill ring (counted in rx_fill_ring_empty_descs too, and as "
                                "the interface's rx_dropped)"),
        Field("rx_invalid_descs", 64), Field("tx_invalid_descs", 64), Field("rx_ring_full", 64),
        Field("rx_fill_ring_empty_descs", 64), Field("tx_ring_empty_descs", 64),
        Field("steps", 64, "batches the engine took from this queue"),
        Field("wakeups", 64, "times the engine woke to frames, on any queue"),
    ), "the python engine's packet I/O on one RX queue (map `xsk_io`, written by userspace): its AF_XDP socket's "
       "XDP_STATISTICS (TPACKET_V3: the ring's drops, as rx_ring_full), then its steps and wake-ups"),
    Record("transmit_frame", (
        Field("len", 32), Raw("frame", TRANSMIT_FRAME_MAX),
    ), "a frame the python engine transmits through its XDP program (map `transmit_frames`, BPF_F_MMAPABLE)"),
    Record("transmit_control", (
        Field("count", 32, "frames of this call: slots 0..count-1"),
        Field("next", 32, "the slot the next run sends; runs past count send nothing"),
        Field("ifindex", 32, "where the frames go"), Field("pad", 32),
    ), "one transmit call of the python engine (map `transmit_control`, BPF_F_MMAPABLE, written by userspace "
       "before each call)"),
    Record("report_generator_value", (
        Field("next_index", 64, "reports sent so far: each run sends report `next_index` and counts it"),
        Field("frame_len", 32), Field("key_span", 32, "distinct keys: report i carries key_base + i % key_span"),
        Field("key_base", 32), Field("data_base", 32, "report i carries data_base + i"),
        Field("ifindex", 32, "where it sends: on any other interface (its loopback link) a frame passes"),
        Field("key_offset", 16, "where the key's last 4 bytes are in the frame, 0 = nowhere"),
        Field("data_offset", 16, "where the data's last 4 bytes are, 0 = nowhere"),
        Field("seq_offset", 16, "where the seqnum is (report i: seq_base + i), 0 = nowhere"),
        Field("destination_offset", 16, "where the IPv4 destination is: report i goes to entry i % key_span of "
                                        "map `report_destinations`; 0 = the template's destination"),
        Field("checksum_offset", 16, "where the IPv4 header checksum is"),
        Field("seq_base", 8), Field("pad", 8),
        Raw("frame", GENERATOR_FRAME_MAX),
    ), "the kernel report generator's template and how it varies it per report (map `report_generator`)"),
    Record("report_destination", (
        Field("ip", 32, "the IPv4 destination, as a big-endian number"),
        Field("checksum", 16, "the IPv4 header checksum with it"), Field("pad", 16),
    ), "where the kernel report generator sends the reports of one key (map `report_destinations`, "
       "BPF_F_MMAPABLE, written by userspace): its slot's collector in a fleet"),
)
