"""`softdta collector up`: a backend, the control server and the query service on one uvloop event loop."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Callable, Protocol

from softdta.collector import service
from softdta.collector.backend import Backend
from softdta.collector.collector import Collector
from softdta.collector.config import CollectorConfig
from softdta.collector.control import ControlError, ControlServer, server_tls
from softdta.collector.registration import FleetSettings, current_epoch, register
from softdta.collector.snapshot import Snapshots
from softdta.collector.xdp_backend import XdpBackend, lock_pin_dir, pin_dir_for
from softdta.core.export import ExportError
from softdta.errors import SoftdtaError
from softdta.kernel.owner import own_interface
from softdta.wire.frames import ip_str

CHECKPOINT_S = 60.0
FLEET_EPOCH_S = 1.0  # how often a collector in a fleet reads the slot map's epoch (stamped on what it exports)
COMPLETION_POLL_S = 0.002  # 1024 receives per verbs QP run out within 2 ms only above 500k immediates/s


def make_backend(config: CollectorConfig, pin_dir: Path | None) -> Backend:
    if config.backend == "verbs":
        from softdta.collector.verbs import VerbsBackend
        return VerbsBackend(data_dir=config.data_dir)
    return XdpBackend.for_config(config, pin_dir=pin_dir)


def raise_descriptor_limit() -> None:
    """The soft limit on open files up to the hard one: every translator, query client and region file takes one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Announce(Protocol):
    """Where the collector says it is up (print, by default)."""

    def __call__(self, *values: object, flush: bool) -> None: ...


class Closeable(Protocol):
    def close(self) -> None: ...


class StartError(SoftdtaError, RuntimeError):
    """The collector cannot start as configured; the message names the setting and the fix."""


def ignore_hangup(*_: object) -> None:
    print("softdta: SIGHUP ignored: the collector reloads nothing; restart it to apply a changed configuration",
          file=sys.stderr, flush=True)


async def serve_collector(collector: Collector, *, control_host: str = "0.0.0.0", query_host: str = "127.0.0.1",
                          ready: Announce = print, fleet: FleetSettings | None = None) -> None:
    """Serve until SIGINT or SIGTERM; region files are saved every CHECKPOINT_S seconds (and at close). A
    StartError is raised before `ready` only. With `fleet`, the collector registers in it once it serves, and
    leaves at stop."""
    config = collector.config
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, ignore_hangup)
    try:
        tls = server_tls(str(config.tls_cert), str(config.tls_key),
                         str(config.tls_client_ca) if config.tls_client_ca else None) if config.tls_cert else None
    except ControlError as error:
        raise StartError(f"[collector] {error}") from None
    try:
        control = await ControlServer(collector, config.token, tls=tls).start(control_host, config.control_port)
    except OSError as error:
        raise StartError(f"cannot listen for translators on {control_host}:{config.control_port} ({error.strerror}); "
                         "set another [collector] control_port, or stop what uses it") from None
    feeds = service.append_feeds(collector)
    exporter = None
    if config.export is not None:
        from softdta.collector.export import Exporter  # nats-py: only where the collector exports
        assert config.data_dir is not None  # config.validate requires it with [export]
        try:
            exporter = Exporter(config.export, config.name, ip_str(config.ip), feeds, config.data_dir,
                                epoch=lambda: collector.fleet_epoch, structures=collector)
        except (OSError, ExportError) as error:
            control.close()
            raise StartError(f"[export] {error}") from None
    try:
        snapshots_dir = config.snapshots_dir()
        snapshots = Snapshots(snapshots_dir, config.name, every=config.snapshot_every or None,
                              epoch=lambda: collector.fleet_epoch) if snapshots_dir is not None else None
        query = await service.serve(collector, query_host, config.query_port, config.token, snapshots, feeds=feeds,
                                    exporter=exporter)
    except OSError as error:
        control.close()
        raise StartError(f"cannot serve queries on {query_host}:{config.query_port} ({error.strerror}); set another "
                         "[collector] query_port, or stop what uses it") from None
    ready(f"softdta collector {config.name} up: {config.backend} backend"
          f"{' on ' + config.interface if config.interface else ''} at {ip_str(config.ip)}, "
          f"{len(collector.regions)} regions; control {control_host}:{config.control_port}, "
          f"queries http://{query_host}:{config.query_port}", flush=True)
    if fleet is not None:
        collector.registration = register(config, fleet, control_host=control_host, query_host=query_host)
    completions = loop.create_task(poll_completions(collector, stop))
    epochs = loop.create_task(follow_fleet_epoch(collector, fleet, stop)) if fleet is not None else None
    export = loop.create_task(exporter.run(stop)) if exporter is not None else None
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), CHECKPOINT_S)
        except asyncio.TimeoutError:
            checkpoint = getattr(collector.backend, "checkpoint", None)
            try:
                if checkpoint:
                    checkpoint()
            except OSError as error:  # out of file descriptors or disk: the memory is intact, save again later
                print(f"softdta: saving the regions failed ({error}); trying again in {CHECKPOINT_S:.0f} s",
                      file=sys.stderr, flush=True)
    await completions
    if epochs is not None:
        await epochs
    if export is not None:
        await export
    if collector.registration is not None:
        await loop.run_in_executor(None, collector.registration.close)
    control.close()
    await query.cleanup()


