"""The offline command line, run as a user would: report -> translate -> decode, and its error messages."""

import json
import subprocess
import sys

import pytest

from softdta.wire.pcap import Packet, read_pcap, write_pcap
from softdta.wire.roce import parse_roce
from tests.common import EXAMPLE_TABLES


def softdta(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "softdta.cli", *map(str, args)], capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_report_translate_decode_round_trip(tmp_path):
    reports, roce = tmp_path / "reports.pcap", tmp_path / "roce.pcap"
    softdta("report", "key-write", "--count", 20, "-n", 3, "--out", reports)
    summary = json.loads(softdta("translate", "--tables", EXAMPLE_TABLES, "--in", reports, "--out", roce,
                                 "--with-collector", "--json").stdout)
    assert summary["counters"] == {"rx_reports": 20, "rx_key_write": 20, "tx_frames": 60}
    assert summary["collector"] == {"executed": 60}
    frames = [parse_roce(p.frame) for p in read_pcap(roce)]
    assert len(frames) == 60 and all(f.icrc_ok for f in frames)
    lines = [json.loads(line) for line in softdta("decode", roce, "--json").stdout.splitlines()]
    assert [line["psn"] for line in lines] == list(range(60))
    assert all(line["kind"] == "roce" and not line["problems"] for line in lines)
    dta_lines = [json.loads(line) for line in softdta("decode", reports, "--json").stdout.splitlines()]
    assert {line["report"]["opcode"] for line in dta_lines} == {"KEY_WRITE"}


def test_translate_flush_writes_partial_batches(tmp_path):
    reports, roce = tmp_path / "reports.pcap", tmp_path / "roce.pcap"
    softdta("report", "append", "--count", 6, "--lists", 1, "--out", reports)
    assert len(list(read_pcap(reports))) == 6
    softdta("translate", "--tables", EXAMPLE_TABLES, "--in", reports, "--out", roce)
    assert len(list(read_pcap(roce))) == 1  # one full batch of 4
    softdta("translate", "--tables", EXAMPLE_TABLES, "--in", reports, "--out", roce, "--flush")
    assert len(list(read_pcap(roce))) == 2


def test_decode_flags_bad_icrc_and_malformed_reports(tmp_path):
    reports, roce = tmp_path / "reports.pcap", tmp_path / "roce.pcap"
    softdta("report", "key-write", "--count", 2, "-n", 1, "--out", reports)
    softdta("translate", "--tables", EXAMPLE_TABLES, "--in", reports, "--out", roce)
    packets = list(read_pcap(roce))
    corrupted = bytearray(packets[0].frame)
    corrupted[-8] ^= 0xFF
    truncated_report = next(iter(read_pcap(reports))).frame
    truncated_report = truncated_report[:-3]
    bad = tmp_path / "bad.pcap"
    write_pcap(bad, [Packet(0, bytes(corrupted)), packets[1], Packet(0, truncated_report)])
    result = softdta("decode", bad, "--json", check=False)
    assert result.returncode == 1
    problems = [json.loads(line)["problems"] for line in result.stdout.splitlines()]
    assert problems[0] == ["bad iCRC"] and problems[1] == [] and problems[2]


def test_errors_name_the_problem_and_the_fix(tmp_path):
    missing = softdta("translate", "--tables", tmp_path / "none.toml", "--in", "x", "--out", "y", check=False)
    assert missing.returncode == 2 and "no such file" in missing.stderr
    broken = tmp_path / "tables.toml"
    broken.write_text(EXAMPLE_TABLES.read_text().replace("length = 1048576 }", "length = 1000000 }", 1))
    reports = tmp_path / "r.pcap"
    softdta("report", "append", "--count", 1, "--out", reports)
    result = softdta("translate", "--tables", broken, "--in", reports, "--out", tmp_path / "o.pcap", check=False)
    assert result.returncode == 2 and "power of two" in result.stderr and "length" in result.stderr
    not_pcap = tmp_path / "text.pcap"
    not_pcap.write_text("hello world, this is not a capture")
    result = softdta("decode", not_pcap, check=False)
    assert result.returncode == 2 and "not a pcap file" in result.stderr
    result = softdta("report", "key-write", "--key-len", 13, "--profile", "dta-v1", "--out", reports, check=False)
    assert result.returncode == 0  # 13-byte keys switch to the extended format by themselves


def test_codegen_check_passes_on_a_clean_tree():
    assert softdta("codegen", "--check").stdout == ""


@pytest.mark.privileged
def test_translate_engines_write_the_same_frames(tmp_path):
    frames = {}
    for primitive, extra in (("key-write", ["-n", 3]), ("append", []), ("postcarding", []), ("sketch-merge", [])):
        reports = tmp_path / f"{primitive}.pcap"
        softdta("report", primitive, "--count", 40, *extra, "--out", reports)
        for engine in ("reference", "xdp"):
            out = tmp_path / f"{primitive}-{engine}.pcap"
            summary = json.loads(softdta("translate", "--engine", engine, "--tables", EXAMPLE_TABLES, "--in", reports,
                                         "--out", out, "--flush", "--json").stdout)
            frames[engine] = ([p.frame for p in read_pcap(out)], summary["counters"])
        assert frames["xdp"] == frames["reference"], primitive
