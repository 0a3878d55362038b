"""The commands README.md and docs/ show, run as a user types them: the installed `softdta` console script, from
the checkout, in an environment holding only PATH and HOME (and $P4C / $BMV2 where docs/p4.md says to set them),
so that nothing the test process imported or set can make them work."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from softdta.kernel.netns import Namespace, cleanup_prefix, veth_pair
from softdta.wire.pcap import read_pcap
from softdta.wire.roce import parse_roce
from tests.common import ROOT, bmv2_tool, p4_tool, wait_for_line

PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TABLES = "examples/tables.toml"  # relative, as the docs write it: the commands run in the checkout


@pytest.fixture(scope="module")
def console_script() -> str:
    found = shutil.which("softdta")
    if not found:
        pytest.fail("the `softdta` console script is not on PATH: run `pip install -e .` (scripts/setup.sh does)")
    return found


@pytest.fixture
def shell(console_script, tmp_path):
    """Runs `softdta ARGS...` in a plain shell's environment; `tools` adds $P4C or $BMV2 as a user sets them."""
    home = tmp_path / "home"
    home.mkdir()

    def run(*args, tools: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([console_script, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env=plain_environment(home, tools))
    return run


def plain_environment(home: Path, tools: dict[str, str] | None = None) -> dict[str, str]:
    return {"PATH": PLAIN_PATH, "HOME": str(home), **(tools or {})}


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{result.args[1:]}: exit {result.returncode}\n{result.stderr[-3000:]}"
    return result


def failed_in_one_line(result: subprocess.CompletedProcess, words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("softdta: error: "), \
        f"{result.args[1:]}: exit {result.returncode}\n{result.stderr[-3000:]}"
    assert words in lines[0], lines[0]


def p4c() -> dict[str, str]:
    return {"P4C": str(Path(p4_tool("p4c-bm2-ss")).parent)}


def closed_port() -> socket.socket:
    """A bound TCP port nobody listens on, held until closed: connecting to it is refused."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    return holder


def sub_commands(help_text: str) -> list[str]:
    """The sub-commands a usage offers: `{a,b,c} ...` (choices of an argument have no `...` after them)."""
    usage = " ".join(help_text.split("\n\n")[0].split())
    found = re.search(r"\{([a-z0-9,-]+)\} \.\.\.", usage)
    return found.group(1).split(",") if found else []


def test_help_of_every_command_and_sub_command(shell):
    groups = sub_commands(succeeded(shell("--help")).stdout)
    assert {"translate", "decode", "report", "translator", "collector", "query", "demo", "lab", "p4",
            "codegen"} <= set(groups)
    for group in groups:
        for action in sub_commands(succeeded(shell(group, "--help")).stdout):
            assert succeeded(shell(group, action, "--help")).stdout.startswith(f"usage: softdta {group} {action}")


def test_report_translate_decode(shell, tmp_path):
    reports, roce = tmp_path / "reports.pcap", tmp_path / "roce.pcap"
    succeeded(shell("report", "key-write", "--count", 1000, "-n", 2, "--out", reports))
    succeeded(shell("translate", "--tables", TABLES, "--in", reports, "--out", roce, "--with-collector"))
    frames = [parse_roce(packet.frame) for packet in read_pcap(roce)]
    assert len(frames) == 2000 and all(frame.icrc_ok for frame in frames)
    assert "0 frame(s) with problems" in succeeded(shell("decode", roce)).stderr
    decoded = [json.loads(line) for line in succeeded(shell("decode", roce, "--json")).stdout.splitlines()]
    assert len(decoded) == 2000 and not any(line["problems"] for line in decoded)


def test_codegen_check(shell):
    succeeded(shell("codegen", "--check"))


def test_p4_entries(shell):
    updates = succeeded(shell("p4", "entries", "--tables", TABLES)).stdout.splitlines()
    assert updates and all(update.startswith(("type: INSERT", "type: MODIFY")) for update in updates)
    succeeded(shell("p4", "entries", "--tables", TABLES, "--architecture", "tna", "--port", "key-write@c1=4"))


def test_p4_build(shell, tmp_path):
    out = tmp_path / "p4"
    assert succeeded(shell("p4", "build", "--out", out, tools=p4c())).stdout.startswith("built ")
    assert json.loads((out / "softdta.json").read_text())["pipelines"]
    assert "tables {" in (out / "softdta.p4info.txtpb").read_text()


def test_p4_build_without_p4c_says_how_to_get_it(shell, tmp_path):
    if shutil.which("p4c-bm2-ss", path=PLAIN_PATH):
        pytest.skip("p4c-bm2-ss is on the plain PATH here")
    failed_in_one_line(shell("p4", "build", "--out", tmp_path / "p4"), "set P4C")


def test_p4_push_to_no_switch_fails_in_one_line(shell):
    with closed_port() as port:
        failed_in_one_line(shell("p4", "push", "--tables", TABLES, "--p4runtime",
                                 f"127.0.0.1:{port.getsockname()[1]}", "--timeout", 1), "P4Runtime")


def test_query_without_a_collector_fails_in_one_line(shell):
    with closed_port() as port:
        failed_in_one_line(shell("query", "structures", "--url", f"http://127.0.0.1:{port.getsockname()[1]}"),
                           "softdta collector up")


def test_translator_stats_without_a_translator_fails_in_one_line(shell, tmp_path):
    failed_in_one_line(shell("translator", "stats", "--pin", tmp_path / "none"), "softdta translator up")


def test_demo_offline(shell):
    summary = succeeded(shell("demo", "--offline", timeout=600)).stdout
    assert "queries against the truth" in summary and "key-write" in summary


# as root: BPF programs and interfaces

PREFIX = f"sdtash{os.getpid() % 10000}"  # namespaces of this test run only


@pytest.mark.privileged
def test_translate_through_the_xdp_fast_path(shell, tmp_path):
    reports, roce = tmp_path / "reports.pcap", tmp_path / "roce.pcap"
    succeeded(shell("report", "key-write", "--count", 100, "-n", 2, "--out", reports))
    succeeded(shell("translate", "--engine", "xdp", "--tables", TABLES, "--in", reports, "--out", roce))
    frames = [parse_roce(packet.frame) for packet in read_pcap(roce)]
    assert len(frames) == 200 and all(frame.icrc_ok for frame in frames)


@pytest.mark.privileged
def test_p4_run_and_a_push_to_it(console_script, tmp_path):
    """`softdta p4 run` on a port in a namespace of the test's own, then `softdta p4 push` of the same tables to
    its P4Runtime server, then SIGTERM: each exits 0."""
    cleanup_prefix(PREFIX)
    switch, host = Namespace.create(PREFIX + "s"), Namespace.create(PREFIX + "h")
    tools = {"P4C": str(Path(p4_tool("p4c-bm2-ss")).parent), "BMV2": str(Path(bmv2_tool("simple_switch_grpc")).parent)}
    environment = plain_environment(tmp_path, tools)
    process = None
    try:
        veth_pair(switch, "p0", host, "h0")
        process = subprocess.Popen(["ip", "netns", "exec", switch.name, console_script, "p4", "run", "--tables",
                                    TABLES, "-i", "p0", "--log", str(tmp_path / "bmv2.log")],
                                   cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        assert wait_for_line(process, "bmv2 translator up on 0@p0", timeout=120)
        pushed = subprocess.run(["ip", "netns", "exec", switch.name, console_script, "p4", "push", "--tables", TABLES,
                                 "--p4runtime", "127.0.0.1:9559", "--election-id", "2", "--bmv2-thrift", "9090"],
                                cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
        assert succeeded(pushed).stdout.startswith("pushed ")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process and process.poll() is None:
            process.kill()
            process.wait()
        cleanup_prefix(PREFIX)
