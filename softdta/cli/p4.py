"""`softdta p4 entries|push|build|run`: the P4 translator and its control plane."""

from __future__ import annotations

import argparse
from pathlib import Path

from softdta.cli.common import CliError, Commands, Signals, add_command
from softdta.core.control_plane import DEFAULT_FLUSH_IDLE_NS
from softdta.core.tables import Tables


def register(commands: Commands) -> None:
    """Add the p4 command(s) to the `softdta` parser."""
    p4 = add_command(commands, "p4", "translate on a P4 switch instead: print or push its table entries, build the "
                     "program, run it in bmv2", "See docs/p4.md.")
    p4_actions = p4.add_subparsers(dest="action", required=True, title="actions")
    entries = add_command(p4_actions, "entries", "print the P4Runtime updates a first push of the tables sends "
                          "(protobuf text format, one a line)")
    push = add_command(p4_actions, "push", "write the tables to a running P4 switch over P4Runtime, live")
    run_p4 = add_command(p4_actions, "run", "build the v1model program, run it in bmv2 on interfaces, and push the "
                         "tables to it; until interrupted (root)")
    for command in (entries, push, run_p4):
        command.add_argument("--tables", required=True, help="translator tables (TOML, docs/tables.md)")
        command.add_argument("--port", action="append", default=[], metavar="QP_OR_INTERFACE=PORT",
                             help="device port towards a QP's collector (default: the port reports came in on)")
    for command in (entries, push):
        command.add_argument("--architecture", choices=["v1model", "tna"], default="v1model",
                             help="the program the switch runs: v1model (default: bmv2) or tna (Tofino)")
    push.add_argument("--p4runtime", required=True, metavar="HOST:PORT", help="the switch's P4Runtime server")
    push.add_argument("--device-id", type=int, default=1, help="the switch's P4Runtime device ID (default 1)")
    push.add_argument("--election-id", type=int, default=1,
                      help="this controller's election ID: the highest one connected may write (default 1)")
    push.add_argument("--pipeline", help="device config (compiler output) to install first")
    push.add_argument("--bmv2-thrift", type=int, metavar="PORT",
                      help="bmv2: its Thrift port, for the register writes its P4Runtime server refuses")
    push.add_argument("--timeout", type=float, default=10.0,
                      help="seconds to wait for the switch (default %(default)s)")
    build = add_command(p4_actions, "build", "compile the v1model program for bmv2 with p4c-bm2-ss (found in $P4C "
                        "or on PATH)")
    build.add_argument("--out", default="build/p4",
                       help="where the bmv2 JSON and the P4Info go (default %(default)s)")
    run_p4.add_argument("--interface", "-i", action="append", required=True, metavar="[PORT@]INTERFACE",
                        help="a switch port (repeat; numbered from 0 in order unless PORT@ says)")
    run_p4.add_argument("--grpc-port", type=int, default=9559,
                        help="port of bmv2's P4Runtime server (default %(default)s)")
    run_p4.add_argument("--thrift-port", type=int, default=9090,
                        help="port of bmv2's Thrift server (default %(default)s)")
    run_p4.add_argument("--log", help="write bmv2's log to this file")
    p4.set_defaults(run=_p4)


def _p4(args: argparse.Namespace) -> int:
    import tempfile

    from softdta.core.control_plane import Slots, plan
    from softdta.targets.bmv2 import Bmv2, ThriftRegisters, compile_v1model, tool
    from softdta.targets.p4info import one_line_text
    from softdta.targets.p4runtime import (
        P4Names,
        P4RuntimeClient,
        P4RuntimeError,
        P4Translator,
        egress_ports,
        load_p4info,
        planned_updates,
        require_supported,
    )

    try:
        if args.action == "build":
            program, p4info = compile_v1model(Path(args.out))
            print(f"built {program} and {p4info}")
            return 0
        tables = Tables.from_toml(args.tables)
        egress = egress_ports(args.port)
        require_supported(tables, plan(tables, Slots(), flush_idle_ns=DEFAULT_FLUSH_IDLE_NS, egress=egress),
                          getattr(args, "architecture", "v1model"))
        if args.action == "entries":
            for update in planned_updates(tables, egress=egress):
                print(one_line_text(update))
            return 0
        if args.action == "push":
            with P4RuntimeClient(args.p4runtime, device_id=args.device_id, election_id=args.election_id,
                                 timeout=args.timeout) as client:
                if args.pipeline:
                    client.set_pipeline(load_p4info(), Path(args.pipeline).read_bytes())
                registers = ThriftRegisters(tool("simple_switch_CLI", "BMV2", "bmv2"), args.bmv2_thrift,
                                            P4Names(load_p4info())).write if args.bmv2_thrift else None
                P4Translator(client, architecture=args.architecture, egress=egress,
                             write_registers=registers).apply(tables)
            print(f"pushed {len(tables.qps)} queue pairs to {args.p4runtime}")
            return 0
        ports = {}
        for position, given in enumerate(args.interface):
            number, _, name = given.rpartition("@")
            if number and not number.isdigit():
                raise CliError(f"--interface {given!r}: give INTERFACE or PORT@INTERFACE, for example 1@veth1")
            ports[int(number) if number else position] = name
        stop = Signals()
        with tempfile.TemporaryDirectory(prefix="softdta-p4-") as out:
            program, _ = compile_v1model(Path(out))
            with Bmv2(program, ports, grpc_port=args.grpc_port, thrift_port=args.thrift_port,
                      log=Path(args.log) if args.log else None) as switch:
                switch.translator(egress=egress).apply(tables)
                print(f"bmv2 translator up on {', '.join(f'{p}@{n}' for p, n in sorted(ports.items()))}: "
                      f"{len(tables.qps)} queue pairs; P4Runtime 127.0.0.1:{args.grpc_port}, Thrift "
                      f"{args.thrift_port}", flush=True)
                while not stop.wait(0.5):
                    if switch.process.poll() is not None:
                        raise CliError(f"simple_switch_grpc exited with {switch.process.returncode}"
                                       f"{'; see ' + args.log if args.log else '; --log FILE keeps its log'}")
        return 0
    except P4RuntimeError as error:
        raise CliError(str(error)) from None
