"""The one declarative description of every wire header, opcode, counter and translator table.

Python codecs (`softdta.wire.codec`), the BPF C header (`bpf/include/softdta_spec.h`) and the P4 definitions
(`p4/softdta_spec.p4`) are all derived from the objects in this module; nothing else spells out a layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, IntFlag


@dataclass(frozen=True)
class Field:
    """An unsigned big-endian integer field of `bits` bits (bit fields are packed MSB first). An `icrc_variant`
    field may change in flight, so the RoCEv2 iCRC covers it as all ones (IBTA Annex A17)."""

    name: str
    bits: int
    doc: str = ""
    icrc_variant: bool = False


@dataclass(frozen=True)
class SpinLock(Field):
    """A `struct bpf_spin_lock` in a table value: the data path and the flusher run on different CPUs."""

    bits: int = 32


@dataclass(frozen=True)
class Raw:
    """A fixed number of opaque bytes, copied as they are (keys and data)."""

    name: str
    size: int
    doc: str = ""

    @property
    def bits(self) -> int:
        return self.size * 8


@dataclass(frozen=True)
class Var:
    """Trailing bytes whose length is `unit` times the value of the integer field `length_from`."""

    name: str
    length_from: str
    unit: int = 1
    doc: str = ""


@dataclass(frozen=True)
class Header:
    """A wire header: a fixed part of `Field`/`Raw` entries, optionally followed by `Var` parts."""

    name: str
    fields: tuple[Field | Raw, ...]
    doc: str
    tail: tuple[Var, ...] = ()

    def __post_init__(self) -> None:
        bits = sum(f.bits for f in self.fields)
        if bits % 8:
            raise ValueError(f"header {self.name} is {bits} bits, not a whole number of bytes")
        names = {f.name for f in self.fields}
        for var in self.tail:
            if var.length_from not in names:
                raise ValueError(f"{self.name}.{var.name} takes its length from unknown field {var.length_from}")

    @property
    def size(self) -> int:
        """Size of the fixed part in bytes."""
        return sum(f.bits for f in self.fields) // 8


# --------------------------------------------------------------------------------------------------
# Constants

DTA_PORT = 40040
DTA_NACK_PORT = 40044
ROCE_PORT = 4791
ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
IPPROTO_UDP = 17
DEFAULT_PKEY = 0xFFFF
IPV4_VERSION_NUMBER = 4
IPV4_MAX_HEADER_LEN = 60
IPV4_FLAG_MORE_FRAGMENTS = 1  # in the ipv4 `flags` field
IPV4_FLAG_DONT_FRAGMENT = 2
REPLY_TTL = 64  # of the collector's ACKs and NAKs
# The iCRC starts with eight 0xff bytes that stand for the InfiniBand LRH a RoCEv2 packet does not carry.
LRH_STAND_IN_LEN = 8
PSN_MASK = 0xFFFFFF
# A PSN ahead of the expected one by less than this is out of sequence; the other half of the space is behind it.
PSN_WINDOW = 1 << 23
# A retransmit-flagged report's seqnum up to this far behind the last one is a duplicate; further is a gap.
SEQ_WINDOW = 128

# The extended base header starts with this byte. dta-v1 opcodes are 1..4, so a set top bit can never be a
# dta-v1 report, and a dta-v1-only parser rejects it as an unknown opcode instead of misreading it.
EXTENDED_MARKER = 0x80
EXTENDED_VERSION = 1
EXTENDED_FIRST_BYTE = EXTENDED_MARKER | EXTENDED_VERSION

MAX_REDUNDANCY = 4
MAX_APPEND_BATCH = 16
MAX_KEY_LEN = 32
MAX_DATA_LEN = 64
MAX_SKETCH_ROWS = 16
MAX_POSTCARD_HOPS = 8
DTA_V1_POSTCARD_HOPS = 5
KEY_CHECKSUM_LEN = 4
# Largest RDMA WRITE payload the translator builds (an Append batch, a Sketch-Merge group): it bounds the
# per-list batch buffers kept in kernel maps and keeps every frame far below a 1500-byte MTU.
MAX_WRITE_PAYLOAD = 256
POSTCARD_CACHE_ENTRIES = 32768
DEFAULT_GRACE_NS = 1_000_000

# Polynomials (normal notation) of the per-hop Postcarding checksums in dta-v1; dta-v1 names them "seeds".
POSTCARD_HOP_POLYNOMIALS = (0x1E12A700, 0x65B96595, 0x49CF878B, 0x36518F0D, 0x7A40A908,
                            0x2F5C6C59, 0x5A2B4F1B, 0x1D8E3C27)


class KeyHash(IntEnum):
    """How Key-Write and Key-Increment derive the slot of copy n from the reversed key bytes k."""

    # dta-v1: CRC32(k || n). CRC is affine, so copy n's hash is copy 0's XOR a constant: two keys that
    # collide in one copy collide in all of them, and redundancy does not protect against overwrites.
    DTA_V1 = 0
    # Copy n hashes k || n with its own polynomial KEY_HASH_POLYNOMIALS[n]; copy 0 equals dta-v1's.
    INDEPENDENT = 1


# CRC-32, CRC-32C (Castagnoli), CRC-32K (Koopman), CRC-32Q, in normal notation.
KEY_HASH_POLYNOMIALS = (0x04C11DB7, 0x1EDC6F41, 0x741B8CD7, 0x814141AB)


class DtaOpcode(IntEnum):
    """The DTA primitives, by their report opcodes; a structure's kind is the opcode that feeds it."""

    KEY_WRITE = 1
    APPEND = 2
    KEY_INCREMENT = 3
    POSTCARDING = 4
    SKETCH_MERGE = 5  # extended profile only




