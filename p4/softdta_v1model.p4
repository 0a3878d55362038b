// softdta translator for v1model (bmv2 simple_switch): DTA reports in, RoCEv2 frames out, like the XDP
// translator and softdta.core.translator (the oracle). Layouts, tables and registers come from the generated
// softdta_spec.p4, softdta_tables.p4 and softdta_registers.p4; docs/p4.md explains the pipeline.
//
//   p4c-bm2-ss --std p4-16 --p4runtime-files softdta.p4info.txtpb -o softdta.json softdta_v1model.p4
//
// Reports use the dta-v1 base header (3 bytes, with seqnum); Sketch-Merge uses the extended one.

#include <core.p4>
#include <v1model.p4>

#include "softdta_spec.p4"
#include "softdta_types.p4"
#include "softdta_registers.p4"

const bit<32> INSTANCE_RECIRCULATED = 4; // bmv2's instance_type of a recirculated packet
const bit<8> GATHER_FIELDS = 0; // no metadata survives recirculation: the gather header carries the state

// v1model registers are global: ingress and egress both reach them.
#define SOFTDTA_REGISTER(W, N) register<bit<W>>(N)
SOFTDTA_QP_STATE_REGISTERS
SOFTDTA_APPEND_STATE_REGISTERS
SOFTDTA_POSTCARD_CACHE_REGISTERS
SOFTDTA_SKETCH_COLUMN_REGISTERS
SOFTDTA_SKETCH_REPORTER_REGISTERS
SOFTDTA_REPORTER_SEQ_REGISTERS

@name(".translator_counters") counter((bit<32>)COUNTER_SLOTS, CounterType.packets) translator_counters;

parser SoftdtaParser(packet_in packet, out headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t std) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ethertype) {
            ETH_P_IP: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (4w5, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        packet.extract(hdr.udp);
        transition select(std.instance_type, hdr.udp.dport) {
            (INSTANCE_RECIRCULATED, _): parse_gather;
            (_, DTA_PORT): parse_dta;
            (_, ROCE_PORT): parse_bth;
            default: accept;
        }
    }
    state parse_gather {
        packet.extract(hdr.gather);
        meta.words_left = hdr.gather.gathered;
        transition select(hdr.gather.gathered) {
            0: accept;
            default: parse_gathered_word;
        }
    }
    state parse_gathered_word {
        packet.extract(hdr.payload.next);
        meta.words_left = meta.words_left - 1;
        transition select(meta.words_left) {
            0: accept;
            default: parse_gathered_word;
        }
    }
    state parse_dta {
        transition select(packet.lookahead<bit<8>>()) {
            EXTENDED_FIRST_BYTE: parse_base_ext;
            default: parse_base_v1;
        }
    }
    state parse_base_v1 {
        packet.extract(hdr.base_v1);
        transition select(hdr.base_v1.opcode) {
            DTA_OP_KEY_WRITE: parse_key_write;
            DTA_OP_APPEND: parse_append;
            DTA_OP_KEY_INCREMENT: parse_key_increment;
            DTA_OP_POSTCARDING: parse_postcard;
            default: accept;
        }
    }
    state parse_key_write {
        packet.extract(hdr.key_write);
        transition accept;
    }
    state parse_append {
        packet.extract(hdr.append);
        transition accept;
    }
    state parse_key_increment {
        packet.extract(hdr.key_increment);
        transition accept;
    }
    state parse_postcard {
        packet.extract(hdr.postcard);
        transition accept;
    }
    state parse_base_ext {
        packet.extract(hdr.base_ext);
        transition select(hdr.base_ext.opcode) {
            DTA_OP_SKETCH_MERGE: parse_sketch;
            FLUSH_OPCODE: parse_flush;
            default: accept;
        }
    }
    state parse_flush {
        packet.extract(hdr.flush);
        transition accept;
    }
    state parse_sketch {
        packet.extract(hdr.sketch);
        meta.words_left = hdr.sketch.rows;
        transition select(hdr.sketch.rows) {
            0: accept;
            default: parse_counter;
        }
    }
    state parse_counter {
        packet.extract(hdr.counters.next);
        meta.words_left = meta.words_left - 1;
        transition select(meta.words_left) {
            0: accept;
            default: parse_counter;
        }
    }
    state parse_bth {
        packet.extract(hdr.bth);
        transition select(hdr.bth.opcode) {
            ROCE_OP_RC_ACK: parse_aeth;
            ROCE_OP_RC_ATOMIC_ACK: parse_aeth;
            default: accept;
        }
    }
    state parse_aeth {
        packet.extract(hdr.aeth);
        transition accept;
    }
}

control SoftdtaVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

// Append: word i of the batch being written, from the list's batch registers; a flushed batch's words past
// the pending entries are zero.
#define APPEND_WORD(i) \
    if ((bit<32>)i < batch) { \
        word = 0; \
        if ((bit<32>)i < pending) { \
            append_state_data.read(word, (state_index << P4_APPEND_BATCH_BITS) | i); \
        } \
        hdr.payload[i].setValid(); \
        hdr.payload[i].word = word; \
    }

