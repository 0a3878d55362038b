// softdta translator for TNA (Tofino-1): every dta-v1 primitive. Key-Write and Key-Increment with per-copy
// slots from the egress replication ID; Append batches in registers with the ring wrap; Postcarding with a
// cache whose evicted path goes to the evicted key's own slot; Sketch-Merge merged in registers and collected
// by recirculation; per-QP PSNs, AETH resync with a time-based grace, and the iCRC as a per-QP constant XOR a
// CRC over the variable tail, chained over hash units (softdta/wire/icrc_split.py). docs/p4.md says what is
// verified.
//
// This file holds what both gresses share (the bridge header, the headers type) and the pipeline; the parsers,
// ingress and egress are in tna/. Layouts, control-plane tables, registers and the unrolled families come from
// the generated softdta_spec.p4, softdta_tables.p4, softdta_registers.p4 and softdta_tna_unrolled.p4.
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
#include "softdta_tna_unrolled.p4"

const bit<8> BRIDGE_REPORT = 1;
const bit<8> BRIDGE_REPLY = 2;
const bit<8> BRIDGE_FRAME = 3; // a WRITE whose payload ingress built (Append, Postcarding, Sketch-Merge)
const bit<8> BRIDGE_GATHER = 4; // a Sketch-Merge group being collected, one word per recirculation
const bit<8> BRIDGE_ICRC_PASS = 5; // a frame whose tail CRC continues in a second egress pass
const bit<8> BRIDGE_REPLY_CHECK = 6; // an RC reply, to egress, which owns the PSN window
const bit<8> BRIDGE_REPLY_TAKEN = 7; // ... back to ingress: its PSN was outstanding
const bit<8> BRIDGE_REPLY_REFUSED = 8; // ... back to ingress: its PSN was not
const PortId_t RECIRCULATION_PORT = 68; // pipe 0's recirculation port on Tofino-1
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

struct tna_headers_t {
    bridge_h bridge;
    headers_t dta;
    word_h gathered; // the word a gather pass adds in front of those gathered before
    // A FRAME's payload in egress: its lead, (payload words mod TAIL_CHUNK_WORDS) words, hashed with the
    // headers, then whole chunks, one chained hash unit each.
#define LEAD_HEADER(n) tail_lead_##n##_h lead_##n;
    SOFTDTA_EACH_TNA_LEAD(LEAD_HEADER)
    tail_chunk_h[SOFTDTA_TAIL_CHUNKS] chunks;
}

// TNA registers: one element type, indexed by bit<32>. A register is accessed once per packet, so a record
// whose words are all read at once (an Append batch, a Postcarding path, a sketch column) has one register
// per word.
#define SOFTDTA_REGISTER(W, N) Register<bit<W>, bit<32>>(N)

#include "tna/parser.p4"
#include "tna/ingress.p4"
#include "tna/egress.p4"

Pipeline(SoftdtaIngressParser(), SoftdtaIngress(), SoftdtaIngressDeparser(), SoftdtaEgressParser(),
         SoftdtaEgress(), SoftdtaEgressDeparser()) pipe;
Switch(pipe) main;