# A flush request (extended profile, softdta): the P4 translators' idle flush, since a switch has no timer. It
# names an Append list or a Postcarding cache entry, which is written out if it has waited `flush_idle_ns`; a
# packet generator or the control plane sends it (docs/p4.md). Software translators flush on their own timer
# and drop it as an unknown opcode.
FLUSH_OPCODE = 0x7F


class FlushTarget(IntEnum):
    APPEND_LIST = 1  # index = the list id
    POSTCARD_ENTRY = 2  # index = the cache entry of the Postcarding structure at the packet's destination


class NackKind(IntEnum):
    SEQUENCE = 1  # value = last in-order report seqnum
    SKETCH_COLUMN = 2  # value = the column the reporter must resend from


class RoceOpcode(IntEnum):
    RC_SEND_ONLY = 0x04
    RC_WRITE_ONLY = 0x0A
    RC_WRITE_ONLY_IMM = 0x0B
    RC_ACK = 0x11
    RC_ATOMIC_ACK = 0x12
    RC_COMPARE_SWAP = 0x13
    RC_FETCH_ADD = 0x14
    UC_WRITE_ONLY = 0x2A
    UC_WRITE_ONLY_IMM = 0x2B
    UD_SEND_ONLY = 0x64
    CNP = 0x81


class AethKind(IntEnum):
    """Top three bits of the AETH syndrome."""

    ACK = 0
    RNR_NAK = 1
    NAK = 3


AETH_KIND_SHIFT = 5  # the syndrome is the kind, then five bits of credits, timer or NAK code
AETH_VALUE_MASK = 0x1F
ACK_SYNDROME = AethKind.ACK << AETH_KIND_SHIFT | AETH_VALUE_MASK  # an ACK with the most credits, as rxe sends


class NakCode(IntEnum):
    PSN_SEQUENCE_ERROR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2
    REMOTE_OPERATIONAL_ERROR = 3


class Transport(IntEnum):
    RC = 0
    UC = 1


class SketchMerge(IntEnum):
    SUM = 0
    MAX = 1


class QpState(IntEnum):
    ACTIVE = 0
    GRACE = 1  # after a sequence-error NAK, until the grace period ends
    FAILED = 2  # after a remote-access or operational NAK; only the control plane revives it


