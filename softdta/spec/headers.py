"""Every wire header: the outer headers, DTA's base headers and sub-headers, RoCEv2's transport headers; and the
one registry of the built-in primitives."""

from __future__ import annotations

from dataclasses import dataclass

from softdta.spec.constants import DtaOpcode, RoceOpcode
from softdta.spec.model import Field, Header, Raw, Var

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
# packet metadata (FANOUT_META_MAGIC, count, egress, CPU, sequence), which no frame from the wire can carry. A
# report of one frame parks nothing: the metadata alone tells the tc stage where to send it.
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
