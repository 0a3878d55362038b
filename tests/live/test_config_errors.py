"""Careless configuration through the real command line: exit 2, one line naming the setting and the fix, and
never a traceback (translator tables and collector configuration)."""

import os
import re
import socket
import subprocess
import sys

import pytest

from softdta.wire.pcap import write_pcap
from tests.common import ROOT

SOFTDTA = [sys.executable, "-m", "softdta.cli"]
COLLECTOR = (ROOT / "examples" / "collector.toml").read_text()
TABLES = (ROOT / "examples" / "tables.toml").read_text()


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("softdta: error: "), result.stderr
    return lines[0]


def edited(text: str, pattern: str, replacement: str) -> str:
    changed, count = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
    assert count == 1, pattern
    return changed


@pytest.mark.parametrize("pattern, replacement, words", [
    (r"^batch = 4 *$", "batch = 0", "batch = 0"),
    (r'^token = .*$', 'token = ""', "token is missing or empty"),
    (r"^control_port = .*$", "control_port = 70000", "control_port = 70000 is out of range"),
    (r'^ip = .*$', "ip = 12", "ip = 12 must be a string"),
    (r"^slots = 131072.*$", "slots = 1024.5", "slots = 1024.5 must be a whole number"),
    (r"^query_port = .*$", "query_port = 40050", "control_port and query_port are both 40050"),
    (r"^control_port = .*$", "contrl_port = 40051", "did you mean 'control_port'"),
    (r'^data_dir = .*$', 'data_dir = "collector.toml"', "is a file"),
    (r"^max_qps = .*$|^query_port = 8040$", "query_port = 8040\nmax_qps = 0", "max_qps = 0"),
    (r"^query_port = 8040$", 'query_port = 8040\ntls_cert = "nope.pem"', "tls_cert"),
    (r"^query_port = 8040$", 'query_port = 8040\ntls_cert = "collector.toml"', "needs both tls_cert and tls_key"),
    (r"^batch = 4 *$", "batch = 4\n[[append]]\nfirst_list = 0\nlists = 8\nentries = 16",
     "from first_list 0 (64 lists) and from first_list 0 overlap; give each range its own list ids (first_list 64"),
    (r"^batch = 4 *$", "batch = 4\n[[append]]\nfirst_list = 63\nlists = 8\nentries = 16",
     "from first_list 0 (64 lists) and from first_list 63 overlap"),
    (r"^\[\[structures\]\](.|\n)*", "", "it hosts no structure; add a [[structures]] or an [[append]] table"),
    (r'^name = "c1"$', f'name = "{"c" * 300}"', "(300 characters)' must be 1 to 64 letters, digits"),
    (r'^name = "c1"$', 'name = "c1/../x"', "name 'c1/../x' must be 1 to 64 letters, digits"),
    (r'^ip = .*$', 'ip = "255.255.255.255"', "ip 255.255.255.255 is a multicast, broadcast, loopback"),
    (r'^ip = .*$', 'ip = "224.0.0.1"', "ip 224.0.0.1 is a multicast, broadcast, loopback"),
    (r'^ip = .*$', 'ip = "0.0.0.0"', "ip 0.0.0.0 is a multicast"),
    (r'^mac = .*$', 'mac = "ff:ff:ff:ff:ff:ff"', "mac ff:ff:ff:ff:ff:ff is a multicast, broadcast or all-zero"),
    (r'^mac = .*$', 'mac = "01:00:5e:00:00:01"', "the first octet even"),
])
def test_collector_configuration_errors(tmp_path, pattern, replacement, words):
    (tmp_path / "collector.toml").write_text(edited(COLLECTOR, pattern, replacement))
    result = subprocess.run(SOFTDTA + ["collector", "up", "--config", str(tmp_path / "collector.toml")],
                            capture_output=True, text=True, timeout=60)
    assert words in one_line_error(result)


@pytest.mark.parametrize("pattern, replacement, words", [
    (r"^batch = 4 *$", "batch = 0", "batch = 0"),
    (r'^collector = "c1"$', "collector = 5", "collector = 5 must be a string"),
    (r"^qp = \{ remote_qpn = 0x102.*$", "qp = 5", "must be a table"),
    (r"^ack_request_interval = .*$", "ack_request_interval = -1", "ack_request_interval = -1"),
    (r"^ttl = 64$", "tll = 64", "did you mean 'ttl'"),
    (r"remote_qpn = 0x102", "remote_qpn = 0x101", "remote_qpn 0x101 is already"),
    (r"rkey = 0x1002, base = 0x7f0010000000", "rkey = 0x1001, base = 0x7f0000000040", "overlaps"),
])
def test_translator_table_errors(tmp_path, pattern, replacement, words):
    (tmp_path / "tables.toml").write_text(edited(TABLES, pattern, replacement))
    write_pcap(tmp_path / "in.pcap", [])
    result = subprocess.run(SOFTDTA + ["translate", "--tables", str(tmp_path / "tables.toml"), "--in",
                                       str(tmp_path / "in.pcap"), "--out", str(tmp_path / "out.pcap")],
                            capture_output=True, text=True, timeout=60)
    assert words in one_line_error(result)


@pytest.mark.privileged
@pytest.mark.parametrize("port_key", ["control_port", "query_port"])
def test_a_port_in_use_names_the_setting(tmp_path, port_key):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = edited(COLLECTOR, rf"^{port_key} = .*$", f"{port_key} = {port}")
        config = edited(config, r'^data_dir = .*$', f'data_dir = "{tmp_path / "data"}"')
        (tmp_path / "collector.toml").write_text(config)
        result = subprocess.run(SOFTDTA + ["collector", "up", "--config", str(tmp_path / "collector.toml"),
                                           "--control-host", "127.0.0.1"],
                                capture_output=True, text=True, timeout=60)
    line = one_line_error(result)
    assert port_key in line and str(port) in line


@pytest.mark.parametrize("flag", ["--take", "--follow"])
def test_taking_append_entries_without_the_token(flag):
    result = subprocess.run(SOFTDTA + ["query", "append", "append0@10.77.1.1", flag], capture_output=True, text=True,
                            timeout=60, env={key: value for key, value in os.environ.items()
                                             if key != "SOFTDTA_TOKEN"})
    assert "needs the collector's token: give --token or set SOFTDTA_TOKEN" in one_line_error(result)


@pytest.mark.parametrize("command, words", [
    (["collector", "up", "--config", str(ROOT / "examples" / "collector.toml"), "--netns", "sdta-missing"],
     "network namespace 'sdta-missing' does not exist"),
    (["translator", "up", "--tables", str(ROOT / "examples" / "tables.toml"), "-i", "sdta-missing0",
      "--netns", "sdta-missing"], "network namespace 'sdta-missing' does not exist"),
    (["demo", "--burst-seconds", "-1"], "--burst-seconds -1 must be 0 (no burst) or more"),
    (["demo", "--burst-rate", "-5"], "--burst-rate -5 must be 0 (as fast as the generators go) or more reports/s"),
])
def test_every_error_softdta_raises_on_purpose_is_one_line(command, words):
    """One error hierarchy (softdta.errors.SoftdtaError), caught once by the command line."""
    assert words in one_line_error(subprocess.run(SOFTDTA + command, capture_output=True, text=True, timeout=60))
