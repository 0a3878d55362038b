"""The etcd client against a real etcd process (softdta.lab.etcd_server): keys, compare-and-swap with a fence,
leases that expire, watches that end cleanly, and endpoints that are not etcd."""

import http.server
import json
import threading

import pytest

from softdta.etcd.client import Etcd, EtcdUnavailable, LeaseExpired, NotEtcd
from softdta.lab.etcd_server import EtcdServer
from softdta.lab.local_server import free_port
from tests.common import eventually


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with EtcdServer(tmp_path_factory.mktemp("etcd")) as running:
        yield running


def test_keys_and_prefixes_round_trip(server):
    etcd = server.client()
    first = etcd.put("/t/keys/a", b"\x00\xffbinary")
    second = etcd.put("/t/keys/b", "text")
    etcd.put("/t/keysz", "outside the prefix")
    assert second > first
    kv = etcd.get("/t/keys/a")
    assert (kv.key, kv.value, kv.mod_revision) == ("/t/keys/a", b"\x00\xffbinary", first)
    kvs, revision = etcd.get_prefix("/t/keys/")
    assert [kv.key for kv in kvs] == ["/t/keys/a", "/t/keys/b"] and revision >= second
    etcd.delete("/t/keys/a")
    assert etcd.get("/t/keys/a") is None


def test_put_if_swaps_only_from_the_revision_read_and_while_the_fence_holds(server):
    etcd = server.client()
    assert etcd.put_if("/t/cas", "one", mod_revision=0)
    assert not etcd.put_if("/t/cas", "again", mod_revision=0), "mod_revision 0 means: only if absent"
    read = etcd.get("/t/cas")
    fence = etcd.put("/t/fence", "mine")
    written = etcd.put_if("/t/cas", "two", mod_revision=read.mod_revision, unchanged={"/t/fence": fence})
    assert written == etcd.get("/t/cas").mod_revision, "the revision of the write"
    assert not etcd.put_if("/t/cas", "stale", mod_revision=read.mod_revision), "a stale read must not swap"
    current = etcd.get("/t/cas")
    etcd.put("/t/fence", "someone else's")
    assert not etcd.put_if("/t/cas", "fenced", mod_revision=current.mod_revision, unchanged={"/t/fence": fence})
    assert etcd.get("/t/cas").value == b"two"


def test_a_lease_that_expires_takes_its_key_and_refuses_writes_under_it(server):
    etcd = server.client()
    lease = etcd.grant(2)
    etcd.put("/t/leased", "here", lease=lease)
    assert etcd.get("/t/leased").lease == lease
    assert 1 <= etcd.keepalive(lease) <= 2
    eventually(lambda: etcd.get("/t/leased") is None)
    assert etcd.keepalive(lease) == 0
    with pytest.raises(LeaseExpired, match="requested lease not found"):
        etcd.put("/t/leased", "late", lease=lease)
    etcd.revoke(lease)  # an expired lease revokes quietly


def test_a_watch_sees_puts_and_deletes_in_order_and_is_quiet_when_idle(server):
    etcd = server.client()
    _, revision = etcd.get_prefix("/t/watched/")
    watch = etcd.watch("/t/watched/", revision + 1)
    try:
        assert watch.poll(0.1) == []
        etcd.put("/t/watched/x", "1")
        etcd.put("/t/elsewhere", "not watched")
        etcd.delete("/t/watched/x")
        events = []
        eventually(lambda: events.extend(watch.poll(0.2)) or len(events) >= 2)
        assert [(event.kind, event.key, event.value) for event in events] == [
            ("put", "/t/watched/x", b"1"), ("delete", "/t/watched/x", b"")]
    finally:
        watch.close()


def test_closing_a_watch_ends_its_reader_without_an_error(server):
    errors = []
    hook, threading.excepthook = threading.excepthook, errors.append
    try:
        etcd = server.client()
        for _ in range(20):
            watch = etcd.watch("/t/closing/", 1)
            watch.close()
            watch.reader.join(5)
            assert not watch.reader.is_alive()
            assert list(watch) == []
    finally:
        threading.excepthook = hook
    assert errors == []


def test_a_watch_raises_when_etcd_dies(tmp_path):
    with EtcdServer(tmp_path) as running:
        etcd = running.client()
        watch = etcd.watch("/t/", 1)
        running.kill()
        with pytest.raises(EtcdUnavailable):
            eventually(lambda: watch.poll(0.2) and False, within=10)


class _JsonHandler(http.server.BaseHTTPRequestHandler):
    status, body = 200, {"status": "ok"}

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        payload = json.dumps(self.body).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, body", [(200, {"status": "ok"}), (404, {"error": "no such route"}), (200, [1])])
def test_a_json_service_that_is_not_etcd_is_named_as_such(status, body):
    handler = type("Handler", (_JsonHandler,), {"status": status, "body": body})
    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    try:
        with pytest.raises(NotEtcd, match="is that etcd's client port"):
            Etcd(f"http://127.0.0.1:{service.server_address[1]}").get("/t/anything")
    finally:
        service.shutdown()


def test_nothing_listening_is_unavailable_not_a_wrong_service():
    with pytest.raises(EtcdUnavailable, match="unreachable") as raised:
        Etcd(f"http://127.0.0.1:{free_port()}", timeout=0.5).get("/t/x")
    assert not isinstance(raised.value, NotEtcd)
