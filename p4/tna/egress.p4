// The TNA translator's egress: per-QP PSNs, the reply window, the frame's RoCE headers and the chained
// iCRC (p4/softdta_tna.p4 includes this file).

// CRC-32 of copy n under KeyHash.INDEPENDENT: KEY_HASH_POLYNOMIALS[n], reflected, zlib's init and final XOR.
#define KEY_HASH_UNIT(n) \
    CRCPolynomial<bit<32>>(KEY_HASH_POLYNOMIALS_##n, true, false, false, 32w0xFFFFFFFF, 32w0xFFFFFFFF) poly_##n; \
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, poly_##n) independent_##n;

// va = base + slot * size, with the size a power of two: a shift, and a carry into the upper word.
#define SLOT_OFFSET_ACTION(size, shift) action offset_##shift() { offset = slot << shift; }
#define SLOT_OFFSET_NAME(size, shift) offset_##shift;
#define SLOT_OFFSET_ENTRY(size, shift) size : offset_##shift();

// The tail's hash units, in wire order: the headers and lead words of a FRAME (with or without ImmDt) in one
// unit, chosen by the lead header that is valid, then each chunk continuing the CRC (icrc_split.continue_crc).
#define FRAME_TAIL_HEAD ack_req, 7w0, psn[23:0], va_high, va_low, hdr.bridge.rkey, 16w0, hdr.bridge.payload_len
#define HEAD_IMM_LEAD(n) \
    else if (hdr.lead_##n.isValid()) {                                                                           \
        tail = head_imm_lead_##n.get({ FRAME_TAIL_HEAD, hdr.bridge.immediate,                                    \
                                       SOFTDTA_TAIL_LEAD_WORDS_##n(hdr.lead_##n) });                             \
    }
#define HEAD_LEAD(n) \
    else if (hdr.lead_##n.isValid()) {                                                                           \
        tail = head_lead_##n.get({ FRAME_TAIL_HEAD, SOFTDTA_TAIL_LEAD_WORDS_##n(hdr.lead_##n) });                \
    }
#define CHUNK_HASH(c) \
    if (hdr.chunks[c].isValid()) {                                                                               \
        tail = chunk_##c.get({ BYTESWAP32(tail) ^ hdr.chunks[c].w0,                                              \
                               SOFTDTA_TAIL_CHUNK_WORDS_AFTER_FIRST(hdr.chunks[c]) });                           \
    }

control SoftdtaEgress(inout tna_headers_t hdr, inout metadata_t meta,
                      in egress_intrinsic_metadata_t eg_intr_md,
                      in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                      inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                      inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    SOFTDTA_REGISTER_QP_STATE_NEXT_PSN
    SOFTDTA_REGISTER_QP_STATE_UNACKED_PSN
    SOFTDTA_REGISTER_QP_STATE_FRAMES_SENT

    Hash<bit<32>>(HashAlgorithm_t.CRC32) dta_v1_key_hash;
    SOFTDTA_EACH_EXTRA_COPY(KEY_HASH_UNIT)
    // L(tail): the iCRC polynomial with initial value 0 and no final XOR (softdta/wire/icrc_split.py).
    CRCPolynomial<bit<32>>(KEY_HASH_POLYNOMIALS_0, true, false, false, 32w0, 32w0) tail_poly;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) write_tail;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) write_imm_tail;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) fetch_add_tail;
    // A FRAME's tail: its headers and lead words in one unit (one per lead length, with and without ImmDt),
    // then one unit per chunk, each continuing the CRC of all before it (icrc_split.continue_crc).
#define HEAD_LEAD_UNIT(n) Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_lead_##n;
#define HEAD_IMM_LEAD_UNIT(n) Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) head_imm_lead_##n;
#define CHUNK_UNIT(c) Hash<bit<32>>(HashAlgorithm_t.CUSTOM, tail_poly) chunk_##c;
    SOFTDTA_EACH_TNA_LEAD_LENGTH(HEAD_LEAD_UNIT)
    SOFTDTA_EACH_TNA_LEAD_LENGTH(HEAD_IMM_LEAD_UNIT)
    SOFTDTA_EACH_TNA_CHUNK(CHUNK_UNIT)

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

    SOFTDTA_EACH_KEYED_SLOT_SHIFT(SLOT_OFFSET_ACTION)
    table slot_offset {
        key = { hdr.bridge.slot_size : exact; }
        actions = { SOFTDTA_EACH_KEYED_SLOT_SHIFT(SLOT_OFFSET_NAME) }
        const entries = {
            SOFTDTA_EACH_KEYED_SLOT_SHIFT(SLOT_OFFSET_ENTRY)
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
            SOFTDTA_EACH_TNA_SECOND_PASS_CHUNK(CHUNK_HASH)
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
#define INDEPENDENT_COPY_HASH(n) \
                if (copy == n) {                                          \
                    slot_hash = independent_##n.get({ reversed_key, copy }); \
                } else
                SOFTDTA_EACH_EXTRA_COPY(INDEPENDENT_COPY_HASH) {}
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
                    tail = head_imm_lead_0.get({ FRAME_TAIL_HEAD, hdr.bridge.immediate });
                }
                SOFTDTA_EACH_TNA_LEAD(HEAD_IMM_LEAD)
            } else {
                if (hdr.bridge.lead_words == 0) {
                    tail = head_lead_0.get({ FRAME_TAIL_HEAD });
                }
                SOFTDTA_EACH_TNA_LEAD(HEAD_LEAD)
            }
            SOFTDTA_EACH_TNA_FIRST_PASS_CHUNK(CHUNK_HASH)
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
#define EMIT_LEAD(n) pkt.emit(hdr.lead_##n);
        SOFTDTA_EACH_TNA_LEAD(EMIT_LEAD)
        pkt.emit(hdr.chunks);
        pkt.emit(hdr.dta.icrc);
    }
}
