"""`softdta translator up|stats|down`: a translator engine on interfaces, fed by a table source."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from pathlib import Path
from typing import Any

from softdta.cli.common import CliError, Commands, Signals, add_command
from softdta.core.control_plane import DEFAULT_FLUSH_IDLE_NS
from softdta.core.settings import TableError
from softdta.core.tables import Tables
from softdta.engines.engine import LiveEngine
from softdta.engines.xdp import DEFAULT_PIN_DIR
from softdta.links.source import TablesFile, TableSource
from softdta.spec import QpState


def register(commands: Commands) -> None:
    """Add the translator command(s) to the `softdta` parser."""
    translator = add_command(commands, "translator", "translate the DTA reports arriving on interfaces into RDMA "
                             "writes to the collectors (root): start, inspect and stop it",
                             "See docs/translator.md.")
    actions = translator.add_subparsers(dest="action", required=True, title="actions")
    up = add_command(actions, "up", "translate on interfaces until interrupted (root)",
                     "Its tables come from a file (--tables) or from the collectors (--collector, --collector-cm); "
                     "SIGHUP reloads them live; SIGTERM or Ctrl-C stops it and keeps its state pinned.")
    up.add_argument("--tables", required=True, help="translator tables (TOML, see docs/tables.md)")
    up.add_argument("--interface", "-i", action="append", required=True,
                    help="interface to translate on (repeat for several: reports in, collectors out)")
    up.add_argument("--mode", choices=["native", "generic"], default="native",
                    help="how XDP attaches: native (default) in the driver, generic (slower) for drivers without "
                         "XDP support")
    up.add_argument("--pin", default=str(DEFAULT_PIN_DIR),
                    help="bpffs directory that keeps the translator's state, so a restart resumes its PSNs, "
                         "Append heads and caches (default %(default)s)")
    up.add_argument("--flush-idle-ms", type=float, default=DEFAULT_FLUSH_IDLE_NS / 1e6,
                    help="write out partial Append batches and Postcarding paths idle this many milliseconds "
                         "(default %(default)s)")
    up.add_argument("--netns", help="run in this network namespace (unlike `ip netns exec`, keeps the host's bpffs)")
    up.add_argument("--engine", choices=["xdp", "python"], default="xdp",
                    help="xdp (default): the kernel fast path; python: the batch translator (and plug-in "
                         "primitives) in Python on AF_XDP, one interface (docs/primitives.md)")
    up.add_argument("--primitive", action="append", default=[], metavar="MODULE:CLASS",
                    help="--engine python: add this plug-in primitive (repeat for several), e.g. "
                         "softdta.plugins.latency_sum:LatencySum")
    up.add_argument("--io", choices=["auto", "af_xdp", "af_packet"], default="auto",
                    help="--engine python: packet I/O (auto, the default: AF_XDP, else an AF_PACKET TPACKET_V3 "
                         "ring)")
    up.add_argument("--transmit", choices=["auto", "socket"], default="auto",
                    help="--engine python: where frames leave (auto, the default: from XDP where the interface "
                         "takes frames from it, else through the socket; socket: through the socket, which waits "
                         "for room where the interface has a queueing discipline)")
    up.add_argument("--collector", action="append", default=[], metavar="HOST:PORT",
                    help="take the structures from this collector's control service (repeat for several); "
                         "--tables then needs only its [translator] section")
    up.add_argument("--token", default="", help="the collectors' control token")
    up.add_argument("--collector-ca", metavar="PEM",
                    help="speak TLS to the collectors, whose certificates this CA signed (docs/control.md)")
    up.add_argument("--collector-cert", metavar="PEM", help="with --collector-ca: this translator's certificate, for "
                                                           "collectors that require one")
    up.add_argument("--collector-key", metavar="PEM", help="with --collector-cert: its private key")
    up.add_argument("--collector-cm", action="append", default=[],
                    metavar="IP:PORT,kind=K[,list=N][,batch=B][,redundancy=N]",
                    help="connect over rdma_cm to a collector written for the original DTA, one listening port per "
                         "structure (kind: key-write, key-increment, postcarding, append); repeat for each port. "
                         "--tables then needs only its [translator] section (docs/drop-in.md)")
    up.add_argument("--etcd", metavar="URL", help="follow a fleet's slot map and collectors in this etcd "
                    "(http://HOST:PORT; with --fleet and --fleet-address); --tables then needs only its [translator] "
                    "section (docs/fleet.md)")
    up.add_argument("--fleet", metavar="NAME", help="with --etcd: the fleet's name (its keys are under /softdta/NAME/)")
    up.add_argument("--fleet-address", metavar="IP", help="with --etcd: the address reporters send the fleet's "
                                                          "reports to")
    up.add_argument("--across", action="store_true", help="with --etcd: copy n of a redundant Key-Write or "
                                                           "Key-Increment report goes to replica n of its slot")
    up.add_argument("--name", help="with --etcd: this translator's name under the fleet's applied/ keys (default: "
                                   "its IP)")
    up.set_defaults(run=_translator_up)

    stats = add_command(actions, "stats", "show a translator's counters and the state of its queue pairs",
                        "Works while it runs and after it stopped, from the state it pinned.")
    stats.add_argument("--pin", default=str(DEFAULT_PIN_DIR),
                       help="the directory `translator up --pin` kept its state in (default %(default)s)")
    stats.add_argument("--json", action="store_true", help="print them as JSON")
    stats.set_defaults(run=_translator_stats)

    down = add_command(actions, "down", "detach a translator from interfaces; --forget also drops its state")
    down.add_argument("--interface", "-i", action="append", default=[],
                      help="interface to detach from (repeat for several)")
    down.add_argument("--pin", default=str(DEFAULT_PIN_DIR),
                      help="with --forget: the directory its state is kept in (default %(default)s)")
    down.add_argument("--forget", action="store_true",
                      help="also remove the kept state: the next `translator up` starts its PSNs afresh")
    down.set_defaults(run=_translator_down)


def _translator_up(args: argparse.Namespace) -> int:
    if args.netns:
        from softdta.kernel.netns import NetnsError, in_netns
        try:
            with in_netns(args.netns):
                return _run_translator(args)
        except NetnsError as error:
            raise CliError(f"{error}; list namespaces with `ip netns list`") from None
    return _run_translator(args)


def _run_translator(args: argparse.Namespace) -> int:
    from softdta.kernel.bpf import BpfError, ensure_bpffs
    from softdta.kernel.programs import EngineError
    from softdta.links.fleet import FleetLinks
    if sum(map(bool, (args.collector, args.collector_cm, args.etcd))) > 1:
        raise CliError("give one of --collector (softdta collectors), --collector-cm (rdma_cm collectors) and "
                       "--etcd (a fleet)")
    _own_pins(Path(args.pin))  # before its sessions, programs or pins are touched
    _own_interfaces(args.interface)
    source, tables = _table_source(args)
    try:
        ensure_bpffs()
        pin = Path(args.pin)
        pin.mkdir(parents=True, exist_ok=True)
        engine = _translator_engine(args, tables, pin)
    except (EngineError, BpfError, PermissionError) as error:
        source.close()
        raise CliError(f"{error}; `softdta translator up` needs root") from None
    # failed QPs go back to the collectors, which re-create their ends
    source.report_failures(lambda: {qp.local_qpn for qp in engine.tables.qps
                                    if engine.qp_state(qp)["state"] == QpState.FAILED})
    source.report_psns(lambda: next_psns(engine))
    if isinstance(source, FleetLinks):
        source.report_applied(lambda: engine.tables)

    def reload() -> None:
        try:
            source.updates.put(source.tables())  # the engine applies them between ticks (or batches)
            origin = args.tables if isinstance(source, TablesFile) else "the collectors"
            print(f"softdta: tables reloaded from {origin}", flush=True)
        except (TableError, OSError) as error:  # a broken or missing file must not stop the translator
            reason = f"{error.filename}: {error.strerror}" if isinstance(error, OSError) else error
            print(f"softdta: error: reload refused, the running tables stay: {reason}", file=sys.stderr, flush=True)

    stop = Signals(reload)
    try:
        engine.attach(args.interface, mode=args.mode)
        print(f"softdta translator up on {', '.join(args.interface)} ({_how_it_runs(engine, args.mode)}), "
              f"maps pinned in {pin}; "
              f"{len(tables.qps)} QPs, {len(tables.structures)} structures, "
              f"{sum(a.lists for a in tables.append_lists)} Append lists", flush=True)
        engine.serve(stop, source.updates)
    except (EngineError, BpfError) as error:
        raise CliError(str(error)) from None
    finally:
        engine.close()
        source.close()
    print(f"softdta translator down; state kept in {pin} (`softdta translator stats --pin {pin}`)")
    return 0


def _own_pins(pin: Path, fix: str = "or give this one another --pin") -> None:
    """Make this process, until it exits, the only one at work on the translator state in `pin` (the lock's
    descriptor stays open till then). While a translator runs on it: exit 2, naming its pid, with `fix`."""
    from softdta.kernel.owner import AlreadyOwned, own
    from softdta.links.control import owner_lock_for
    try:
        own(owner_lock_for(pin), "translator")
    except AlreadyOwned as error:
        raise CliError(f"a translator is already running on the state pinned in {pin} (pid {error.owner}); stop it "
                       f"first (SIGTERM), {fix}") from None


def _own_interfaces(names: list[str], fix: str = "or give this one other interfaces",
                    doing: str = "this translator would replace") -> None:
    """Make this process, until it exits, the only softdta daemon on the interfaces `names` (`kernel.owner`),
    whatever its --pin. Where one is missing, another translator or a collector runs on it, or a program softdta
    did not attach is there (which it would replace or detach, `doing`): exit 2, naming it, with `fix`."""
    from softdta.kernel.owner import own_interface
    for name in dict.fromkeys(names):
        own_interface(name, "translator", doing, fix)


def _how_it_runs(engine: LiveEngine, mode: str) -> str:
    """The engine's packet path once attached, and why it is not the fast one when it is not."""
    from softdta.engines.python import PythonEngine
    if not isinstance(engine, PythonEngine):
        return f"{mode} XDP"
    return (f"python engine, {engine.io_name}"
            + (f" because AF_XDP failed: {engine.fallback_reason}" if engine.fallback_reason else "")
            + f"; frames out {engine.transmit_path}"
            + (f" because {engine.transmit_reason}" if engine.transmit_reason else ""))


