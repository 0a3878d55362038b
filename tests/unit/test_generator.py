"""The kernel report generator's plan: where each report's key, data and seqnum go, for every primitive and
encoding, proven by building the reports it predicts with the ordinary codec."""

import pytest

from softdta.core import workload
from softdta.core.generator import GeneratorError, plan
from softdta.spec import GENERATOR_FRAME_MAX
from softdta.wire import dta
from softdta.wire.dta import Profile
from softdta.wire.frames import ip_bytes, mac_bytes

ADDRESS = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"),
                                   mac_bytes("02:5d:7a:00:00:01"), ip_bytes("10.77.1.1"))
TEMPLATES = {
    "key-write v1": (dta.key_write(0x0A0B0C0D, 0xFFFFFFF0, 1, seqnum=250), Profile.DTA_V1),
    "key-write short": (dta.key_write(7, 9, 2), Profile.DTA_V1_SHORT),
    "key-write extended": (dta.key_write(bytes(range(13)), bytes(20), 3, extended=True, immediate=True),
                           Profile.DTA_V1),
    "key-increment": (dta.key_increment(5, 1500, 1), Profile.DTA_V1),
    "append": (dta.append(3, 1), Profile.DTA_V1),
    "postcarding extended": (dta.postcard(bytes(8), 2, 77, path_length=5, extended=True, essential=True),
                             Profile.DTA_V1),
    "sketch-merge": (dta.sketch_column(1, 9, [1, 2, 3, 4]), Profile.DTA_V1),
}


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_predicted_report_is_the_frame_the_generator_writes(name):
    template, profile = TEMPLATES[name]
    generator = plan(template, ADDRESS.frame(template, profile), profile, key_span=5)
    for index in [0, 1, 4, 5, 6, 255, 256, 1000, 2**32 - 1, 2**32 + 3]:
        report = generator.report_at(index)
        assert generator.frame_at(index) == ADDRESS.frame(report, profile), (name, index)
        assert dta.decode(generator.frame_at(index)[42:], profile) == report
    assert generator.report_at(0) == template


def test_keys_cycle_over_the_span_and_data_and_seqnum_count_up_with_wraparound():
    template, profile = TEMPLATES["key-write v1"]
    generator = plan(template, ADDRESS.frame(template, profile), profile, key_span=3)
    reports = [generator.report_at(index) for index in range(20)]
    assert len({report.key for report in reports}) == 3
    assert [report.key for report in reports[:4]] == [bytes.fromhex(k) for k in
                                                        ("0a0b0c0d", "0a0b0c0e", "0a0b0c0f", "0a0b0c0d")]
    assert [int.from_bytes(report.data, "big") for report in reports[15:17]] == [0xFFFFFFFF, 0]
    assert [report.seqnum for report in reports[4:8]] == [254, 255, 0, 1]
    config = generator.config()
    assert (config["key_offset"], config["data_offset"], config["seq_offset"]) == (42 + 4, 42 + 8, 42 + 1)
    assert (config["key_base"], config["data_base"], config["seq_base"]) == (0x0A0B0C0D, 0xFFFFFFF0, 250)


def test_fields_a_template_lacks_are_left_alone():
    sketch, profile = TEMPLATES["sketch-merge"]
    generator = plan(sketch, ADDRESS.frame(sketch, profile), profile, key_span=9)
    assert (generator.key_offset, generator.data_offset, generator.key_span) == (0, 0, 1)
    short, profile = TEMPLATES["key-write short"]
    assert plan(short, ADDRESS.frame(short, profile), profile).seq_offset == 0  # dta-v1-short has no seqnum
    assert {generator.report_at(i).counters for i in range(10)} == {sketch.counters}


def test_templates_the_kernel_cannot_send_are_refused_with_the_fix():
    template, profile = TEMPLATES["key-write v1"]
    frame = ADDRESS.frame(template, profile)
    with pytest.raises(GeneratorError, match="give 1 to"):
        plan(template, frame, profile, key_span=0)
    long = dta.key_write(bytes(64), bytes(200), 1, extended=True)
    with pytest.raises(GeneratorError, match=f"at most {GENERATOR_FRAME_MAX}"):
        plan(long, ADDRESS.frame(long, profile), profile)
    ipv6 = workload.ReporterAddress(ADDRESS.mac, ip_bytes("fd00::9"), ADDRESS.translator_mac, ip_bytes("fd00::1"))
    with pytest.raises(GeneratorError, match="IPv4 reports without a UDP checksum"):
        plan(template, ipv6.frame(template, profile), profile)
    with pytest.raises(GeneratorError, match="does not carry the template"):
        plan(dta.key_write(1, 2, 1), frame, profile)