class Counter(IntEnum):
    """Per-CPU translator counters. Names starting with DROP_ are drops, each with its reason."""

    RX_REPORTS = 0
    TX_FRAMES = 1
    TX_NACKS = 2
    APPEND_BATCHED = 3
    POSTCARD_CACHED = 4
    SKETCH_MERGED = 5
    POSTCARD_EVICTIONS = 6
    RX_ACKS = 7
    RX_NAK_SEQUENCE = 8
    RX_NAK_FATAL = 9
    RX_RNR_NAKS = 10
    ESSENTIAL_DEFERRED = 11
    APPEND_FLUSHES = 12
    POSTCARD_FLUSHES = 13
    DROP_TRUNCATED = 16
    DROP_BAD_LENGTH = 17
    DROP_UNKNOWN_OPCODE = 18
    DROP_BAD_REDUNDANCY = 19
    DROP_UNKNOWN_COLLECTOR = 20
    DROP_UNKNOWN_LIST = 21
    DROP_UNKNOWN_REPORTER = 22
    DROP_BAD_HOP = 23
    DROP_GRACE = 24
    DROP_QP_FAILED = 25
    DROP_SEQUENCE_GAP = 26
    DROP_DUPLICATE = 27
    DROP_SKETCH_GAP = 28
    DROP_SKETCH_STALE = 29
    DROP_BAD_PROFILE = 30
    DROP_UNKNOWN_QP = 31
    DROP_BAD_ICRC = 32
    DROP_OUT_OF_REGION = 33
    DROP_DEFER_FULL = 34  # the ring to userspace for essential reports was full
    DROP_NO_ROOM = 35  # the driver gave no room to grow the frame
    DROP_FANOUT_LOST = 36  # tc found no parked frames for a redundant report (it came too late)
    DROP_REPLY_PSN_OUTSIDE_WINDOW = 37  # an RC reply whose PSN is not outstanding (stale, or forged)
    DROP_REPLY_ON_UC = 38  # a UC queue pair takes no ACK or NAK: a reply to one is forged
    DROP_BAD_FLUSH = 39  # a flush request naming no target kind, or a cache entry past the structure's
    # Well-formed reports per primitive: RX_KEY_WRITE + opcode - 1.
    RX_KEY_WRITE = 40
    RX_APPEND = 41
    RX_KEY_INCREMENT = 42
    RX_POSTCARDING = 43
    RX_SKETCH_MERGE = 44


COUNTER_SLOTS = 48


class Access(IntFlag):
    """Access rights of a registered memory region (ibv_access_flags)."""

    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8


class ResponderCounter(IntEnum):
    """Per-CPU counters of a collector's RoCE responder; the first five carry rdma_rxe's hw_counters names."""

    EXECUTED = 0
    ICRC_ERRORS = 1
    OUT_OF_SEQ_REQUEST = 2
    DUPLICATE_REQUEST = 3
    REMOTE_ACCESS_ERRORS = 4
    MALFORMED = 5
    NOT_FOR_THIS_PORT = 6
    UNKNOWN_QPN = 7
    SOURCE_GID_MISMATCH = 8
    QP_IN_ERROR = 9
    OPCODE_NOT_VALID = 10
    UC_ACCESS_ERROR = 11
    OUT_OF_SEQUENCE_AFTER_NAK = 12
    MISALIGNED_ATOMIC = 13
    REPLIES_SENT = 14
    COMPLETIONS = 15
    COMPLETIONS_LOST = 16  # the completion ring to userspace was full


RESPONDER_COUNTER_SLOTS = 32


# --------------------------------------------------------------------------------------------------
# L2-L4 headers (outer headers of both DTA and RoCEv2 frames)

ETHERNET = Header("ethernet", (Raw("dst", 6), Raw("src", 6), Field("ethertype", 16)), "Ethernet II")
IPV4 = Header("ipv4", (
    Field("version", 4), Field("ihl", 4), Field("dscp", 6, icrc_variant=True), Field("ecn", 2, icrc_variant=True),
    Field("total_length", 16), Field("identification", 16), Field("flags", 3), Field("fragment_offset", 13),
    Field("ttl", 8, icrc_variant=True), Field("protocol", 8), Field("checksum", 16, icrc_variant=True),
    Raw("src", 4), Raw("dst", 4),
), "IPv4 without options")
IPV6 = Header("ipv6", (
    Field("version", 4), Field("traffic_class", 8, icrc_variant=True), Field("flow_label", 20, icrc_variant=True),
    Field("payload_length", 16), Field("next_header", 8), Field("hop_limit", 8, icrc_variant=True),
    Raw("src", 16), Raw("dst", 16),
), "IPv6 fixed header")
UDP = Header("udp", (Field("sport", 16), Field("dport", 16), Field("length", 16),
                     Field("checksum", 16, icrc_variant=True)), "UDP")

# --------------------------------------------------------------------------------------------------
# DTA base headers