def next_psns(engine: LiveEngine) -> dict[int, int]:
    """The PSN each of the engine's QPs sends next, by local QPN (read from the control thread while the engine
    may be swapping its tables: a QP in the middle of that is left out)."""
    psns = {}
    for qp in engine.tables.qps:
        try:
            psns[qp.local_qpn] = engine.qp_state(qp)["next_psn"]
        except (KeyError, TypeError):
            continue
    return psns


def _translator_engine(args: argparse.Namespace, tables: Tables, pin: Path) -> LiveEngine:
    """The engine `--engine` names, loaded with its tables and pinned in `pin`."""
    flush_idle_ns = int(args.flush_idle_ms * 1e6)
    if args.engine == "xdp":
        if args.primitive or args.io != "auto" or args.transmit != "auto":
            raise CliError("--primitive, --io and --transmit apply to --engine python only")
        from softdta.engines.xdp import XdpTranslator
        return XdpTranslator(tables, pin_dir=pin, flush_idle_ns=flush_idle_ns)
    from softdta.core.primitives import load
    from softdta.engines.python import PythonEngine
    try:
        plugins = [load(spec) for spec in args.primitive]
    except ValueError as error:
        raise CliError(str(error)) from None
    return PythonEngine(tables, pin_dir=pin, flush_idle_ns=flush_idle_ns, plugins=plugins, io=args.io,
                        transmit=args.transmit)


