"""The control protocol between translators and a collector (docs/control.md).

Newline-delimited JSON over TCP. A translator says hello with the shared token and its addresses, then asks
for a queue pair into each structure it wants, giving its virtual QPN and first PSN. The collector brings the
queue pair up and advertises it: QPN, PSN, R_Key, address, size, transport and the structure's layout. When a
queue pair falls into ERROR, the collector re-creates it and advertises it again on the same connection.
Either side drops a connection that stays silent for three keepalive intervals; translators reconnect.
With TLS (`server_tls`, `client_tls`) the same lines travel encrypted, and the translator checks the collector's
certificate (docs/control.md, "Threat model").
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import ssl
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict

from softdta.collector.backend import BackendError, Peer
from softdta.collector.collector import Collector, Session
from softdta.errors import SoftdtaError
from softdta.wire.frames import ip_str, mac_bytes, mac_str

VERSION = 1
KEEPALIVE_S = 5.0
MAX_LINE = 1 << 16
FAILURE_POLL_S = 0.2  # how often a translator looks for failed QPs to report
QUEUE_QPN_STRIDE = 0x10000  # a translator's virtual QPN for RX queue q: queue 0's + q x this
HELLO_TIMEOUT_S = 3.0  # an unauthenticated connection holds a descriptor: it gets this long to say hello
MAX_CONNECTIONS = 256  # open control connections, authenticated or not, so idle ones cannot exhaust descriptors
MAX_CONNECTIONS_PER_HOST = 16
MAX_SECRET = 256  # characters of a presented session secret


# one message as received: a decoded JSON object, whose fields are checked where they are read
Message = dict[str, Any]


class ControlError(SoftdtaError, RuntimeError):
    """The other side refused or broke the protocol; the message says what and why."""


class CollectorIdentity(TypedDict):
    """How a collector names itself in its welcome."""

    name: str
    ip: str
    mac: str


def server_tls(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The collector's TLS: its certificate chain and key; with `client_ca`, translators must present a
    certificate that CA signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context.load_cert_chain, "tls_cert and tls_key", cert, key)
    if client_ca:
        _load(context.load_verify_locations, "tls_client_ca", client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_tls(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """The translator's TLS: the CA that signed the collectors' certificates (each must name the address the
    translator dials), and its own certificate when collectors require one."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context.load_verify_locations, "the collector CA", ca)
    if cert or key:
        if not (cert and key):
            raise ControlError("a translator certificate needs both its certificate and its key")
        _load(context.load_cert_chain, "the translator certificate and key", cert, key)
    return context


def _load(load: Callable[..., None], what: str, *paths: str) -> None:
    try:
        load(*paths)
    except (OSError, ssl.SSLError) as error:
        raise ControlError(f"{what} ({', '.join(paths)}) could not be loaded: "
                           f"{getattr(error, 'reason', None) or error.strerror or error}") from None