DTA_BASE_V1_SHORT = Header("dta_base_v1_short", (
    Field("opcode", 8), Field("immediate", 1), Field("reserved", 7),
), "dta-v1 variant A (2 bytes): what the original Reporter P4 emits")
DTA_BASE_V1_SEQ = Header("dta_base_v1_seq", (
    Field("opcode", 8), Field("seqnum", 8), Field("immediate", 1), Field("retransmit", 1), Field("reserved", 6),
), "dta-v1 variant B (3 bytes, with seqnum): what the original generators emit")
DTA_BASE_EXT = Header("dta_base_ext", (
    Field("marker", 8, "EXTENDED_FIRST_BYTE: top bit set, low 7 bits the extension version"),
    Field("opcode", 8), Field("immediate", 1), Field("essential", 1), Field("retransmit", 1),
    Field("reserved", 5), Field("seqnum", 8),
), "softdta extended base header (4 bytes)")

# --------------------------------------------------------------------------------------------------
# DTA primitive sub-headers

KEY_WRITE_V1 = Header("key_write_v1", (Field("redundancy", 8), Raw("key", 4), Raw("data", 4)),
                      "dta-v1 Key-Write")
KEY_INCREMENT_V1 = Header("key_increment_v1", (Field("redundancy", 8), Raw("key", 4), Field("counter", 64)),
                          "dta-v1 Key-Increment")
APPEND_V1 = Header("append_v1", (Field("list_id", 32), Raw("data", 4)), "dta-v1 Append")
POSTCARD_V1 = Header("postcard_v1", (Raw("key", 4), Field("hop", 8, "1-based hop index"), Raw("data", 4)),
                     "dta-v1 Postcarder")

KEY_WRITE_EXT = Header("key_write_ext", (
    Field("redundancy", 8), Field("key_len", 8), Field("data_len", 8),
), "extended Key-Write", (Var("key", "key_len"), Var("data", "data_len")))
KEY_INCREMENT_EXT = Header("key_increment_ext", (
    Field("redundancy", 8), Field("key_len", 8), Field("counter", 64),
), "extended Key-Increment", (Var("key", "key_len"),))
APPEND_EXT = Header("append_ext", (Field("list_id", 32), Field("data_len", 8)), "extended Append",
                    (Var("data", "data_len"),))
POSTCARD_EXT = Header("postcard_ext", (
    Field("hop", 8, "1-based hop index"), Field("path_length", 8, "hops on this path, 0 = use the table's"),
    Field("key_len", 8), Raw("data", 4),
), "extended Postcarding", (Var("key", "key_len"),))
SKETCH_MERGE_EXT = Header("sketch_merge_ext", (
    Field("reporter", 16), Field("column", 16), Field("rows", 8),
), "extended Sketch-Merge: one sketch column of `rows` 32-bit counters", (Var("counters", "rows", 4),))
FLUSH_EXT = Header("flush_ext", (
    Field("target", 8, "FlushTarget"), Field("index", 32, "list id, or cache entry"),
), "flush request (P4 translators): write out a waiting Append batch or Postcarding path")

NACK_V1 = Header("nack_v1", (Field("seqnum", 8), Field("nack", 1), Field("reserved", 7)),
                 "dta-v1 NACK (UDP 40044): last in-order seqnum")
NACK_EXT = Header("nack_ext", (
    Field("marker", 8), Field("kind", 8), Field("reporter", 16), Field("value", 32),
), "extended NACK (UDP 40044)")

# XDP sends the first frame of a report that needs several (Key-Write/Key-Increment redundancy) up to the tc
# stage, which clones it out and then the others, parked in the `fanout` table. XDP marks such a frame with
# packet metadata (FANOUT_META_MAGIC, CPU, sequence), which no frame from the wire can carry.
FANOUT_META_MAGIC = 0x5D7A0F4E
FANOUT_FRAME_MAX = 256  # a power of two above the longest Key-Write (182 B) or Key-Increment frame

@dataclass(frozen=True)
class PrimitiveInfo:
    """One built-in DTA primitive, declared once: its opcode, its one spelling (tables and collector
    configuration, HTTP paths, the command line), its sub-header in each profile, and whether its reports land in
    a structure (`[[structures]]` of the tables) rather than in Append lists."""

    opcode: DtaOpcode
    slug: str
    v1_subheader: Header | None  # None: extended profile only
    ext_subheader: Header
    structure: bool = True