def _translator_section(path: str) -> dict[str, Any]:
    import tomllib
    try:
        section = tomllib.loads(Path(path).read_text())["translator"]
    except (KeyError, tomllib.TOMLDecodeError) as error:
        raise CliError(f"{path}: needs a valid [translator] section ({error})") from None
    if not isinstance(section, dict):
        raise CliError(f"{path}: [translator] must be a table of settings, not {type(section).__name__}")
    return section


def _table_source(args: argparse.Namespace) -> tuple[TableSource, Tables]:
    """Where the translator's tables come from (--tables, --collector or --collector-cm), and the first tables."""
    if args.collector:
        return _collector_links(args)
    if args.etcd:
        return _fleet_links(args)
    if args.collector_cm:
        return _cm_links(args)
    source = TablesFile(args.tables)
    return source, source.start()


def _cm_links(args: argparse.Namespace) -> tuple[TableSource, Tables]:
    """rdma_cm connections to original-DTA collectors, and the first tables their regions make."""
    from softdta.links.cm import CmError, CmLinks, CmTarget
    if len(args.interface) != 1:
        raise CliError("--collector-cm: give one --interface, the one the collectors are reached on")
    try:
        links = CmLinks(_translator_section(args.tables), [CmTarget.parse(text) for text in args.collector_cm],
                        args.interface[0], log=lambda line: print(line, flush=True))
        return links, links.start()
    except CmError as error:
        raise CliError(str(error)) from None