async def cancel_tasks() -> None:
    """Cancel every other task of the running loop and let them finish, so the loop can stop cleanly."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def send(writer: asyncio.StreamWriter, message: Mapping[str, object]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _peer(writer: asyncio.StreamWriter) -> str:
    address = writer.get_extra_info("peername")
    return f"{address[0]}:{address[1]}" if address else "?"


async def receive(reader: asyncio.StreamReader, timeout: float) -> Message:
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except asyncio.TimeoutError:
        raise ControlError(f"no message for {timeout:.0f} s: the peer is gone") from None
    except ValueError:
        raise ControlError(f"message longer than {MAX_LINE} bytes") from None
    if not line:
        raise ControlError("connection closed")
    try:
        message = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise ControlError("not UTF-8: a message is one line of JSON text") from None
    except json.JSONDecodeError as error:
        raise ControlError(f"not JSON: {error}") from None
    except (RecursionError, ValueError):
        raise ControlError("JSON nested too deeply, or with NaN or Infinity: send plain JSON objects") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ControlError("a message is a JSON object with a string field \"type\"")
    return message


@dataclass
class ControlServer:
    """The collector's side: one task per translator connection, plus a repair loop."""

    collector: Collector
    token: str
    keepalive_s: float = KEEPALIVE_S
    tls: ssl.SSLContext | None = None
    sessions: dict[Session, asyncio.StreamWriter] = field(default_factory=dict)  # authenticated connections
    open_per_host: dict[str, int] = field(default_factory=dict)

    async def start(self, host: str, port: int) -> asyncio.Server:
        if not self.token:
            raise ControlError("set a token in the collector configuration: translators must authenticate")
        server = await asyncio.start_server(self.handle, host, port, limit=MAX_LINE, ssl=self.tls,
                                            ssl_handshake_timeout=HELLO_TIMEOUT_S if self.tls else None)
        asyncio.get_running_loop().create_task(self.repair_forever())
        return server

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host = _peer(writer).rpartition(":")[0]
        if sum(self.open_per_host.values()) >= MAX_CONNECTIONS or \
                self.open_per_host.get(host, 0) >= MAX_CONNECTIONS_PER_HOST:
            writer.close()  # no reply: answering a flood would cost what the limit saves
            return
        self.open_per_host[host] = self.open_per_host.get(host, 0) + 1
        try:
            await self._session(reader, writer)
        except asyncio.CancelledError:
            pass  # the collector stops: the session has ended (asyncio's stream callback would log a traceback)
        finally:
            self.open_per_host[host] -= 1
            if not self.open_per_host[host]:
                del self.open_per_host[host]

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = None
        try:
            hello = await receive(reader, HELLO_TIMEOUT_S)
            session = self._welcome(hello)
            self.sessions[session] = writer
            config = self.collector.config
            identity: CollectorIdentity = {"name": config.name, "ip": ip_str(config.ip), "mac": mac_str(config.mac)}
            await send(writer, {"type": "welcome", "version": VERSION, "structures": sorted(self.collector.specs),
                                "collector": identity, "secret": session.secret})
            while True:
                message = await receive(reader, 3 * self.keepalive_s)
                reply: Message
                if message["type"] == "ping":
                    reply = {"type": "pong"}
                elif message["type"] == "connect":
                    reply = self._connect(message, session)
                elif message["type"] == "failed":
                    reply = await self._failed(message, session)
                else:
                    reply = {"type": "error", "error": f"unknown message type {message['type']!r}; "
                                                      "expected connect, failed or ping"}
                if reply["type"] == "error":
                    print(f"softdta: control message from {_peer(writer)} refused: {reply['error']}",
                          file=sys.stderr, flush=True)
                await send(writer, reply)
        except ControlError as error:
            print(f"softdta: control connection from {_peer(writer)} refused: {error}", file=sys.stderr, flush=True)
            if not writer.is_closing():
                try:
                    await send(writer, {"type": "error", "error": str(error)})
                except ConnectionError:
                    pass
        except ConnectionError:
            pass
        finally:
            if session is not None:
                del self.sessions[session]
                self.collector.release(session)
            writer.close()

    def _welcome(self, hello: Message) -> Session:
        if hello["type"] != "hello":
            raise ControlError("say hello first: {\"type\": \"hello\", \"version\": 1, \"token\": ..., \"translator\": "
                               "{\"ip\": ..., \"mac\": ...}}")
        if hello.get("version") != VERSION:
            raise ControlError(f"protocol version {hello.get('version')!r} is not supported; this collector speaks "
                               f"{VERSION}")
        if not hmac.compare_digest(str(hello.get("token", "")).encode(), self.token.encode()):
            raise ControlError("wrong token; use the collector's token (its configuration, [collector] token)")
        translator, secret = hello.get("translator"), hello.get("secret")
        if not isinstance(translator, dict) or not isinstance(translator.get("ip"), str) or \
                not isinstance(translator.get("mac"), str):
            raise ControlError("hello needs translator {\"ip\": \"a.b.c.d\", \"mac\": \"02:..\"}, both strings")
        try:
            address = ipaddress.ip_address(translator["ip"])
        except ValueError:
            raise ControlError(f"translator ip {translator['ip'][:64]!r} is not an IP address; give its IPv4 "
                               "address, a.b.c.d") from None
        if address.version != 4:
            raise ControlError(f"translator ip {translator['ip']} is IPv6; softdta's data path is IPv4: give the "
                               "translator's IPv4 address, a.b.c.d")
        try:
            mac = mac_bytes(translator["mac"])
        except ValueError:
            raise ControlError(f"translator mac {translator['mac'][:64]!r} is not a MAC address; give six hex "
                               "bytes like 02:00:00:00:00:01") from None
        if secret is not None and not (isinstance(secret, str) and len(secret) <= MAX_SECRET):
            raise ControlError("secret is the string this collector sent in its welcome; leave it out to get new "
                               "queue pairs")
        return self.collector.open_session(address.packed, mac, secret)

    def _connect(self, message: Message, session: Session) -> Message:
        qpn, psn, structure = message.get("qpn"), message.get("psn"), message.get("structure")
        if qpn is None or psn is None or not isinstance(structure, str):
            return {"type": "error", "error": "connect needs structure, qpn and psn"}
        if type(qpn) is not int or type(psn) is not int or not 0 < qpn < 1 << 24 or not 0 <= psn < 1 << 24:
            return {"type": "error", "error": f"qpn and psn are 24-bit whole numbers (qpn not 0), not "
                                              f"{json.dumps(qpn)[:32]} and {json.dumps(psn)[:32]}"}
        try:
            advert = self.collector.connection_of(session, structure, qpn) or \
                self.collector.connect(structure, Peer(session.ip, session.mac, qpn, psn), session)
        except BackendError as error:
            return {"type": "error", "error": str(error)}
        return {"type": "advertise", **advert}

    async def _failed(self, message: Message, session: Session) -> Message:
        structure, qpn = message.get("structure"), message.get("qpn")
        if not isinstance(structure, str) or not (qpn is None or type(qpn) is int):
            return {"type": "error", "error": "failed needs the structure whose queue pair failed, and the "
                                              "translator's qpn of it when it has several"}
        try:
            holder, advert = self.collector.recreate(session, structure, qpn)
        except BackendError as error:
            return {"type": "error", "error": str(error)}
        if holder is not session:
            await self._advertise(holder, advert)
        return {"type": "advertise", **advert}

    async def _advertise(self, holder: Session | None, advert: Message) -> None:
        """Tell the session holding a queue pair of its new advertisement, if it is open."""
        writer = self.sessions.get(holder) if holder is not None else None
        if writer is not None and not writer.is_closing():
            try:
                await send(writer, {"type": "advertise", **advert})
            except ConnectionError:
                pass  # its session ends and releases the queue pair

    async def repair_forever(self) -> None:
        while True:
            await asyncio.sleep(self.keepalive_s / 5)
            try:
                repaired = self.collector.repair()
            except BackendError as error:  # data_dir unwritable: the loop carries on, and says so each pass
                print(f"softdta: repair: {error}", file=sys.stderr, flush=True)
                continue
            for holder, advert in repaired:
                await self._advertise(holder, advert)