PRIMITIVES = {info.opcode: info for info in (
    PrimitiveInfo(DtaOpcode.KEY_WRITE, "key-write", KEY_WRITE_V1, KEY_WRITE_EXT),
    PrimitiveInfo(DtaOpcode.APPEND, "append", APPEND_V1, APPEND_EXT, structure=False),
    PrimitiveInfo(DtaOpcode.KEY_INCREMENT, "key-increment", KEY_INCREMENT_V1, KEY_INCREMENT_EXT),
    PrimitiveInfo(DtaOpcode.POSTCARDING, "postcarding", POSTCARD_V1, POSTCARD_EXT),
    PrimitiveInfo(DtaOpcode.SKETCH_MERGE, "sketch-merge", None, SKETCH_MERGE_EXT),
)}
PRIMITIVE_BY_SLUG = {info.slug: opcode for opcode, info in PRIMITIVES.items()}
STRUCTURE_KINDS = {info.slug: opcode for opcode, info in PRIMITIVES.items() if info.structure}
DTA_V1_OPCODES = tuple(opcode for opcode, info in PRIMITIVES.items() if info.v1_subheader)

DTA_HEADERS = (DTA_BASE_V1_SHORT, DTA_BASE_V1_SEQ, DTA_BASE_EXT, KEY_WRITE_V1, KEY_INCREMENT_V1, APPEND_V1,
               POSTCARD_V1, KEY_WRITE_EXT, KEY_INCREMENT_EXT, APPEND_EXT, POSTCARD_EXT, SKETCH_MERGE_EXT, FLUSH_EXT,
               NACK_V1, NACK_EXT)

# --------------------------------------------------------------------------------------------------
# RoCEv2 transport headers

BTH = Header("bth", (
    Field("opcode", 8), Field("solicited", 1), Field("migreq", 1), Field("pad_count", 2), Field("tver", 4),
    Field("pkey", 16), Field("fecn", 1, icrc_variant=True), Field("becn", 1, icrc_variant=True),
    Field("reserved6", 6, icrc_variant=True), Field("dest_qp", 24),
    Field("ack_req", 1), Field("reserved7", 7), Field("psn", 24),
), "Base Transport Header")
RETH = Header("reth", (Field("va", 64), Field("rkey", 32), Field("dma_length", 32)), "RDMA Extended Transport Header")
ATOMIC_ETH = Header("atomic_eth", (
    Field("va", 64), Field("rkey", 32), Field("swap_add", 64), Field("compare", 64),
), "Atomic Extended Transport Header")
IMMDT = Header("immdt", (Field("immediate", 32),), "Immediate Data")
AETH = Header("aeth", (Field("syndrome", 8), Field("msn", 24)), "ACK Extended Transport Header")
ATOMIC_ACK_ETH = Header("atomic_ack_eth", (Field("original", 64),), "Atomic ACK Extended Transport Header")
DETH = Header("deth", (Field("qkey", 32), Field("reserved", 8), Field("src_qp", 24)),
              "Datagram Extended Transport Header")
ICRC_LEN = 4

ROCE_HEADERS = (BTH, RETH, ATOMIC_ETH, IMMDT, AETH, ATOMIC_ACK_ETH, DETH)

# Extended transport headers that follow the BTH, per opcode (in wire order).
ROCE_OPCODE_HEADERS: dict[RoceOpcode, tuple[Header, ...]] = {
    RoceOpcode.RC_SEND_ONLY: (),
    RoceOpcode.RC_WRITE_ONLY: (RETH,),
    RoceOpcode.RC_WRITE_ONLY_IMM: (RETH, IMMDT),
    RoceOpcode.RC_ACK: (AETH,),
    RoceOpcode.RC_ATOMIC_ACK: (AETH, ATOMIC_ACK_ETH),
    RoceOpcode.RC_COMPARE_SWAP: (ATOMIC_ETH,),
    RoceOpcode.RC_FETCH_ADD: (ATOMIC_ETH,),
    RoceOpcode.UC_WRITE_ONLY: (RETH,),
    RoceOpcode.UC_WRITE_ONLY_IMM: (RETH, IMMDT),
    RoceOpcode.UD_SEND_ONLY: (DETH,),
}

# --------------------------------------------------------------------------------------------------
# Translator tables: the contract between control plane and data plane (BPF maps, P4 tables).


@dataclass(frozen=True)
class Table:
    name: str
    key: tuple[Field | Raw, ...]
    value: tuple[Field | Raw, ...]
    max_entries: int
    doc: str


