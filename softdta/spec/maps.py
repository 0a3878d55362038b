"""The tables the control planes share with the data planes (BPF maps, P4 tables and registers)."""

from __future__ import annotations

from softdta.spec.constants import (
    MAX_APPEND_BATCH,
    MAX_KEY_LEN,
    MAX_POSTCARD_HOPS,
    MAX_REDUNDANCY,
    MAX_REPLICAS,
    MAX_RX_QUEUES,
    MAX_SKETCH_ROWS,
    MAX_SLOT_BITS,
    MAX_WRITE_PAYLOAD,
)
from softdta.spec.headers import FANOUT_FRAME_MAX
from softdta.spec.model import Field, Map, Raw, SpinLock

# --------------------------------------------------------------------------------------------------
# Translator tables: the contract between control plane and data plane (BPF maps, P4 tables).


QP_TABLE_ENTRIES = 4096
QUEUE_QP_SLOTS = QP_TABLE_ENTRIES * MAX_RX_QUEUES

TRANSLATOR_MAPS = (
    Map("translator_config", (Field("index", 32),), (
        Raw("src_mac", 6), Field("udp_sport", 16), Field("src_ip", 32, "network order"),
        Field("dscp", 8), Field("ttl", 8),
        Field("profile", 8, "0 dta-v1 (3-byte base), 1 dta-v1-short; extended reports are always accepted"),
        Field("ack_req_interval", 8, "set AckReq on every n-th frame of an RC QP, 0 = never"),
        Field("grace_ns", 64), Field("flush_idle_ns", 64, "idle time before a partial batch is flushed"),
    ), 1, "global translator settings"),
    Map("tables_generation", (Field("index", 32),), (
        Field("generation", 64, "0 before the first"),
    ), 1, "counts the control plane's table changes, written after each: what the data path copied out of a "
          "table is good for one generation"),
    Map("qp", (Field("qp_index", 32),), (
        Field("remote_qpn", 32), Field("local_qpn", 32, "translator's virtual QPN, DestQP of replies"),
        Field("rkey", 32), Field("collector_ip", 32, "network order"), Raw("collector_mac", 6),
        Field("transport", 8), Field("pad", 8),
        Field("start_psn", 32), Field("ifindex", 32, "egress interface, 0 = the interface the report came in on"),
        Field("base_va", 64), Field("length", 64),
    ), QP_TABLE_ENTRIES, "one RDMA queue pair towards one collector memory region"),
    Map("qp_state", (Field("qp_index", 32),), (
        Field("next_psn", 32), Field("state", 32), Field("grace_until_ns", 64),
        Field("flush_mark_ns", 64, "when the flusher last saw frames_sent change"),
        Field("frames_sent", 32, "drives the AckReq interval and tells the flusher the QP is busy"),
        Field("flush_mark", 32, "frames_sent as the flusher last saw it"),
        Field("unacked_psn", 32, "oldest PSN not yet acknowledged: RC replies count only in [unacked_psn, next_psn)"),
        Raw("pad", 92, "to two cache lines: the QPs of two RX queues are written by two CPUs, and prefetchers "
                       "fetch lines in pairs"),
    ), QP_TABLE_ENTRIES, "per-QP dynamic state (PSN, acknowledgement window, grace, failure)"),
    Map("collector", (Field("ip", 32, "network order"),), (Raw("mac", 6), Field("pad", 16)), 1024,
          "collectors whose RoCE replies (ACK, NAK) the translator consumes"),
    Map("qp_by_local_qpn", (Field("local_qpn", 32),), (Field("qp_index", 32),), QP_TABLE_ENTRIES,
          "reply demultiplexing: DestQP of an ACK/NAK to the QP"),
    Map("structure", (Field("collector_ip", 32, "network order"), Field("primitive", 32)), (
        Field("qp_index", 32, "the QP of RX queue 0"), Field("queues", 32, "RX queues with a QP (queue_qp)"),
        Field("slot_count", 32), Field("slot_size", 32), Field("key_len", 8),
        Field("data_len", 8), Field("hops", 8), Field("merge", 8), Field("key_hash", 32, "spec.KeyHash"),
        Field("redundancy", 8, "Key-Write, Key-Increment: the most copies a report may ask for; above 1 a "
                               "report's frames leave together (copies), or through the tc stage"),
        Raw("pad", 3), Field("rows", 32), Field("reporters", 32), Field("columns", 32), Field("cache_entries", 32),
        Field("batch", 32), Field("state_index", 32, "index into the primitive's state maps"),
    ), 1024, "a Key-Write, Key-Increment, Postcarding or Sketch-Merge structure, keyed by collector IP"),
    Map("append_list", (Field("list_id", 32),), (
        Field("qp_index", 32, "the QP of RX queue 0"), Field("queues", 32, "RX queues with a QP (queue_qp)"),
        Field("first_slot", 32, "ring start within the region, in entries"),
        Field("slot_count", 32, "ring size in entries"), Field("entry_size", 32), Field("batch", 32),
        Field("state_index", 32),
    ), 65536, "an Append list: its ring inside a QP's region"),
    Map("queue_qp", (Field("slot", 32, "queue 0's qp_index x MAX_RX_QUEUES + RX queue"),), (
        Field("qp_index", 32),), QUEUE_QP_SLOTS,
          "the QP a structure or Append range writes through for reports from RX queue 1.. (each queue orders its "
          "own PSNs); queue 0's is the qp_index of its entry"),
    # Translator state, written by the data path; the control plane reads it for stats and keeps it pinned.
    Map("append_state", (Field("state_index", 32),), (
        SpinLock("lock"), Field("head", 32, "next ring entry to write"),
        Field("pending", 32, "entries waiting in the batch"),
        Field("first_pending_ns", 64), Raw("data", MAX_WRITE_PAYLOAD, "the batch being filled"),
    ), 65536, "per-list Append batch and ring head"),
    Map("postcard_cache", (Field("slot", 32, "structure state_index + cache index"),), (
        SpinLock("lock"), Field("first_ns", 64),
        Raw("values", 4 * MAX_POSTCARD_HOPS, "encoded hop values, big-endian as written"),
        Raw("key", MAX_KEY_LEN), Field("key_len", 8), Field("path_length", 8), Field("hop_mask", 8),
        Field("valid", 8),
    ), 131072, "Postcarding translator cache (all structures share it, each from its state_index)"),
    Map("sketch_column", (Field("state_index", 32), Field("column", 32)), (
        Field("epoch", 32, "times this column was written out"), Field("contributors", 32),
        Raw("counters", 4 * MAX_SKETCH_ROWS, "aggregate, host-order u32"),
    ), 65536, "Sketch-Merge aggregate of one column"),
    Map("sketch_reporter", (Field("state_index", 32), Field("reporter", 32)), (
        Field("next_column", 32), Field("wraps", 32, "times the reporter went past the last column"),
    ), 65536, "Sketch-Merge progress of one reporter"),
    Map("fanout", (Field("slot", 32, "CPU x FANOUT_MAX_ENTRIES + sequence % FANOUT_MAX_ENTRIES"),), (
        Field("sequence", 32), Field("count", 8, "frames of the report, the first one travels as the packet"),
        Field("pad", 8), Field("frame_len", 16), Field("ifindex", 32, "egress interface, 0 = the ingress one"),
        Raw("frames", (MAX_REDUNDANCY - 1) * FANOUT_FRAME_MAX, "frames 2..count"),
    ), 256, "frames 2..N of a redundant report, from XDP to the tc stage (entries per CPU)"),
    Map("copies", (Field("ifindex", 32, "egress interface"), Field("count", 32, "frames of the report")), (
        Field("devmap", 32, "a devmap of `count` entries for `ifindex`, each running softdta_copy"),), 256,
          "how the frames of a Key-Write or Key-Increment report leave from XDP: broadcast to the devmap, whose "
          "program cuts copy i out of the packet; without an entry (generic XDP) they take the tc stage"),
    Map("fleet_config", (Field("index", 32),), (
        Field("address", 32, "network order; reports to the fleet address go by slot, 0 = no fleet"),
        Field("slot_bits", 8, "the slot table has 2^slot_bits entries"),
        Field("across", 8, "1: copy n of a Key-Write or Key-Increment report goes to replica n of its slot"),
        Field("pad", 16), Field("epoch", 64, "of the slot map the control plane wrote last"),
    ), 1, "the fleet: where reports addressed to the fleet address go (docs/fleet.md)"),
    Map("fleet_slot", (Field("slot", 32, "partition hash & (2^slot_bits - 1)"),), (
        Field("replicas", 32, "collectors in the replica set, 0 = none"),
        Raw("collector_ip", 4 * MAX_REPLICAS, "the replica set's collector IPs in order, network order"),
    ), 1 << MAX_SLOT_BITS, "the slot map: each slot's ordered replica set of collectors"),
    Map("reporter_seq", (Field("reporter_ip", 32, "network order"),), (Field("last_seqnum", 32),), 65536,
          "go-back-N tracking of retransmitting reporters"),
)

