"""Every constant and enumeration the wire formats, the data planes and the control planes share."""

from __future__ import annotations

from enum import IntEnum, IntFlag

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
# RX queues a structure can have queue pairs for, one each (and the python engine's AF_XDP sockets).
MAX_RX_QUEUES = 64
KEY_CHECKSUM_LEN = 4
# Largest RDMA WRITE payload the translator builds (an Append batch, a Sketch-Merge group): it bounds the
# per-list batch buffers kept in kernel maps and keeps every frame far below a 1500-byte MTU.
MAX_WRITE_PAYLOAD = 256
POSTCARD_CACHE_ENTRIES = 32768
DEFAULT_GRACE_NS = 1_000_000
# An RC QP asks for an ACK every this many frames unless its tables say otherwise: ACKs move the oldest
# unacknowledged PSN, which bounds the PSNs a reply may name (docs/protocol.md, "Queue-pair PSNs").
DEFAULT_ACK_REQUEST_INTERVAL = 16
MAX_ACK_REQUEST_INTERVAL = 1 << 16

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


# CRC-32 (zlib's, the key checksum's and the iCRC's), in normal notation.
CRC32_POLYNOMIAL = 0x04C11DB7
# CRC-32, CRC-32C (Castagnoli), CRC-32K (Koopman), CRC-32Q, in normal notation.
KEY_HASH_POLYNOMIALS = (CRC32_POLYNOMIAL, 0x1EDC6F41, 0x741B8CD7, 0x814141AB)

# The fleet's partition hash ("crc32k2", Koopman's CRC-32/K2): reflected CRC-32 with this polynomial, init and xorout
# 0xFFFFFFFF, over a report's partition key in wire order; its low slot_bits bits are the key's slot (docs/fleet.md).
# No slot hash uses it, and its 12 slot bits are linearly independent of the 17 low bits of every slot hash on 4-byte
# keys, so the keys of one slot spread over every slot of a collector's structure (CRC-32D's are not: they tie to
# CRC-32K's and CRC-32Q's, the independent copies 2 and 3).
PARTITION_HASH_NAME = "crc32k2"
PARTITION_POLYNOMIAL = 0x32583499
DEFAULT_SLOT_BITS = 12
MAX_SLOT_BITS = 16
MAX_REPLICAS = MAX_REDUNDANCY  # collectors per slot: with copies across collectors, copy n goes to replica n


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


class MergeFunction(IntEnum):
    SUM = 0
    MAX = 1


class QpState(IntEnum):
    ACTIVE = 0
    GRACE = 1  # after a sequence-error NAK, until the grace period ends
    FAILED = 2  # after a remote-access or operational NAK; only the control plane revives it


class TranslatorCounter(IntEnum):
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
    DROP_NO_QUEUE_QP = 14  # a report came in on an RX queue its structure has no queue pair for
    DROP_FLEET_UNMAPPED = 15  # a report to the fleet address whose slot names no collector with its structure
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
    DROP_FANOUT_LOST = 36  # softdta_copy or tc found no parked frames for a redundant report (it came too late)
    DROP_REPLY_PSN_OUTSIDE_WINDOW = 37  # an RC reply whose PSN is not outstanding (stale, or forged)
    DROP_REPLY_ON_UC = 38  # a UC queue pair takes no ACK or NAK: a reply to one is forged
    DROP_BAD_FLUSH = 39  # a flush request naming no target kind, or a cache entry past the structure's
    # Well-formed reports per primitive: RX_KEY_WRITE + opcode - 1.
    RX_KEY_WRITE = 40
    RX_APPEND = 41
    RX_KEY_INCREMENT = 42
    RX_POSTCARDING = 43
    RX_SKETCH_MERGE = 44
    NAK_LOST_WRITES = 45  # frames sent at or after the PSN of a NAK: the collector did not execute them
    PSN_ADOPTED = 46  # advertisements whose PSN the translator took over from the collector (control plane)
    FLEET_RESOLVED = 47  # reports to the fleet address that the slot map sent to a collector
    DROP_CONTROL_SEND = 48  # a frame a control-plane run wrote out that the interface refused (generic XDP)
    # reports the python engine's XDP program passed to its AF_XDP socket: off the link, not yet translated
    RX_TO_SOCKET = 49
    # reports the python engine took off its AF_XDP sockets into a step: translated or being translated
    RX_FROM_SOCKET = 50


COUNTER_SLOTS = 51


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


class FloorCounter(IntEnum):
    """Per-CPU counters of the benchmarks' bare forwarder and sink (map `floor_counters`)."""

    FORWARDED = 0
    SUNK = 1
    SUNK_BYTES = 2


FLOOR_COUNTER_SLOTS = 4