TRANSLATOR_TABLES = (
    Table("translator_config", (Field("index", 32),), (
        Raw("src_mac", 6), Field("udp_sport", 16), Field("src_ip", 32, "network order"),
        Field("dscp", 8), Field("ttl", 8),
        Field("profile", 8, "0 dta-v1 (3-byte base), 1 dta-v1-short; extended reports are always accepted"),
        Field("ack_req_interval", 8, "set AckReq on every n-th frame of an RC QP, 0 = never"),
        Field("grace_ns", 64), Field("flush_idle_ns", 64, "idle time before a partial batch is flushed"),
    ), 1, "global translator settings"),
    Table("qp", (Field("qp_index", 32),), (
        Field("remote_qpn", 32), Field("local_qpn", 32, "translator's virtual QPN, DestQP of replies"),
        Field("rkey", 32), Field("collector_ip", 32, "network order"), Raw("collector_mac", 6),
        Field("transport", 8), Field("pad", 8),
        Field("start_psn", 32), Field("ifindex", 32, "egress interface, 0 = the interface the report came in on"),
        Field("base_va", 64), Field("length", 64),
    ), 4096, "one RDMA queue pair towards one collector memory region"),
    Table("qp_state", (Field("qp_index", 32),), (
        Field("next_psn", 32), Field("state", 32), Field("grace_until_ns", 64),
        Field("flush_mark_ns", 64, "when the flusher last saw frames_sent change"),
        Field("frames_sent", 32, "drives the AckReq interval and tells the flusher the QP is busy"),
        Field("flush_mark", 32, "frames_sent as the flusher last saw it"),
        Field("unacked_psn", 32, "oldest PSN not yet acknowledged: RC replies count only in [unacked_psn, next_psn)"),
        Field("pad", 32),
    ), 4096, "per-QP dynamic state (PSN, acknowledgement window, grace, failure)"),
    Table("collector", (Field("ip", 32, "network order"),), (Raw("mac", 6), Field("pad", 16)), 1024,
          "collectors whose RoCE replies (ACK, NAK) the translator consumes"),
    Table("qp_by_local_qpn", (Field("local_qpn", 32),), (Field("qp_index", 32),), 4096,
          "reply demultiplexing: DestQP of an ACK/NAK to the QP"),
    Table("structure", (Field("collector_ip", 32, "network order"), Field("primitive", 32)), (
        Field("qp_index", 32), Field("slot_count", 32), Field("slot_size", 32), Field("key_len", 8),
        Field("data_len", 8), Field("hops", 8), Field("merge", 8), Field("key_hash", 32, "spec.KeyHash"),
        Field("rows", 32), Field("reporters", 32), Field("columns", 32), Field("cache_entries", 32),
        Field("batch", 32), Field("state_index", 32, "index into the primitive's state maps"),
    ), 1024, "a Key-Write, Key-Increment, Postcarding or Sketch-Merge structure, keyed by collector IP"),
    Table("append_list", (Field("list_id", 32),), (
        Field("qp_index", 32), Field("first_slot", 32, "ring start within the region, in entries"),
        Field("slot_count", 32, "ring size in entries"), Field("entry_size", 32), Field("batch", 32),
        Field("state_index", 32),
    ), 65536, "an Append list: its ring inside a QP's region"),
    # Translator state, written by the data path; the control plane reads it for stats and keeps it pinned.
    Table("append_state", (Field("state_index", 32),), (
        SpinLock("lock"), Field("head", 32, "next ring entry to write"),
        Field("pending", 32, "entries waiting in the batch"),
        Field("first_pending_ns", 64), Raw("data", MAX_WRITE_PAYLOAD, "the batch being filled"),
    ), 65536, "per-list Append batch and ring head"),
    Table("postcard_cache", (Field("slot", 32, "structure state_index + cache index"),), (
        SpinLock("lock"), Field("first_ns", 64),
        Raw("values", 4 * MAX_POSTCARD_HOPS, "encoded hop values, big-endian as written"),
        Raw("key", MAX_KEY_LEN), Field("key_len", 8), Field("path_length", 8), Field("hop_mask", 8),
        Field("valid", 8),
    ), 131072, "Postcarding translator cache (all structures share it, each from its state_index)"),
    Table("sketch_column", (Field("state_index", 32), Field("column", 32)), (
        Field("epoch", 32, "times this column was written out"), Field("contributors", 32),
        Raw("counters", 4 * MAX_SKETCH_ROWS, "aggregate, host-order u32"),
    ), 65536, "Sketch-Merge aggregate of one column"),
    Table("sketch_reporter", (Field("state_index", 32), Field("reporter", 32)), (
        Field("next_column", 32), Field("wraps", 32, "times the reporter went past the last column"),
    ), 65536, "Sketch-Merge progress of one reporter"),
    Table("fanout", (Field("slot", 32, "CPU x FANOUT_MAX_ENTRIES + sequence % FANOUT_MAX_ENTRIES"),), (
        Field("sequence", 32), Field("count", 8, "frames of the report, the first one travels as the packet"),
        Field("pad", 8), Field("frame_len", 16), Field("ifindex", 32, "egress interface, 0 = the ingress one"),
        Raw("frames", (MAX_REDUNDANCY - 1) * FANOUT_FRAME_MAX, "frames 2..count"),
    ), 256, "frames 2..N of a redundant report, from XDP to the tc stage (entries per CPU)"),
    Table("reporter_seq", (Field("reporter_ip", 32, "network order"),), (Field("last_seqnum", 32),), 65536,
          "go-back-N tracking of retransmitting reporters"),
)

