// softdta translator for TNA (Tofino-1): every dta-v1 primitive. Key-Write and Key-Increment with per-copy
// slots from the egress replication ID; Append batches in registers with the ring wrap; Postcarding with a
// cache whose evicted path goes to the evicted key's own slot; Sketch-Merge merged in registers and collected
// by recirculation; per-QP PSNs, AETH resync with a time-based grace, and the iCRC as a per-QP constant XOR a
// CRC over the variable tail, chained over hash units (softdta/wire/icrc_split.py). Layouts and control-plane
// tables come from the generated softdta_spec.p4 and softdta_tables.p4; docs/p4.md says what is verified.
//
//   p4test --std p4-16 -I <tofino includes> -D__TARGET_TOFINO__=1 softdta_tna.p4     (or bf-p4c)

#include <core.p4>
#include <tna.p4>

#include "softdta_spec.p4"
#include "softdta_types.p4"
// The default Tofino-1 build (the spec's TNA_* limits, docs/p4.md): state sized to fit one pipe. The control
// plane refuses tables beyond it (p4runtime.unsupported).
#define SOFTDTA_APPEND_STATE_ENTRIES TNA_APPEND_STATE_ENTRIES
#define SOFTDTA_POSTCARD_CACHE_ENTRIES TNA_POSTCARD_CACHE_ENTRIES
#define SOFTDTA_SKETCH_COLUMN_ENTRIES TNA_SKETCH_COLUMN_ENTRIES
#include "softdta_registers.p4"

const bit<8> BRIDGE_REPORT = 1;
const bit<8> BRIDGE_REPLY = 2;
const bit<8> BRIDGE_FRAME = 3; // a WRITE whose payload ingress built (Append, Postcarding, Sketch-Merge)
const bit<8> BRIDGE_GATHER = 4; // a Sketch-Merge group being collected, one word per recirculation
const bit<8> BRIDGE_ICRC_PASS = 5; // a frame whose tail CRC continues in a second egress pass
const bit<8> BRIDGE_REPLY_CHECK = 6; // an RC reply, to egress, which owns the PSN window
const bit<8> BRIDGE_REPLY_TAKEN = 7; // ... back to ingress: its PSN was outstanding
const bit<8> BRIDGE_REPLY_REFUSED = 8; // ... back to ingress: its PSN was not
const PortId_t RECIRCULATION_PORT = 68; // pipe 0's recirculation port on Tofino-1
const bit<8> TAIL_CHUNK_WORDS = 8; // 32 bytes per chained hash unit (icrc_split.TAIL_CHUNK_BYTES)
const bit<8> TAIL_CHUNKS_PER_PASS = 4; // chained hash units one egress pass affords
const bit<32> GATE_ACTIVE = (bit<32>)QP_STATE_ACTIVE;
const bit<32> GATE_GRACE = (bit<32>)QP_STATE_GRACE;
const bit<32> GATE_FAILED = (bit<32>)QP_STATE_FAILED;

// What ingress hands egress: Tofino carries no user metadata between the gresses.
header bridge_h {
    bit<8> kind;
    bit<8> roce_opcode;
    bit<8> key_hash;
    bit<8> slot_size;
    bit<32> qp_index;
    bit<32> key;
    bit<32> key_checksum;
    bit<32> slot_mask;
    bit<16> ip_length;
    bit<16> payload_len;
    bit<32> icrc_constant;
    bit<32> remote_qpn;
    bit<32> rkey;
    bit<64> base_va;
    bit<32> collector_ip;
    bit<48> collector_mac;
    bit<48> src_mac;
    bit<32> src_ip;
    bit<16> udp_sport;
    bit<8> dscp;
    bit<8> ttl;
    bit<8> transport;
    bit<8> ack_req_interval;
    bit<24> psn; // a reply's PSN
    bit<64> va; // a FRAME's address
    bit<32> immediate; // a FRAME's ImmDt
    bit<8> lead_words; // a FRAME's payload: lead_words words, then `chunks` chunks of TAIL_CHUNK_WORDS
    bit<8> chunks;
    bit<32> tail_crc; // an ICRC_PASS: L over the tail up to its chunk TAIL_CHUNKS_PER_PASS
    bit<16> egress_port; // where a recirculated frame leaves in the end
}

// The first (payload words mod TAIL_CHUNK_WORDS) words of a FRAME's payload, hashed with the headers.
header tail_lead_1_h {
    bit<32> w0;
}
header tail_lead_2_h {
    bit<32> w0;
    bit<32> w1;
}
header tail_lead_3_h {
    bit<32> w0;
    bit<32> w1;
    bit<32> w2;
}
header tail_lead_4_h {
    bit<32> w0;
    bit<32> w1;
    bit<32> w2;
    bit<32> w3;
}
header tail_lead_5_h {
    bit<32> w0;
    bit<32> w1;
    bit<32> w2;
    bit<32> w3;
    bit<32> w4;
}
header tail_lead_6_h {
    bit<32> w0;
    bit<32> w1;
    bit<32> w2;
    bit<32> w3;
    bit<32> w4;
    bit<32> w5;
}
header tail_lead_7_h {
    bit<32> w0;
    bit<32> w1;
    bit<32> w2;
    bit<32> w3;
    bit<32> w4;
    bit<32> w5;
    bit<32> w6;
}

// TAIL_CHUNK_WORDS payload words: the input of one chained hash unit.
header tail_chunk_h {
    bit<32> w0;
    bit<32> w1;
    bit<32> w2;
    bit<32> w3;
    bit<32> w4;
    bit<32> w5;
    bit<32> w6;
    bit<32> w7;
}

struct tna_headers_t {
    bridge_h bridge;
    headers_t dta;
    word_h gathered; // the word a gather pass adds in front of those gathered before
    tail_lead_1_h lead_1;
    tail_lead_2_h lead_2;
    tail_lead_3_h lead_3;
    tail_lead_4_h lead_4;
    tail_lead_5_h lead_5;
    tail_lead_6_h lead_6;
    tail_lead_7_h lead_7;
    tail_chunk_h[8] chunks; // MAX_WRITE_PAYLOAD / 4 / TAIL_CHUNK_WORDS
}

// TNA registers: one element type, indexed by bit<32>. A register is accessed once per packet, so a record
// whose words are all read at once (an Append batch, a Postcarding path, a sketch column) has one register
// per word.
#define SOFTDTA_REGISTER(W, N) Register<bit<W>, bit<32>>(N)

// The gate of a QP: its state and the end of its grace period, one register pair so one stateful ALU
// decides (TNA's form of qp_state.state and qp_state.grace_until_ns, which need two ALUs in one decision).
struct qp_gate_t {
    bit<32> state;
    bit<32> grace_until;
}

parser SoftdtaIngressParser(packet_in pkt, out tna_headers_t hdr, out metadata_t meta,
                            out ingress_intrinsic_metadata_t ig_intr_md) {
    ParserCounter() rows_left;

    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        transition select(ig_intr_md.ingress_port) {
            RECIRCULATION_PORT: parse_recirculated;
            default: parse_ethernet;
        }
    }
    // Recirculated: a gather pass reads its gather header; the words gathered so far stay payload.
    state parse_recirculated {
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.kind) {
            BRIDGE_GATHER: parse_gather;
            BRIDGE_REPLY_TAKEN: parse_checked_reply;
            BRIDGE_REPLY_REFUSED: parse_checked_reply;
            default: accept;
        }
    }
    state parse_checked_reply {
        pkt.extract(hdr.dta.ethernet);
        pkt.extract(hdr.dta.ipv4);
        pkt.extract(hdr.dta.udp);
        transition parse_bth;
    }
    state parse_gather {
        pkt.extract(hdr.dta.ethernet);
        pkt.extract(hdr.dta.ipv4);
        pkt.extract(hdr.dta.udp);
        pkt.extract(hdr.dta.gather);
        transition accept;
    }
    state parse_ethernet {
        pkt.extract(hdr.dta.ethernet);
        transition select(hdr.dta.ethernet.ethertype) {
            ETH_P_IP: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.dta.ipv4);
        transition select(hdr.dta.ipv4.ihl, hdr.dta.ipv4.protocol) {
            (4w5, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.dta.udp);
        transition select(hdr.dta.udp.dport) {
            DTA_PORT: parse_dta;
            ROCE_PORT: parse_bth;
            default: accept;
        }
    }
    state parse_dta {
        transition select(pkt.lookahead<bit<8>>()) {
            EXTENDED_FIRST_BYTE: parse_base_ext;
            default: parse_base_v1;
        }
    }
    state parse_base_v1 {
        pkt.extract(hdr.dta.base_v1);
        transition select(hdr.dta.base_v1.opcode) {
            DTA_OP_KEY_WRITE: parse_key_write;
            DTA_OP_APPEND: parse_append;
            DTA_OP_KEY_INCREMENT: parse_key_increment;
            DTA_OP_POSTCARDING: parse_postcard;
            default: accept;
        }
    }
    state parse_key_write {
        pkt.extract(hdr.dta.key_write);
        transition accept;
    }
    state parse_append {
        pkt.extract(hdr.dta.append);
        transition accept;
    }
    state parse_key_increment {
        pkt.extract(hdr.dta.key_increment);
        transition accept;
    }
    state parse_postcard {
        pkt.extract(hdr.dta.postcard);
        transition accept;
    }
    state parse_base_ext {
        pkt.extract(hdr.dta.base_ext);
        transition select(hdr.dta.base_ext.opcode) {
            DTA_OP_SKETCH_MERGE: parse_sketch;
            default: accept;
        }
    }
    state parse_sketch {
        pkt.extract(hdr.dta.sketch);
        rows_left.set(hdr.dta.sketch.rows);
        transition select(hdr.dta.sketch.rows) {
            0: accept;
            default: parse_counter;
        }
    }
    state parse_counter {
        pkt.extract(hdr.dta.counters.next);
        rows_left.decrement(1);
        transition select(rows_left.is_zero()) {
            true: accept;
            default: parse_counter;
        }
    }
    state parse_bth {
        pkt.extract(hdr.dta.bth);
        transition select(hdr.dta.bth.opcode) {
            ROCE_OP_RC_ACK: parse_aeth;
            ROCE_OP_RC_ATOMIC_ACK: parse_aeth;
            default: accept;
        }
    }
    state parse_aeth {
        pkt.extract(hdr.dta.aeth);
        transition accept;
    }
}

