"""The libbpf binding and the netns helpers against the running kernel (root only)."""

import json
import os
import shutil
import struct
import subprocess
import sysconfig
import uuid
from pathlib import Path

import pytest

from softdta.kernel import netns
from softdta.kernel.bpf import (
    BPF_MAP_TYPE_ARRAY,
    BpfError,
    BpfObject,
    Map,
    RingBuffer,
    attach_tc_ingress,
    attach_xdp,
    attached_xdp,
    detach_tc,
    detach_xdp,
    ensure_bpffs,
    xdp_md,
)
from softdta.kernel.owner import InterfaceUnavailable, own_interface
from softdta.kernel.programs import VETH_PEER_SOURCE, build_object

pytestmark = pytest.mark.privileged

XDP_TX = 3

TINY = r"""
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 4); __type(key, __u32); __type(value, __u64);
} arr SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 1); __type(key, __u32); __type(value, __u32);
} runs SEC(".maps");
struct {
	__uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16); __type(key, __u32); __type(value, __u32);
} hash SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 4096); } events SEC(".maps");

/* a .rodata global, so the object has an internal map that must not be pinned */
volatile const __u32 verdict = XDP_TX;

SEC("xdp")
int tiny(struct xdp_md *ctx)
{
	__u32 zero = 0, head;
	__u32 *n = bpf_map_lookup_elem(&runs, &zero);
	if (n)
		(*n)++;
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + 4 > end)
		return XDP_ABORTED;
	__builtin_memcpy(&head, data, 4);
	bpf_ringbuf_output(&events, &head, 4, 0);
	if (bpf_xdp_adjust_meta(ctx, -4))
		return XDP_ABORTED;
	void *meta = (void *)(long)ctx->data_meta;
	data = (void *)(long)ctx->data;
	if (meta + 4 > data)
		return XDP_ABORTED;
	__builtin_memcpy(meta, "META", 4);
	return verdict;
}

SEC("xdp")
int pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("tc")
int tc_pass(struct __sk_buff *skb)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
"""

UNCHECKED = r"""
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int unchecked(struct xdp_md *ctx)
{
	return *(__u8 *)(long)ctx->data;
}

char LICENSE[] SEC("license") = "GPL";
"""

FRAME = bytes.fromhex("02000000000b" "02000000000a" "88b5") + bytes(range(50))


