// softdta translator for TNA (Tofino-1): Key-Write and Key-Increment with per-copy slots from the egress
// replication ID, per-QP PSNs, AETH resync with a time-based grace, and the iCRC as a per-QP constant XOR a
// CRC over the variable tail. Layouts and control-plane tables come from the generated softdta_spec.p4 and
// softdta_tables.p4; docs/p4.md says what this program covers and what it does not (Append, Postcarding and
// Sketch-Merge run on the v1model program and the XDP translator).
//
//   p4test --std p4-16 -I <tofino includes> -D__TARGET_TOFINO__=1 softdta_tna.p4     (or bf-p4c)

#include <core.p4>
#include <tna.p4>

#include "softdta_spec.p4"
#include "softdta_types.p4"
#include "softdta_registers.p4"

const bit<8> BRIDGE_REPORT = 1;
const bit<8> BRIDGE_REPLY = 2;
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
    bit<32> grace_units; // grace_ns / 1024: the gate counts time in 1.024 us units
    bit<8> syndrome; // a reply's AETH syndrome
    bit<24> psn; // a reply's PSN
}

struct tna_headers_t {
    bridge_h bridge;
    headers_t dta;
}

// The gate of a QP: its state and the end of its grace period, one register pair so one stateful ALU
// decides (TNA's form of qp_state.state and qp_state.grace_until_ns, which need two ALUs in one decision).
struct qp_gate_t {
    bit<32> state;
    bit<32> grace_until;
}