// Bytes of a 32-bit value in the other order: DTA data and sketch counters are stored little-endian.
#define BYTESWAP32(x) ((x)[7:0] ++ (x)[15:8] ++ (x)[23:16] ++ (x)[31:24])

control SoftdtaIngress(inout tna_headers_t hdr, inout metadata_t meta,
                       in ingress_intrinsic_metadata_t ig_intr_md,
                       in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                       inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                       inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
#include "softdta_tables.p4"

    Counter<bit<32>, bit<32>>((bit<32>)COUNTER_SLOTS, CounterType_t.PACKETS) translator_counters;
    Hash<bit<32>>(HashAlgorithm_t.CRC32) key_checksum;
    Hash<bit<32>>(HashAlgorithm_t.CRC32) postcard_slot_hash;
    Hash<bit<32>>(HashAlgorithm_t.CRC32) postcard_checksum;
    Hash<bit<32>>(HashAlgorithm_t.CRC32) postcard_entry_hash;
    // H_hop(key) of hop i + 1: one hash unit per hop polynomial.
#define HOP_HASH_UNIT(i) \
    CRCPolynomial<bit<32>>(POSTCARD_HOP_POLYNOMIALS_##i, true, false, false, 32w0xFFFFFFFF, 32w0xFFFFFFFF) hop_poly_##i; \
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, hop_poly_##i) hop_hash_##i;
    SOFTDTA_EACH_POSTCARD_WORD(HOP_HASH_UNIT)

    // Values the register actions read: set before the stage that executes them.
    bit<32> batch;
    bit<32> pending;
    bit<32> stored_data;
    bit<32> postcard_key;
    bit<8> hop_bit;
    bit<8> complete_mask;
    bit<32> hop_index;
    bit<32> encoded;
    bool fresh_entry;
    bit<32> sketch_column;
    bit<32> reporter_bit;
    bit<32> everyone;
    bit<32> offset;
    bit<32> now; // the packet's arrival in 1.024 us units

    // The gate of each QP, in ingress so that a report a QP cannot send leaves every state untouched.
    Register<qp_gate_t, bit<32>>((bit<32>)QP_STATE_MAX_ENTRIES) qp_gate;
    // A report may use the QP when it is active, or in grace and the grace period is over (it ends it).
    RegisterAction<qp_gate_t, bit<32>, bit<32>>(qp_gate) pass_gate = {
        void apply(inout qp_gate_t value, out bit<32> result) {
            if (value.state == GATE_GRACE && now >= value.grace_until) {
                value.state = GATE_ACTIVE;
            }
            result = value.state;
        }
    };
    RegisterAction<qp_gate_t, bit<32>, bit<32>>(qp_gate) start_grace = {
        void apply(inout qp_gate_t value) {
            value.state = GATE_GRACE;
            value.grace_until = now + meta.tables.translator_config.grace_ns[41:10];
        }
    };
    RegisterAction<qp_gate_t, bit<32>, bit<32>>(qp_gate) fail_gate = {
        void apply(inout qp_gate_t value) {
            value.state = GATE_FAILED;
        }
    };

    // Append: state in the list's registers (ingress owns them; nothing else touches them).
    SOFTDTA_REGISTER_APPEND_STATE_PENDING
    SOFTDTA_REGISTER_APPEND_STATE_HEAD
    // The batch position of this entry; the count starts over when the batch is full.
    RegisterAction<bit<32>, bit<32>, bit<32>>(append_state_pending) take_pending = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
            if (value + 1 >= batch) {
                value = 0;
            } else {
                value = value + 1;
            }
        }
    };
    // Rings hold a whole number of batches (validated), so the head wraps to 0 exactly at the end (dta-v1
    // §7.19) and a batch never straddles it.
    RegisterAction<bit<32>, bit<32>, bit<32>>(append_state_head) advance_head = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
            if (value + batch == meta.tables.append_list.slot_count) {
                value = 0;
            } else {
                value = value + batch;
            }
        }
    };
    // Word i of every list's batch: the entry lands in word `pending`, and every word is read out.
#define APPEND_WORD_REGISTER(i) \
    Register<bit<32>, bit<32>>((bit<32>)SOFTDTA_APPEND_STATE_ENTRIES) append_word_##i; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(append_word_##i) append_slot_##i = { \
        void apply(inout bit<32> value, out bit<32> result) {                      \
            if (pending == i) {                                                    \
                value = stored_data;                                               \
            }                                                                      \
            result = value;                                                        \
        }                                                                          \
    };
    SOFTDTA_EACH_TNA_APPEND_WORD(APPEND_WORD_REGISTER)

    // Postcarding: the cached key, its hop mask (0: the entry is free, so key 0 is an ordinary key) and one
    // register per hop value.
    SOFTDTA_REGISTER_POSTCARD_CACHE_KEY
    SOFTDTA_REGISTER_POSTCARD_CACHE_HOP_MASK
    RegisterAction<bit<32>, bit<32>, bit<32>>(postcard_cache_key) claim_entry = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
            value = postcard_key;
        }
    };
    // The hop mask before this report; the entry keeps this flow's hops, and is freed when the path is complete.
    RegisterAction<bit<8>, bit<32>, bit<8>>(postcard_cache_hop_mask) mark_hop = {
        void apply(inout bit<8> value, out bit<8> result) {
            result = value;
            bit<8> mask = fresh_entry || value == 0 ? hop_bit : value | hop_bit;
            if (mask == complete_mask) {
                value = 0;
            } else {
                value = mask;
            }
        }
    };
    // Hop value i of every cache entry. A fresh entry reads out the evicted path's value and starts anew.
