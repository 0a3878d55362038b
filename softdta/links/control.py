"""The translator's side of the control protocol (docs/control.md): a connection to each softdta collector."""

from __future__ import annotations

import asyncio
import json
import queue
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softdta.collector.collector import tables_document
from softdta.collector.control import (
    FAILURE_POLL_S,
    KEEPALIVE_S,
    CollectorIdentity,
    ControlError,
    Message,
    cancel_tasks,
    fetch_advertisements,
    receive,
    send,
)
from softdta.core.tables import Tables
from softdta.kernel.owner import flat_name

SECRETS_ROOT = Path("/run/softdta-translator")  # bpffs holds no regular files: the secrets kept for a pin dir


def secrets_file_for(pin_dir: Path) -> Path:
    """Where `softdta translator up --pin PIN` keeps its control sessions' secrets: a translator restarted on the
    state in PIN reclaims its queue pairs with them; `translator down --forget` removes both."""
    return SECRETS_ROOT / f"{flat_name(pin_dir)}.json"


def owner_lock_for(pin_dir: Path) -> Path:
    """The lock (`kernel.owner`) that makes one `softdta translator up --pin PIN` the only one on PIN: a second
    would share its pinned QPs and PSNs, replace its programs and reclaim its sessions."""
    return SECRETS_ROOT / f"{flat_name(pin_dir)}.lock"