def _collector_links(args: argparse.Namespace) -> tuple[TableSource, Tables]:
    """Control links to the collectors and the first tables they advertise."""
    from softdta.collector.control import ControlError
    from softdta.links.control import CollectorLinks, secrets_file_for
    translator = _translator_section(args.tables)
    addresses = []
    for address in args.collector:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise CliError(f"--collector {address!r}: give HOST:PORT, for example 10.77.1.1:40050")
        addresses.append((host, int(port)))
    links = CollectorLinks(translator, addresses, args.token, tls=_collector_tls(args), queues=_rx_queues_of(args),
                           secrets_file=secrets_file_for(Path(args.pin)))
    try:
        return links, links.start()
    except ControlError as error:
        links.close()
        raise CliError(str(error)) from None


def _collector_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """TLS towards the collectors' control services, if --collector-ca asks for it."""
    from softdta.collector.control import ControlError, client_tls
    if (args.collector_cert or args.collector_key) and not args.collector_ca:
        raise CliError("--collector-cert and --collector-key need --collector-ca, "
                       "the CA of the collectors' certificates")
    try:
        return client_tls(args.collector_ca, args.collector_cert, args.collector_key) if args.collector_ca else None
    except ControlError as error:
        raise CliError(f"--collector-ca/--collector-cert/--collector-key: {error}") from None


def _fleet_links(args: argparse.Namespace) -> tuple[TableSource, Tables]:
    """Follow the fleet in etcd: control links to its collectors and the first tables its slot map makes."""
    from softdta.core.fleet import FleetError
    from softdta.etcd.client import Etcd, EtcdUnavailable
    from softdta.links.control import secrets_file_for
    from softdta.links.fleet import FleetLinks
    if not args.fleet or not args.fleet_address:
        raise CliError("--etcd needs --fleet NAME and --fleet-address IP (where reporters send the fleet's reports)")
    translator = _translator_section(args.tables)
    try:
        etcd = Etcd(args.etcd)
        links = FleetLinks(translator, etcd, args.fleet, args.fleet_address,
                           name=args.name or str(translator.get("ip", "")), across=args.across, token=args.token,
                           tls=_collector_tls(args), queues=_rx_queues_of(args),
                           secrets_file=secrets_file_for(Path(args.pin)))
    except EtcdUnavailable as error:
        raise CliError(str(error)) from None
    try:
        return links, links.start()
    except (EtcdUnavailable, FleetError, TableError) as error:
        links.close()
        raise CliError(f"fleet {args.fleet}: {error}") from None