#define POSTCARD_HOP_REGISTER(i) \
    Register<bit<32>, bit<32>>((bit<32>)SOFTDTA_POSTCARD_CACHE_ENTRIES) postcard_hop_##i;  \
    RegisterAction<bit<32>, bit<32>, bit<32>>(postcard_hop_##i) postcard_value_##i = { \
        void apply(inout bit<32> value, out bit<32> result) {                          \
            if (fresh_entry) {                                                         \
                result = value;                                                        \
                value = hop_index == i ? encoded : 32w0;                               \
            } else {                                                                   \
                if (hop_index == i) {                                                  \
                    value = encoded;                                                   \
                }                                                                      \
                result = value;                                                        \
            }                                                                          \
        }                                                                              \
    };
    SOFTDTA_EACH_POSTCARD_WORD(POSTCARD_HOP_REGISTER)

    // Sketch-Merge: a reporter's next column, a column's contributors and epoch, one register per row.
    SOFTDTA_REGISTER_SKETCH_REPORTER_NEXT_COLUMN
    SOFTDTA_REGISTER_SKETCH_COLUMN_CONTRIBUTORS
    SOFTDTA_REGISTER_SKETCH_COLUMN_EPOCH
    // The column the reporter must send; it moves on only when this report is that column.
    RegisterAction<bit<32>, bit<32>, bit<32>>(sketch_reporter_next_column) expect_column = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
            if (value == sketch_column) {
                if (value + 1 == meta.tables.structure.columns) {
                    value = 0;
                } else {
                    value = value + 1;
                }
            }
        }
    };
    // The contributors before this report; its bit is added.
    RegisterAction<bit<32>, bit<32>, bit<32>>(sketch_column_contributors) contribute = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
            value = value | reporter_bit;
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(sketch_column_contributors) clear_contributors = {
        void apply(inout bit<32> value) {
            value = 0;
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(sketch_column_epoch) next_epoch = {
        void apply(inout bit<32> value) {
            value = value + 1;
        }
    };
    // Row i of every column: merged as a sum or a maximum, taken (read and cleared) when written out.
#define SKETCH_ROW_REGISTER(i) \
    Register<bit<32>, bit<32>>((bit<32>)SOFTDTA_SKETCH_COLUMN_ENTRIES) sketch_row_##i; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(sketch_row_##i) sketch_sum_##i = {   \
        void apply(inout bit<32> value) {                                          \
            value = value + hdr.dta.counters[i].word;                              \
        }                                                                          \
    };                                                                             \
    RegisterAction<bit<32>, bit<32>, bit<32>>(sketch_row_##i) sketch_max_##i = {   \
        void apply(inout bit<32> value) {                                          \
            if (hdr.dta.counters[i].word > value) {                                \
                value = hdr.dta.counters[i].word;                                  \
            }                                                                      \
        }                                                                          \
    };                                                                             \
    RegisterAction<bit<32>, bit<32>, bit<32>>(sketch_row_##i) sketch_take_##i = {  \
        void apply(inout bit<32> value, out bit<32> result) {                      \
            result = value;                                                        \
            value = 0;                                                             \
        }                                                                          \
    };
    SOFTDTA_EACH_TNA_SKETCH_ROW(SKETCH_ROW_REGISTER)

    action consume(bit<8> slot) {
        translator_counters.count((bit<32>)slot);
        ig_dprsr_md.drop_ctl = 1;
    }
    action count(bit<8> slot) {
        translator_counters.count((bit<32>)slot);
    }
    action bridge_qp() {
        hdr.bridge.setValid();
        hdr.bridge.qp_index = meta.tables.qp_key.qp_index;
        hdr.bridge.remote_qpn = meta.tables.qp.remote_qpn;
        hdr.bridge.rkey = meta.tables.qp.rkey;
        hdr.bridge.base_va = meta.tables.qp.base_va;
        hdr.bridge.collector_ip = meta.tables.qp.collector_ip;
        hdr.bridge.collector_mac = meta.tables.qp.collector_mac;
        hdr.bridge.transport = meta.tables.qp.transport;
        hdr.bridge.src_mac = meta.tables.translator_config.src_mac;
        hdr.bridge.src_ip = meta.tables.translator_config.src_ip;
        hdr.bridge.udp_sport = meta.tables.translator_config.udp_sport;
        hdr.bridge.dscp = meta.tables.translator_config.dscp;
        hdr.bridge.ttl = meta.tables.translator_config.ttl;
        hdr.bridge.ack_req_interval = meta.tables.translator_config.ack_req_interval;
    }
    // A WRITE of `words` payload words at `va`, with an ImmDt when `immediate` is set.
    action write_frame(bit<64> va, bit<8> words, bit<1> immediate, bit<32> tag) {
        bool rc = meta.tables.qp.transport == TRANSPORT_RC;
        hdr.bridge.kind = BRIDGE_FRAME;
        hdr.bridge.roce_opcode = immediate == 1 ? (rc ? ROCE_OP_RC_WRITE_ONLY_IMM : ROCE_OP_UC_WRITE_ONLY_IMM)
                                                : (rc ? ROCE_OP_RC_WRITE_ONLY : ROCE_OP_UC_WRITE_ONLY);
        hdr.bridge.va = va;
        hdr.bridge.immediate = tag;
        hdr.bridge.payload_len = (bit<16>)words << 2;
        hdr.bridge.lead_words = words & (TAIL_CHUNK_WORDS - 1);
        hdr.bridge.chunks = words >> 3;
        hdr.bridge.ip_length = (bit<16>)IPV4_SIZE + (bit<16>)UDP_SIZE + (bit<16>)BTH_SIZE + (bit<16>)RETH_SIZE
                               + (immediate == 1 ? (bit<16>)IMMDT_SIZE : 16w0) + ((bit<16>)words << 2)
                               + (bit<16>)ICRC_LEN;
    }

    // slot * slot_size: Postcarding slots are powers of two of 4..32 bytes (4 per hop, rounded up).
    action offset_2() { offset = offset << 2; }
    action offset_3() { offset = offset << 3; }
    action offset_4() { offset = offset << 4; }
    action offset_5() { offset = offset << 5; }
    action offset_6() { offset = offset << 6; }
    action offset_7() { offset = offset << 7; }
    table postcard_slot_offset {
        key = { meta.tables.structure.slot_size : exact; }
        actions = { offset_2; offset_3; offset_4; offset_5; offset_6; offset_7; }
        const entries = {
            4 : offset_2();
            8 : offset_3();
            16 : offset_4();
            32 : offset_5();
            64 : offset_6();
            128 : offset_7();
        }
        size = 8;
    }

    // Shifts by a packet's value are lookups: the ALUs shift by constants.
    action set_hop_bit(bit<8> value) { hop_bit = value; }
    table hop_bits {
        key = { hdr.dta.postcard.hop : exact; }
        actions = { set_hop_bit; }
        const entries = {
            1 : set_hop_bit(1);
            2 : set_hop_bit(2);
            3 : set_hop_bit(4);
            4 : set_hop_bit(8);
            5 : set_hop_bit(16);
            6 : set_hop_bit(32);
            7 : set_hop_bit(64);
            8 : set_hop_bit(128);
        }
        size = 8;
    }
    // A path's hop mask once every hop reported.
    action set_complete_mask(bit<8> value) { complete_mask = value; }
    table complete_masks {
        key = { meta.tables.structure.hops : exact; }
        actions = { set_complete_mask; }
        const entries = {
            1 : set_complete_mask(1);
            2 : set_complete_mask(3);
            3 : set_complete_mask(7);
            4 : set_complete_mask(15);
            5 : set_complete_mask(31);
            6 : set_complete_mask(63);
            7 : set_complete_mask(127);
            8 : set_complete_mask(255);
        }
        size = 8;
    }
    // A reporter's bit among a column's contributors.
    action set_reporter_bit(bit<32> value) { reporter_bit = value; }
    table reporter_bits {
        key = { hdr.dta.sketch.reporter : exact; }
        actions = { set_reporter_bit; }
        const entries = {
            0 : set_reporter_bit(0x1);
            1 : set_reporter_bit(0x2);
            2 : set_reporter_bit(0x4);
            3 : set_reporter_bit(0x8);
            4 : set_reporter_bit(0x10);
            5 : set_reporter_bit(0x20);
            6 : set_reporter_bit(0x40);
            7 : set_reporter_bit(0x80);
            8 : set_reporter_bit(0x100);
            9 : set_reporter_bit(0x200);
            10 : set_reporter_bit(0x400);
            11 : set_reporter_bit(0x800);
            12 : set_reporter_bit(0x1000);
            13 : set_reporter_bit(0x2000);
            14 : set_reporter_bit(0x4000);
            15 : set_reporter_bit(0x8000);
            16 : set_reporter_bit(0x10000);
            17 : set_reporter_bit(0x20000);
            18 : set_reporter_bit(0x40000);
            19 : set_reporter_bit(0x80000);
            20 : set_reporter_bit(0x100000);
            21 : set_reporter_bit(0x200000);
            22 : set_reporter_bit(0x400000);
            23 : set_reporter_bit(0x800000);
            24 : set_reporter_bit(0x1000000);
            25 : set_reporter_bit(0x2000000);
            26 : set_reporter_bit(0x4000000);
            27 : set_reporter_bit(0x8000000);
            28 : set_reporter_bit(0x10000000);
            29 : set_reporter_bit(0x20000000);
            30 : set_reporter_bit(0x40000000);
            31 : set_reporter_bit(0x80000000);
        }
        size = 32;
    }
    // The contributors of a complete column.
    action set_everyone(bit<32> value) { everyone = value; }
    table everyone_masks {
        key = { meta.tables.structure.reporters : exact; }
        actions = { set_everyone; }
        const entries = {
            1 : set_everyone(0x1);
            2 : set_everyone(0x3);
            3 : set_everyone(0x7);
            4 : set_everyone(0xf);
            5 : set_everyone(0x1f);
            6 : set_everyone(0x3f);
            7 : set_everyone(0x7f);
            8 : set_everyone(0xff);
            9 : set_everyone(0x1ff);
            10 : set_everyone(0x3ff);
            11 : set_everyone(0x7ff);
            12 : set_everyone(0xfff);
            13 : set_everyone(0x1fff);
            14 : set_everyone(0x3fff);
            15 : set_everyone(0x7fff);
            16 : set_everyone(0xffff);
            17 : set_everyone(0x1ffff);
            18 : set_everyone(0x3ffff);
            19 : set_everyone(0x7ffff);
            20 : set_everyone(0xfffff);
            21 : set_everyone(0x1fffff);
            22 : set_everyone(0x3fffff);
            23 : set_everyone(0x7fffff);
            24 : set_everyone(0xffffff);
            25 : set_everyone(0x1ffffff);
            26 : set_everyone(0x3ffffff);
            27 : set_everyone(0x7ffffff);
            28 : set_everyone(0xfffffff);
            29 : set_everyone(0x1fffffff);
            30 : set_everyone(0x3fffffff);
            31 : set_everyone(0x7fffffff);
            32 : set_everyone(0xffffffff);
        }
        size = 32;
    }

    // first_column * rows * 4 without a multiplier: one sum of shifts per row count.
    action column_bytes_1() { offset = (offset << 2); }
    action column_bytes_2() { offset = (offset << 3); }
    action column_bytes_3() { offset = (offset << 2) + (offset << 3); }
    action column_bytes_4() { offset = (offset << 4); }
    action column_bytes_5() { offset = (offset << 2) + (offset << 4); }
    action column_bytes_6() { offset = (offset << 3) + (offset << 4); }
    action column_bytes_7() { offset = (offset << 2) + (offset << 3) + (offset << 4); }
    action column_bytes_8() { offset = (offset << 5); }
    action column_bytes_9() { offset = (offset << 2) + (offset << 5); }
    action column_bytes_10() { offset = (offset << 3) + (offset << 5); }
    action column_bytes_11() { offset = (offset << 2) + (offset << 3) + (offset << 5); }
    action column_bytes_12() { offset = (offset << 4) + (offset << 5); }
    action column_bytes_13() { offset = (offset << 2) + (offset << 4) + (offset << 5); }
    action column_bytes_14() { offset = (offset << 3) + (offset << 4) + (offset << 5); }
    action column_bytes_15() { offset = (offset << 2) + (offset << 3) + (offset << 4) + (offset << 5); }
    action column_bytes_16() { offset = (offset << 6); }
    table sketch_group_offset {
        key = { hdr.dta.gather.rows : exact; }
        actions = { column_bytes_1; column_bytes_2; column_bytes_3; column_bytes_4; column_bytes_5; column_bytes_6;
                    column_bytes_7; column_bytes_8; column_bytes_9; column_bytes_10; column_bytes_11;
                    column_bytes_12; column_bytes_13; column_bytes_14; column_bytes_15; column_bytes_16; }
        const entries = {
            1 : column_bytes_1();
            2 : column_bytes_2();
            3 : column_bytes_3();
            4 : column_bytes_4();
            5 : column_bytes_5();
            6 : column_bytes_6();
            7 : column_bytes_7();
            8 : column_bytes_8();
            9 : column_bytes_9();
            10 : column_bytes_10();
            11 : column_bytes_11();
            12 : column_bytes_12();
            13 : column_bytes_13();
            14 : column_bytes_14();
            15 : column_bytes_15();
            16 : column_bytes_16();
        }
        size = 16;
    }

    apply {
        if (ig_prsr_md.parser_err != 0) {
            consume(CNT_DROP_TRUNCATED);
            return;
        }
        if (hdr.bridge.isValid() && hdr.bridge.kind == BRIDGE_ICRC_PASS) {
            ig_tm_md.ucast_egress_port = (PortId_t)hdr.bridge.egress_port; // egress finishes its tail CRC
            return;
        }
        if (!hdr.dta.udp.isValid()) {
            ig_dprsr_md.drop_ctl = 1;
            return;
        }
        meta.tables.translator_config_key.index = 0;
        if (!translator_config.apply().hit) {
            ig_dprsr_md.drop_ctl = 1;
            return;
        }
        now = ig_intr_md.ingress_mac_tstamp[41:10];
        bit<32> word = 0; // the gather chain sets it for every row a column has

        // ---------------------------------------------------------------------------------------
        // A Sketch-Merge group being collected: one aggregate word per pass, the last first, each in front
        // of those gathered before, so the payload ends up in order.
        if (hdr.dta.gather.isValid()) {
            bit<32> column_index = (hdr.dta.gather.state_index << P4_SKETCH_COLUMN_BITS)
                                   | (bit<32>)hdr.dta.gather.column;
#define TAKE_ROW(i) \
            if (hdr.dta.gather.row == i) {                    \
                word = sketch_take_##i.execute(column_index); \
            } else
            SOFTDTA_EACH_TNA_SKETCH_ROW(TAKE_ROW) {}
            hdr.gathered.setValid();
            hdr.gathered.word = BYTESWAP32(word);
            hdr.dta.gather.gathered = hdr.dta.gather.gathered + 1;
            // The group's first cell is the last collected (no multiplier here to count batch * rows words).
            bool last = hdr.dta.gather.row == 0 && hdr.dta.gather.column == hdr.dta.gather.first_column;
            if (hdr.dta.gather.row == 0) {
                clear_contributors.execute(column_index);
                next_epoch.execute(column_index);
                hdr.dta.gather.row = hdr.dta.gather.rows - 1;
                hdr.dta.gather.column = hdr.dta.gather.column - 1;
            } else {
                hdr.dta.gather.row = hdr.dta.gather.row - 1;
            }
            if (!last) {
                ig_tm_md.ucast_egress_port = RECIRCULATION_PORT;
                return;
            }
            meta.tables.qp_key.qp_index = hdr.dta.gather.qp_index;
            qp.apply();
            bit<16> origin = hdr.bridge.egress_port;
            bridge_qp();
            hdr.bridge.egress_port = origin;
            offset = (bit<32>)hdr.dta.gather.first_column;
            sketch_group_offset.apply();
            write_frame(meta.tables.qp.base_va + (bit<64>)offset, hdr.dta.gather.gathered,
                        hdr.dta.gather.immediate[0:0],
                        (bit<32>)hdr.dta.gather.first_column);
            hdr.dta.gather.setInvalid();
        }

        // ---------------------------------------------------------------------------------------
        // Collector replies, taken as an RC requester takes them: a UC QP takes none, an RC QP only one whose
        // PSN is outstanding, in [unacked_psn, next_psn) modulo 2^24 (docs/protocol.md). Egress owns the PSNs,
        // so it decides, and the reply comes back here (recirculated) to act on the gate and be counted.
        else if (hdr.dta.aeth.isValid() && hdr.bridge.isValid()) {
            bit<32> index = hdr.bridge.qp_index;
            bit<3> kind = (bit<3>)(hdr.dta.aeth.syndrome >> AETH_KIND_SHIFT);
            bit<5> code = (bit<5>)(hdr.dta.aeth.syndrome & AETH_VALUE_MASK);
            if (hdr.bridge.kind == BRIDGE_REPLY_REFUSED) {
                consume(CNT_DROP_REPLY_PSN_OUTSIDE_WINDOW);
            } else if (kind == (bit<3>)AETH_ACK) {
                consume(CNT_RX_ACKS);
            } else if (kind == (bit<3>)AETH_RNR_NAK) {
                consume(CNT_RX_RNR_NAKS);
            } else if (kind == (bit<3>)AETH_NAK && code == (bit<5>)NAK_PSN_SEQUENCE_ERROR) {
                // Only a PSN sequence error NAK resyncs (dta-v1 §7.13): egress moves next_psn, after a grace.
                count(CNT_RX_NAK_SEQUENCE);
                start_grace.execute(index);
                hdr.bridge.kind = BRIDGE_REPLY;
                ig_tm_md.ucast_egress_port = RECIRCULATION_PORT; // egress drops it once resynced
            } else {
                consume(CNT_RX_NAK_FATAL);
                fail_gate.execute(index);
            }
            return;
        }
        else if (hdr.dta.aeth.isValid()) {
            meta.tables.qp_by_local_qpn_key.local_qpn = (bit<32>)hdr.dta.bth.dest_qp;
            if (!qp_by_local_qpn.apply().hit) {
                consume(CNT_DROP_UNKNOWN_QP);
                return;
            }
            meta.tables.qp_key.qp_index = meta.tables.qp_by_local_qpn.qp_index;
            if (!qp.apply().hit || meta.tables.qp.collector_ip != hdr.dta.ipv4.src) {
                consume(CNT_DROP_UNKNOWN_QP);
                return;
            }
            if (meta.tables.qp.transport != TRANSPORT_RC) {
                consume(CNT_DROP_REPLY_ON_UC);
                return;
            }
            bridge_qp();
            hdr.bridge.kind = BRIDGE_REPLY_CHECK;
            hdr.bridge.psn = hdr.dta.bth.psn;
            ig_tm_md.ucast_egress_port = RECIRCULATION_PORT;
            return;
        }

        // ---------------------------------------------------------------------------------------
        // Reports
        else {
            if (hdr.dta.udp.dport != DTA_PORT) {
                ig_dprsr_md.drop_ctl = 1;
                return;
            }
            count(CNT_RX_REPORTS);
            if (!(hdr.dta.key_write.isValid() || hdr.dta.key_increment.isValid() || hdr.dta.append.isValid()
                  || hdr.dta.postcard.isValid() || hdr.dta.sketch.isValid())) {
                consume(CNT_DROP_UNKNOWN_OPCODE); // other extended reports: the XDP translator
                return;
            }
            if (meta.tables.translator_config.profile != 0 && hdr.dta.base_v1.isValid()) {
                consume(CNT_DROP_BAD_PROFILE); // compiled for the 3-byte dta-v1 base header
                return;
            }
            bit<8> opcode = hdr.dta.base_v1.isValid() ? hdr.dta.base_v1.opcode : hdr.dta.base_ext.opcode;
            bit<1> immediate = hdr.dta.base_v1.isValid() ? hdr.dta.base_v1.immediate : hdr.dta.base_ext.immediate;
            if (opcode == DTA_OP_APPEND) {
                meta.tables.append_list_key.list_id = hdr.dta.append.list_id;
                if (!append_list.apply().hit) {
                    consume(CNT_DROP_UNKNOWN_LIST);
                    return;
                }
                if (meta.tables.append_list.entry_size != 4) {
                    consume(CNT_DROP_BAD_LENGTH); // dta-v1 Append data is 4 bytes
                    return;
                }
                meta.tables.qp_key.qp_index = meta.tables.append_list.qp_index;
            } else {
                meta.tables.structure_key.collector_ip = hdr.dta.ipv4.dst;
                meta.tables.structure_key.primitive = (bit<32>)opcode;
                if (!structure.apply().hit) {
                    consume(CNT_DROP_UNKNOWN_COLLECTOR);
                    return;
                }
                meta.tables.qp_key.qp_index = meta.tables.structure.qp_index;
            }
            if (!qp.apply().hit) {
                consume(CNT_DROP_UNKNOWN_QP);
                return;
            }
            // A QP that cannot send takes no report: its state stays as the collector last saw it.
            bit<32> gate = pass_gate.execute(meta.tables.qp_key.qp_index);
            if (gate == GATE_FAILED) {
                consume(CNT_DROP_QP_FAILED);
                return;
            }
            if (gate == GATE_GRACE) {
                consume(CNT_DROP_GRACE);
                return;
            }
            bridge_qp();
            hdr.bridge.egress_port = meta.tables.qp.ifindex == 0 ? (bit<16>)ig_intr_md.ingress_port
                                                                  : (bit<16>)meta.tables.qp.ifindex;

            if (opcode == DTA_OP_KEY_WRITE || opcode == DTA_OP_KEY_INCREMENT) {
                bit<8> redundancy = hdr.dta.key_write.isValid() ? hdr.dta.key_write.redundancy
                                                                : hdr.dta.key_increment.redundancy;
                if (redundancy == 0 || redundancy > MAX_REDUNDANCY
                    || redundancy > meta.tables.structure.redundancy) {
                    consume(CNT_DROP_BAD_REDUNDANCY);
                    return;
                }
                hdr.bridge.kind = BRIDGE_REPORT;
                hdr.bridge.key_hash = (bit<8>)meta.tables.structure.key_hash;
                hdr.bridge.slot_size = (bit<8>)meta.tables.structure.slot_size;
                hdr.bridge.slot_mask = meta.tables.structure.slot_count - 1;
                bit<32> report_key = hdr.dta.key_write.isValid() ? hdr.dta.key_write.key : hdr.dta.key_increment.key;
                hdr.bridge.key = report_key;
                hdr.bridge.key_checksum = key_checksum.get({ BYTESWAP32(report_key) });
                if (hdr.dta.key_write.isValid()) {
                    count(CNT_RX_KEY_WRITE);
                    if (meta.tables.structure.key_len != 4 || meta.tables.structure.data_len != 4) {
                        consume(CNT_DROP_BAD_LENGTH);
                        return;
                    }
                    bool rc = meta.tables.qp.transport == TRANSPORT_RC;
                    hdr.bridge.roce_opcode = immediate == 1
                                             ? (rc ? ROCE_OP_RC_WRITE_ONLY_IMM : ROCE_OP_UC_WRITE_ONLY_IMM)
                                             : (rc ? ROCE_OP_RC_WRITE_ONLY : ROCE_OP_UC_WRITE_ONLY);
                    hdr.bridge.payload_len = (bit<16>)KEY_CHECKSUM_LEN + 4; // key checksum, then the 4 data bytes of dta-v1
                    hdr.bridge.ip_length = (bit<16>)IPV4_SIZE + (bit<16>)UDP_SIZE + (bit<16>)BTH_SIZE
                                           + (bit<16>)RETH_SIZE + (immediate == 1 ? (bit<16>)IMMDT_SIZE : 16w0) + 8
                                           + (bit<16>)ICRC_LEN;
                } else {
                    count(CNT_RX_KEY_INCREMENT);
                    hdr.bridge.roce_opcode = ROCE_OP_RC_FETCH_ADD;
                    hdr.bridge.payload_len = 0;
                    hdr.bridge.ip_length = (bit<16>)IPV4_SIZE + (bit<16>)UDP_SIZE + (bit<16>)BTH_SIZE
                                           + (bit<16>)ATOMIC_ETH_SIZE + (bit<16>)ICRC_LEN;
                }
                // N copies, one per replication ID 0..N-1: egress hashes copy `rid`'s own slot.
                ig_tm_md.mcast_grp_a = (bit<16>)(meta.tables.qp.ifindex * (bit<32>)MAX_REDUNDANCY
                                                 + (bit<32>)redundancy);
            } else if (opcode == DTA_OP_APPEND) {
                count(CNT_RX_APPEND);
                batch = meta.tables.append_list.batch;
                stored_data = BYTESWAP32(hdr.dta.append.data);
                bit<32> slot_base = meta.tables.append_list.state_index;
                pending = take_pending.execute(slot_base);
                // Every word register is read (one access each); the entry lands in word `pending`.
#define APPEND_WORD(i) \
                word = append_slot_##i.execute(slot_base); \
                if (i < batch) {                           \
                    hdr.dta.payload[i].setValid();         \
                    hdr.dta.payload[i].word = word;        \
                }
                SOFTDTA_EACH_TNA_APPEND_WORD(APPEND_WORD)
                if (pending + 1 < batch) {
                    consume(CNT_APPEND_BATCHED);
                    return;
                }
                bit<32> head = advance_head.execute(slot_base);
                write_frame(meta.tables.qp.base_va + ((bit<64>)(meta.tables.append_list.first_slot + head) << 2),
                            (bit<8>)batch, immediate, hdr.dta.append.list_id);
            } else if (opcode == DTA_OP_POSTCARDING) {
                count(CNT_RX_POSTCARDING);
                bit<32> hops = (bit<32>)meta.tables.structure.hops;
                if (hdr.dta.postcard.hop == 0 || (bit<32>)hdr.dta.postcard.hop > hops) {
                    consume(CNT_DROP_BAD_HOP);
                    return;
                }
                // H_hop(key): one CRC per hop polynomial.
                bit<32> hop_hash = 0;
#define HOP_HASH(i) \
                if (hdr.dta.postcard.hop == (i + 1)) {                     \
                    hop_hash = hop_hash_##i.get({ hdr.dta.postcard.key }); \
                }
                SOFTDTA_EACH_POSTCARD_WORD(HOP_HASH)
                encoded = hdr.dta.postcard.data ^ hop_hash;
                // The frame goes to the slot of `frame_key`: this flow's, or an evicted flow's own (dta-v1 §7.3).
                bit<32> frame_key = hdr.dta.postcard.key;
                bit<8> frame_words = (bit<8>)hops;
                bit<1> frame_immediate = immediate;
                if (hops == 1) {
                    // A one-hop path is complete on arrival: written without touching the cache.
                    hdr.dta.payload[0].setValid();
                    hdr.dta.payload[0].word = encoded;
                } else {
                    bit<32> entry = meta.tables.structure.state_index
                                    + (postcard_entry_hash.get({ hdr.dta.postcard.key })
                                       & (meta.tables.structure.cache_entries - 1));
                    postcard_key = hdr.dta.postcard.key;
                    hop_index = (bit<32>)hdr.dta.postcard.hop - 1;
                    hop_bits.apply();
                    complete_masks.apply();
                    bit<32> cached_key = claim_entry.execute(entry << P4_POSTCARD_WORD_BITS);
                    fresh_entry = cached_key != postcard_key;
                    bit<8> hop_mask = mark_hop.execute(entry);
                    bool evict = fresh_entry && hop_mask != 0;
                    fresh_entry = fresh_entry || hop_mask == 0; // a free entry starts a path as an evicted one does
                    bit<8> mask = fresh_entry ? hop_bit : hop_mask | hop_bit;
#define POSTCARD_WORD(i) \
                    word = postcard_value_##i.execute(entry); \
                    if (i < hops) {                           \
                        hdr.dta.payload[i].setValid();        \
                        hdr.dta.payload[i].word = word;       \
                    }
                    SOFTDTA_EACH_POSTCARD_WORD(POSTCARD_WORD)
                    if (evict) {
                        count(CNT_POSTCARD_EVICTIONS);
                        frame_key = cached_key;
                        frame_immediate = 0;
                    } else if (mask != complete_mask) {
                        consume(CNT_POSTCARD_CACHED);
                        return;
                    }
                }
                offset = postcard_slot_hash.get({ frame_key }) & (meta.tables.structure.slot_count - 1);
                postcard_slot_offset.apply();
                write_frame(meta.tables.qp.base_va + (bit<64>)offset, frame_words, frame_immediate,
                            postcard_checksum.get({ BYTESWAP32(frame_key) }));
            } else {
                count(CNT_RX_SKETCH_MERGE);
                bit<32> rows = meta.tables.structure.rows;
                if ((bit<32>)hdr.dta.sketch.reporter >= meta.tables.structure.reporters) {
                    consume(CNT_DROP_UNKNOWN_REPORTER);
                    return;
                }
                if ((bit<32>)hdr.dta.sketch.rows != rows
                    || (bit<32>)hdr.dta.sketch.column >= meta.tables.structure.columns) {
                    consume(CNT_DROP_BAD_LENGTH);
                    return;
                }
                bit<32> state_index = meta.tables.structure.state_index;
                sketch_column = (bit<32>)hdr.dta.sketch.column;
                bit<32> expected = expect_column.execute((state_index << P4_SKETCH_REPORTER_BITS)
                                                         | (bit<32>)hdr.dta.sketch.reporter);
                if (sketch_column != expected) {
                    consume(sketch_column > expected ? CNT_DROP_SKETCH_GAP : CNT_DROP_SKETCH_STALE);
                    return;
                }
                bit<32> column_index = (state_index << P4_SKETCH_COLUMN_BITS) | expected;
                reporter_bits.apply();
                bit<32> contributors = contribute.execute(column_index);
                if ((contributors & reporter_bit) != 0) {
                    consume(CNT_DROP_SKETCH_STALE);
                    return;
                }
#define MERGE_ROW(i) \
                if (i < rows) {                                            \
                    if (meta.tables.structure.merge == SKETCH_MERGE_MAX) { \
                        sketch_max_##i.execute(column_index);              \
                    } else {                                               \
                        sketch_sum_##i.execute(column_index);              \
                    }                                                      \
                }
                SOFTDTA_EACH_TNA_SKETCH_ROW(MERGE_ROW)
                contributors = contributors | reporter_bit;
                everyone_masks.apply();
                batch = meta.tables.structure.batch;
                // Reporters send columns in order, so a group is complete when its last column is.
                bool last_of_group = (expected & (batch - 1)) == batch - 1;
                if (contributors != everyone || !last_of_group) {
                    consume(CNT_SKETCH_MERGED);
                    return;
                }
                count(CNT_SKETCH_MERGED);
                hdr.dta.base_ext.setInvalid();
                hdr.dta.sketch.setInvalid();
                hdr.dta.counters.pop_front(16); // all MAX_SKETCH_ROWS of them
                hdr.bridge.kind = BRIDGE_GATHER;
                hdr.dta.gather.setValid();
                hdr.dta.gather.state_index = state_index;
                hdr.dta.gather.qp_index = meta.tables.qp_key.qp_index;
                hdr.dta.gather.first_column = (bit<16>)(expected - (batch - 1));
                hdr.dta.gather.column = (bit<16>)expected;
                hdr.dta.gather.rows = (bit<8>)rows;
                hdr.dta.gather.row = (bit<8>)rows - 1;
                hdr.dta.gather.left = 0; // unused on TNA: the gather ends at the group's first cell
                hdr.dta.gather.gathered = 0;
                hdr.dta.gather.immediate = (bit<8>)immediate;
                ig_tm_md.ucast_egress_port = RECIRCULATION_PORT;
                return;
            }
        }

        // The per-QP part of the iCRC for this frame's shape (control plane, softdta/wire/icrc_split.py).
        meta.tables.icrc_constant_key.qp_index = meta.tables.qp_key.qp_index;
        meta.tables.icrc_constant_key.opcode = hdr.bridge.roce_opcode;
        meta.tables.icrc_constant_key.ip_length = hdr.bridge.ip_length;
        if (!icrc_constant.apply().hit) {
            consume(CNT_DROP_BAD_LENGTH);
            return;
        }
        hdr.bridge.icrc_constant = meta.tables.icrc_constant.constant;
        if (hdr.bridge.kind == BRIDGE_FRAME) {
            hdr.dta.base_v1.setInvalid();
            hdr.dta.append.setInvalid();
            hdr.dta.postcard.setInvalid();
            // Tails longer than one pass's chained hash units finish in a second egress pass.
            ig_tm_md.ucast_egress_port = hdr.bridge.chunks > TAIL_CHUNKS_PER_PASS ? RECIRCULATION_PORT
                                                                                  : (PortId_t)hdr.bridge.egress_port;
        }
    }
}