def compile_bpf(src: str, out: Path) -> Path:
    source = out.with_suffix(".c")
    source.write_text(src)
    # linux/types.h includes asm/types.h, which Debian keeps under the multiarch include directory
    subprocess.run(["clang", "-O2", "-g", "-target", "bpf", f"-I/usr/include/{sysconfig.get_config_var('MULTIARCH')}",
                    "-c", str(source), "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def tiny_o(tmp_path_factory) -> Path:
    return compile_bpf(TINY, tmp_path_factory.mktemp("bpf") / "tiny.o")


@pytest.fixture
def obj(tiny_o):
    with BpfObject(tiny_o) as o:
        yield o


@pytest.fixture
def pin_dir():
    path = ensure_bpffs() / f"sdta-t-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def namespaces():
    prefix = f"sdta-t-{os.getpid()}-"
    try:
        a, b = netns.Namespace.create(prefix + "a"), netns.Namespace.create(prefix + "b")
        netns.veth_pair(a, "va", b, "vb", mac_a="02:00:00:00:00:0a", mac_b="02:00:00:00:00:0b")
        yield a, b
    finally:
        removed = netns.cleanup_prefix(prefix)
    assert sorted(removed) == [prefix + "a", prefix + "b"]
    assert prefix not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def u32(n: int) -> bytes:
    return struct.pack("I", n)


def test_objects_list_maps_and_programs(obj):
    assert {"arr", "runs", "hash", "events"} <= obj.maps.keys()
    arr = obj.maps["arr"]
    assert (arr.key_size, arr.value_size, arr.max_entries, arr.map_type) == (4, 8, 4, BPF_MAP_TYPE_ARRAY)
    assert set(obj.programs) == {"tiny", "pass", "tc_pass"}
    assert all(p.fd > 0 for p in obj.programs.values())


def test_array_and_hash_maps(obj):
    arr, h = obj.maps["arr"], obj.maps["hash"]
    arr.update(u32(1), struct.pack("Q", 42))
    assert arr.lookup(u32(1)) == struct.pack("Q", 42)
    assert arr.lookup(u32(7)) is None
    assert list(arr.keys()) == [u32(i) for i in range(4)]

    for k in (5, 6, 7):
        h.update(u32(k), u32(k * 10))
    assert sorted(h.keys()) == sorted(u32(k) for k in (5, 6, 7))
    assert dict(h.items())[u32(6)] == u32(60)
    assert h.delete(u32(6)) and not h.delete(u32(6))
    assert h.lookup(u32(6)) is None
    h.clear()
    assert list(h.keys()) == []


def test_values_reads_a_whole_array_in_batches():
    written = {0: 1, 1: 2, 4095: 4096, 4096: 4097, 9999: 10000}
    with Map.create("batch", BPF_MAP_TYPE_ARRAY, 4, 8, 10_000) as array:
        for index, value in written.items():
            array.update(u32(index), struct.pack("Q", value))
        for chunk in (1, 1000, 4096, 20_000):
            values = [struct.unpack("Q", value)[0] for value in array.values(chunk)]
            assert len(values) == 10_000
            assert {index: value for index, value in enumerate(values) if value} == written


def test_wrong_sizes_and_unsupported_operations_raise(obj):
    with pytest.raises(BpfError, match="key is 2 bytes, expected 4"):
        obj.maps["hash"].lookup(b"ab")
    with pytest.raises(BpfError, match="value is 4 bytes, expected 8"):
        obj.maps["arr"].update(u32(0), u32(0))
    with pytest.raises(BpfError, match="only hash maps"):
        obj.maps["arr"].clear()
    with pytest.raises(BpfError, match="array maps only"):
        next(obj.maps["hash"].values())
    with pytest.raises(BpfError, match="array entries cannot be deleted"):
        obj.maps["arr"].delete(u32(0))
    with pytest.raises(BpfError, match="lookup_percpu"):
        obj.maps["runs"].lookup(u32(0))
    with pytest.raises(BpfError, match="not a BPF_MAP_TYPE_RINGBUF"):
        RingBuffer(obj.maps["hash"])


def test_xdp_test_run_splits_metadata_from_packet(obj):
    run = obj.programs["tiny"].test_run(FRAME, want_ctx=True)
    assert run.retval == XDP_TX
    assert (run.meta, run.data) == (b"META", FRAME)
    # the kernel reports the packet's offset from data_meta in ctx.data, and data_end relative to data_meta too
    assert struct.unpack("6I", run.ctx)[:3] == (4, 4 + len(FRAME), 0)


def test_xdp_test_run_accepts_input_metadata_and_ingress_ifindex(obj):
    # ctx.data declares the first bytes of data as existing metadata; the program prepends its own in front
    ctx = bytearray(xdp_md(ingress_ifindex=1))
    struct.pack_into("I", ctx, 0, 4)
    run = obj.programs["tiny"].test_run(b"meta" + FRAME, ctx=bytes(ctx))
    assert (run.meta, run.data) == (b"METAmeta", FRAME)


def test_xdp_repeat_reruns_on_the_same_buffer(obj):
    # repetitions are not reset in between, so adjust_meta compounds
    run = obj.programs["tiny"].test_run(FRAME, repeat=3)
    assert (run.meta, run.data) == (b"META" * 3, FRAME)


def test_percpu_counter_and_ring_buffer(obj):
    prog = obj.programs["tiny"]
    for _ in range(3):
        prog.test_run(FRAME)
    prog.test_run(FRAME, repeat=4)
    per_cpu = obj.maps["runs"].lookup_percpu(u32(0))
    assert sum(struct.unpack("I", v)[0] for v in per_cpu) == 7
    with RingBuffer(obj.maps["events"]) as ring:
        assert ring.poll(100) == [FRAME[:4]] * 7
        assert ring.consume() == []
    obj.maps["runs"].update(u32(0), u32(0))
    assert set(obj.maps["runs"].lookup_percpu(u32(0))) == {u32(0)}


def test_map_sizes_resize_before_load(tiny_o):
    with BpfObject(tiny_o, map_sizes={"hash": 64}) as o:
        assert o.maps["hash"].max_entries == 64
    with pytest.raises(BpfError, match="no such map"):
        BpfObject(tiny_o, map_sizes={"nope": 1})


def test_ensure_bpffs_mounts_only_where_needed(tmp_path):
    sub = ensure_bpffs() / f"sdta-t-{os.getpid()}-sub"
    mounts = Path("/proc/mounts").read_text()
    try:
        assert ensure_bpffs(sub).is_dir()
        assert Path("/proc/mounts").read_text() == mounts
    finally:
        sub.rmdir()
    fresh = ensure_bpffs(tmp_path / "bpffs")
    try:
        assert f" {fresh} bpf " in Path("/proc/mounts").read_text()
    finally:
        subprocess.run(["umount", str(fresh)], check=True)


def test_pinned_maps_survive_reload(tiny_o, pin_dir):
    with BpfObject(tiny_o, pin_dir=pin_dir) as first:
        first.maps["arr"].update(u32(2), struct.pack("Q", 1234))
    assert sorted(p.name for p in pin_dir.iterdir()) == ["arr", "events", "hash", "runs"]
    with BpfObject(tiny_o, pin_dir=pin_dir) as second:
        assert second.maps["arr"].lookup(u32(2)) == struct.pack("Q", 1234)
        second.maps["hash"].update(u32(9), u32(99))
    with Map.from_pinned(pin_dir / "hash") as h:
        assert (h.name, h.key_size, h.value_size, h.max_entries) == ("hash", 4, 4, 16)
        assert h.lookup(u32(9)) == u32(99)
    with pytest.raises(BpfError, match="parameter mismatch"):
        BpfObject(tiny_o, pin_dir=pin_dir, map_sizes={"hash": 32})
    with pytest.raises(BpfError, match="is the translator running"):
        Map.from_pinned(pin_dir / "missing")


def test_verifier_rejection_carries_the_log(tmp_path):
    bad = compile_bpf(UNCHECKED, tmp_path / "unchecked.o")
    with pytest.raises(BpfError) as err:
        BpfObject(bad)
    assert "verifier rejected" in str(err.value)
    assert "invalid access to packet" in str(err.value)


def test_in_netns_switches_and_restores():
    before = os.readlink("/proc/thread-self/ns/net")
    ns = netns.Namespace.create(f"sdta-t-{os.getpid()}-solo")
    try:
        with netns.in_netns(ns.name):
            assert os.readlink("/proc/thread-self/ns/net") != before
        assert os.readlink("/proc/thread-self/ns/net") == before
    finally:
        ns.delete()
        ns.delete()


def test_xdp_and_tc_attach_detach(obj, namespaces):
    a, _ = namespaces
    va = netns.ifindex(a, "va")
    with netns.in_netns(a.name):
        attach_xdp(va, obj.programs["pass"].fd, mode="native")
        shown = a.run("ip", "-d", "link", "show", "va").stdout
        assert " xdp " in shown and "name pass" in shown
        with pytest.raises(BpfError, match="other mode"):
            attach_xdp(va, obj.programs["pass"].fd, mode="generic")
        detach_xdp(va)
        assert "prog/xdp" not in a.run("ip", "-d", "link", "show", "va").stdout

        attach_tc_ingress(va, obj.programs["tc_pass"].fd)
        attach_tc_ingress(va, obj.programs["tc_pass"].fd)
        filters = a.run("tc", "filter", "show", "dev", "va", "ingress").stdout
        assert filters.count("softdta direct-action") == 1 and "name tc_pass" in filters
        detach_tc(va)
        detach_tc(va)
        assert a.run("tc", "filter", "show", "dev", "va", "ingress").stdout == ""
    with pytest.raises(BpfError, match="No such device"):
        attach_xdp(va + 1000, obj.programs["pass"].fd)


def test_attached_xdp_names_the_program_in_either_mode_and_tells_softdtas_from_others(obj, namespaces):
    """An operator's program (here `pass`) is foreign to softdta, whose programs are all named softdta_*: a daemon
    may own an interface with one of softdta's there (a killed daemon's), never with the operator's."""
    a, _ = namespaces
    va = netns.ifindex(a, "va")

    def owned() -> bool:
        os.close(own_interface("va", "translator", "would go", "or not"))  # let go at once: the next turn takes it
        return True
    with netns.in_netns(a.name), BpfObject(build_object(VETH_PEER_SOURCE)) as ours:
        assert attached_xdp(va) == [] and owned()
        for mode in ("native", "generic"):
            attach_xdp(va, obj.programs["pass"].fd, mode=mode)
            prog_id = attached_xdp(va)[0][0]
            assert attached_xdp(va) == [(prog_id, "pass")]
            with pytest.raises(InterfaceUnavailable) as refused:
                owned()
            assert refused.value.line() == (f"va runs the XDP program pass (id {prog_id}), which is not softdta's and "
                                            "which would go; detach it first (`ip link set dev va xdp off`), or not")
            detach_xdp(va)
            attach_xdp(va, ours.programs["softdta_pass"].fd, mode=mode)
            assert attached_xdp(va)[0][1] == "softdta_pass" and owned()
            detach_xdp(va)


def rx_packets(ns: netns.Namespace, ifname: str) -> int:
    return json.loads(ns.run("ip", "-j", "-s", "link", "show", "dev", ifname).stdout)[0]["stats64"]["rx"]["packets"]


def test_live_frames_are_transmitted(obj, namespaces):
    a, b = namespaces
    # veth delivers XDP frames only to a peer with NAPI running, which an attached XDP program ensures
    with netns.in_netns(b.name):
        attach_xdp(netns.ifindex(b, "vb"), obj.programs["pass"].fd)
    before = rx_packets(b, "vb")
    with netns.in_netns(a.name):
        obj.programs["tiny"].test_run_live(FRAME, ifindex=netns.ifindex(a, "va"), repeat=10)
    assert rx_packets(b, "vb") - before == 10
    assert sum(struct.unpack("I", v)[0] for v in obj.maps["runs"].lookup_percpu(u32(0))) == 10
