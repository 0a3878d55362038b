"""bmv2 (simple_switch_grpc) as a P4 translator: what its P4Runtime server does not do, done over Thrift.

bmv2's P4Runtime takes the pipeline and table entries, but not register writes, and has no way to set the
parameters of `crc32_custom` hashes. Both go through bmv2's runtime CLI (`simple_switch_CLI`, Thrift):
`ThriftRegisters` carries the control plane's register writes, and `crc32_custom_commands` gives each
`crc32_custom` call site of the compiled program its polynomial (docs/p4.md, "Setting up bmv2").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softdta.core.control_plane import DEFAULT_FLUSH_IDLE_NS
from softdta.core.tables import QueuePair
from softdta.kernel.resources import P4_DIR
from softdta.spec import KEY_HASH_POLYNOMIALS, PARTITION_POLYNOMIAL, POSTCARD_HOP_POLYNOMIALS

# .p4runtime first: it picks the protobuf runtime the p4runtime wheel needs
from softdta.targets.p4runtime import P4Names, P4RuntimeClient, P4RuntimeError, P4Translator, load_p4info

# isort: split
from p4.v1 import p4runtime_pb2  # noqa: E402

KEY_COPY = re.compile(r"\{ reversed_key, 8w(\d) \}")  # COPY_HASH(n) in p4/softdta_v1model.p4
HOP_HASH = "hash(hop_hash, HashAlgorithm.crc32_custom"  # HOP_HASH(n), in hop order
PARTITION_HASH = "hash(partition_hash, HashAlgorithm.crc32_custom"  # the fleet's slot of a report


def run_cli(cli: str | Path, thrift_port: int, commands: list[str]) -> None:
    """Run runtime-CLI commands; any error it prints is raised."""
    try:
        result = subprocess.run([str(cli), "--thrift-port", str(thrift_port)],
                                input="".join(c + "\n" for c in commands), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise P4RuntimeError(f"bmv2 runtime CLI {cli}: {error}") from None
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if "Error" in line or "Invalid" in line or "Traceback" in line]
    if result.returncode != 0 or problems:
        raise P4RuntimeError(f"bmv2 runtime CLI (Thrift port {thrift_port}) failed: "
                             f"{problems[0] if problems else result.stderr.strip()[-300:]}")


class ThriftRegisters:
    """Register writes for bmv2, whose P4Runtime server refuses them ("Register writes are not supported
    yet"): the control plane's RegisterEntry messages, carried over Thrift (`P4Translator(write_registers=)`)."""

    def __init__(self, cli: str | Path, thrift_port: int, names: P4Names):
        self.cli, self.thrift_port = cli, thrift_port
        self.name_by_id = {r.preamble.id: r.preamble.name for r in names.info.registers}

    def write(self, entries: list[p4runtime_pb2.RegisterEntry]) -> None:
        if entries:
            run_cli(self.cli, self.thrift_port,
                    [f"register_write {self.name_by_id[e.register_id]} {e.index.index} "
                     f"{int.from_bytes(e.data.bitstring, 'big')}" for e in entries])


def crc32_custom_commands(program: dict[str, Any]) -> list[str]:
    """`set_crc32_parameters` for every crc32_custom call site of the compiled v1model program (its bmv2 JSON):
    Key-Write/Key-Increment copy n takes KEY_HASH_POLYNOMIALS[n], hop hash n POSTCARD_HOP_POLYNOMIALS[n], the
    fleet's partition hash PARTITION_POLYNOMIAL."""
    custom = {c["name"] for c in program["calculations"] if c["algo"] == "crc32_custom"}
    commands, hops = [], 0
    for action in program["actions"]:
        for primitive in action["primitives"]:
            calculation = next((p["value"] for p in primitive["parameters"] if p["type"] == "calculation"), None)
            if calculation not in custom:
                continue
            fragment = primitive.get("source_info", {}).get("source_fragment", "")
            copy = KEY_COPY.search(fragment)
            if copy:
                polynomial = KEY_HASH_POLYNOMIALS[int(copy.group(1))]
            elif fragment.startswith(HOP_HASH):
                polynomial, hops = POSTCARD_HOP_POLYNOMIALS[hops], hops + 1
            elif fragment.startswith(PARTITION_HASH):
                polynomial = PARTITION_POLYNOMIAL
            else:
                raise P4RuntimeError(f"crc32_custom call site {calculation} ({fragment[:60]!r}) is neither a key "
                                     "copy hash, a hop hash nor the partition hash: p4/softdta_v1model.p4 and "
                                     "softdta/targets/bmv2.py disagree")
            commands.append(f"set_crc32_parameters {calculation} {polynomial:#010x} 0xffffffff 0xffffffff true true")
    return commands


PROGRAM = P4_DIR / "softdta_v1model.p4"


def tool(name: str, variable: str, what: str) -> str:
    """`name` from $`variable` (its bin directory) or PATH; P4RuntimeError saying how to get it otherwise."""
    given = Path(os.environ.get(variable, "") or "/nonexistent") / name
    found = str(given) if given.is_file() else shutil.which(name)
    if not found:
        raise P4RuntimeError(f"{name} not found: set {variable} to {what}'s bin directory or put it on PATH "
                             "(neither Debian nor PyPI packages it; docs/p4.md)")
    return found


def compile_v1model(out: Path) -> tuple[Path, Path]:
    """The v1model program compiled by p4c-bm2-ss into `out`: the bmv2 JSON and the P4Info (text)."""
    out.mkdir(parents=True, exist_ok=True)
    program, p4info = out / "softdta.json", out / "softdta.p4info.txtpb"
    result = subprocess.run([tool("p4c-bm2-ss", "P4C", "p4c"), "--std", "p4-16", "-I", str(PROGRAM.parent),
                             "-o", str(program), "--p4runtime-files", str(p4info), str(PROGRAM)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise P4RuntimeError(f"p4c-bm2-ss failed on {PROGRAM}: {result.stderr.strip().splitlines()[-1:]}")
    return program, p4info


class Bmv2:
    """simple_switch_grpc serving `ports` ({port number: interface}), its pipeline set to `program` (bmv2 JSON),
    with crc32_custom parameters set; `translator()` gives the P4Translator that fills it."""

    def __init__(self, program: Path, ports: dict[int, str], *, grpc_port: int = 9559, thrift_port: int = 9090,
                 device_id: int = 1, log: Path | None = None, timeout: float = 30.0):
        switch = tool("simple_switch_grpc", "BMV2", "bmv2")
        self.cli, self.thrift_port = tool("simple_switch_CLI", "BMV2", "bmv2"), thrift_port
        interfaces = [argument for port, name in sorted(ports.items()) for argument in ("-i", f"{port}@{name}")]
        self.process = subprocess.Popen(
            [switch, "--no-p4", "--device-id", str(device_id), *interfaces, "--thrift-port", str(thrift_port), "--",
             "--grpc-server-addr", f"127.0.0.1:{grpc_port}"],
            stdout=log.open("w") if log else subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            self.client = P4RuntimeClient(f"127.0.0.1:{grpc_port}", device_id=device_id, timeout=timeout)
            self.client.set_pipeline(load_p4info(), program.read_bytes())
            run_cli(self.cli, thrift_port, crc32_custom_commands(json.loads(program.read_bytes())))
        except BaseException:
            self.close()
            raise

    def translator(self, *, egress: Callable[[QueuePair], int] = lambda qp: 0,
                   flush_idle_ns: int = DEFAULT_FLUSH_IDLE_NS) -> P4Translator:
        registers = ThriftRegisters(self.cli, self.thrift_port, P4Names(load_p4info()))
        return P4Translator(self.client, write_registers=registers.write, egress=egress, flush_idle_ns=flush_idle_ns)

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Bmv2:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