control SoftdtaIngressDeparser(packet_out pkt, inout tna_headers_t hdr, in metadata_t meta,
                               in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr.bridge);
        pkt.emit(hdr.dta.ethernet);
        pkt.emit(hdr.dta.ipv4);
        pkt.emit(hdr.dta.udp);
        pkt.emit(hdr.dta.gather);
        pkt.emit(hdr.gathered); // in front of the words gathered before, which follow as payload
        pkt.emit(hdr.dta.base_v1);
        pkt.emit(hdr.dta.key_write);
        pkt.emit(hdr.dta.key_increment);
        pkt.emit(hdr.dta.bth);
        pkt.emit(hdr.dta.aeth);
        pkt.emit(hdr.dta.payload); // an Append batch or a Postcarding path
    }
}

parser SoftdtaEgressParser(packet_in pkt, out tna_headers_t hdr, out metadata_t meta,
                           out egress_intrinsic_metadata_t eg_intr_md) {
    ParserCounter() chunks_left;

    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.kind) {
            BRIDGE_GATHER: accept; // passes through on its way back to ingress
            BRIDGE_REPLY: parse_reply;
            BRIDGE_REPLY_CHECK: parse_reply;
            BRIDGE_REPORT: parse_report;
            BRIDGE_ICRC_PASS: parse_built;
            default: parse_frame;
        }
    }
    state parse_reply {
        pkt.extract(hdr.dta.ethernet);
        pkt.extract(hdr.dta.ipv4);
        pkt.extract(hdr.dta.udp);
        pkt.extract(hdr.dta.bth);
        pkt.extract(hdr.dta.aeth);
        transition accept;
    }
    state parse_report {
        pkt.extract(hdr.dta.ethernet);
        pkt.extract(hdr.dta.ipv4);
        pkt.extract(hdr.dta.udp);
        pkt.extract(hdr.dta.base_v1);
        transition select(hdr.dta.base_v1.opcode) {
            DTA_OP_KEY_WRITE: parse_key_write;
            default: parse_key_increment;
        }
    }
    state parse_key_write {
        pkt.extract(hdr.dta.key_write);
        transition accept;
    }
    state parse_key_increment {
        pkt.extract(hdr.dta.key_increment);
        transition accept;
    }
    // A FRAME's payload follows its UDP header: the lead words, then whole chunks.
    state parse_frame {
        pkt.extract(hdr.dta.ethernet);
        pkt.extract(hdr.dta.ipv4);
        pkt.extract(hdr.dta.udp);
        transition parse_lead;
    }
    // The second pass of a long frame: its RoCE headers are built, the payload follows them.
    state parse_built {
        pkt.extract(hdr.dta.ethernet);
        pkt.extract(hdr.dta.ipv4);
        pkt.extract(hdr.dta.udp);
        pkt.extract(hdr.dta.bth);
        pkt.extract(hdr.dta.reth);
        transition select(hdr.dta.bth.opcode) {
            ROCE_OP_RC_WRITE_ONLY_IMM: parse_immdt;
            ROCE_OP_UC_WRITE_ONLY_IMM: parse_immdt;
            default: parse_lead;
        }
    }
    state parse_immdt {
        pkt.extract(hdr.dta.immdt);
        transition parse_lead;
    }
    state parse_lead {
        chunks_left.set(hdr.bridge.chunks);
        transition select(hdr.bridge.lead_words) {
            1: parse_lead_1;
            2: parse_lead_2;
            3: parse_lead_3;
            4: parse_lead_4;
            5: parse_lead_5;
            6: parse_lead_6;
            7: parse_lead_7;
            default: parse_chunks;
        }
    }
    state parse_lead_1 {
        pkt.extract(hdr.lead_1);
        transition parse_chunks;
    }
    state parse_lead_2 {
        pkt.extract(hdr.lead_2);
        transition parse_chunks;
    }
    state parse_lead_3 {
        pkt.extract(hdr.lead_3);
        transition parse_chunks;
    }
    state parse_lead_4 {
        pkt.extract(hdr.lead_4);
        transition parse_chunks;
    }
    state parse_lead_5 {
        pkt.extract(hdr.lead_5);
        transition parse_chunks;
    }
    state parse_lead_6 {
        pkt.extract(hdr.lead_6);
        transition parse_chunks;
    }
    state parse_lead_7 {
        pkt.extract(hdr.lead_7);
        transition parse_chunks;
    }
    state parse_chunks {
        transition select(hdr.bridge.chunks) {
            0: accept;
            default: parse_chunk;
        }
    }
    state parse_chunk {
        pkt.extract(hdr.chunks.next);
        chunks_left.decrement(1);
        transition select(chunks_left.is_zero()) {
            true: accept;
            default: parse_chunk;
        }
    }
}