# --------------------------------------------------------------------------------------------------
# The xdp collector backend's tables: the contract between the collector's control plane and its XDP responder.

ARENA_PAGE = 4096  # the responder's memory is an mmapable array of pages that userspace maps as one buffer
RESPONDER_IP_LIMIT = 1280  # the longest IP packet a collector accepts: WRITE payloads of up to 1220 bytes

RESPONDER_TABLES = (
    Table("responder_config", (Field("index", 32),), (
        Raw("mac", 6), Field("udp_sport", 16), Field("ip", 32, "network order"),
        Field("layout", 64, "hash of the regions' layout: a restarted collector adopts only its own memory"),
    ), 1, "the collector port"),
    Table("responder_qp", (Field("qpn", 32),), (
        Field("remote_qpn", 32), Field("remote_ip", 32, "network order"), Raw("remote_mac", 6),
        Field("transport", 8), Field("access", 8, "spec.Access"), Field("rkey", 32), Field("base_va", 64),
        Field("length", 64), Field("arena_offset", 64, "where the region starts in the arena, in bytes"),
        Field("start_psn", 32, "the PSN advertised at connect, advertised again by a restarted collector"),
        Field("ring_bytes", 32, "Append: the bytes of one list's ring (0: the region holds no rings)"),
        Field("ring_index", 32, "Append: the region's first list in ring_writes"),
    ), 1024, "a queue pair of the collector and the region it may write"),
    Table("responder_qp_state", (Field("qpn", 32),), (
        Field("expected_psn", 32), Field("msn", 32), Field("error", 8), Field("nak_sent", 8),
        Field("atomic_valid", 8), Field("pad", 8), Field("atomic_psn", 32), Field("atomic_original", 64),
    ), 1024, "per-QP responder state: expected PSN, MSN, error, the last Fetch&Add for duplicates"),
    Table("arena", (Field("page", 32),), (Raw("bytes", ARENA_PAGE),), 262144,
          "the collector's memory, every region page-aligned in it (BPF_F_MMAPABLE; sized at load)"),
    Table("ring_writes", (Field("ring", 32),), (Field("writes", 64),), 65536,
          "WRITEs executed into each Append ring: how a reader learns a lap overwrote entries (BPF_F_MMAPABLE)"),
)

TABLES = TRANSLATOR_TABLES + RESPONDER_TABLES  # every BPF map layout the control planes share with the kernel

# --------------------------------------------------------------------------------------------------
# Records a BPF program and userspace exchange outside the tables: ring-buffer entries, XDP metadata, and a map
# value only userspace writes. Each becomes a C struct in host order and a Python layout (softdta.kernel.maps).


@dataclass(frozen=True)
class Record:
    name: str
    fields: tuple[Field | Raw, ...]
    doc: str


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
    Table("icrc_constant", (Field("qp_index", 32), Field("opcode", 8), Field("ip_length", 16)), (
        Field("constant", 32, "iCRC of such a frame with its variable tail zeroed, read little-endian"),
    ), 16384, "TNA: the per-QP part of the iCRC of every frame shape a QP sends (softdta/wire/icrc_split.py)"),
    Table("multicast_group", (Field("group", 16, "port x MAX_REDUNDANCY + copies"),), (
        Field("port", 32), Field("copies", 8, "replicas, with replication IDs 0..copies-1"),
    ), 1024, "packet replication of Key-Write and Key-Increment reports (a P4Runtime multicast group)"),
)
