// softdta P4 translator: the packet and metadata types both architectures share (hand-written; every wire
// header and table layout comes from the generated p4/softdta_spec.p4).

#ifndef SOFTDTA_TYPES_P4
#define SOFTDTA_TYPES_P4

// A 32-bit word of a variable part: Sketch-Merge counters in a report, the payload of an RDMA WRITE.
header word_h {
    bit<32> word;
}

header icrc_h {
    bit<32> value; // the CRC, byte-swapped: the iCRC goes on the wire least significant byte first
}

// Carried by a Sketch-Merge group while recirculation collects its counters one word per pass.
header gather_h {
    bit<32> state_index;
    bit<32> qp_index;
    bit<16> first_column;
    bit<16> column; // the column being collected, from the group's last down to its first
    bit<8> row; // the row being collected, from the last down to 0
    bit<8> rows;
    bit<16> left; // words still to collect
    bit<8> gathered; // words already in the packet, after this header
    bit<8> immediate;
}

struct headers_t {
    ethernet_h ethernet;
    ipv4_h ipv4;
    udp_h udp;
    gather_h gather;
    dta_base_v1_seq_h base_v1;
    dta_base_ext_h base_ext;
    key_write_v1_h key_write;
    key_increment_v1_h key_increment;
    append_v1_h append;
    postcard_v1_h postcard;
    sketch_merge_ext_h sketch;
    flush_ext_h flush; // v1model only: the TNA program takes no flush request yet
    word_h[MAX_SKETCH_ROWS] counters;
    bth_h bth;
    reth_h reth;
    atomic_eth_h atomic_eth;
    immdt_h immdt;
    aeth_h aeth;
    word_h[MAX_WRITE_PAYLOAD / 4] payload;
    icrc_h icrc;
}

// What ingress decides about the RoCE frame(s) a report becomes; egress builds them.
struct translation_t {
    bit<1> emit;
    bit<8> primitive;
    bit<8> roce_opcode;
    bit<8> copies;
    bit<32> qp_index;
    bit<32> key; // Key-Write and Key-Increment: the key whose slot each copy hashes
    bit<64> va; // the address, unless each copy hashes its own
    bit<16> payload_len; // bytes after the extended headers
    bit<16> ip_length;
    bit<32> immediate;
    bit<32> icrc_constant;
}

struct metadata_t {
    translator_tables_t tables;
    translation_t emitted;
    bit<8> words_left; // parser loop counter
    bit<64> now_ns;
}

// Bytes of a 32-bit value in the other order: DTA data and sketch counters are stored little-endian.
#define BYTESWAP32(x) ((x)[7:0] ++ (x)[15:8] ++ (x)[23:16] ++ (x)[31:24])

#endif // SOFTDTA_TYPES_P4