// CRC-32 of copy n under KeyHash.INDEPENDENT: KEY_HASH_POLYNOMIALS[n], reflected, zlib's init and final XOR.
#define KEY_HASH_UNIT(n) \
    CRCPolynomial<bit<32>>(KEY_HASH_POLYNOMIALS_##n, true, false, false, 32w0xFFFFFFFF, 32w0xFFFFFFFF) poly_##n; \
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, poly_##n) independent_##n;

// va = base + slot * size, with the size a power of two: a shift, and a carry into the upper word.
#define SLOT_OFFSET(shift) \
    action offset_##shift() { offset = slot << shift; }

control SoftdtaEgress(inout tna_headers_t hdr, inout metadata_t meta,
                      in egress_intrinsic_metadata_t eg_intr_md,
                      in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                      inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                      inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    SOFTDTA_REGISTER_QP_STATE_NEXT_PSN
    SOFTDTA_REGISTER_QP_STATE_UNACKED_PSN
    SOFTDTA_REGISTER_QP_STATE_FRAMES_SENT

    Hash<bit<32>>(HashAlgorithm_t.CRC32) dta_v1_key_hash;
    KEY_HASH_UNIT(1)
    KEY_HASH_UNIT(2)
    KEY_HASH_UNIT(3)
    // L(tail): the iCRC polynomial with initial value 0 and no final XOR (softdta/wire/icrc_split.py).
    CRCPolynomial<bit<32>>(KEY_HASH_POLYNOMIALS_0, true, false, false, 32w0, 32w0) tail_poly;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) write_tail;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) write_imm_tail;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) fetch_add_tail;
    // A FRAME's tail: its headers and lead words in one unit (one per lead length, with and without ImmDt),
    // then one unit per chunk, each continuing the CRC of all before it (icrc_split.continue_crc).
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_0;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_1;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_2;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_3;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_4;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_5;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_6;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_7;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_0;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_1;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_2;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_3;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_4;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_5;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_6;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_7;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_0;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_1;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_2;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_3;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_4;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_5;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_6;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_7;

    bit<32> slot;
    bit<32> offset;
    bit<32> psn;
    bit<1> ack_req;
    bit<32> tail; // L over the iCRC tail so far (softdta/wire/icrc_split.py)

    RegisterAction<bit<32>, bit<32>, bit<32>>(qp_state_next_psn) take_psn = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
            value = (value + 1) & 0xffffff;
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(qp_state_next_psn) resync_psn = {
        void apply(inout bit<32> value) {
            value = (bit<32>)hdr.bridge.psn;
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(qp_state_next_psn) read_next_psn = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
        }
    };
    // An RC reply's verdict: 1 if its PSN is outstanding. An ACK then acknowledges every PSN up to its own,
    // and a sequence NAK moves the window's start to its PSN (next_psn follows in the resync pass).
    bit<32> window_end; // next_psn
    bool reply_acks;
    bool reply_resyncs;
    RegisterAction<bit<32>, bit<32>, bit<8>>(qp_state_unacked_psn) take_reply = {
        void apply(inout bit<32> value, out bit<8> result) {
            result = 0;
            if ((((bit<32>)hdr.bridge.psn - value) & PSN_MASK) < ((window_end - value) & PSN_MASK)) {
                result = 1;
                if (reply_acks) {
                    value = ((bit<32>)hdr.bridge.psn + 1) & 0xffffff;
                } else if (reply_resyncs) {
                    value = (bit<32>)hdr.bridge.psn;
                }
            }
        }
    };
    // AckReq on every n-th frame of a QP: the count starts over at the interval.
    RegisterAction<bit<32>, bit<32>, bit<1>>(qp_state_frames_sent) count_frame = {
        void apply(inout bit<32> value, out bit<1> result) {
            if (value + 1 >= (bit<32>)hdr.bridge.ack_req_interval) {
                value = 0;
                result = 1;
            } else {
                value = value + 1;
                result = 0;
            }
        }
    };

    SLOT_OFFSET(3) SLOT_OFFSET(4) SLOT_OFFSET(5) SLOT_OFFSET(6) SLOT_OFFSET(7)
    table slot_offset {
        key = { hdr.bridge.slot_size : exact; }
        actions = { offset_3; offset_4; offset_5; offset_6; offset_7; }
        const entries = {
            8 : offset_3();
            16 : offset_4();
            32 : offset_5();
            64 : offset_6();
            128 : offset_7();
        }
        size = 8;
    }

    // The iCRC: the per-QP constant XOR L over the tail, in wire order.
    action finish_icrc() {
        bit<32> crc = hdr.bridge.icrc_constant ^ tail;
        hdr.dta.icrc.setValid();
        hdr.dta.icrc.value = crc[7:0] ++ crc[15:8] ++ crc[23:16] ++ crc[31:24];
        hdr.bridge.setInvalid();
    }

    apply {
        if (hdr.bridge.kind == BRIDGE_GATHER) {
            return; // a Sketch-Merge group on its way back to ingress
        }
        bit<32> index = hdr.bridge.qp_index;
        if (hdr.bridge.kind == BRIDGE_REPLY_CHECK) {
            bit<3> kind = (bit<3>)(hdr.dta.aeth.syndrome >> AETH_KIND_SHIFT);
            reply_acks = kind == (bit<3>)AETH_ACK;
            reply_resyncs = kind == (bit<3>)AETH_NAK && (bit<5>)(hdr.dta.aeth.syndrome & AETH_VALUE_MASK) == (bit<5>)NAK_PSN_SEQUENCE_ERROR;
            window_end = read_next_psn.execute(index);
            hdr.bridge.kind = take_reply.execute(index) == 1 ? BRIDGE_REPLY_TAKEN : BRIDGE_REPLY_REFUSED;
            return; // out of the recirculation port, back to ingress with the verdict
        }
        if (hdr.bridge.kind == BRIDGE_REPLY) {
            resync_psn.execute(index); // a PSN sequence error NAK: to the PSN the collector expects
            eg_dprsr_md.drop_ctl = 1;
            return;
        }
        if (hdr.bridge.kind == BRIDGE_ICRC_PASS) {
            // The second pass of a long frame: the CRC continues where the first pass left it.
            tail = hdr.bridge.tail_crc;
            if (hdr.chunks[4].isValid()) {
                tail = chunk_4.get({ BYTESWAP32(tail) ^ hdr.chunks[4].w0,
                                     hdr.chunks[4].w1, hdr.chunks[4].w2, hdr.chunks[4].w3, hdr.chunks[4].w4,
                                     hdr.chunks[4].w5, hdr.chunks[4].w6, hdr.chunks[4].w7 });
            }
            if (hdr.chunks[5].isValid()) {
                tail = chunk_5.get({ BYTESWAP32(tail) ^ hdr.chunks[5].w0,
                                     hdr.chunks[5].w1, hdr.chunks[5].w2, hdr.chunks[5].w3, hdr.chunks[5].w4,
                                     hdr.chunks[5].w5, hdr.chunks[5].w6, hdr.chunks[5].w7 });
            }
            if (hdr.chunks[6].isValid()) {
                tail = chunk_6.get({ BYTESWAP32(tail) ^ hdr.chunks[6].w0,
                                     hdr.chunks[6].w1, hdr.chunks[6].w2, hdr.chunks[6].w3, hdr.chunks[6].w4,
                                     hdr.chunks[6].w5, hdr.chunks[6].w6, hdr.chunks[6].w7 });
            }
            if (hdr.chunks[7].isValid()) {
                tail = chunk_7.get({ BYTESWAP32(tail) ^ hdr.chunks[7].w0,
                                     hdr.chunks[7].w1, hdr.chunks[7].w2, hdr.chunks[7].w3, hdr.chunks[7].w4,
                                     hdr.chunks[7].w5, hdr.chunks[7].w6, hdr.chunks[7].w7 });
            }
            finish_icrc();
            return;
        }
        psn = take_psn.execute(index);
        ack_req = 0;
        if (hdr.bridge.transport == TRANSPORT_RC && hdr.bridge.ack_req_interval != 0) {
            ack_req = count_frame.execute(index);
        }

        hdr.dta.ethernet.src = hdr.bridge.src_mac;
        hdr.dta.ethernet.dst = hdr.bridge.collector_mac;
        hdr.dta.ipv4.dscp = (bit<6>)hdr.bridge.dscp;
        hdr.dta.ipv4.ecn = 0;
        hdr.dta.ipv4.total_length = hdr.bridge.ip_length;
        hdr.dta.ipv4.identification = 0;
        hdr.dta.ipv4.flags = 0b010;
        hdr.dta.ipv4.fragment_offset = 0;
        hdr.dta.ipv4.ttl = hdr.bridge.ttl;
        hdr.dta.ipv4.src = hdr.bridge.src_ip;
        hdr.dta.ipv4.dst = hdr.bridge.collector_ip;
        hdr.dta.udp.sport = hdr.bridge.udp_sport;
        hdr.dta.udp.dport = ROCE_PORT;
        hdr.dta.udp.length = hdr.bridge.ip_length - (bit<16>)IPV4_SIZE;
        hdr.dta.udp.checksum = 0;
        hdr.dta.bth.setValid();
        hdr.dta.bth.opcode = hdr.bridge.roce_opcode;
        hdr.dta.bth.solicited = 0;
        hdr.dta.bth.migreq = 1;
        hdr.dta.bth.pad_count = 0;
        hdr.dta.bth.tver = 0;
        hdr.dta.bth.pkey = DEFAULT_PKEY;
        hdr.dta.bth.fecn = 0;
        hdr.dta.bth.becn = 0;
        hdr.dta.bth.reserved6 = 0;
        hdr.dta.bth.dest_qp = hdr.bridge.remote_qpn[23:0];
        hdr.dta.bth.ack_req = ack_req;
        hdr.dta.bth.reserved7 = 0;
        hdr.dta.bth.psn = psn[23:0];

        if (hdr.bridge.kind == BRIDGE_REPORT) {
            // Per copy: its own slot, from its replication ID (not from any register shared by reports).
            bit<8> copy = (bit<8>)eg_intr_md.egress_rid;
            bit<32> reversed_key = BYTESWAP32(hdr.bridge.key);
            bit<32> slot_hash = dta_v1_key_hash.get({ reversed_key, copy });
            if (hdr.bridge.key_hash != KEY_HASH_DTA_V1) {
                if (copy == 1) {
                    slot_hash = independent_1.get({ reversed_key, copy });
                } else if (copy == 2) {
                    slot_hash = independent_2.get({ reversed_key, copy });
                } else if (copy == 3) {
                    slot_hash = independent_3.get({ reversed_key, copy });
                }
            }
            slot = slot_hash & hdr.bridge.slot_mask;
            offset = 0;
            slot_offset.apply(); // dta-v1 Key-Write and Key-Increment slots are 8 bytes; larger ones for other sizes
            bit<32> va_low = hdr.bridge.base_va[31:0] + offset;
            bit<32> va_high = hdr.bridge.base_va[63:32];
            if (va_low < offset) {
                va_high = va_high + 1;
            }
            if (hdr.dta.key_increment.isValid()) {
                hdr.dta.atomic_eth.setValid();
                hdr.dta.atomic_eth.va = va_high ++ va_low;
                hdr.dta.atomic_eth.rkey = hdr.bridge.rkey;
                hdr.dta.atomic_eth.swap_add = hdr.dta.key_increment.counter;
                hdr.dta.atomic_eth.compare = 0;
                tail = fetch_add_tail.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey,
                                            hdr.dta.key_increment.counter, 64w0 });
            } else {
                hdr.dta.reth.setValid();
                hdr.dta.reth.va = va_high ++ va_low;
                hdr.dta.reth.rkey = hdr.bridge.rkey;
                hdr.dta.reth.dma_length = (bit<32>)hdr.bridge.payload_len;
                bit<32> stored_checksum = BYTESWAP32(hdr.bridge.key_checksum);
                hdr.dta.payload[0].setValid();
                hdr.dta.payload[0].word = stored_checksum;
                hdr.dta.payload[1].setValid();
                hdr.dta.payload[1].word = hdr.dta.key_write.data;
                if (hdr.bridge.roce_opcode == ROCE_OP_RC_WRITE_ONLY_IMM
                    || hdr.bridge.roce_opcode == ROCE_OP_UC_WRITE_ONLY_IMM) {
                    hdr.dta.immdt.setValid();
                    hdr.dta.immdt.immediate = hdr.bridge.key_checksum;
                    tail = write_imm_tail.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey,
                                                16w0, hdr.bridge.payload_len, hdr.bridge.key_checksum,
                                                stored_checksum, hdr.dta.key_write.data });
                } else {
                    tail = write_tail.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey,
                                            16w0, hdr.bridge.payload_len, stored_checksum, hdr.dta.key_write.data });
                }
            }
            hdr.dta.base_v1.setInvalid();
            hdr.dta.key_write.setInvalid();
            hdr.dta.key_increment.setInvalid();
        } else {
            // A FRAME: ingress built the payload (Append, Postcarding, Sketch-Merge); its address and ImmDt
            // come in the bridge.
            hdr.dta.reth.setValid();
            hdr.dta.reth.va = hdr.bridge.va;
            hdr.dta.reth.rkey = hdr.bridge.rkey;
            hdr.dta.reth.dma_length = (bit<32>)hdr.bridge.payload_len;
            bit<32> va_high = hdr.bridge.va[63:32];
            bit<32> va_low = hdr.bridge.va[31:0];
            if (hdr.bridge.roce_opcode == ROCE_OP_RC_WRITE_ONLY_IMM
                || hdr.bridge.roce_opcode == ROCE_OP_UC_WRITE_ONLY_IMM) {
                hdr.dta.immdt.setValid();
                hdr.dta.immdt.immediate = hdr.bridge.immediate;
                if (hdr.bridge.lead_words == 0) {
                    tail = head_imm_lead_0.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                                 hdr.bridge.payload_len, hdr.bridge.immediate });
                } else if (hdr.lead_1.isValid()) {
                    tail = head_imm_lead_1.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                                 hdr.bridge.payload_len, hdr.bridge.immediate, hdr.lead_1.w0 });
                } else if (hdr.lead_2.isValid()) {
                    tail = head_imm_lead_2.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                                 hdr.bridge.payload_len, hdr.bridge.immediate, hdr.lead_2.w0,
                                                 hdr.lead_2.w1 });
                } else if (hdr.lead_3.isValid()) {
                    tail = head_imm_lead_3.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                                 hdr.bridge.payload_len, hdr.bridge.immediate, hdr.lead_3.w0,
                                                 hdr.lead_3.w1, hdr.lead_3.w2 });
                } else if (hdr.lead_4.isValid()) {
                    tail = head_imm_lead_4.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                                 hdr.bridge.payload_len, hdr.bridge.immediate, hdr.lead_4.w0,
                                                 hdr.lead_4.w1, hdr.lead_4.w2, hdr.lead_4.w3 });
                } else if (hdr.lead_5.isValid()) {
                    tail = head_imm_lead_5.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                                 hdr.bridge.payload_len, hdr.bridge.immediate, hdr.lead_5.w0,
                                                 hdr.lead_5.w1, hdr.lead_5.w2, hdr.lead_5.w3, hdr.lead_5.w4 });
                } else if (hdr.lead_6.isValid()) {
                    tail = head_imm_lead_6.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                                 hdr.bridge.payload_len, hdr.bridge.immediate, hdr.lead_6.w0,
                                                 hdr.lead_6.w1, hdr.lead_6.w2, hdr.lead_6.w3, hdr.lead_6.w4,
                                                 hdr.lead_6.w5 });
                } else if (hdr.lead_7.isValid()) {
                    tail = head_imm_lead_7.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                                 hdr.bridge.payload_len, hdr.bridge.immediate, hdr.lead_7.w0,
                                                 hdr.lead_7.w1, hdr.lead_7.w2, hdr.lead_7.w3, hdr.lead_7.w4,
                                                 hdr.lead_7.w5, hdr.lead_7.w6 });
                }
            } else {
                if (hdr.bridge.lead_words == 0) {
                    tail = head_lead_0.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                             hdr.bridge.payload_len });
                } else if (hdr.lead_1.isValid()) {
                    tail = head_lead_1.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                             hdr.bridge.payload_len, hdr.lead_1.w0 });
                } else if (hdr.lead_2.isValid()) {
                    tail = head_lead_2.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                             hdr.bridge.payload_len, hdr.lead_2.w0, hdr.lead_2.w1 });
                } else if (hdr.lead_3.isValid()) {
                    tail = head_lead_3.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                             hdr.bridge.payload_len, hdr.lead_3.w0, hdr.lead_3.w1, hdr.lead_3.w2 });
                } else if (hdr.lead_4.isValid()) {
                    tail = head_lead_4.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                             hdr.bridge.payload_len, hdr.lead_4.w0, hdr.lead_4.w1, hdr.lead_4.w2,
                                             hdr.lead_4.w3 });
                } else if (hdr.lead_5.isValid()) {
                    tail = head_lead_5.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                             hdr.bridge.payload_len, hdr.lead_5.w0, hdr.lead_5.w1, hdr.lead_5.w2,
                                             hdr.lead_5.w3, hdr.lead_5.w4 });
                } else if (hdr.lead_6.isValid()) {
                    tail = head_lead_6.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                             hdr.bridge.payload_len, hdr.lead_6.w0, hdr.lead_6.w1, hdr.lead_6.w2,
                                             hdr.lead_6.w3, hdr.lead_6.w4, hdr.lead_6.w5 });
                } else if (hdr.lead_7.isValid()) {
                    tail = head_lead_7.get({ ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0,
                                             hdr.bridge.payload_len, hdr.lead_7.w0, hdr.lead_7.w1, hdr.lead_7.w2,
                                             hdr.lead_7.w3, hdr.lead_7.w4, hdr.lead_7.w5, hdr.lead_7.w6 });
                }
            }
            if (hdr.chunks[0].isValid()) {
                tail = chunk_0.get({ BYTESWAP32(tail) ^ hdr.chunks[0].w0,
                                     hdr.chunks[0].w1, hdr.chunks[0].w2, hdr.chunks[0].w3, hdr.chunks[0].w4,
                                     hdr.chunks[0].w5, hdr.chunks[0].w6, hdr.chunks[0].w7 });
            }
            if (hdr.chunks[1].isValid()) {
                tail = chunk_1.get({ BYTESWAP32(tail) ^ hdr.chunks[1].w0,
                                     hdr.chunks[1].w1, hdr.chunks[1].w2, hdr.chunks[1].w3, hdr.chunks[1].w4,
                                     hdr.chunks[1].w5, hdr.chunks[1].w6, hdr.chunks[1].w7 });
            }
            if (hdr.chunks[2].isValid()) {
                tail = chunk_2.get({ BYTESWAP32(tail) ^ hdr.chunks[2].w0,
                                     hdr.chunks[2].w1, hdr.chunks[2].w2, hdr.chunks[2].w3, hdr.chunks[2].w4,
                                     hdr.chunks[2].w5, hdr.chunks[2].w6, hdr.chunks[2].w7 });
            }
            if (hdr.chunks[3].isValid()) {
                tail = chunk_3.get({ BYTESWAP32(tail) ^ hdr.chunks[3].w0,
                                     hdr.chunks[3].w1, hdr.chunks[3].w2, hdr.chunks[3].w3, hdr.chunks[3].w4,
                                     hdr.chunks[3].w5, hdr.chunks[3].w6, hdr.chunks[3].w7 });
            }
            if (hdr.bridge.chunks > TAIL_CHUNKS_PER_PASS) {
                // The rest of the tail in a second pass (ingress sent this one to the recirculation port).
                hdr.bridge.kind = BRIDGE_ICRC_PASS;
                hdr.bridge.tail_crc = tail;
                return;
            }
        }
        finish_icrc();
    }
}

