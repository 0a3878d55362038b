// The TNA translator's ingress: table lookups, the QP gate, and the state of Append, Postcarding and
// Sketch-Merge (p4/softdta_tna.p4 includes this file).

// The gate of a QP: its state and the end of its grace period, one register pair so one stateful ALU
// decides (TNA's form of qp_state.state and qp_state.grace_until_ns, which need two ALUs in one decision).
struct qp_gate_t {
    bit<32> state;
    bit<32> grace_until;
}

control SoftdtaIngress(inout tna_headers_t hdr, inout metadata_t meta,
                       in ingress_intrinsic_metadata_t ig_intr_md,
                       in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                       inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                       inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
#include "../softdta_tables.p4"

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
    // The fleet's partition hash: the slot of a report to the fleet address.
    CRCPolynomial<bit<32>>(PARTITION_POLYNOMIAL, true, false, false, 32w0xFFFFFFFF, 32w0xFFFFFFFF) partition_poly;
    Hash<bit<32>>(HashAlgorithm_t.CUSTOM, partition_poly) partition_hash_unit;

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
        hdr.bridge.chunks = words >> TAIL_CHUNK_WORD_BITS;
        hdr.bridge.ip_length = (bit<16>)IPV4_SIZE + (bit<16>)UDP_SIZE + (bit<16>)BTH_SIZE + (bit<16>)RETH_SIZE
                               + (immediate == 1 ? (bit<16>)IMMDT_SIZE : 16w0) + ((bit<16>)words << 2)
                               + (bit<16>)ICRC_LEN;
    }

    // slot * slot_size: Postcarding slots are powers of two (4 bytes per hop, rounded up).
#define POSTCARD_OFFSET_ACTION(size, shift) action offset_##shift() { offset = offset << shift; }
#define POSTCARD_OFFSET_NAME(size, shift) offset_##shift;
#define POSTCARD_OFFSET_ENTRY(size, shift) size : offset_##shift();
    SOFTDTA_EACH_POSTCARD_SLOT_SHIFT(POSTCARD_OFFSET_ACTION)
    table postcard_slot_offset {
        key = { meta.tables.structure.slot_size : exact; }
        actions = { SOFTDTA_EACH_POSTCARD_SLOT_SHIFT(POSTCARD_OFFSET_NAME) }
        const entries = {
            SOFTDTA_EACH_POSTCARD_SLOT_SHIFT(POSTCARD_OFFSET_ENTRY)
        }
        size = 8;
    }

    // Shifts by a packet's value are lookups: the ALUs shift by constants.
    action set_hop_bit(bit<8> value) { hop_bit = value; }
#define SET_HOP_BIT_ENTRY(key, value) key : set_hop_bit(value);
    table hop_bits {
        key = { hdr.dta.postcard.hop : exact; }
        actions = { set_hop_bit; }
        const entries = {
            SOFTDTA_EACH_POSTCARD_HOP_BIT(SET_HOP_BIT_ENTRY)
        }
        size = 8;
    }
    // A path's hop mask once every hop reported.
    action set_complete_mask(bit<8> value) { complete_mask = value; }
#define SET_COMPLETE_MASK_ENTRY(key, value) key : set_complete_mask(value);
    table complete_masks {
        key = { meta.tables.structure.hops : exact; }
        actions = { set_complete_mask; }
        const entries = {
            SOFTDTA_EACH_POSTCARD_COMPLETE_MASK(SET_COMPLETE_MASK_ENTRY)
        }
        size = 8;
    }
    // A reporter's bit among a column's contributors.
    action set_reporter_bit(bit<32> value) { reporter_bit = value; }
#define SET_REPORTER_BIT_ENTRY(key, value) key : set_reporter_bit(value);
    table reporter_bits {
        key = { hdr.dta.sketch.reporter : exact; }
        actions = { set_reporter_bit; }
        const entries = {
            SOFTDTA_EACH_SKETCH_REPORTER_BIT(SET_REPORTER_BIT_ENTRY)
        }
        size = 32;
    }
    // The contributors of a complete column.
    action set_everyone(bit<32> value) { everyone = value; }