# --------------------------------------------------------------------------------------------------
# The xdp collector backend's tables: the contract between the collector's control plane and its XDP responder.

ARENA_PAGE = 4096  # the responder's memory is an mmapable array of pages that userspace maps as one buffer
RESPONDER_IP_LIMIT = 1280  # the longest IP packet a collector accepts: WRITE payloads of up to 1220 bytes

RESPONDER_MAPS = (
    Map("responder_config", (Field("index", 32),), (
        Raw("mac", 6), Field("udp_sport", 16), Field("ip", 32, "network order"),
        Field("layout", 64, "hash of the regions' layout: a restarted collector adopts only its own memory"),
        Field("qp_slot_mask", 32, "responder_qp's entries - 1 (a power of two): a queue pair's slot is qpn & this"),
    ), 1, "the collector port"),
    Map("responder_qp", (Field("slot", 32, "qpn & responder_config.qp_slot_mask"),), (
        Field("remote_qpn", 32), Field("remote_ip", 32, "network order"), Raw("remote_mac", 6),
        Field("transport", 8), Field("access", 8, "spec.Access"), Field("rkey", 32),
        Field("qpn", 32, "the queue pair in this slot; 0: none (QPN 0 is never given)"), Field("base_va", 64),
        Field("length", 64), Field("arena_offset", 64, "where the region starts in the arena, in bytes"),
        Field("start_psn", 32, "the PSN advertised at connect, advertised again by a restarted collector"),
        Field("ring_bytes", 32, "Append: the bytes of one list's ring (0: the region holds no rings)"),
        Field("ring_index", 32, "Append: the region's first list in ring_writes"),
    ), 1024, "a queue pair of the collector and the region it may write (sized at load)"),
    Map("responder_qp_state", (Field("slot", 32, "the queue pair's slot in responder_qp"),), (
        Field("expected_psn", 32), Field("msn", 32), Field("error", 8), Field("nak_sent", 8),
        Field("atomic_valid", 8), Field("pad", 8), Field("atomic_psn", 32), Field("atomic_original", 64),
    ), 1024, "per-QP responder state: expected PSN, MSN, error, the last Fetch&Add for duplicates (sized at load)"),
    Map("arena", (Field("page", 32),), (Raw("bytes", ARENA_PAGE),), 262144,
          "the collector's memory, every region page-aligned in it (BPF_F_MMAPABLE; sized at load)"),
    Map("ring_writes", (Field("ring", 32),), (Field("writes", 64),), 65536,
          "WRITEs executed into each Append ring: how a reader learns a lap overwrote entries (BPF_F_MMAPABLE)"),
)