control SoftdtaEgressDeparser(packet_out pkt, inout tna_headers_t hdr, in metadata_t meta,
                              in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        hdr.dta.ipv4.checksum = ipv4_checksum.update({
            hdr.dta.ipv4.version, hdr.dta.ipv4.ihl, hdr.dta.ipv4.dscp, hdr.dta.ipv4.ecn,
            hdr.dta.ipv4.total_length, hdr.dta.ipv4.identification, hdr.dta.ipv4.flags,
            hdr.dta.ipv4.fragment_offset, hdr.dta.ipv4.ttl, hdr.dta.ipv4.protocol, hdr.dta.ipv4.src,
            hdr.dta.ipv4.dst });
        pkt.emit(hdr.bridge); // only a frame on its way to a second pass, a gather pass or a reply's verdict
        pkt.emit(hdr.dta.ethernet);
        pkt.emit(hdr.dta.ipv4);
        pkt.emit(hdr.dta.udp);
        pkt.emit(hdr.dta.bth);
        pkt.emit(hdr.dta.aeth); // a reply on its way back to ingress
        pkt.emit(hdr.dta.reth);
        pkt.emit(hdr.dta.atomic_eth);
        pkt.emit(hdr.dta.immdt);
        pkt.emit(hdr.dta.payload[0]); // a Key-Write's key checksum and data
        pkt.emit(hdr.dta.payload[1]);
        pkt.emit(hdr.lead_1);
        pkt.emit(hdr.lead_2);
        pkt.emit(hdr.lead_3);
        pkt.emit(hdr.lead_4);
        pkt.emit(hdr.lead_5);
        pkt.emit(hdr.lead_6);
        pkt.emit(hdr.lead_7);
        pkt.emit(hdr.chunks);
        pkt.emit(hdr.dta.icrc);
    }
}

Pipeline(SoftdtaIngressParser(), SoftdtaIngress(), SoftdtaIngressDeparser(), SoftdtaEgressParser(),
         SoftdtaEgress(), SoftdtaEgressDeparser()) pipe;
Switch(pipe) main;
