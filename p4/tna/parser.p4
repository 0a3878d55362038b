// The TNA translator's parsers (p4/softdta_tna.p4 includes this file after the shared types).

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
#define LEAD_CASE(n) n: parse_lead_##n;
        transition select(hdr.bridge.lead_words) {
            SOFTDTA_EACH_TNA_LEAD(LEAD_CASE)
            default: parse_chunks;
        }
    }
#define LEAD_STATE(n)                \
    state parse_lead_##n {           \
        pkt.extract(hdr.lead_##n);   \
        transition parse_chunks;     \
    }
    SOFTDTA_EACH_TNA_LEAD(LEAD_STATE)
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
