"""Careless configuration is refused with the reason: translator tables and collector configuration through the
real command line (exit 2, one line naming the setting and the fix, never a traceback) and through the validator
itself, and the commands docker-compose.yml runs against the command line's options. Nothing here needs root."""

import subprocess

import pytest
import yaml

from softdta.collector.config import CollectorConfig
from softdta.core.settings import TableError
from softdta.wire.pcap import write_pcap
from tests.common import COLLECTOR_CONFIG as COLLECTOR
from tests.common import ROOT, SOFTDTA, edited, one_line_error

TABLES = (ROOT / "examples" / "tables.toml").read_text()


def softdta(*args):
    result = subprocess.run(SOFTDTA + list(args), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("pattern, replacement, words", [
    (r"^batch = 4 *$", "batch = 0", "batch = 0"),
    (r'^token = .*$', 'token = ""', "token is missing or empty"),
    (r"^control_port = .*$", "control_port = 70000", "control_port = 70000 is out of range"),
    (r'^ip = .*$', "ip = 12", "ip = 12 must be a string"),
    (r"^slots = 131072.*$", "slots = 1024.5", "slots = 1024.5 must be a whole number"),
    (r"^query_port = .*$", "query_port = 40050", "control_port and query_port are both 40050"),
    (r"^query_port = 8040$", 'query_port = 8040\nxdp_mode = "skb"', "xdp_mode = 'skb' must be one of 'native', "
                                                                   "'generic'"),
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
    (r'^backend = .*$', 'backend = "verbs"\ntranslate_locally = true', 'translate_locally needs backend = "xdp"'),
    (r"^query_port = 8040$", 'query_port = 8040\ntranslate_locally = "yes"', "translate_locally = 'yes' must be "
                                                                             "true or false"),
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


@pytest.mark.parametrize("change, message", [
    ({"slots": 1000}, "power of two"),
    ({"transport": "uc", "primitive": "key-increment"}, "needs transport \"rc\""),
    ({"hash": "md5"}, "hash = 'md5'"),
    ({"redundancy": 5}, "redundancy = 5 is out of range; give a whole number from 1 to 4"),
])
def test_bad_structures_are_refused_with_the_reason(change, message):
    document = {"collector": {"ip": "10.77.1.1", "mac": "02:00:00:00:00:01"},
                "structures": [{"primitive": "key-write", "slots": 1024, **change}]}
    with pytest.raises(TableError, match=message):
        CollectorConfig.from_dict(document)


@pytest.mark.parametrize("value", [0, -1, "8", 1.5, True, 1 << 21])
def test_max_qps_must_be_a_sensible_whole_number(value):
    document = {"collector": {"ip": "10.77.1.1", "mac": "02:00:00:00:00:01", "max_qps": value},
                "structures": [{"primitive": "key-write", "slots": 1024}]}
    with pytest.raises(TableError, match="max_qps = .* whole number"):
        CollectorConfig.from_dict(document)


def test_docker_compose_runs_only_commands_the_cli_has_with_configurations_that_load():
    """The verdict itself runs in tests/interop/test_compose.py; this catches a renamed option or setting early."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"etcd", "nats", "controller", "c1", "c2", "c3", "t1", "t2", "r1", "r2", "router", "check"} == set(services)
    for name, service in services.items():
        assert service["cap_add"] == ["ALL"] and service["cap_drop"] == ["SYS_RESOURCE"], name
        command = service["command"]
        if command[0] != "softdta":
            continue
        help_text = softdta(*command[1:3], "--help").stdout
        for option in (arg for arg in command[3:] if arg.startswith("--")):
            assert option in help_text, f"{name}: {option} is not an option of softdta {' '.join(command[1:3])}"
        if "--config" in command:
            config = command[command.index("--config") + 1].replace("/etc/softdta", str(ROOT / "examples/compose"))
            assert CollectorConfig.from_toml(config).xdp_mode == "generic", name  # docker's bridge ports run no XDP