class CollectorLinks:
    """The translator's side: a control connection to each collector, kept open and re-established, whose
    advertisements become translator tables.

    `start()` connects to every collector and returns the first tables; later tables (a re-created queue pair, a
    collector that came back) are put on `updates`, which the translator applies between control-loop ticks.
    `report_failures` tells it how to find the translator's failed QPs (local QPNs): it reports each to its
    collector, which re-creates its end and advertises it again; `report_psns`, how to read the PSN each QP sends
    next, which a queue pair the collector makes anew starts at. `queues`: the translator's RX queues; it asks
    for a queue pair per queue into each structure. `secrets_file`: where the sessions' secrets are kept, so that
    the next process reclaims these queue pairs (else they live as long as this object).
    """

    def __init__(self, translator: dict[str, Any], collectors: list[tuple[str, int]], token: str,
                 first_qpn: int = 0x1000, keepalive_s: float = KEEPALIVE_S, tls: ssl.SSLContext | None = None,
                 queues: int = 1, secrets_file: Path | None = None):
        self.translator, self.collectors, self.token, self.tls = translator, collectors, token, tls
        self.first_qpn, self.keepalive_s, self.queues = first_qpn, keepalive_s, queues
        self.failed_qpns: Callable[[], set[int]] = set
        self.next_psns: Callable[[], dict[int, int]] = dict
        self.updates: queue.Queue[Tables] = queue.Queue()
        # address -> (collector, adverts by our QPN: one per structure and RX queue)
        self._state: dict[tuple[str, int], tuple[CollectorIdentity, dict[int, Message]]] = {}
        self.secrets_file = secrets_file
        self._secrets = self._kept_secrets()  # address -> our session's secret: a reconnect reclaims our QPs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="softdta-control", daemon=True)
        self._first = threading.Event()

    def start(self, timeout: float = 3 * KEEPALIVE_S) -> Tables:
        self._thread.start()
        for index, address in enumerate(self.collectors):
            future = asyncio.run_coroutine_threadsafe(self._connect(index, address), self._loop)
            try:
                future.result(timeout)
            except ssl.SSLError as error:
                raise ControlError(f"TLS with collector {address[0]}:{address[1]} failed: "
                                   f"{error.reason or error}; its certificate must be signed by the CA given "
                                   "(--collector-ca) and name the address dialled") from None
            except (OSError, asyncio.TimeoutError, TimeoutError) as error:
                raise ControlError(f"cannot reach collector {address[0]}:{address[1]}: {error or 'timed out'}; "
                                   "is `softdta collector up` running there?") from None
        return self.tables()

    def report_failures(self, failed_qpns: Callable[[], set[int]]) -> None:
        self.failed_qpns = failed_qpns

    def report_psns(self, next_psns: Callable[[], dict[int, int]]) -> None:
        self.next_psns = next_psns

    def close(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(cancel_tasks(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()

    def tables(self) -> Tables:
        return Tables.from_dict(self.document(), "collector advertisements")

    def document(self) -> dict[str, Any]:
        """The translator tables (docs/tables.md) the collectors' current advertisements make, as a dict."""
        document: dict[str, Any] = {"translator": self.translator, "collectors": [], "structures": [], "append": []}
        for collector, adverts in self._state.values():
            part = tables_document(self.translator, collector, list(adverts.values()))
            for key in ("collectors", "structures", "append"):
                document[key] += part[key]
        return document

    def _kept_secrets(self) -> dict[tuple[str, int], str]:
        try:
            kept = json.loads(self.secrets_file.read_text()) if self.secrets_file else {}
        except (OSError, ValueError):
            return {}  # none kept, or unreadable: new queue pairs, and the old ones are freed after the grace period
        return {(host, int(port)): secret for address, secret in kept.items() if isinstance(secret, str)
                for host, _, port in [address.rpartition(":")] if port.isdigit()}

    def _keep_secrets(self) -> None:
        if self.secrets_file is None:
            return
        partial = self.secrets_file.with_suffix(".partial")
        try:
            self.secrets_file.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({f"{host}:{port}": secret for (host, port), secret in self._secrets.items()}))
            partial.chmod(0o600)
            partial.replace(self.secrets_file)
        except OSError as error:  # the translator runs on; only a restart of it gets new queue pairs
            print(f"softdta: cannot keep the collectors' secrets in {self.secrets_file} ({error.strerror}); a "
                  "restarted translator gets new queue pairs", flush=True)

    def _local_qpn(self, collector_index: int, position: int) -> int:
        return self.first_qpn + 0x100 * collector_index + position

    async def _fetch(self, index: int, address: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        collector, adverts, reader, writer, self._secrets[address] = await fetch_advertisements(
            *address, self.token, self.translator, {"*": (self._local_qpn(index, 0), 0)}, tls=self.tls,
            queues=self.queues, secret=self._secrets.get(address), psns=self.next_psns())
        self._state[address] = (collector, {advert["qp"]["local_qpn"]: advert for advert in adverts})
        self._keep_secrets()
        return reader, writer

    async def _connect(self, index: int, address: tuple[str, int]) -> None:
        reader, writer = await self._fetch(index, address)
        self._loop.create_task(self._follow(index, address, reader, writer))

    async def _report_failures(self, address: tuple[str, int], writer: asyncio.StreamWriter) -> None:
        """Tell the collector about each failed QP once per advertisement; its new advertisement revives it."""
        reported: set[tuple[str, int, int]] = set()  # (structure, remote QPN, start PSN) of each advertisement
        while True:
            await asyncio.sleep(FAILURE_POLL_S)
            failed = self.failed_qpns()
            for advert in list(self._state[address][1].values()):
                structure, qp = advert["structure"], advert["qp"]
                if qp["local_qpn"] in failed and (structure, qp["remote_qpn"], qp["start_psn"]) not in reported:
                    reported.add((structure, qp["remote_qpn"], qp["start_psn"]))
                    print(f"softdta: QP {qp['local_qpn']:#x} into {structure} at {address[0]} failed; "
                          "asking the collector to re-create it", flush=True)
                    await send(writer, {"type": "failed", "structure": structure, "qpn": qp["local_qpn"]})

    async def _follow(self, index: int, address: tuple[str, int], reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """Apply re-advertisements; keep the connection alive; report failed QPs; reconnect (with backoff) when it
        drops."""
        while True:
            watch = self._loop.create_task(self._report_failures(address, writer))
            try:
                while True:
                    ping = self._loop.call_later(self.keepalive_s, lambda: self._loop.create_task(_ping(writer)))
                    message = await receive(reader, 3 * self.keepalive_s)
                    ping.cancel()
                    if message["type"] == "advertise":
                        adverts, qp = self._state[address][1], message.get("qp")
                        ours = qp.get("local_qpn") if isinstance(qp, dict) else None
                        if ours in adverts:  # a re-created queue pair, for the same RX queue
                            adverts[ours] = {**{k: v for k, v in message.items() if k != "type"},
                                             "queue": adverts[ours]["queue"]}
                            self.updates.put(self.tables())
                    elif message["type"] == "error":
                        print(f"softdta: collector {address[0]}:{address[1]}: {message.get('error')}", flush=True)
            except (ControlError, OSError):
                writer.close()
            finally:
                watch.cancel()
            delay = 0.5
            while True:
                await asyncio.sleep(delay)
                try:
                    reader, writer = await self._fetch(index, address)
                except (ControlError, OSError, asyncio.TimeoutError):
                    delay = min(delay * 2, 10.0)
                    continue
                self.updates.put(self.tables())
                break


async def _ping(writer: asyncio.StreamWriter) -> None:
    """A keepalive; a connection already lost is noticed by the receive that waits on it."""
    try:
        await send(writer, {"type": "ping"})
    except (ConnectionError, OSError):
        pass