#define SET_EVERYONE_ENTRY(key, value) key : set_everyone(value);
    table everyone_masks {
        key = { meta.tables.structure.reporters : exact; }
        actions = { set_everyone; }
        const entries = {
            SOFTDTA_EACH_SKETCH_EVERYONE_MASK(SET_EVERYONE_ENTRY)
        }
        size = 32;
    }

    // The slot mask of the fleet's slot map, 2^slot_bits - 1.
    bit<32> fleet_slot_mask;
    action set_fleet_slot_mask(bit<32> value) { fleet_slot_mask = value; }
#define SET_FLEET_SLOT_MASK_ENTRY(key, value) key : set_fleet_slot_mask(value);
    table fleet_slot_masks {
        key = { meta.tables.fleet_config.slot_bits : exact; }
        actions = { set_fleet_slot_mask; }
        const entries = {
            SOFTDTA_EACH_FLEET_SLOT_MASK(SET_FLEET_SLOT_MASK_ENTRY)
        }
        size = 16;
    }

    // first_column * rows * 4 without a multiplier: one sum of shifts per row count.
#define COLUMN_BYTES_ACTION(rows) action column_bytes_##rows() { offset = SOFTDTA_ROW_BYTES_##rows(offset); }
#define COLUMN_BYTES_NAME(rows) column_bytes_##rows;
#define COLUMN_BYTES_ENTRY(rows) rows : column_bytes_##rows();
    SOFTDTA_EACH_SKETCH_ROWS(COLUMN_BYTES_ACTION)
    table sketch_group_offset {
        key = { hdr.dta.gather.rows : exact; }
        actions = { SOFTDTA_EACH_SKETCH_ROWS(COLUMN_BYTES_NAME) }
        const entries = {
            SOFTDTA_EACH_SKETCH_ROWS(COLUMN_BYTES_ENTRY)
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
                // At the fleet address: the first replica of the partition key's slot that holds a structure of
                // this primitive.
                meta.tables.fleet_config_key.index = 0;
                if (fleet_config.apply().hit && meta.tables.fleet_config.address == hdr.dta.ipv4.dst) {
                    bit<32> partition_hash = 0; // Sketch-Merge's key is empty: its CRC is 0 (init and xorout cancel)
                    if (hdr.dta.key_write.isValid()) {
                        partition_hash = partition_hash_unit.get({ hdr.dta.key_write.key });
                    } else if (hdr.dta.key_increment.isValid()) {
                        partition_hash = partition_hash_unit.get({ hdr.dta.key_increment.key });
                    } else if (hdr.dta.postcard.isValid()) {
                        partition_hash = partition_hash_unit.get({ hdr.dta.postcard.key });
                    }
                    fleet_slot_mask = 0;
                    fleet_slot_masks.apply(); // slot_bits is 1..MAX_SLOT_BITS (tables.Fleet.validate)
                    meta.tables.fleet_slot_key.slot = partition_hash & fleet_slot_mask;
                    bit<4> holders = 0;
                    if (fleet_slot.apply().hit) {
                        // Tofino shifts by constants only: one slice of has_structure per primitive.
                        bit<32> has_structure = meta.tables.fleet_slot.has_structure;
                        if (opcode == DTA_OP_KEY_WRITE) {
                            holders = has_structure[4 * DTA_OP_KEY_WRITE + 3:4 * DTA_OP_KEY_WRITE];
                        } else if (opcode == DTA_OP_KEY_INCREMENT) {
                            holders = has_structure[4 * DTA_OP_KEY_INCREMENT + 3:4 * DTA_OP_KEY_INCREMENT];
                        } else if (opcode == DTA_OP_POSTCARDING) {
                            holders = has_structure[4 * DTA_OP_POSTCARDING + 3:4 * DTA_OP_POSTCARDING];
                        } else if (opcode == DTA_OP_SKETCH_MERGE) {
                            holders = has_structure[4 * DTA_OP_SKETCH_MERGE + 3:4 * DTA_OP_SKETCH_MERGE];
                        }
                    }
                    if (holders == 0) {
                        consume(CNT_DROP_FLEET_UNMAPPED);
                        return;
                    }
                    count(CNT_FLEET_RESOLVED);
                    bit<128> replicas = meta.tables.fleet_slot.collector_ip;
                    meta.tables.structure_key.collector_ip = holders[0:0] == 1 ? replicas[127:96]
                        : (holders[1:1] == 1 ? replicas[95:64]
                        : (holders[2:2] == 1 ? replicas[63:32] : replicas[31:0]));
                }
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