# The benchmarks' floor (softdta.lab.direct, `bare`): the same wire with a forwarder in the translator's place and a
# sink in the responder's, which do nothing else (bpf/floor.bpf.c).
FLOOR_MAPS = (
    Map("floor_config", (Field("index", 32),), (
        Raw("src_mac", 6), Raw("dst_mac", 6), Field("frame_len", 32, "each forwarded frame's length: a WRITE's"),
        Field("ifindex", 32, "where the forwarder redirects"),
    ), 1, "the bare forwarder's frame"),
)

# The live lab's switch (softdta.lab.topology, bpf/lab_switch.bpf.c): it forwards in XDP to the ports that take
# frames from XDP, as fast as a hardware switch would; the kernel's bridge, behind it, forwards the rest.
LAB_MAPS = (
    Map("switch_port", (Raw("mac", 6), Field("pad", 16)), (Field("ifindex", 32, "the switch port towards it"),),
        64, "a station the lab's switch forwards to in XDP, by its MAC"),
)

MAPS = TRANSLATOR_MAPS + RESPONDER_MAPS + FLOOR_MAPS + LAB_MAPS  # every BPF map layout userspace shares with the kernel


# --------------------------------------------------------------------------------------------------
# Control-plane entries only the P4 data planes take (p4/, docs/p4.md).

# Register indexes of the P4 translators' state: the parts of a record side by side, index << bits | part.
P4_APPEND_BATCH_BITS = (MAX_APPEND_BATCH - 1).bit_length()  # the batch words of an Append list
P4_POSTCARD_WORD_BITS = (MAX_POSTCARD_HOPS - 1).bit_length()  # the hop values of a Postcarding cache entry
P4_SKETCH_ROW_BITS = (MAX_SKETCH_ROWS - 1).bit_length()  # the counters of a sketch column
P4_SKETCH_COLUMN_BITS = 12  # the columns of a sketch
P4_SKETCH_REPORTER_BITS = 5  # the reporters of a sketch: a column's contributors are a 32-bit bitmap

# The TNA program's default build, sized to fit one Tofino-1 pipe: 35 stateful ALUs of 48 and about 3.5 MiB of
# register SRAM of some 15 (an estimate without bf-p4c; docs/p4.md). The control plane refuses tables beyond it.
TNA_MAX_APPEND_BATCH = 8  # one register per batch word
TNA_MAX_SKETCH_ROWS = 8  # one register per row
TNA_APPEND_STATE_ENTRIES = 16384  # Append lists over all ranges
TNA_POSTCARD_CACHE_ENTRIES = 32768  # Postcarding cache entries over all structures
TNA_SKETCH_COLUMN_ENTRIES = 2 << P4_SKETCH_COLUMN_BITS  # two sketches of up to 4096 columns

P4_TABLES = (
    Map("icrc_constant", (Field("qp_index", 32), Field("opcode", 8), Field("ip_length", 16)), (
        Field("constant", 32, "iCRC of such a frame with its variable tail zeroed, read little-endian"),
    ), 16384, "TNA: the per-QP part of the iCRC of every frame shape a QP sends (softdta/wire/icrc_split.py)"),
    Map("multicast_group", (Field("group", 16, "port x MAX_REDUNDANCY + copies"),), (
        Field("port", 32), Field("copies", 8, "replicas, with replication IDs 0..copies-1"),
    ), 1024, "packet replication of Key-Write and Key-Increment reports (a P4Runtime multicast group)"),
)