// Postcarding: value i of a path (cached entry `entry`), into the payload.
#define POSTCARD_WORD(i) \
    if ((bit<32>)i < hops) { \
        postcard_cache_values.read(word, (entry << P4_POSTCARD_WORD_BITS) | i); \
        hdr.payload[i].setValid(); \
        hdr.payload[i].word = word; \
    }

// Postcarding: hop value i of a new cache entry: this report's value at its hop, 0 elsewhere.
#define POSTCARD_RESET(i) \
    postcard_cache_values.write((entry << P4_POSTCARD_WORD_BITS) | i, \
                                (bit<32>)i == (bit<32>)hdr.postcard.hop - 1 ? encoded : 32w0);

// Postcarding: the path gathered so far in hdr.payload, written to the slot of the key cached with it, with no
// ImmDt (an eviction or a flush, not this packet's report).
#define WRITE_CACHED_PATH(key) \
    bit<32> cached_slot_hash; \
    bit<32> cached_checksum; \
    hash(cached_slot_hash, HashAlgorithm.crc32, 32w0, { key }, 64w0x100000000); \
    hash(cached_checksum, HashAlgorithm.crc32, 32w0, { BYTESWAP32(key) }, 64w0x100000000); \
    write_frame(meta.tables.qp.base_va + (bit<64>)(cached_slot_hash & (meta.tables.structure.slot_count - 1)) \
                    * (bit<64>)meta.tables.structure.slot_size, \
                (bit<16>)hops << 2, 0, cached_checksum);

// Postcarding: H_hop(key) of hop n, POSTCARD_HOP_POLYNOMIALS[n - 1].
#define HOP_HASH(n) \
    if (hdr.postcard.hop == n) { \
        hash(hop_hash, HashAlgorithm.crc32_custom, 32w0, { hdr.postcard.key }, 64w0x100000000); \
    }

// Sketch-Merge: merge row i of the report into its column's aggregate.
#define MERGE_ROW(i) \
    if ((bit<32>)i < (bit<32>)hdr.sketch.rows) { \
        sketch_column_counters.read(word, (column_index << P4_SKETCH_ROW_BITS) | i); \
        if (meta.tables.structure.merge == SKETCH_MERGE_MAX) { \
            word = word > hdr.counters[i].word ? word : hdr.counters[i].word; \
        } else { \
            word = word + hdr.counters[i].word; \
        } \
        sketch_column_counters.write((column_index << P4_SKETCH_ROW_BITS) | i, word); \
    }