def _rx_queues_of(args: argparse.Namespace) -> int:
    """The RX queues the engine translates on, each with its own queue pairs: every queue of the interfaces, but
    one for the python engine on AF_PACKET, which takes all its frames as queue 0's."""
    if args.engine != "xdp" and args.io == "af_packet":
        return 1
    from softdta.engines.xdp import interface_index, rx_queues
    from softdta.kernel.programs import EngineError
    try:
        return max(rx_queues(interface_index(name)) for name in args.interface)
    except EngineError as error:
        raise CliError(str(error)) from None


def _translator_stats(args: argparse.Namespace) -> int:
    from softdta.engines.python import engine_stats
    from softdta.kernel.programs import EngineError
    try:
        stats = engine_stats(Path(args.pin))
    except EngineError as error:
        raise CliError(str(error)) from None
    fleet = _fleet_status(Path(args.pin))
    if args.json:
        print(json.dumps({**stats, **({"fleet": fleet} if fleet else {})}, indent=2))
        return 0
    engine = stats["engine"]
    print(f"engine: {engine['name']}" +
          (f" ({engine['io']}, frames out through {engine['transmit']})" if "io" in engine else ""))
    print("counters:")
    for name, value in stats["counters"].items():
        print(f"  {name:28} {value}")
    print("queue pairs:")
    for qp in stats["qps"]:
        print(f"  local 0x{qp['local_qpn']:06x} -> remote 0x{qp['remote_qpn']:06x} at {qp['collector']:15} "
              f"{qp['transport']}  next PSN {qp['next_psn']:8}  {qp['state']}")
    if fleet:
        etcd = "reachable" if fleet["etcd_reachable"] else "UNREACHABLE, running on the last epoch"
        print(f"fleet {fleet['fleet']} at {fleet['address']} as {fleet['translator']}: epoch {fleet['epoch']} "
              f"(generation {fleet['generation']}), etcd {fleet['etcd']} {etcd}")
        for name in ("slot_map_epoch", "slot_maps_refused", "tables_refused", "members_refused",
                     "replicas_unconnected", "slots_unmapped", "etcd_outages"):
            print(f"  {name:28} {fleet[name]}")
        for name, state in sorted(fleet["collectors"].items()):
            print(f"  collector {name:18} {state}")
    return 0


def _fleet_status(pin: Path) -> dict[str, Any] | None:
    """What a translator that follows a fleet (--etcd) last said about it, if it does."""
    from softdta.links.control import secrets_file_for
    from softdta.links.fleet import fleet_status_file
    try:
        status = json.loads(fleet_status_file(secrets_file_for(pin)).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def _translator_down(args: argparse.Namespace) -> int:
    import shutil
    import socket

    from softdta.kernel.bpf import BpfError, detach_tc, detach_xdp
    _own_pins(Path(args.pin), "`translator down` is for the state a stopped translator left")
    _own_interfaces(args.interface, "`translator down` is for the interfaces a stopped translator left",
                    "`translator down` would detach")
    for name in args.interface:
        try:
            index = socket.if_nametoindex(name)
            detach_tc(index)
            detach_xdp(index)
        except OSError:  # gone since it was locked
            raise CliError(f"interface {name!r} does not exist; check `ip link`") from None
        except BpfError as error:
            raise CliError(str(error)) from None
    if args.forget:
        from softdta.links.control import secrets_file_for
        shutil.rmtree(args.pin, ignore_errors=True)
        secrets = secrets_file_for(Path(args.pin))
        for kept in [secrets, *secrets.parent.glob(f"{secrets.stem}.*.json")]:  # a fleet's, by collector
            kept.unlink(missing_ok=True)  # the collectors' queue pairs go with the state
    print(f"detached from {', '.join(args.interface) or 'no interface'}"
          + (f"; removed {args.pin}" if args.forget else ""))
    return 0