async def follow_fleet_epoch(collector: Collector, fleet: FleetSettings, stop: asyncio.Event) -> None:
    while not stop.is_set():
        collector.fleet_epoch = await asyncio.get_running_loop().run_in_executor(
            None, current_epoch, fleet, collector.fleet_epoch)
        try:
            await asyncio.wait_for(stop.wait(), FLEET_EPOCH_S)
        except asyncio.TimeoutError:
            pass


async def poll_completions(collector: Collector, stop: asyncio.Event) -> None:
    while not stop.is_set():
        collector.poll_completions()
        await asyncio.sleep(COMPLETION_POLL_S)


def run(config: CollectorConfig, *, control_host: str = "0.0.0.0", query_host: str = "127.0.0.1",
        ready: Announce = print, fleet: FleetSettings | None = None,
        translate_locally: Callable[[Collector], Closeable] | None = None) -> None:
    """The backend is set up (and torn down) outside the event loop: attaching XDP uses pyroute2's own loop.

    With [collector] translate_locally, `translate_locally` starts the collector's own translator on it (the
    layer above provides it: softdta.links.local.LocalLink); it stops before the collector closes.

    The xdp backend's pin directory and interface are locked first, so a second collector of the same
    configuration, or a collector on another softdta daemon's interface, touches nothing of the first one's. A
    start that fails leaves no program attached and nothing pinned (`discard`), unless it adopted a killed
    collector's memory."""
    import uvloop
    signal.signal(signal.SIGHUP, ignore_hangup)  # from the start: the default action would kill mid-load
    raise_descriptor_limit()
    pin_dir = pin_dir_for(config.name, config.ip) if config.backend == "xdp" else None
    locks = []
    try:
        if pin_dir is not None:
            locks.append(lock_pin_dir(pin_dir))
            if config.interface:
                locks.append(own_interface(config.interface, "collector", "the collector's responder would replace",
                                           "or give this collector another [collector] interface"))
        backend = make_backend(config, pin_dir)
        local: Closeable | None = None
        try:
            collector = Collector(config, backend)
            if config.translate_locally:
                if translate_locally is None:
                    raise StartError("translate_locally is set but this caller cannot start local translation; "
                                     "run `softdta collector up`")
                local = translate_locally(collector)
        except BaseException:
            _discard(backend)
            raise
        started = False

        def announce(*values: object, flush: bool) -> None:
            nonlocal started
            started = True
            ready(*values, flush=flush)

        try:
            # not uvloop.install(): pyroute2 (detaching XDP at close) needs a standard loop, which it makes itself
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(serve_collector(collector, control_host=control_host, query_host=query_host,
                                           ready=announce, fleet=fleet))
        except BaseException:
            if local is not None:
                local.close()
            if not started:
                _discard(backend)
                raise
            collector.close()
            raise
        signal.signal(signal.SIGHUP, ignore_hangup)  # closing the loop restored the default action
        if local is not None:
            local.close()
        collector.close()
    finally:
        for held in locks:
            os.close(held)


def _discard(backend: Backend) -> None:
    """Undo a start that failed, where the backend can (the xdp backend's pins); else a plain close."""
    getattr(backend, "discard", backend.close)()
