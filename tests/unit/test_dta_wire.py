"""DTA report and NACK wire formats: dta-v1 vectors (dta-v1.md sections 1-3), round trips, rejection reasons.

Byte vectors are written out by hand from dta-v1.md; hash vectors are the ones the document lists.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softdta.spec import (
    APPEND_V1,
    DTA_BASE_EXT,
    DTA_BASE_V1_SEQ,
    DTA_BASE_V1_SHORT,
    KEY_HASH_POLYNOMIALS,
    KEY_INCREMENT_V1,
    KEY_WRITE_V1,
    MAX_POSTCARD_HOPS,
    NACK_EXT,
    NACK_V1,
    POSTCARD_HOP_POLYNOMIALS,
    POSTCARD_V1,
    DtaOpcode,
    KeyHash,
    NackKind,
)
from softdta.wire import hashing
from softdta.wire.codec import WireError
from softdta.wire.dta import (
    Nack,
    Profile,
    Report,
    append,
    decode,
    decode_nack,
    encode,
    encode_nack,
    key_increment,
    key_write,
    postcard,
    sketch_column,
)
from tests.common import bitwise_crc32

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEY1 = bytes.fromhex("00000001")


def reason_of(payload: bytes, profile: Profile = Profile.DTA_V1) -> str:
    with pytest.raises(WireError) as err:
        decode(payload, profile)
    return err.value.reason


# --------------------------------------------------------------------------------------------------
# dta-v1 vectors (section 1)


def test_header_sizes():
    assert DTA_BASE_V1_SHORT.size == 2  # variant A
    assert DTA_BASE_V1_SEQ.size == 3  # variant B
    assert (KEY_WRITE_V1.size, KEY_INCREMENT_V1.size, APPEND_V1.size, POSTCARD_V1.size) == (9, 13, 8, 9)
    assert DTA_BASE_EXT.size == 4
    assert NACK_V1.size == 2 and NACK_EXT.size == 8


def test_key_write_variant_b_is_12_bytes():
    # 01 SS FF NN KKKKKKKK DDDDDDDD
    payload = encode(key_write(0x0A0B0C0D, 0x11223344, redundancy=3, seqnum=0x5A), Profile.DTA_V1)
    assert payload == bytes.fromhex("01 5A 00 03 0A0B0C0D 11223344")
    assert encode(key_write(0x0A0B0C0D, 0x11223344, redundancy=3, seqnum=0x5A, immediate=True)) == \
           bytes.fromhex("01 5A 80 03 0A0B0C0D 11223344")
    assert encode(key_write(0x0A0B0C0D, 0x11223344, redundancy=3, seqnum=0x5A, retransmit=True)) == \
           bytes.fromhex("01 5A 40 03 0A0B0C0D 11223344")
    assert encode(key_write(KEY1, b"\xff\xfe\xfd\xfc", redundancy=4, seqnum=255, immediate=True,
                            retransmit=True)) == bytes.fromhex("01 FF C0 04 00000001 FFFEFDFC")


def test_key_write_variant_a_is_11_bytes():
    # 01 FF NN KKKKKKKK DDDDDDDD (what the Reporter P4 emits: N = 2, immediate 0)
    assert encode(key_write(0xC0A80001, 0x00001234, redundancy=2), Profile.DTA_V1_SHORT) == \
           bytes.fromhex("01 00 02 C0A80001 00001234")
    assert encode(key_write(0xC0A80001, 0x00001234, redundancy=2, immediate=True), Profile.DTA_V1_SHORT) == \
           bytes.fromhex("01 80 02 C0A80001 00001234")


def test_other_primitives_byte_layout():
    assert encode(key_increment(0x01020304, 0x1122334455667788, redundancy=1, seqnum=7)) == \
           bytes.fromhex("03 07 00 01 01020304 1122334455667788")
    assert encode(append(0xA1B2C3D4, 0xDEADBEEF, seqnum=8)) == bytes.fromhex("02 08 00 A1B2C3D4 DEADBEEF")
    assert encode(postcard(0x01020304, 5, 0x0000BEEF, seqnum=9)) == bytes.fromhex("04 09 00 01020304 05 0000BEEF")
    assert encode(key_increment(0x01020304, 1, redundancy=2), Profile.DTA_V1_SHORT) == \
           bytes.fromhex("03 00 02 01020304 0000000000000001")
    assert encode(append(3, 4), Profile.DTA_V1_SHORT) == bytes.fromhex("02 00 00000003 00000004")
    assert encode(postcard(1, 1, 2), Profile.DTA_V1_SHORT) == bytes.fromhex("04 00 00000001 01 00000002")


@pytest.mark.parametrize("report, size", [(key_write(1, 2), 9), (key_increment(1, 2), 13), (append(1, 2), 8),
                                          (postcard(1, 3, 2), 9)])
def test_encoded_lengths(report, size):
    assert len(encode(report, Profile.DTA_V1)) == 3 + size
    assert len(encode(report, Profile.DTA_V1_SHORT)) == 2 + size


def test_extended_byte_layout():
    # 81 OP FLAGS(imm, ess, retx, 5 reserved) SEQ, then the primitive.
    assert encode(key_write(KEY1, b"\xaa\xbb\xcc\xdd", redundancy=2, seqnum=9, immediate=True, essential=True,
                            retransmit=True, extended=True)) == \
           bytes.fromhex("81 01 E0 09 02 04 04 00000001 AABBCCDD")
    assert encode(key_write(KEY1, b"\xaa", essential=True, extended=True)) == \
           bytes.fromhex("81 01 40 00 01 04 01 00000001 AA")
    assert encode(sketch_column(0x0102, 0x0304, [1, 0xFFFFFFFF], seqnum=3)) == \
           bytes.fromhex("81 05 00 03 0102 0304 02 00000001 FFFFFFFF")
    assert encode(append(7, b"xyz", extended=True, retransmit=True)) == \
           bytes.fromhex("81 02 20 00 00000007 03") + b"xyz"
    assert encode(key_increment(b"abc", 5, redundancy=4, extended=True)) == \
           bytes.fromhex("81 03 00 00 04 03 0000000000000005") + b"abc"
    assert encode(postcard(b"k" * 13, 2, 0x01020304, path_length=3, extended=True)) == \
           bytes.fromhex("81 04 00 00 02 03 0D 01020304") + b"k" * 13


def test_short_profile_cannot_carry_retransmit():
    with pytest.raises(ValueError):
        encode(key_write(1, 2, retransmit=True), Profile.DTA_V1_SHORT)


def test_dta_v1_refuses_what_needs_extended():
    for report in (key_write(b"abcde", 1), key_write(1, b"12345"), key_write(1, 2, essential=True),
                   postcard(1, 2, 3, path_length=4), replace(sketch_column(1, 2, [3]), extended=False)):
        with pytest.raises(ValueError):
            encode(report)


# --------------------------------------------------------------------------------------------------
# Hash vectors (section 2)


def test_key_write_hash_vectors():
    assert hashing.key_checksum(KEY1) == 0x99F8B879
    assert hashing.key_checksum(KEY1).to_bytes(4, "little") == bytes.fromhex("79B8F899")  # RDMA payload bytes 0..3
    assert [hashing.key_slot_hash(KEY1, n) for n in range(4)] == [0xFB42DEAD, 0x8C45EE3B, 0x154CBF81, 0x624B8F17]
    assert [hashing.key_slot(KEY1, n, 256) for n in range(4)] == [173, 59, 129, 23]
    # Independent formulation: CRC32(reversed key || n), CRC32(reversed key).
    assert zlib.crc32(KEY1[::-1] + b"\x02") == 0x154CBF81
    assert zlib.crc32(b"\x01\x00\x00\x00") == 0x99F8B879


def test_postcard_hash_vectors():
    assert [hashing.postcard_hop_hash(KEY1, hop) for hop in range(1, 6)] == \
           [0xFFFDD680, 0x119CA20C, 0x55F952F3, 0xF4B8DA4A, 0xFE06C36C]
    assert hashing.postcard_slot_hash(KEY1) & 0x7FFF == 28554  # 32768-entry cache index
    assert POSTCARD_HOP_POLYNOMIALS[:5] == (0x1E12A700, 0x65B96595, 0x49CF878B, 0x36518F0D, 0x7A40A908)


def test_crc32_poly_against_bitwise_reference():
    rng = random.Random(3)
    for _ in range(200):
        data = rng.randbytes(rng.randrange(0, 20))
        assert hashing.crc32_poly(0x04C11DB7, data) == zlib.crc32(data) == hashing.crc32(data)
        polynomial = rng.choice(POSTCARD_HOP_POLYNOMIALS)
        assert hashing.crc32_poly(polynomial, data) == bitwise_crc32(polynomial, data)


@pytest.mark.parametrize("key_len", [1, 4, 13, 32])
def test_vectorized_hashes_match_scalar(key_len):
    rng = np.random.default_rng(key_len)
    count, copies = 3000, 4
    rows = rng.integers(0, 256, size=(count, key_len), dtype=np.uint8)
    rows[0] = 0
    rows[1] = 0xFF
    if key_len == 4:
        rows[2] = np.frombuffer(KEY1, dtype=np.uint8)
    checksums, slot_hashes = hashing.key_hashes_rows(rows, copies)
    assert checksums.dtype == np.uint32 and slot_hashes.shape == (copies, count)
    plain = hashing.crc32_rows(rows)
    for i in range(count):
        key = rows[i].tobytes()
        assert int(checksums[i]) == hashing.key_checksum(key) == zlib.crc32(key[::-1])
        for copy in range(copies):
            assert int(slot_hashes[copy, i]) == hashing.key_slot_hash(key, copy) == \
                   zlib.crc32(key[::-1] + bytes([copy]))
        assert int(plain[i]) == zlib.crc32(key)
    if key_len == 4:
        assert [int(slot_hashes[c, 2]) for c in range(4)] == [0xFB42DEAD, 0x8C45EE3B, 0x154CBF81, 0x624B8F17]
        for hop, polynomial in enumerate(POSTCARD_HOP_POLYNOMIALS[:5], start=1):
            vector = hashing.crc32_rows(rows[:500], polynomial)
            assert [int(v) for v in vector] == [hashing.postcard_hop_hash(rows[i].tobytes(), hop) for i in range(500)]


@pytest.mark.parametrize("key_len", [4, 13])
def test_vectorized_independent_scheme_matches_scalar(key_len):
    rng = np.random.default_rng(100 + key_len)
    rows = rng.integers(0, 256, size=(1000, key_len), dtype=np.uint8)
    copies = len(KEY_HASH_POLYNOMIALS)
    checksums, slot_hashes = hashing.key_hashes_rows(rows, copies, KeyHash.INDEPENDENT)
    _, dta_v1 = hashing.key_hashes_rows(rows, 1)
    assert np.array_equal(slot_hashes[0], dta_v1[0])  # copy 0 is dta-v1's hash
    for i in range(rows.shape[0]):
        key = rows[i].tobytes()
        assert int(checksums[i]) == zlib.crc32(key[::-1])
        for copy in range(copies):
            scalar = hashing.key_slot_hash(key, copy, KeyHash.INDEPENDENT)
            assert int(slot_hashes[copy, i]) == scalar
            if i < 50:
                assert scalar == bitwise_crc32(KEY_HASH_POLYNOMIALS[copy], key[::-1] + bytes([copy]))


@pytest.mark.parametrize("key_len", [4, 9])
def test_vectorized_postcard_hashes_match_scalar(key_len):
    rng = np.random.default_rng(200 + key_len)
    rows = rng.integers(0, 256, size=(400, key_len), dtype=np.uint8)
    hops = rng.integers(1, MAX_POSTCARD_HOPS + 1, size=400)
    slot_hashes, checksums, hop_hashes = hashing.postcard_hashes_rows(rows, hops)
    for i in range(rows.shape[0]):
        key = rows[i].tobytes()
        assert int(slot_hashes[i]) == hashing.postcard_slot_hash(key)
        assert int(checksums[i]) == hashing.key_checksum(key)
        assert int(hop_hashes[i]) == hashing.postcard_hop_hash(key, int(hops[i]))


def test_keys_to_rows():
    keys = [0, 1, 0x01020304, 0xFFFFFFFF]
    rows = hashing.keys_to_rows(keys)
    assert [rows[i].tobytes() for i in range(4)] == [k.to_bytes(4, "big") for k in keys]
    wide = hashing.keys_to_rows([0x0102030405060708], key_len=8)
    assert wide[0].tobytes() == bytes.fromhex("0102030405060708")


# --------------------------------------------------------------------------------------------------
# Round trips (hypothesis)

u8, u16, u32, u64 = (st.integers(0, (1 << bits) - 1) for bits in (8, 16, 32, 64))
word = st.binary(min_size=4, max_size=4)
flags_v1 = st.fixed_dictionaries({"seqnum": u8, "immediate": st.booleans(), "retransmit": st.booleans()})


@st.composite
def v1_reports(draw) -> Report:
    flags = draw(flags_v1)
    return draw(st.sampled_from([
        key_write(draw(word), draw(word), redundancy=draw(st.integers(1, 4)), **flags),
        key_increment(draw(word), draw(u64), redundancy=draw(st.integers(1, 4)), **flags),
        append(draw(u32), draw(word), **flags),
        postcard(draw(word), draw(st.integers(1, 5)), draw(word), **flags),
    ]))


def ext_keys():
    return st.one_of(st.binary(min_size=13, max_size=13), st.binary(min_size=1, max_size=32))


def ext_data():
    return st.one_of(st.binary(min_size=20, max_size=20), st.binary(min_size=1, max_size=64))


@st.composite
def ext_reports(draw) -> Report:
    flags = {"seqnum": draw(u8), "immediate": draw(st.booleans()), "essential": draw(st.booleans()),
             "retransmit": draw(st.booleans()), "extended": True}
    path_length = draw(st.integers(0, 8))
    hop = draw(st.integers(1, path_length or 8))
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return key_write(draw(ext_keys()), draw(ext_data()), redundancy=draw(st.integers(1, 4)), **flags)
    if choice == 1:
        return key_increment(draw(ext_keys()), draw(u64), redundancy=draw(st.integers(1, 4)), **flags)
    if choice == 2:
        return append(draw(u32), draw(ext_data()), **flags)
    if choice == 3:
        return postcard(draw(ext_keys()), hop, draw(word), path_length=path_length, **flags)
    del flags["extended"]  # sketch_column() always sets it (and refuses it as a keyword)
    return sketch_column(draw(u16), draw(u16), draw(st.lists(u32, min_size=1, max_size=16)), **flags)


@SETTINGS
@given(v1_reports())
def test_round_trip_dta_v1(report):
    payload = encode(report, Profile.DTA_V1)
    assert payload[0] == report.opcode
    assert decode(payload, Profile.DTA_V1) == report


@SETTINGS
@given(v1_reports())
def test_round_trip_dta_v1_short(report):
    report = replace(report, seqnum=0, retransmit=False)  # variant A has neither
    payload = encode(report, Profile.DTA_V1_SHORT)
    assert payload[0] == report.opcode
    assert decode(payload, Profile.DTA_V1_SHORT) == report


@SETTINGS
@given(v1_reports())
def test_short_profile_drops_the_seqnum(report):
    report = replace(report, retransmit=False)
    assert decode(encode(report, Profile.DTA_V1_SHORT), Profile.DTA_V1_SHORT) == replace(report, seqnum=0)


@SETTINGS
@given(ext_reports())
def test_round_trip_extended(report):
    payload = encode(report)
    assert payload[0] == 0x81
    assert payload[1] == report.opcode
    assert payload[2] == (report.immediate << 7) | (report.essential << 6) | (report.retransmit << 5)
    assert payload[3] == report.seqnum
    # Extended reports are recognised whatever dta-v1 profile the translator is configured with.
    assert decode(payload, Profile.DTA_V1) == report
    assert decode(payload, Profile.DTA_V1_SHORT) == report
    expected_len = 4 + {DtaOpcode.KEY_WRITE: 3 + len(report.key) + len(report.data),
                        DtaOpcode.KEY_INCREMENT: 10 + len(report.key),
                        DtaOpcode.APPEND: 5 + len(report.data),
                        DtaOpcode.POSTCARDING: 7 + len(report.key),
                        DtaOpcode.SKETCH_MERGE: 5 + 4 * len(report.counters)}[report.opcode]
    assert len(payload) == expected_len


@SETTINGS
@given(st.binary(min_size=0, max_size=80))
def test_decode_arbitrary_bytes_only_raises_wire_error(payload):
    for profile in Profile:
        try:
            report = decode(payload, profile)
        except WireError as err:
            assert err.reason in {"TRUNCATED", "BAD_LENGTH", "UNKNOWN_OPCODE", "BAD_REDUNDANCY", "BAD_HOP",
                                  "BAD_PROFILE"}
            continue
        # Never misparsed across formats: the first byte alone decides.
        assert report.extended == (payload[0] == 0x81)
        # Whatever decodes re-encodes to the same bytes, apart from reserved flag bits (ignored on decode).
        canonical = bytearray(payload)
        flags_at, reserved = (2, 0x1F) if report.extended else (profile.base_header.size - 1,
                                                                 0x3F if profile is Profile.DTA_V1 else 0x7F)
        canonical[flags_at] &= ~reserved & 0xFF
        assert encode(report, profile) == bytes(canonical)


@SETTINGS
@given(st.one_of(v1_reports(), ext_reports()), st.data())
def test_decode_mutated_reports_only_raises_wire_error(report, data):
    payload = bytearray(encode(report))
    for _ in range(data.draw(st.integers(1, 3))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(u8)
    try:
        decoded = decode(bytes(payload))
    except WireError:
        return
    assert decoded.extended == (payload[0] == 0x81)


# --------------------------------------------------------------------------------------------------
# Cross-format and wrong-profile behaviour


@SETTINGS
@given(v1_reports())
def test_dta_v1_never_parses_as_extended(report):
    for profile in Profile:
        if profile is Profile.DTA_V1_SHORT:
            report = replace(report, seqnum=0, retransmit=False)
        payload = encode(report, profile)
        assert payload[0] & 0x80 == 0
        assert decode(payload, profile).extended is False


@SETTINGS
@given(ext_reports())
def test_extended_never_parses_as_dta_v1(report):
    payload = encode(report)
    assert payload[0] & 0x80
    for profile in Profile:
        assert decode(payload, profile).extended is True


@SETTINGS
@given(v1_reports())
def test_wrong_dta_v1_profile_is_rejected_by_length(report):
    """Variant B read as A: the sub-header ends one byte early, BAD_LENGTH. Variant A read as B: TRUNCATED.

    Every dta-v1 primitive has a fixed size, so a profile mismatch never decodes into a wrong report.
    """
    payload_b = encode(report, Profile.DTA_V1)
    assert reason_of(payload_b, Profile.DTA_V1_SHORT) == "BAD_LENGTH"
    payload_a = encode(replace(report, retransmit=False), Profile.DTA_V1_SHORT)
    assert reason_of(payload_a, Profile.DTA_V1) == "TRUNCATED"


# --------------------------------------------------------------------------------------------------
# Malformed input


def sample_payloads() -> list[tuple[str, bytes, Profile]]:
    out = []
    v1 = [key_write(1, 2, redundancy=2, seqnum=4), key_increment(1, 2, redundancy=3), append(5, 6),
          postcard(7, 3, 8)]
    for report in v1:
        out.append((f"v1-{report.opcode.name}", encode(report, Profile.DTA_V1), Profile.DTA_V1))
        out.append((f"v1short-{report.opcode.name}", encode(report, Profile.DTA_V1_SHORT), Profile.DTA_V1_SHORT))
    ext = [key_write(b"k" * 13, b"d" * 20, redundancy=4, extended=True), key_increment(b"k" * 13, 9, extended=True),
           append(5, b"d" * 20, extended=True), postcard(b"k" * 13, 2, 3, path_length=5, extended=True),
           sketch_column(1, 2, [3, 4, 5])]
    for report in ext:
        out.append((f"ext-{report.opcode.name}", encode(report), Profile.DTA_V1))
    return out


SAMPLES = sample_payloads()


@pytest.mark.parametrize("name, payload, profile", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_truncated_at_every_byte(name, payload, profile):
    decode(payload, profile)
    for cut in range(len(payload)):
        assert reason_of(payload[:cut], profile) == "TRUNCATED", cut


@pytest.mark.parametrize("name, payload, profile", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_trailing_bytes(name, payload, profile):
    for extra in (b"\0", b"\x01\x02\x03\x04"):
        assert reason_of(payload + extra, profile) == "BAD_LENGTH"


@pytest.mark.parametrize("opcode", [0, 5, 6, 0x7F])
@pytest.mark.parametrize("profile", list(Profile))
def test_unknown_dta_v1_opcodes(opcode, profile):
    base = bytes([opcode, 0, 0])[:profile.base_header.size]
    for body_len in (0, 9, 13):
        assert reason_of(base + bytes(body_len), profile) == "UNKNOWN_OPCODE"


@pytest.mark.parametrize("opcode", [0, 6, 99, 0xFF])
def test_unknown_extended_opcodes(opcode):
    for body in (b"", bytes(7), bytes(40)):
        assert reason_of(bytes([0x81, opcode, 0, 0]) + body) == "UNKNOWN_OPCODE"


@pytest.mark.parametrize("first", [0x80, 0x82, 0xC1, 0xFF])
def test_unsupported_extended_version(first):
    payload = bytearray(encode(key_write(KEY1, KEY1, extended=True)))
    payload[0] = first
    for profile in Profile:
        assert reason_of(bytes(payload), profile) == "BAD_PROFILE"


@pytest.mark.parametrize("n", [0, 5, 255])
def test_bad_redundancy(n):
    assert reason_of(bytes.fromhex("01 00 00") + bytes([n]) + bytes(8)) == "BAD_REDUNDANCY"
    assert reason_of(bytes.fromhex("01 00") + bytes([n]) + bytes(8), Profile.DTA_V1_SHORT) == "BAD_REDUNDANCY"
    assert reason_of(bytes.fromhex("03 00 00") + bytes([n]) + bytes(12)) == "BAD_REDUNDANCY"
    assert reason_of(bytes.fromhex("81 01 00 00") + bytes([n, 4, 4]) + bytes(8)) == "BAD_REDUNDANCY"
    assert reason_of(bytes.fromhex("81 03 00 00") + bytes([n, 4]) + bytes(12)) == "BAD_REDUNDANCY"
    for good in range(1, 5):
        assert decode(bytes.fromhex("01 00 00") + bytes([good]) + bytes(8)).redundancy == good


@pytest.mark.parametrize("key_len", [0, 33])
def test_bad_key_length(key_len):
    key = b"k" * key_len
    assert reason_of(bytes.fromhex("81 01 00 00 01") + bytes([key_len, 4]) + key + b"dddd") == "BAD_LENGTH"
    assert reason_of(bytes.fromhex("81 03 00 00 01") + bytes([key_len]) + bytes(8) + key) == "BAD_LENGTH"
    assert reason_of(bytes.fromhex("81 04 00 00 01 00") + bytes([key_len]) + b"dddd" + key) == "BAD_LENGTH"


def test_key_length_limits_accepted():
    for key_len in (1, 32):
        key = bytes(range(key_len))
        assert decode(bytes.fromhex("81 01 00 00 01") + bytes([key_len, 4]) + key + b"dddd").key == key


def test_bad_data_length():
    kw = bytes.fromhex("81 01 00 00 01 04")
    assert reason_of(kw + bytes([0]) + KEY1) == "BAD_LENGTH"  # data_len 0
    assert reason_of(kw + bytes([65]) + KEY1 + bytes(65)) == "BAD_LENGTH"  # data_len 65
    assert reason_of(kw + bytes([4]) + KEY1 + bytes(5)) == "BAD_LENGTH"  # data_len says 4, 5 present
    assert reason_of(kw + bytes([8]) + KEY1 + bytes(4)) == "TRUNCATED"  # data_len says 8, 4 present
    assert decode(kw + bytes([64]) + KEY1 + bytes(64)).data == bytes(64)
    ap = bytes.fromhex("81 02 00 00 00000001")
    assert reason_of(ap + bytes([0])) == "BAD_LENGTH"
    assert reason_of(ap + bytes([65]) + bytes(65)) == "BAD_LENGTH"
    assert reason_of(ap + bytes([3]) + bytes(4)) == "BAD_LENGTH"
    assert reason_of(ap + bytes([3]) + bytes(2)) == "TRUNCATED"


def test_bad_sketch_rows():
    head = bytes.fromhex("81 05 00 00 0001 0002")
    assert reason_of(head + bytes([0])) == "BAD_LENGTH"
    assert reason_of(head + bytes([17]) + bytes(68)) == "BAD_LENGTH"
    assert reason_of(head + bytes([2]) + bytes(7)) == "TRUNCATED"
    assert decode(head + bytes([16]) + bytes(64)).counters == (0,) * 16


@pytest.mark.parametrize("hop", [0, 9, 255])
def test_bad_hop(hop):
    assert reason_of(bytes.fromhex("04 00 00 00000001") + bytes([hop]) + bytes(4)) == "BAD_HOP"
    assert reason_of(bytes.fromhex("04 00 00000001") + bytes([hop]) + bytes(4), Profile.DTA_V1_SHORT) == "BAD_HOP"
    assert reason_of(bytes.fromhex("81 04 00 00") + bytes([hop, 0, 4]) + bytes(4) + KEY1) == "BAD_HOP"


def test_hop_beyond_path_length():
    assert reason_of(bytes.fromhex("81 04 00 00") + bytes([4, 3, 4]) + bytes(4) + KEY1) == "BAD_HOP"
    assert reason_of(bytes.fromhex("81 04 00 00") + bytes([1, 9, 4]) + bytes(4) + KEY1) == "BAD_HOP"
    assert decode(bytes.fromhex("81 04 00 00") + bytes([3, 3, 4]) + bytes(4) + KEY1).hop == 3
    assert decode(bytes.fromhex("81 04 00 00") + bytes([8, 0, 4]) + bytes(4) + KEY1).hop == 8


def test_empty_payload():
    for profile in Profile:
        assert reason_of(b"", profile) == "TRUNCATED"


# --------------------------------------------------------------------------------------------------
# NACKs


def nack_reason(payload: bytes) -> str:
    with pytest.raises(WireError) as err:
        decode_nack(payload)
    return err.value.reason


def test_nack_v1_layout_and_round_trip_low_seqnums():
    assert encode_nack(Nack(NackKind.SEQUENCE, 0x2A)) == bytes.fromhex("2A 80")
    for seqnum in range(128):
        nack = decode_nack(encode_nack(Nack(NackKind.SEQUENCE, seqnum)))
        assert (nack.kind, nack.value, nack.extended) == (NackKind.SEQUENCE, seqnum, False)


def test_nack_v1_round_trip_high_seqnums():
    for seqnum in range(128, 256):
        nack = decode_nack(encode_nack(Nack(NackKind.SEQUENCE, seqnum)))
        assert (nack.kind, nack.value, nack.extended) == (NackKind.SEQUENCE, seqnum, False)


@SETTINGS
@given(st.sampled_from(list(NackKind)), u16, u32)
def test_nack_extended_round_trip(kind, reporter, value):
    payload = encode_nack(Nack(kind, value, reporter, extended=True))
    assert payload == bytes([0x81, kind]) + reporter.to_bytes(2, "big") + value.to_bytes(4, "big")
    assert decode_nack(payload) == Nack(kind, value, reporter, extended=True)


def test_nack_v1_cannot_carry_sketch_columns():
    with pytest.raises(ValueError):
        encode_nack(Nack(NackKind.SKETCH_COLUMN, 3))


def test_decode_nack_rejects_bad_lengths():
    assert nack_reason(b"") == "BAD_LENGTH"
    assert nack_reason(b"\x05") == "BAD_LENGTH"
    assert nack_reason(b"\x05\x80\x00") == "BAD_LENGTH"
    assert nack_reason(bytes.fromhex("81 01 0000 000000")) == "BAD_LENGTH"
    assert nack_reason(bytes.fromhex("81 01 0000 00000000 00")) == "BAD_LENGTH"


@pytest.mark.parametrize("kind", [0, 3, 255])
def test_decode_nack_unknown_kind(kind):
    assert nack_reason(bytes([0x81, kind]) + bytes(6)) in {"UNKNOWN_OPCODE", "BAD_LENGTH"}


def test_decode_nack_unsupported_version():
    assert nack_reason(bytes.fromhex("82 01 0001 00000001")) == "BAD_PROFILE"