class Advertised(NamedTuple):
    """What a translator's control session got from a collector."""

    collector: CollectorIdentity
    adverts: list[Message]  # each with the "queue" it is for
    reader: asyncio.StreamReader  # the open connection: later advertisements arrive on it
    writer: asyncio.StreamWriter
    secret: str  # presented in the next session's hello, it reclaims these queue pairs


async def fetch_advertisements(host: str, port: int, token: str, translator: Mapping[str, object],
                               wanted: dict[str, tuple[int, int]],
                               timeout: float = 3 * KEEPALIVE_S, tls: ssl.SSLContext | None = None, queues: int = 1,
                               secret: str | None = None, psns: Mapping[int, int] = {}) -> Advertised:
    """Connect as a translator and ask for every structure in `wanted` (name -> (virtual QPN, first PSN)): a
    queue pair for each of its `queues` RX queues, queue q's with the virtual QPN + q x QUEUE_QPN_STRIDE.
    `secret`, the one an earlier session was given, takes back that session's queue pairs. `psns` maps a virtual
    QPN to the PSN it sends next, in place of the first PSN, so that a queue pair made anew starts there.

    `wanted` may name "*" to take every structure the collector hosts, numbering QPNs from the given one.
    """
    reader, writer = await asyncio.wait_for(asyncio.open_connection(
        host, port, limit=MAX_LINE, ssl=tls, server_hostname=host if tls else None), timeout)
    hello = {"type": "hello", "version": VERSION, "token": token,
             "translator": {"ip": translator["ip"], "mac": translator["mac"]}}
    try:
        await send(writer, hello if secret is None else {**hello, "secret": secret})
        welcome = await receive(reader, timeout)
    except (ControlError, OSError) as error:  # with TLS 1.3 a refused client certificate shows up here
        writer.close()
        hint = ("does the collector require TLS (--collector-ca)?" if tls is None else
                "does it require a translator certificate (--collector-cert)?")
        reason = getattr(error, "reason", None) or error or "closed"
        raise ControlError(f"collector {host}:{port} sent no welcome ({reason}); {hint}") from None
    if welcome["type"] != "welcome":
        writer.close()
        raise ControlError(f"collector {host}:{port} refused: {welcome.get('error', welcome)}")
    if "*" in wanted:
        first_qpn, psn = wanted["*"]
        wanted = {name: (first_qpn + index, psn) for index, name in enumerate(welcome["structures"])}
    adverts = []
    for structure, (qpn, psn) in wanted.items():
        for queue in range(queues):
            queue_qpn = qpn + queue * QUEUE_QPN_STRIDE
            await send(writer, {"type": "connect", "structure": structure, "qpn": queue_qpn,
                                "psn": psns.get(queue_qpn, psn)})
            reply = await receive(reader, timeout)
            if reply["type"] != "advertise":
                writer.close()
                raise ControlError(f"collector {host}:{port} refused {structure}: {reply.get('error', reply)}")
            adverts.append({**{key: value for key, value in reply.items() if key != "type"}, "queue": queue})
    return Advertised(welcome["collector"], adverts, reader, writer, welcome["secret"])