control SoftdtaIngress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
#include "softdta_tables.p4"

    action count(bit<8> slot) {
        translator_counters.count((bit<32>)slot);
    }
    // The report ends here: dropped for `slot`'s reason, or held in state (batched, cached, merged).
    action consume(bit<8> slot) {
        translator_counters.count((bit<32>)slot);
        mark_to_drop(std);
    }
    // A WRITE of `length` payload bytes, with an immediate when the report asks for one.
    action write_frame(bit<64> va, bit<16> length, bit<1> immediate, bit<32> tag) {
        bool rc = meta.tables.qp.transport == TRANSPORT_RC;
        meta.emitted.roce_opcode = immediate == 1 ? (rc ? ROCE_OP_RC_WRITE_ONLY_IMM : ROCE_OP_UC_WRITE_ONLY_IMM)
                                              : (rc ? ROCE_OP_RC_WRITE_ONLY : ROCE_OP_UC_WRITE_ONLY);
        meta.emitted.emit = 1;
        meta.emitted.va = va;
        meta.emitted.payload_len = length;
        meta.emitted.immediate = tag;
        meta.emitted.ip_length = (bit<16>)IPV4_SIZE + (bit<16>)UDP_SIZE + (bit<16>)BTH_SIZE
                             + (bit<16>)RETH_SIZE + (immediate == 1 ? (bit<16>)IMMDT_SIZE : 16w0)
                             + length + (bit<16>)ICRC_LEN;
    }

    apply {
        if (std.parser_error != error.NoError) {
            if (hdr.udp.isValid() && hdr.udp.dport == DTA_PORT) {
                count(CNT_RX_REPORTS); // a report all the same, as the reference counts it
            }
            consume(CNT_DROP_TRUNCATED);
            return;
        }
        if (!hdr.udp.isValid()) {
            mark_to_drop(std); // not DTA, not RoCE: the translator forwards nothing else
            return;
        }
        meta.now_ns = (bit<64>)std.ingress_global_timestamp * 1000; // bmv2 counts microseconds
        meta.tables.translator_config_key.index = 0;
        if (!translator_config.apply().hit) {
            mark_to_drop(std);
            return;
        }
        bit<32> word;

        // ---------------------------------------------------------------------------------------
        // A Sketch-Merge group being collected: one aggregate word per pass, the last first.
        if (hdr.gather.isValid()) {
            bit<32> column_index = (hdr.gather.state_index << P4_SKETCH_COLUMN_BITS) | (bit<32>)hdr.gather.column;
            bit<32> cell = (column_index << P4_SKETCH_ROW_BITS) | (bit<32>)hdr.gather.row;
            sketch_column_counters.read(word, cell);
            sketch_column_counters.write(cell, 0);
            hdr.payload.push_front(1);
            hdr.payload[0].setValid();
            hdr.payload[0].word = BYTESWAP32(word);
            hdr.gather.gathered = hdr.gather.gathered + 1;
            hdr.gather.left = hdr.gather.left - 1;
            if (hdr.gather.row == 0) {
                sketch_column_contributors.write(column_index, 0);
                bit<32> epoch;
                sketch_column_epoch.read(epoch, column_index);
                sketch_column_epoch.write(column_index, epoch + 1);
                hdr.gather.row = hdr.gather.rows - 1;
                hdr.gather.column = hdr.gather.column - 1;
            } else {
                hdr.gather.row = hdr.gather.row - 1;
            }
            if (hdr.gather.left != 0) {
                std.egress_spec = std.ingress_port; // egress recirculates it
                return;
            }
            meta.tables.qp_key.qp_index = hdr.gather.qp_index;
        }

        // ---------------------------------------------------------------------------------------
        // Collector replies: AETH syndrome per QP; resync on a PSN sequence error NAK only.
        else if (hdr.aeth.isValid()) {
            mark_to_drop(std);
            meta.tables.collector_key.ip = hdr.ipv4.src;
            if (!collector.apply().hit) {
                return; // RoCE not from a collector: not the translator's (XDP passes it up)
            }
            meta.tables.qp_by_local_qpn_key.local_qpn = (bit<32>)hdr.bth.dest_qp;
            if (!qp_by_local_qpn.apply().hit) {
                count(CNT_DROP_UNKNOWN_QP);
                return;
            }
            meta.tables.qp_key.qp_index = meta.tables.qp_by_local_qpn.qp_index;
        }

        // ---------------------------------------------------------------------------------------
        // Reports: the structure or list names the QP
        else {
            if (hdr.udp.dport != DTA_PORT) {
                mark_to_drop(std);
                return;
            }
            count(CNT_RX_REPORTS);
            if (meta.tables.translator_config.profile != 0 && hdr.base_v1.isValid()) {
                consume(CNT_DROP_BAD_PROFILE); // compiled for the 3-byte dta-v1 base header
                return;
            }
            // dta-v1 sub-headers, extended Sketch-Merge and flush requests; other extended reports take the XDP
            // translator.
            if (!(hdr.key_write.isValid() || hdr.key_increment.isValid() || hdr.append.isValid()
                  || hdr.postcard.isValid() || hdr.sketch.isValid() || hdr.flush.isValid())) {
                consume(CNT_DROP_UNKNOWN_OPCODE);
                return;
            }
            bool flush_list = hdr.flush.isValid() && hdr.flush.target == FLUSH_TARGET_APPEND_LIST;
            if (hdr.flush.isValid() && !flush_list && hdr.flush.target != FLUSH_TARGET_POSTCARD_ENTRY) {
                consume(CNT_DROP_BAD_FLUSH);
                return;
            }
            if (hdr.append.isValid() || flush_list) {
                meta.tables.append_list_key.list_id = flush_list ? hdr.flush.index : hdr.append.list_id;
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
                bit<8> kind = hdr.flush.isValid() ? DTA_OP_POSTCARDING
                    : (hdr.base_v1.isValid() ? hdr.base_v1.opcode : hdr.base_ext.opcode);
                meta.tables.structure_key.collector_ip = hdr.ipv4.dst;
                meta.tables.structure_key.primitive = (bit<32>)kind;
                // At the fleet address: the first replica of the partition key's slot that holds a structure of
                // this primitive. A flush request names an entry of the structure at its own destination.
                meta.tables.fleet_config_key.index = 0;
                if (fleet_config.apply().hit && meta.tables.fleet_config.address == hdr.ipv4.dst
                    && !hdr.flush.isValid()) {
                    bit<32> partition_key = hdr.key_write.isValid() ? hdr.key_write.key
                        : (hdr.key_increment.isValid() ? hdr.key_increment.key : hdr.postcard.key);
                    bit<32> partition_hash = 0; // Sketch-Merge's key is empty: its CRC is 0 (init and xorout cancel)
                    if (!hdr.sketch.isValid()) {
                        // PARTITION_POLYNOMIAL (bmv2: crc32_custom parameters, docs/p4.md)
                        hash(partition_hash, HashAlgorithm.crc32_custom, 32w0, { partition_key }, 64w0x100000000);
                    }
                    meta.tables.fleet_slot_key.slot =
                        partition_hash & ((32w1 << meta.tables.fleet_config.slot_bits) - 1);
                    bit<4> holders = 0;
                    if (fleet_slot.apply().hit) {
                        holders = (bit<4>)(meta.tables.fleet_slot.has_structure >> (kind << 2));
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
        }

        // bmv2 takes each table at one place in the pipeline: the QP is looked up here for all three.
        bool qp_known = qp.apply().hit;

        if (hdr.gather.isValid()) {
            meta.emitted.qp_index = hdr.gather.qp_index;
            meta.emitted.primitive = DTA_OP_SKETCH_MERGE;
            bit<16> length = (bit<16>)hdr.gather.gathered << 2;
            write_frame(meta.tables.qp.base_va
                        + ((bit<64>)hdr.gather.first_column << 2) * (bit<64>)hdr.gather.rows,
                        length, hdr.gather.immediate[0:0], (bit<32>)hdr.gather.first_column);
            hdr.gather.setInvalid();
        }

        else if (hdr.aeth.isValid()) {
            if (!qp_known || meta.tables.qp.collector_ip != hdr.ipv4.src) {
                count(CNT_DROP_UNKNOWN_QP);
                return;
            }
            bit<32> index = meta.tables.qp_key.qp_index;
            // As an RC requester: a UC QP takes no reply, an RC QP only one for a PSN still outstanding,
            // in [unacked_psn, next_psn) modulo 2^24 (docs/protocol.md).
            if (meta.tables.qp.transport != TRANSPORT_RC) {
                count(CNT_DROP_REPLY_ON_UC);
                return;
            }
            bit<32> psn = (bit<32>)hdr.bth.psn;
            bit<32> unacked;
            bit<32> next_psn;
            qp_state_unacked_psn.read(unacked, index);
            qp_state_next_psn.read(next_psn, index);
            if (((psn - unacked) & PSN_MASK) >= ((next_psn - unacked) & PSN_MASK)) {
                count(CNT_DROP_REPLY_PSN_OUTSIDE_WINDOW);
                return;
            }
            bit<3> kind = (bit<3>)(hdr.aeth.syndrome >> AETH_KIND_SHIFT);
            bit<5> code = (bit<5>)(hdr.aeth.syndrome & AETH_VALUE_MASK);
            if (kind == (bit<3>)AETH_ACK) {
                count(CNT_RX_ACKS);
                qp_state_unacked_psn.write(index, (psn + 1) & PSN_MASK); // coalesced: every PSN up to psn
            } else if (kind == (bit<3>)AETH_RNR_NAK) {
                count(CNT_RX_RNR_NAKS);
            } else if (kind == (bit<3>)AETH_NAK && code == (bit<5>)NAK_PSN_SEQUENCE_ERROR) {
                count(CNT_RX_NAK_SEQUENCE);
                qp_state_unacked_psn.write(index, psn);
                qp_state_next_psn.write(index, psn);
                qp_state_state.write(index, (bit<32>)QP_STATE_GRACE);
                qp_state_grace_until_ns.write(index, meta.now_ns + meta.tables.translator_config.grace_ns);
            } else {
                count(CNT_RX_NAK_FATAL);
                qp_state_state.write(index, (bit<32>)QP_STATE_FAILED);
            }
            return;
        }

        // ---------------------------------------------------------------------------------------
        // Reports
        else {
            bit<8> opcode = hdr.base_v1.isValid() ? hdr.base_v1.opcode : hdr.base_ext.opcode;
            bit<1> immediate = hdr.base_v1.isValid() ? hdr.base_v1.immediate : hdr.base_ext.immediate;
            if (hdr.flush.isValid()) {
                // What a flush writes out was not in this packet: no ImmDt, and Append or Postcarding's QP.
                immediate = 0;
                opcode = hdr.flush.target == FLUSH_TARGET_APPEND_LIST ? DTA_OP_APPEND : DTA_OP_POSTCARDING;
            }
            if (!qp_known) {
                consume(CNT_DROP_UNKNOWN_QP);
                return;
            }
            bit<32> qp_index = meta.tables.qp_key.qp_index;
            meta.emitted.qp_index = qp_index;
            meta.emitted.primitive = opcode;

            // A QP that cannot send takes no report: its state stays as the collector last saw it.
            bit<32> state;
            bit<64> grace_until;
            qp_state_state.read(state, qp_index);
            qp_state_grace_until_ns.read(grace_until, qp_index);
            if (state == (bit<32>)QP_STATE_FAILED) {
                consume(CNT_DROP_QP_FAILED);
                return;
            }
            if (state == (bit<32>)QP_STATE_GRACE) {
                if (meta.now_ns < grace_until) {
                    consume(CNT_DROP_GRACE);
                    return;
                }
                qp_state_state.write(qp_index, (bit<32>)QP_STATE_ACTIVE);
            }

            if (opcode == DTA_OP_KEY_WRITE || opcode == DTA_OP_KEY_INCREMENT) {
                bit<8> redundancy = opcode == DTA_OP_KEY_WRITE ? hdr.key_write.redundancy
                                                               : hdr.key_increment.redundancy;
                if (redundancy == 0 || redundancy > MAX_REDUNDANCY
                    || redundancy > meta.tables.structure.redundancy) {
                    consume(CNT_DROP_BAD_REDUNDANCY);
                    return;
                }
                // N copies, one per replication ID 0..N-1: egress hashes copy `rid`'s own slot.
                std.mcast_grp = (bit<16>)(meta.tables.qp.ifindex * (bit<32>)MAX_REDUNDANCY + (bit<32>)redundancy);
                meta.emitted.copies = redundancy;
                meta.emitted.emit = 1;
                if (opcode == DTA_OP_KEY_WRITE) {
                    count(CNT_RX_KEY_WRITE);
                    if (meta.tables.structure.key_len != 4 || meta.tables.structure.data_len != 4) {
                        consume(CNT_DROP_BAD_LENGTH); // dta-v1 keys and data are 4 bytes
                        return;
                    }
                    meta.emitted.key = hdr.key_write.key;
                    bit<32> checksum;
                    hash(checksum, HashAlgorithm.crc32, 32w0, { BYTESWAP32(hdr.key_write.key) }, 64w0x100000000);
                    write_frame(0, (bit<16>)KEY_CHECKSUM_LEN + (bit<16>)meta.tables.structure.data_len, immediate, checksum);
                } else {
                    count(CNT_RX_KEY_INCREMENT);
                    meta.emitted.key = hdr.key_increment.key;
                    meta.emitted.roce_opcode = ROCE_OP_RC_FETCH_ADD;
                    meta.emitted.payload_len = 0;
                    meta.emitted.ip_length = (bit<16>)IPV4_SIZE + (bit<16>)UDP_SIZE + (bit<16>)BTH_SIZE
                                         + (bit<16>)ATOMIC_ETH_SIZE + (bit<16>)ICRC_LEN;
                }
            } else if (opcode == DTA_OP_APPEND) {
                bit<32> state_index = meta.tables.append_list.state_index;
                bit<32> batch = meta.tables.append_list.batch;
                bit<32> pending;
                append_state_pending.read(pending, state_index);
                if (hdr.append.isValid()) {
                    count(CNT_RX_APPEND);
                    append_state_data.write((state_index << P4_APPEND_BATCH_BITS) | pending,
                                            BYTESWAP32(hdr.append.data));
                    if (pending == 0) {
                        append_state_first_pending_ns.write(state_index, meta.now_ns);
                    }
                    pending = pending + 1;
                    if (pending < batch) {
                        append_state_pending.write(state_index, pending);
                        consume(CNT_APPEND_BATCHED);
                        return;
                    }
                } else {
                    // A flush request: a partial batch that has waited long enough, padded with zero entries.
                    bit<64> first_pending_ns;
                    append_state_first_pending_ns.read(first_pending_ns, state_index);
                    if (pending == 0 || meta.now_ns - first_pending_ns < meta.tables.translator_config.flush_idle_ns) {
                        mark_to_drop(std); // nothing due: not a drop, nothing is lost
                        return;
                    }
                    count(CNT_APPEND_FLUSHES);
                }
                append_state_pending.write(state_index, 0);
                bit<32> head;
                append_state_head.read(head, state_index);
                // Rings hold a whole number of batches (validated), so a batch never straddles the end and
                // the head wraps to 0 exactly when it reaches it.
                bit<32> next = head + batch;
                append_state_head.write(state_index, next == meta.tables.append_list.slot_count ? 32w0 : next);
                SOFTDTA_EACH_APPEND_WORD(APPEND_WORD)
                write_frame(meta.tables.qp.base_va + ((bit<64>)(meta.tables.append_list.first_slot + head) << 2),
                            (bit<16>)batch << 2, immediate, meta.tables.append_list_key.list_id);
            } else if (hdr.flush.isValid()) {
                // A flush request for a Postcarding cache entry: its path, if it has waited long enough.
                if (hdr.flush.index >= meta.tables.structure.cache_entries) {
                    consume(CNT_DROP_BAD_FLUSH);
                    return;
                }
                bit<32> entry = meta.tables.structure.state_index + hdr.flush.index;
                bit<8> valid;
                bit<64> first_ns;
                bit<32> cached_key;
                postcard_cache_valid.read(valid, entry);
                postcard_cache_first_ns.read(first_ns, entry);
                postcard_cache_key.read(cached_key, entry << P4_POSTCARD_WORD_BITS);
                if (valid == 0 || meta.now_ns - first_ns < meta.tables.translator_config.flush_idle_ns) {
                    mark_to_drop(std); // nothing due: not a drop, nothing is lost
                    return;
                }
                count(CNT_POSTCARD_FLUSHES);
                postcard_cache_valid.write(entry, 0);
                bit<32> hops = (bit<32>)meta.tables.structure.hops;
                SOFTDTA_EACH_POSTCARD_WORD(POSTCARD_WORD)
                WRITE_CACHED_PATH(cached_key)
            } else if (opcode == DTA_OP_POSTCARDING) {
                count(CNT_RX_POSTCARDING);
                bit<32> hops = (bit<32>)meta.tables.structure.hops;
                if (hdr.postcard.hop == 0 || (bit<32>)hdr.postcard.hop > hops) {
                    consume(CNT_DROP_BAD_HOP);
                    return;
                }
                bit<32> reversed_key = BYTESWAP32(hdr.postcard.key);
                bit<32> slot_hash;
                hash(slot_hash, HashAlgorithm.crc32, 32w0, { hdr.postcard.key }, 64w0x100000000);
                // H_hop(key): one CRC per hop polynomial (bmv2: set crc32_custom parameters, docs/p4.md).
                bit<32> hop_hash = 0;
                SOFTDTA_EACH_HOP(HOP_HASH)
                bit<32> encoded = hdr.postcard.data ^ hop_hash;
                bit<32> entry = meta.tables.structure.state_index
                                + (slot_hash & (meta.tables.structure.cache_entries - 1));
                bit<8> valid;
                bit<32> cached_key;
                bit<8> hop_mask;
                postcard_cache_valid.read(valid, entry);
                postcard_cache_key.read(cached_key, entry << P4_POSTCARD_WORD_BITS);
                postcard_cache_hop_mask.read(hop_mask, entry);
                bit<8> hop_bit = 8w1 << (hdr.postcard.hop - 1);
                bit<8> complete = (bit<8>)((9w1 << (bit<8>)hops) - 1);
                bit<32> slot_mask = meta.tables.structure.slot_count - 1;
                bit<64> slot_bytes = (bit<64>)meta.tables.structure.slot_size;
                bit<32> checksum;
                if (valid == 1 && cached_key != hdr.postcard.key && hops == 1) {
                    // A one-hop path is complete on arrival: written without evicting another flow.
                    hdr.payload[0].setValid();
                    hdr.payload[0].word = encoded;
                    hash(checksum, HashAlgorithm.crc32, 32w0, { reversed_key }, 64w0x100000000);
                    write_frame(meta.tables.qp.base_va + (bit<64>)(slot_hash & slot_mask) * slot_bytes,
                                4, immediate, checksum);
                } else {
                    if (valid == 1 && cached_key != hdr.postcard.key) {
                        // Eviction: the cached path goes to the cached key's own slot, then this flow takes over.
                        count(CNT_POSTCARD_EVICTIONS);
                        SOFTDTA_EACH_POSTCARD_WORD(POSTCARD_WORD)
                        WRITE_CACHED_PATH(cached_key)
                        valid = 0;
                    }
                    if (valid == 0) {
                        postcard_cache_valid.write(entry, 1);
                        postcard_cache_key.write(entry << P4_POSTCARD_WORD_BITS, hdr.postcard.key);
                        postcard_cache_key_len.write(entry, 4);
                        postcard_cache_path_length.write(entry, (bit<8>)hops);
                        postcard_cache_first_ns.write(entry, meta.now_ns);
                        SOFTDTA_EACH_POSTCARD_WORD(POSTCARD_RESET)
                        hop_mask = 0;
                    } else {
                        postcard_cache_values.write((entry << P4_POSTCARD_WORD_BITS) | ((bit<32>)hdr.postcard.hop - 1),
                                                    encoded);
                    }
                    hop_mask = hop_mask | hop_bit;
                    postcard_cache_hop_mask.write(entry, hop_mask);
                    // After an eviction its frame leaves: this flow's path has just begun.
                    if (meta.emitted.emit == 0) {
                        if (hop_mask != complete) {
                            consume(CNT_POSTCARD_CACHED);
                            return;
                        }
                        postcard_cache_valid.write(entry, 0);
                        SOFTDTA_EACH_POSTCARD_WORD(POSTCARD_WORD)
                        hash(checksum, HashAlgorithm.crc32, 32w0, { reversed_key }, 64w0x100000000);
                        write_frame(meta.tables.qp.base_va + (bit<64>)(slot_hash & slot_mask) * slot_bytes,
                                    (bit<16>)hops << 2, immediate, checksum);
                    }
                }
            } else if (opcode == DTA_OP_SKETCH_MERGE) {
                count(CNT_RX_SKETCH_MERGE);
                bit<32> rows = meta.tables.structure.rows;
                if ((bit<32>)hdr.sketch.reporter >= meta.tables.structure.reporters) {
                    consume(CNT_DROP_UNKNOWN_REPORTER);
                    return;
                }
                if ((bit<32>)hdr.sketch.rows != rows || (bit<32>)hdr.sketch.column >= meta.tables.structure.columns) {
                    consume(CNT_DROP_BAD_LENGTH);
                    return;
                }
                bit<32> state_index = meta.tables.structure.state_index;
                bit<32> progress = (state_index << P4_SKETCH_REPORTER_BITS) | (bit<32>)hdr.sketch.reporter;
                bit<32> expected;
                sketch_reporter_next_column.read(expected, progress);
                bit<32> column_index = (state_index << P4_SKETCH_COLUMN_BITS) | expected;
                bit<32> contributors;
                sketch_column_contributors.read(contributors, column_index);
                bit<32> reporter_bit = 32w1 << (bit<8>)hdr.sketch.reporter;
                if ((bit<32>)hdr.sketch.column != expected || (contributors & reporter_bit) != 0) {
                    consume((bit<32>)hdr.sketch.column > expected ? CNT_DROP_SKETCH_GAP : CNT_DROP_SKETCH_STALE);
                    return;
                }
                sketch_reporter_next_column.write(progress,
                    expected + 1 == meta.tables.structure.columns ? 32w0 : expected + 1);
                SOFTDTA_EACH_SKETCH_ROW(MERGE_ROW)
                contributors = contributors | reporter_bit;
                sketch_column_contributors.write(column_index, contributors);
                bit<32> everyone = (32w1 << (bit<8>)meta.tables.structure.reporters) - 1;
                bit<32> batch = meta.tables.structure.batch;
                // Reporters send columns in order, so a group is complete when its last column is.
                bool last_of_group = (expected & (batch - 1)) == batch - 1;
                if (contributors != everyone || !last_of_group) {
                    consume(CNT_SKETCH_MERGED);
                    return;
                }
                count(CNT_SKETCH_MERGED);
                hdr.base_ext.setInvalid();
                hdr.sketch.setInvalid();
                hdr.counters.pop_front(16); // all MAX_SKETCH_ROWS of them
                hdr.gather.setValid();
                hdr.gather.state_index = state_index;
                hdr.gather.qp_index = qp_index;
                hdr.gather.first_column = (bit<16>)(expected - (batch - 1));
                hdr.gather.column = (bit<16>)expected;
                hdr.gather.rows = (bit<8>)rows;
                hdr.gather.row = (bit<8>)rows - 1;
                hdr.gather.left = (bit<16>)batch * (bit<16>)rows;
                hdr.gather.gathered = 0;
                hdr.gather.immediate = (bit<8>)immediate;
                std.egress_spec = std.ingress_port; // egress recirculates it
                return;
            }
        }

        // The per-QP part of the iCRC for this frame's shape (control plane, softdta/wire/icrc_split.py).
        meta.tables.icrc_constant_key.qp_index = meta.emitted.qp_index;
        meta.tables.icrc_constant_key.opcode = meta.emitted.roce_opcode;
        meta.tables.icrc_constant_key.ip_length = meta.emitted.ip_length;
        if (!icrc_constant.apply().hit) {
            consume(CNT_DROP_BAD_LENGTH);
            return;
        }
        meta.emitted.icrc_constant = meta.tables.icrc_constant.constant;
        if (meta.emitted.copies == 0) {
            std.egress_spec = meta.tables.qp.ifindex == 0 ? std.ingress_port : (bit<9>)meta.tables.qp.ifindex;
        }
    }
}

// Copy n of a Key-Write or Key-Increment: its slot hash over reversed key || n.
// KeyHash.DTA_V1 hashes every copy with CRC-32; KeyHash.INDEPENDENT copy n with KEY_HASH_POLYNOMIALS[n]
// (bmv2: crc32_custom parameters, docs/p4.md). Copy 0 is the same under both.
#define COPY_HASH(n) \
    if (copy == n) { \
        if (meta.tables.structure.key_hash == (bit<32>)KEY_HASH_DTA_V1) { \
            hash(slot_hash, HashAlgorithm.crc32, 32w0, { reversed_key, 8w##n }, 64w0x100000000); \
        } else { \
            hash(slot_hash, HashAlgorithm.crc32_custom, 32w0, { reversed_key, 8w##n }, 64w0x100000000); \
        } \
    }

// The variable tail of the iCRC input (ICRC_TAIL_BYTES = 280 bytes), right-aligned. It is wider than the 2048
// bits p4c allows one value, so it lives in two, tail_hi ++ tail_lo, and values shift in across both.
#define TAIL_SHIFT_IN(k, value) \
    tail_hi = (tail_hi << k) | (bit<192>)tail_lo[2047:2048 - k]; \
    tail_lo = (tail_lo << k) | (bit<2048>)(value);

// Payload word i, shifted into the tail.
#define TAIL_WORD(i) \
    if (hdr.payload[i].isValid()) { \
        TAIL_SHIFT_IN(32, hdr.payload[i].word) \
    }

control SoftdtaEgress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply {
        if (hdr.gather.isValid()) {
            recirculate_preserving_field_list(GATHER_FIELDS);
            return;
        }
        if (meta.emitted.emit == 0) {
            mark_to_drop(std);
            return;
        }
        bit<8> copy = (bit<8>)std.egress_rid;
        bit<32> index = meta.emitted.qp_index;

        // Per copy: its own slot, from its replication ID (not from any register shared by reports).
        if (meta.emitted.copies != 0) {
            bit<32> reversed_key = BYTESWAP32(meta.emitted.key);
            bit<32> slot_hash = 0;
            hash(slot_hash, HashAlgorithm.crc32, 32w0, { reversed_key, 8w0 }, 64w0x100000000);
            SOFTDTA_EACH_EXTRA_COPY(COPY_HASH)
            bit<32> slot = slot_hash & (meta.tables.structure.slot_count - 1);
            meta.emitted.va = meta.tables.qp.base_va + (bit<64>)slot * (bit<64>)meta.tables.structure.slot_size;
        }

        // The RoCE frame, replacing the report's headers.
        hdr.base_v1.setInvalid();
        hdr.base_ext.setInvalid();
        hdr.sketch.setInvalid();
        hdr.flush.setInvalid();
        hdr.aeth.setInvalid();
        hdr.ethernet.src = meta.tables.translator_config.src_mac;
        hdr.ethernet.dst = meta.tables.qp.collector_mac;
        hdr.ipv4.dscp = (bit<6>)meta.tables.translator_config.dscp;
        hdr.ipv4.ecn = 0;
        hdr.ipv4.total_length = meta.emitted.ip_length;
        hdr.ipv4.identification = 0;
        hdr.ipv4.flags = 0b010;
        hdr.ipv4.fragment_offset = 0;
        hdr.ipv4.ttl = meta.tables.translator_config.ttl;
        hdr.ipv4.src = meta.tables.translator_config.src_ip;
        hdr.ipv4.dst = meta.tables.qp.collector_ip;
        hdr.udp.sport = meta.tables.translator_config.udp_sport;
        hdr.udp.dport = ROCE_PORT;
        hdr.udp.length = meta.emitted.ip_length - (bit<16>)IPV4_SIZE;
        hdr.udp.checksum = 0;

        bit<32> psn;
        bit<32> frames_sent;
        qp_state_next_psn.read(psn, index);
        qp_state_next_psn.write(index, (psn + 1) & PSN_MASK);
        // AckReq on every n-th frame of an RC QP: frames_sent counts up to the interval and starts over.
        qp_state_frames_sent.read(frames_sent, index);
        frames_sent = frames_sent + 1;
        bit<32> interval = (bit<32>)meta.tables.translator_config.ack_req_interval;
        bit<1> ack_req = 0;
        if (meta.tables.qp.transport == TRANSPORT_RC && interval != 0 && frames_sent >= interval) {
            ack_req = 1;
            frames_sent = 0;
        }
        qp_state_frames_sent.write(index, frames_sent);
        hdr.bth.setValid();
        hdr.bth.opcode = meta.emitted.roce_opcode;
        hdr.bth.solicited = 0;
        hdr.bth.migreq = 1;
        hdr.bth.pad_count = 0;
        hdr.bth.tver = 0;
        hdr.bth.pkey = DEFAULT_PKEY;
        hdr.bth.fecn = 0;
        hdr.bth.becn = 0;
        hdr.bth.reserved6 = 0;
        hdr.bth.dest_qp = meta.tables.qp.remote_qpn[23:0];
        hdr.bth.ack_req = ack_req;
        hdr.bth.reserved7 = 0;
        hdr.bth.psn = psn[23:0];

        bit<192> tail_hi = 0;
        bit<2048> tail_lo = (bit<2048>)(ack_req ++ 7w0 ++ psn[23:0]);
        if (meta.emitted.roce_opcode == ROCE_OP_RC_FETCH_ADD) {
            hdr.atomic_eth.setValid();
            hdr.atomic_eth.va = meta.emitted.va;
            hdr.atomic_eth.rkey = meta.tables.qp.rkey;
            hdr.atomic_eth.swap_add = hdr.key_increment.counter;
            hdr.atomic_eth.compare = 0;
            tail_hi = tail_lo[2015:1824]; // a shift by 224 moves all of tail_hi out
            tail_lo = (tail_lo << 224) | (bit<2048>)(hdr.atomic_eth.va ++ hdr.atomic_eth.rkey
                                                     ++ hdr.atomic_eth.swap_add ++ hdr.atomic_eth.compare);
        } else {
            hdr.reth.setValid();
            hdr.reth.va = meta.emitted.va;
            hdr.reth.rkey = meta.tables.qp.rkey;
            hdr.reth.dma_length = (bit<32>)meta.emitted.payload_len;
            TAIL_SHIFT_IN(128, hdr.reth.va ++ hdr.reth.rkey ++ hdr.reth.dma_length)
            if (meta.emitted.roce_opcode == ROCE_OP_RC_WRITE_ONLY_IMM || meta.emitted.roce_opcode == ROCE_OP_UC_WRITE_ONLY_IMM) {
                hdr.immdt.setValid();
                hdr.immdt.immediate = meta.emitted.immediate;
                TAIL_SHIFT_IN(32, hdr.immdt.immediate)
            }
        }
        if (hdr.key_write.isValid()) {
            // Key-Write: the key checksum (stored little-endian), then the data.
            bit<32> checksum;
            hash(checksum, HashAlgorithm.crc32, 32w0, { BYTESWAP32(hdr.key_write.key) }, 64w0x100000000);
            hdr.payload[0].setValid();
            hdr.payload[0].word = BYTESWAP32(checksum);
            hdr.payload[1].setValid();
            hdr.payload[1].word = hdr.key_write.data;
        }
        hdr.key_write.setInvalid();
        hdr.key_increment.setInvalid();
        hdr.append.setInvalid();
        hdr.postcard.setInvalid();
        SOFTDTA_EACH_PAYLOAD_WORD(TAIL_WORD)
        bit<32> crc;
        hash(crc, HashAlgorithm.crc32, 32w0, { tail_hi, tail_lo }, 64w0x100000000);
        crc = meta.emitted.icrc_constant ^ crc ^ ICRC_TAIL_ZEROS_CRC;
        hdr.icrc.setValid();
        hdr.icrc.value = BYTESWAP32(crc);
        truncate((bit<32>)ETHERNET_SIZE + (bit<32>)meta.emitted.ip_length); // nothing of the report trails
        translator_counters.count((bit<32>)CNT_TX_FRAMES);
    }
}

control SoftdtaComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
                        { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, hdr.ipv4.total_length,
                          hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragment_offset, hdr.ipv4.ttl,
                          hdr.ipv4.protocol, hdr.ipv4.src, hdr.ipv4.dst },
                        hdr.ipv4.checksum, HashAlgorithm.csum16);
    }
}

control SoftdtaDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.gather);
        packet.emit(hdr.base_v1);
        packet.emit(hdr.base_ext);
        packet.emit(hdr.key_write);
        packet.emit(hdr.key_increment);
        packet.emit(hdr.append);
        packet.emit(hdr.postcard);
        packet.emit(hdr.sketch);
        packet.emit(hdr.counters);
        packet.emit(hdr.bth);
        packet.emit(hdr.reth);
        packet.emit(hdr.atomic_eth);
        packet.emit(hdr.immdt);
        packet.emit(hdr.aeth);
        packet.emit(hdr.payload);
        packet.emit(hdr.icrc);
    }
}

V1Switch(SoftdtaParser(), SoftdtaVerifyChecksum(), SoftdtaIngress(), SoftdtaEgress(), SoftdtaComputeChecksum(),
         SoftdtaDeparser()) main;
