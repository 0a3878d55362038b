"""Careless use of the real command line: exit 2, one line naming the setting and the fix, and never a traceback
(a port in use, a missing token or network namespace, bad demo options). tests/unit/test_config_validation.py
holds the errors in translator tables and collector configuration."""

import os
import socket
import subprocess

import pytest

from tests.common import COLLECTOR_CONFIG as COLLECTOR
from tests.common import ROOT, SOFTDTA, edited, one_line_error


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
    pytest.param(["translator", "up", "--tables", str(ROOT / "examples" / "tables.toml"), "-i", "sdta-missing0",
                  "--pin", "/sys/fs/bpf/softdta-config-errors"],
                 "interface 'sdta-missing0' does not exist in this network namespace; check `ip link`",
                 marks=pytest.mark.privileged),
    (["demo", "--burst-seconds", "-1"], "--burst-seconds -1 must be 0 (no burst) or more"),
    (["demo", "--burst-rate", "-5"], "--burst-rate -5 must be 0 (as fast as the generators go) or more reports/s"),
])
def test_every_error_softdta_raises_on_purpose_is_one_line(command, words):
    """One error hierarchy (softdta.errors.SoftdtaError), caught once by the command line."""
    assert words in one_line_error(subprocess.run(SOFTDTA + command, capture_output=True, text=True, timeout=60))


EXPORT = '\n[export]\nurl = "nats://127.0.0.1:4222"\n'


@pytest.mark.parametrize("edits, words", [
    ([(r"\Z", EXPORT + 'stream = "bad.name"\n')], "[export] stream 'bad.name' is not a JetStream stream name"),
    ([(r"\Z", EXPORT + 'subject_prefix = "a..b"\n')], "[export] subject_prefix 'a..b' is not a NATS subject"),
    ([(r"\Z", EXPORT + 'subject_prefix = "x.*"\n')], "[export] subject_prefix 'x.*' is not a NATS subject"),
    ([(r"\Z", EXPORT.replace("nats://", "http://"))], "give nats://HOST:PORT"),
    ([(r"\Z", EXPORT.replace(":4222", ""))], "give nats://HOST:PORT"),
    ([(r"^data_dir = .*\n", ""), (r"\Z", EXPORT)], "[export] needs [collector] data_dir"),
    ([(r'^name = "c1"', 'name = "c.1"'), (r"\Z", EXPORT)], "collector name 'c.1' cannot be a NATS subject token"),
    ([(r"\Z", EXPORT + "backlog = 5\n")], "[export]: unknown setting 'backlog'; did you mean 'backlog_entries'?"),
], ids=["stream", "prefix-empty-token", "prefix-wildcard", "url-scheme", "url-port", "no-data-dir", "collector-name",
        "unknown-key"])
def test_a_bad_export_section_is_one_line_naming_it(tmp_path, edits, words):
    """`softdta collector up` from a plain shell's environment refuses it before it touches anything."""
    config = COLLECTOR
    for pattern, replacement in edits:
        config = edited(config, pattern, replacement)
    (tmp_path / "collector.toml").write_text(config)
    result = subprocess.run(SOFTDTA + ["collector", "up", "--config", str(tmp_path / "collector.toml")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert words in one_line_error(result)


def test_an_export_url_given_on_the_command_line_is_checked():
    result = subprocess.run(SOFTDTA + ["collector", "up", "--config", str(ROOT / "examples" / "collector.toml"),
                                       "--export", "nats://broker"], capture_output=True, text=True, timeout=60)
    assert "'nats://broker' ([export] url, --export) is not a NATS server URL; give nats://HOST:PORT" in \
        one_line_error(result)