parser SoftdtaIngressParser(packet_in pkt, out tna_headers_t hdr, out metadata_t meta,
                            out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        transition parse_ethernet;
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
            DTA_PORT: parse_base_v1;
            ROCE_PORT: parse_bth;
            default: accept;
        }
    }
    state parse_base_v1 {
        pkt.extract(hdr.dta.base_v1);
        transition select(hdr.dta.base_v1.opcode) {
            DTA_OP_KEY_WRITE: parse_key_write;
            DTA_OP_KEY_INCREMENT: parse_key_increment;
            default: accept;
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

control SoftdtaIngress(inout tna_headers_t hdr, inout metadata_t meta,
                       in ingress_intrinsic_metadata_t ig_intr_md,
                       in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                       inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                       inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
#include "softdta_tables.p4"

    Counter<bit<32>, bit<32>>((bit<32>)COUNTER_SLOTS, CounterType_t.PACKETS) translator_counters;
    Hash<bit<32>>(HashAlgorithm_t.CRC32) key_checksum;

    action consume(bit<8> slot) {
        translator_counters.count((bit<32>)slot);
        ig_dprsr_md.drop_ctl = 1;
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
        hdr.bridge.grace_units = meta.tables.translator_config.grace_ns[41:10];
    }

    apply {
        if (ig_prsr_md.parser_err != 0 || !hdr.dta.udp.isValid()) {
            ig_dprsr_md.drop_ctl = 1;
            return;
        }
        meta.tables.translator_config_key.index = 0;
        if (!translator_config.apply().hit) {
            ig_dprsr_md.drop_ctl = 1;
            return;
        }
        if (hdr.dta.aeth.isValid()) {
            // A collector reply: egress owns the QP registers, so it goes there with its AETH.
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
            bridge_qp();
            hdr.bridge.kind = BRIDGE_REPLY;
            hdr.bridge.syndrome = hdr.dta.aeth.syndrome;
            hdr.bridge.psn = hdr.dta.bth.psn;
            ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port;
            return;
        }
        if (hdr.dta.udp.dport != DTA_PORT) {
            ig_dprsr_md.drop_ctl = 1;
            return;
        }
        translator_counters.count((bit<32>)CNT_RX_REPORTS);
        if (!(hdr.dta.key_write.isValid() || hdr.dta.key_increment.isValid())) {
            consume(CNT_DROP_UNKNOWN_OPCODE); // other primitives: v1model program or XDP translator
            return;
        }
        if (meta.tables.translator_config.profile != 0) {
            consume(CNT_DROP_BAD_PROFILE); // compiled for the 3-byte dta-v1 base header
            return;
        }
        meta.tables.structure_key.collector_ip = hdr.dta.ipv4.dst;
        meta.tables.structure_key.primitive = (bit<32>)hdr.dta.base_v1.opcode;
        if (!structure.apply().hit) {
            consume(CNT_DROP_UNKNOWN_COLLECTOR);
            return;
        }
        meta.tables.qp_key.qp_index = meta.tables.structure.qp_index;
        if (!qp.apply().hit) {
            consume(CNT_DROP_UNKNOWN_QP);
            return;
        }
        bit<8> redundancy = hdr.dta.key_write.isValid() ? hdr.dta.key_write.redundancy
                                                        : hdr.dta.key_increment.redundancy;
        if (redundancy == 0 || redundancy > MAX_REDUNDANCY) {
            consume(CNT_DROP_BAD_REDUNDANCY);
            return;
        }
        bridge_qp();
        hdr.bridge.kind = BRIDGE_REPORT;
        hdr.bridge.key_hash = (bit<8>)meta.tables.structure.key_hash;
        hdr.bridge.slot_size = (bit<8>)meta.tables.structure.slot_size;
        hdr.bridge.slot_mask = meta.tables.structure.slot_count - 1;
        bit<1> immediate = hdr.dta.base_v1.immediate;
        bit<32> report_key = hdr.dta.key_write.isValid() ? hdr.dta.key_write.key : hdr.dta.key_increment.key;
        hdr.bridge.key = report_key;
        hdr.bridge.key_checksum = key_checksum.get({ report_key[7:0], report_key[15:8], report_key[23:16],
                                                     report_key[31:24] });
        if (hdr.dta.key_write.isValid()) {
            translator_counters.count((bit<32>)CNT_RX_KEY_WRITE);
            if (meta.tables.structure.key_len != 4 || meta.tables.structure.data_len != 4) {
                consume(CNT_DROP_BAD_LENGTH);
                return;
            }
            bool rc = meta.tables.qp.transport == TRANSPORT_RC;
            hdr.bridge.roce_opcode = immediate == 1 ? (rc ? ROCE_OP_RC_WRITE_ONLY_IMM : ROCE_OP_UC_WRITE_ONLY_IMM)
                                                    : (rc ? ROCE_OP_RC_WRITE_ONLY : ROCE_OP_UC_WRITE_ONLY);
            hdr.bridge.payload_len = 8; // key checksum, data
            hdr.bridge.ip_length = (bit<16>)IPV4_SIZE + (bit<16>)UDP_SIZE + (bit<16>)BTH_SIZE + (bit<16>)RETH_SIZE
                                   + (immediate == 1 ? (bit<16>)IMMDT_SIZE : 16w0) + 8 + (bit<16>)ICRC_LEN;
        } else {
            translator_counters.count((bit<32>)CNT_RX_KEY_INCREMENT);
            hdr.bridge.roce_opcode = ROCE_OP_RC_FETCH_ADD;
            hdr.bridge.payload_len = 0;
            hdr.bridge.ip_length = (bit<16>)IPV4_SIZE + (bit<16>)UDP_SIZE + (bit<16>)BTH_SIZE
                                   + (bit<16>)ATOMIC_ETH_SIZE + (bit<16>)ICRC_LEN;
        }
        meta.tables.icrc_constant_key.qp_index = meta.tables.qp_key.qp_index;
        meta.tables.icrc_constant_key.opcode = hdr.bridge.roce_opcode;
        meta.tables.icrc_constant_key.ip_length = hdr.bridge.ip_length;
        if (!icrc_constant.apply().hit) {
            consume(CNT_DROP_BAD_LENGTH);
            return;
        }
        hdr.bridge.icrc_constant = meta.tables.icrc_constant.constant;
        // N copies, one per replication ID 0..N-1: egress hashes copy `rid`'s own slot.
        ig_tm_md.mcast_grp_a = (bit<16>)(meta.tables.qp.ifindex * (bit<32>)MAX_REDUNDANCY + (bit<32>)redundancy);
    }
}

control SoftdtaIngressDeparser(packet_out pkt, inout tna_headers_t hdr, in metadata_t meta,
                               in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr.bridge);
        pkt.emit(hdr.dta.ethernet);
        pkt.emit(hdr.dta.ipv4);
        pkt.emit(hdr.dta.udp);
        pkt.emit(hdr.dta.base_v1);
        pkt.emit(hdr.dta.key_write);
        pkt.emit(hdr.dta.key_increment);
        pkt.emit(hdr.dta.bth);
        pkt.emit(hdr.dta.aeth);
    }
}

