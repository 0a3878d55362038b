"""etcd v3 through its JSON gateway (etcd 3.4 serves it at /v3/ on the client port): no gRPC stack to install.

Keys and values are base64 in JSON, and 64-bit numbers are strings; this module turns them back into str, bytes and
int. Every failure to reach etcd, or an answer that is not etcd's, raises `EtcdUnavailable`: the fleet's processes
keep running on what they have and retry (docs/fleet.md, "Failure model").
"""

from __future__ import annotations

import base64
import http.client
import json
import queue
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from softdta.errors import SoftdtaError


class EtcdUnavailable(SoftdtaError, ConnectionError):
    """etcd did not answer, refused the request, or answered with something else than its API."""


class NotEtcd(EtcdUnavailable):
    """Something answered at the endpoint, but not with etcd's API: the URL is wrong, retrying will not help."""


class LeaseExpired(EtcdUnavailable):
    """A write named a lease etcd no longer has (it expired, or was revoked): grant a new one and write again."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "put" or "delete"
    key: str
    value: bytes  # empty for a delete
    mod_revision: int


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def _prefix_end(prefix: str) -> str:
    """The range end that selects every key starting with `prefix` (etcd's convention: the prefix plus one)."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return _b64(b"\0")
    raw[-1] += 1
    return _b64(bytes(raw))


def _kv(document: dict[str, Any]) -> KeyValue:
    return KeyValue(base64.b64decode(document["key"]).decode(), base64.b64decode(document.get("value", "")),
                    int(document.get("mod_revision", 0)), int(document.get("create_revision", 0)),
                    int(document.get("lease", 0)))


class Etcd:
    """One etcd endpoint (http://HOST:PORT). Each call is one request; `timeout` bounds it."""

    def __init__(self, endpoint: str = "http://127.0.0.1:2379", timeout: float = 2.0):
        parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        if parts.scheme != "http" or not parts.hostname:
            raise EtcdUnavailable(f"etcd endpoint {endpoint!r} is not http://HOST:PORT; give etcd's client URL")
        self.endpoint = f"http://{parts.hostname}:{parts.port or 2379}"
        self.host, self.port, self.timeout = parts.hostname, parts.port or 2379, timeout

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            connection.request("POST", f"/v3/{path}", json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise EtcdUnavailable(f"etcd at {self.endpoint} is unreachable ({error}); start etcd or fix --etcd") \
                from None
        finally:
            connection.close()
        try:
            answer = json.loads(text)
        except ValueError:
            raise NotEtcd(f"etcd at {self.endpoint} answered {path} with something else than JSON (HTTP "
                          f"{response.status}); is that etcd's client port?") from None
        if isinstance(answer, dict) and "code" in answer and (response.status != 200 or "error" in answer):
            message = str(answer.get("message", answer))
            refusal = LeaseExpired if "requested lease not found" in message else EtcdUnavailable
            raise refusal(f"etcd at {self.endpoint} refused {path}: {message}")
        result = answer.get("result", answer) if isinstance(answer, dict) else None
        if response.status != 200 or not isinstance(result, dict) or "header" not in result:
            raise NotEtcd(f"etcd at {self.endpoint} answered {path} with JSON that is not etcd's (HTTP "
                          f"{response.status}); is that etcd's client port?")
        return dict(answer)

    # ----------------------------------------------------------------------------------------------
    # keys

    def get(self, key: str) -> KeyValue | None:
        kvs = self.call("kv/range", {"key": _b64(key)}).get("kvs", [])
        return _kv(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix`, and the store's revision they were read at (to watch from revision + 1)."""
        answer = self.call("kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)})
        return [_kv(kv) for kv in answer.get("kvs", [])], int(answer["header"]["revision"])

    def put(self, key: str, value: str | bytes, lease: int = 0) -> int:
        """Write `key`; the revision of the write."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self.call("kv/put", body)["header"]["revision"])

    def delete(self, key: str) -> None:
        self.call("kv/deleterange", {"key": _b64(key)})

    def put_if(self, key: str, value: str | bytes, *, mod_revision: int, lease: int = 0,
               unchanged: Mapping[str, int] | None = None) -> int:
        """Compare-and-swap: write `key` only if its mod revision is still `mod_revision` (0: only if it does not
        exist) and each key of `unchanged` still has its given mod revision (a fence: the writer still holds
        what it read, e.g. its leader key). The revision of the write; 0 (false) if someone else wrote first."""
        compare = [{"key": _b64(name), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}
                   for name, revision in {key: mod_revision, **(unchanged or {})}.items()]
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        answer = self.call("kv/txn", {"compare": compare, "success": [{"request_put": put}]})
        return int(answer["header"]["revision"]) if answer.get("succeeded", False) else 0

    # ----------------------------------------------------------------------------------------------
    # leases

    def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; keys written under it vanish when it is neither renewed nor revoked."""
        return int(self.call("lease/grant", {"TTL": str(ttl)})["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew `lease`: the seconds it now has, 0 if it expired (its keys are gone)."""
        result = self.call("lease/keepalive", {"ID": str(lease)}).get("result", {})
        return int(result.get("TTL", 0))

    def revoke(self, lease: int) -> None:
        try:
            self.call("lease/revoke", {"ID": str(lease)})
        except EtcdUnavailable as error:
            if "lease not found" not in str(error):
                raise

    # ----------------------------------------------------------------------------------------------
    # watches

    def watch(self, prefix: str, start_revision: int, idle_timeout: float = 2.0) -> Watch:
        """The changes under `prefix` from `start_revision` on, as they happen (`Watch` is an iterator)."""
        return Watch(self, prefix, start_revision, idle_timeout)


class Watch:
    """A streaming watch, read by its own thread. Iterating yields batches of events; an empty batch means nothing
    happened for `idle_timeout` seconds (so callers can check for shutdown). Raises EtcdUnavailable once the stream
    broke or etcd canceled it."""

    def __init__(self, etcd: Etcd, prefix: str, start_revision: int, idle_timeout: float):
        self.etcd, self.idle_timeout = etcd, idle_timeout
        self.batches: queue.Queue[list[WatchEvent] | EtcdUnavailable] = queue.Queue()
        self.closed = False
        self.reader: threading.Thread | None = None  # started once the stream is open
        self.connection = http.client.HTTPConnection(etcd.host, etcd.port, timeout=etcd.timeout)
        request = {"create_request": {"key": _b64(prefix), "range_end": _prefix_end(prefix),
                                      "start_revision": str(start_revision)}}
        try:
            self.connection.request("POST", "/v3/watch", json.dumps(request), {"Content-Type": "application/json"})
            self.response = self.connection.getresponse()
            if self.response.status != 200:
                raise EtcdUnavailable(f"etcd at {etcd.endpoint} refused the watch (HTTP {self.response.status})")
            sock = self.connection.sock
            if sock is not None:
                sock.settimeout(None)  # the stream is idle as long as nothing changes
        except (OSError, http.client.HTTPException) as error:
            self.close()
            raise EtcdUnavailable(f"etcd at {etcd.endpoint} is unreachable ({error}); start etcd or fix --etcd") \
                from None
        self.reader = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        """The stream's lines into `batches`; the connection is closed here, never under a running readline."""
        try:
            while True:
                line = self.response.readline()
                if not line:
                    raise EtcdUnavailable(f"etcd at {self.etcd.endpoint} closed the watch")
                batch = self._events(line)
                if batch:
                    self.batches.put(batch)
        except EtcdUnavailable as error:
            self.batches.put(error)
        except (OSError, ValueError, AttributeError, http.client.HTTPException) as error:
            # AttributeError: http.client reading a chunked stream whose socket close() shut down
            self.batches.put(EtcdUnavailable(f"the watch on etcd at {self.etcd.endpoint} broke ({error})"))
        finally:
            self.connection.close()

    def _events(self, line: bytes) -> list[WatchEvent]:
        try:
            document = json.loads(line)
        except ValueError:
            raise EtcdUnavailable(f"etcd at {self.etcd.endpoint} sent a watch line that is not JSON") from None
        if not isinstance(document, dict) or "error" in document:
            error = document.get("error", document) if isinstance(document, dict) else document
            raise EtcdUnavailable(f"etcd at {self.etcd.endpoint} ended the watch: {error}")
        result = document.get("result", {})
        if result.get("canceled"):
            raise EtcdUnavailable(f"etcd canceled the watch: {result.get('cancel_reason', 'compacted')}")
        events = []
        for event in result.get("events", []):
            kv = _kv(event["kv"])
            events.append(WatchEvent("delete" if event.get("type") == "DELETE" else "put", kv.key, kv.value,
                                     kv.mod_revision))
        return events

    def __iter__(self) -> Iterator[list[WatchEvent]]:
        return self

    def __next__(self) -> list[WatchEvent]:
        batch = self.poll(self.idle_timeout)
        if not batch and self.closed:
            raise StopIteration
        return batch

    def poll(self, timeout: float) -> list[WatchEvent]:
        """The next batch of events within `timeout` seconds, else []; raises EtcdUnavailable once the stream
        broke."""
        try:
            batch = self.batches.get(timeout=timeout)
        except queue.Empty:
            return []
        if isinstance(batch, EtcdUnavailable):
            if self.closed:
                return []
            raise batch
        return batch

    def close(self) -> None:
        """End the stream: its reader sees the socket shut down, and closes the connection."""
        self.closed = True
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.reader is None:
            self.connection.close()