parser SoftdtaEgressParser(packet_in pkt, out tna_headers_t hdr, out metadata_t meta,
                           out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        pkt.extract(hdr.dta.ethernet);
        pkt.extract(hdr.dta.ipv4);
        pkt.extract(hdr.dta.udp);
        transition select(hdr.bridge.kind) {
            BRIDGE_REPLY: parse_bth;
            default: parse_base_v1;
        }
    }
    state parse_base_v1 {
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
    state parse_bth {
        pkt.extract(hdr.dta.bth);
        pkt.extract(hdr.dta.aeth);
        transition accept;
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
#define SOFTDTA_REGISTER(W, N) Register<bit<W>, bit<32>>(N)
    SOFTDTA_REGISTER_QP_STATE_NEXT_PSN
    SOFTDTA_REGISTER_QP_STATE_FRAMES_SENT
    Register<qp_gate_t, bit<32>>((bit<32>)QP_STATE_MAX_ENTRIES) qp_gate;

    Hash<bit<32>>(HashAlgorithm_t.CRC32) dta_v1_key_hash;
    KEY_HASH_UNIT(1)
    KEY_HASH_UNIT(2)
    KEY_HASH_UNIT(3)
    // L(tail): the iCRC polynomial with initial value 0 and no final XOR (softdta/icrc_split.py).
    CRCPolynomial<bit<32>>(KEY_HASH_POLYNOMIALS_0, true, false, false, 32w0, 32w0) tail_poly;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) write_tail;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) write_imm_tail;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) fetch_add_tail;

    bit<32> now; // ingress-to-egress global time in 1.024 us units
    bit<32> slot;
    bit<32> offset;
    bit<32> psn;
    bit<32> gate;
    bit<1> ack_req;

    RegisterAction<bit<32>, bit<32>, bit<32>>(qp_state_next_psn) take_psn = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
            value = (value + 1) & 0xffffff;
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(qp_state_next_psn) resync_psn = {
        void apply(inout bit<32> value) {
            value = (bit<32>)hdr.dta.bth.psn;
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
            value.grace_until = now + hdr.bridge.grace_units;
        }
    };
    RegisterAction<qp_gate_t, bit<32>, bit<32>>(qp_gate) fail_gate = {
        void apply(inout qp_gate_t value) {
            value.state = GATE_FAILED;
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

    apply {
        now = eg_prsr_md.global_tstamp[41:10];
        bit<32> index = hdr.bridge.qp_index;
        if (hdr.bridge.kind == BRIDGE_REPLY) {
            // AETH: only a PSN sequence error NAK resyncs, to the PSN the collector expects.
            bit<3> kind = hdr.bridge.syndrome[7:5];
            bit<5> code = hdr.bridge.syndrome[4:0];
            if (kind == (bit<3>)AETH_NAK) {
                if (code == (bit<5>)NAK_PSN_SEQUENCE_ERROR) {
                    resync_psn.execute(index);
                    start_grace.execute(index);
                } else {
                    fail_gate.execute(index);
                }
            }
            eg_dprsr_md.drop_ctl = 1;
            return;
        }
        gate = pass_gate.execute(index);
        if (gate != GATE_ACTIVE) {
            eg_dprsr_md.drop_ctl = 1; // grace or failed: the collector would reject the frame
            return;
        }

        // Per copy: its own slot, from its replication ID (not from any register shared by reports).
        bit<8> copy = (bit<8>)eg_intr_md.egress_rid;
        bit<32> reversed_key = hdr.bridge.key[7:0] ++ hdr.bridge.key[15:8] ++ hdr.bridge.key[23:16]
                               ++ hdr.bridge.key[31:24];
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

        bit<32> tail;
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
            bit<32> stored_checksum = hdr.bridge.key_checksum[7:0] ++ hdr.bridge.key_checksum[15:8]
                                      ++ hdr.bridge.key_checksum[23:16] ++ hdr.bridge.key_checksum[31:24];
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
        bit<32> crc = hdr.bridge.icrc_constant ^ tail;
        hdr.dta.icrc.setValid();
        hdr.dta.icrc.value = crc[7:0] ++ crc[15:8] ++ crc[23:16] ++ crc[31:24];
        hdr.dta.base_v1.setInvalid();
        hdr.dta.key_write.setInvalid();
        hdr.dta.key_increment.setInvalid();
        hdr.bridge.setInvalid();
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
        pkt.emit(hdr.dta.ethernet);
        pkt.emit(hdr.dta.ipv4);
        pkt.emit(hdr.dta.udp);
        pkt.emit(hdr.dta.bth);
        pkt.emit(hdr.dta.reth);
        pkt.emit(hdr.dta.atomic_eth);
        pkt.emit(hdr.dta.immdt);
        pkt.emit(hdr.dta.payload[0]); // a Key-Write's key checksum and data: no other word is ever valid here
        pkt.emit(hdr.dta.payload[1]);
        pkt.emit(hdr.dta.icrc);
    }
}

Pipeline(SoftdtaIngressParser(), SoftdtaIngress(), SoftdtaIngressDeparser(), SoftdtaEgressParser(),
         SoftdtaEgress(), SoftdtaEgressDeparser()) pipe;
Switch(pipe) main;
