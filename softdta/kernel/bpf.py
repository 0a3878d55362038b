"""A small libbpf binding over ctypes: load objects, use maps, run programs, read ring buffers, attach XDP and tc.

Everything acts in the calling thread's network namespace (see `softdta.kernel.netns.in_netns`).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import mmap
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pyroute2 import IPRoute, NetlinkError

from softdta.errors import SoftdtaError

log = logging.getLogger(__name__)

_T = TypeVar("_T")

BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PERCPU_HASH = 5
BPF_MAP_TYPE_PERCPU_ARRAY = 6
BPF_MAP_TYPE_LRU_HASH = 9
BPF_MAP_TYPE_LRU_PERCPU_HASH = 10
BPF_MAP_TYPE_HASH_OF_MAPS = 13
BPF_MAP_TYPE_DEVMAP = 14
BPF_MAP_TYPE_RINGBUF = 27
BPF_PROG_TYPE_XDP = 6
BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1
BPF_XDP = 37  # enum bpf_attach_type: an XDP program on a device, through a BPF link
XDP_FLAGS_SKB_MODE = 2
XDP_FLAGS_DRV_MODE = 4
XDP_MD_SIZE = 24

_PERCPU_TYPES = {BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY, BPF_MAP_TYPE_LRU_PERCPU_HASH}
_HASH_TYPES = {BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_LRU_PERCPU_HASH,
               BPF_MAP_TYPE_HASH_OF_MAPS}
_XDP_MODES = {"native": XDP_FLAGS_DRV_MODE, "generic": XDP_FLAGS_SKB_MODE}
_LIBBPF_WARN = 0
_LOG_TAIL = 60
_ROOT_HINT = "run as root (needs CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN)"


class BpfError(SoftdtaError, RuntimeError):
    """A libbpf, bpf(2) or netlink operation failed."""


class LiveRunInterrupted(BpfError):
    """A signal ended a live-frames run between two of its bursts: some of its repeats ran, the rest did not
    (`Program.test_run_live` resumes where the program's own count says)."""


def _error(op: str, err: int, fixes: dict[int, str] | None = None, log_lines: list[str] | None = None,
           detail: str | None = None) -> BpfError:
    msg = f"{op}: {os.strerror(err)}" + (f" ({detail})" if detail else "")
    fix = (fixes or {}).get(err) or (_ROOT_HINT if err == errno.EPERM else None)
    if fix:
        msg += f"; {fix}"
    if log_lines:
        msg += f"\n--- libbpf log (last {_LOG_TAIL} lines) ---\n" + "\n".join(log_lines[-_LOG_TAIL:])
    return BpfError(msg)


def _check(ret: int, op: str, fixes: dict[int, str] | None = None) -> int:
    if ret < 0:
        raise _error(op, -ret, fixes)
    return ret


_lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
_libc = ctypes.CDLL(None, use_errno=True)

_P, _I, _U32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32
_PRINT_FN = ctypes.CFUNCTYPE(_I, _I, _P, _P)
_SAMPLE_FN = ctypes.CFUNCTYPE(_I, _P, _P, ctypes.c_size_t)

for _name, _res, _args in [
    ("libbpf_set_print", _P, [_PRINT_FN]),
    ("libbpf_num_possible_cpus", _I, []),
    ("bpf_object__open_file", _P, [ctypes.c_char_p, _P]),
    ("bpf_object__load", _I, [_P]),
    ("bpf_object__close", None, [_P]),
    ("bpf_object__find_map_by_name", _P, [_P, ctypes.c_char_p]),
    ("bpf_object__next_map", _P, [_P, _P]),
    ("bpf_object__next_program", _P, [_P, _P]),
    ("bpf_map__set_max_entries", _I, [_P, _U32]),
    ("bpf_map__set_pin_path", _I, [_P, ctypes.c_char_p]),
    ("bpf_map__reuse_fd", _I, [_P, _I]),
    ("bpf_map__name", ctypes.c_char_p, [_P]),
    ("bpf_map__fd", _I, [_P]),
    ("bpf_map__key_size", _U32, [_P]),
    ("bpf_map__value_size", _U32, [_P]),
    ("bpf_map__max_entries", _U32, [_P]),
    ("bpf_map__type", _I, [_P]),
    ("bpf_program__name", ctypes.c_char_p, [_P]),
    ("bpf_program__fd", _I, [_P]),
    ("bpf_program__type", _I, [_P]),
    ("bpf_map_create", _I, [_I, ctypes.c_char_p, _U32, _U32, _U32, _P]),
    ("bpf_map_lookup_elem", _I, [_I, _P, _P]),
    ("bpf_map_update_elem", _I, [_I, _P, _P, ctypes.c_uint64]),
    ("bpf_map_delete_elem", _I, [_I, _P]),
    ("bpf_map_get_next_key", _I, [_I, _P, _P]),
    ("bpf_map_lookup_batch", _I, [_I, _P, _P, _P, _P, ctypes.POINTER(_U32), _P]),
    ("bpf_obj_get", _I, [ctypes.c_char_p]),
    ("bpf_obj_pin", _I, [_I, ctypes.c_char_p]),
    ("bpf_enable_stats", _I, [_I]),
    ("bpf_obj_get_info_by_fd", _I, [_I, _P, ctypes.POINTER(_U32)]),
    ("bpf_prog_test_run_opts", _I, [_I, _P]),
    ("bpf_link_create", _I, [_I, _I, _I, _P]),
    ("bpf_xdp_query_id", _I, [_I, _I, ctypes.POINTER(_U32)]),
    ("bpf_prog_get_fd_by_id", _I, [_U32]),
    ("ring_buffer__new", _P, [_I, _SAMPLE_FN, _P, _P]),
    ("ring_buffer__poll", _I, [_P, _I]),
    ("ring_buffer__consume", _I, [_P]),
    ("ring_buffer__free", None, [_P]),
]:
    _fn = getattr(_lib, _name)
    _fn.restype, _fn.argtypes = _res, _args

_libc.vsnprintf.argtypes = [_P, ctypes.c_size_t, _P, _P]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, _P]


class _TestRunOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_char_p), ("data_out", _P),
                ("data_size_in", _U32), ("data_size_out", _U32), ("ctx_in", ctypes.c_char_p), ("ctx_out", _P),
                ("ctx_size_in", _U32), ("ctx_size_out", _U32), ("retval", _U32), ("repeat", _I),
                ("duration", _U32), ("flags", _U32), ("cpu", _U32), ("batch_size", _U32)]


class _MapInfo(ctypes.Structure):
    _fields_ = [("type", _U32), ("id", _U32), ("key_size", _U32), ("value_size", _U32), ("max_entries", _U32),
                ("map_flags", _U32), ("name", ctypes.c_char * 16), ("ifindex", _U32),
                ("btf_vmlinux_value_type_id", _U32), ("netns_dev", ctypes.c_uint64), ("netns_ino", ctypes.c_uint64),
                ("btf_id", _U32), ("btf_key_type_id", _U32), ("btf_value_type_id", _U32), ("pad", _U32),
                ("map_extra", ctypes.c_uint64)]


class _ProgInfo(ctypes.Structure):
    """struct bpf_prog_info up to the name: the kernel fills as much as it is given."""
    _fields_ = [("type", _U32), ("id", _U32), ("tag", ctypes.c_uint8 * 8), ("jited_prog_len", _U32),
                ("xlated_prog_len", _U32), ("jited_prog_insns", ctypes.c_uint64),
                ("xlated_prog_insns", ctypes.c_uint64), ("load_time", ctypes.c_uint64), ("created_by_uid", _U32),
                ("nr_map_ids", _U32), ("map_ids", ctypes.c_uint64), ("name", ctypes.c_char * 16)]


_capture = threading.local()


def _vformat(fmt: int, args: int) -> str:
    # x86-64: va_list is a pointer to a 24-byte __va_list_tag and va_copy is a plain copy of it, so the copy
    # can be consumed to measure the length without disturbing the original
    copy = ctypes.create_string_buffer(ctypes.string_at(args, 24), 24)
    size = _libc.vsnprintf(None, 0, fmt, copy) + 1
    buf = ctypes.create_string_buffer(size)
    _libc.vsnprintf(buf, size, fmt, args)
    return buf.value.decode(errors="replace")


def _on_libbpf_print(level: int, fmt: int, args: int) -> int:
    lines = getattr(_capture, "lines", None)
    if lines is not None:
        lines.extend(_vformat(fmt, args).splitlines())
    elif level == _LIBBPF_WARN:
        log.warning("libbpf: %s", _vformat(fmt, args).rstrip())
    return 0


# the C callback must outlive every libbpf call, so it stays referenced here
_libbpf_print_callback = _PRINT_FN(_on_libbpf_print)
_lib.libbpf_set_print(_libbpf_print_callback)


@contextmanager
def _libbpf_log() -> Iterator[list[str]]:
    lines: list[str] = []
    _capture.lines = lines
    try:
        yield lines
    finally:
        _capture.lines = None


@functools.cache
def possible_cpus() -> int:
    return _check(_lib.libbpf_num_possible_cpus(), "count possible CPUs")


def _mount_of(path: Path) -> tuple[str, str]:
    """(mount point, fs type) of the mount that holds path."""
    best = ("/", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, fstype = line.split()[:3]
        point = point.encode().decode("unicode_escape")
        if (path == Path(point) or Path(point) in path.parents) and len(point) >= len(best[0]):
            best = (point, fstype)
    return best


def ensure_bpffs(path: str | Path = "/sys/fs/bpf") -> Path:
    """Make sure path is a directory on a bpffs, mounting one there if needed."""
    path = Path(path).absolute()
    on_bpffs = _mount_of(path)[1] == "bpf"
    path.mkdir(parents=True, exist_ok=True)
    if not on_bpffs and _libc.mount(b"bpf", os.fsencode(path), b"bpf", 0, None) != 0:
        raise _error(f"mount bpffs at {path}", ctypes.get_errno())
    return path


@dataclass(eq=False)
class Map:
    """A BPF map by file descriptor; keys and values are raw bytes of the map's declared sizes."""

    name: str
    fd: int
    key_size: int
    value_size: int
    max_entries: int
    map_type: int
    _owns_fd: bool = field(default=False, repr=False)

    @classmethod
    def from_pinned(cls, path: str | Path) -> Map:
        """Open a map pinned on a bpffs, without loading any program; close() it when done."""
        fd = _check(_lib.bpf_obj_get(os.fsencode(path)), f"open pinned map {path}",
                    {errno.ENOENT: "nothing is pinned there; is the translator running?"})
        info = _MapInfo()
        size = _U32(ctypes.sizeof(info))
        ret = _lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size))
        if ret < 0:
            os.close(fd)
            raise _error(f"read map info of {path}", -ret)
        # the kernel keeps only 15 characters of the name; the pin's file name is the full one
        return cls(Path(path).name, fd, info.key_size, info.value_size, info.max_entries, info.type, True)

    @classmethod
    def create(cls, name: str, map_type: int, key_size: int, value_size: int, max_entries: int) -> Map:
        """A new map of no BPF object (a devmap the control plane puts into a map of maps); close() it when
        done: what holds it in the kernel keeps it alive."""
        fd = _check(_lib.bpf_map_create(map_type, name.encode(), key_size, value_size, max_entries, None),
                    f"create map {name}")
        return cls(name, fd, key_size, value_size, max_entries, map_type, True)

    def close(self) -> None:
        """Close the fd if this Map opened it (from_pinned); maps of a BpfObject close with it."""
        if self._owns_fd and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Map:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def percpu(self) -> bool:
        return self.map_type in _PERCPU_TYPES

    def _sized(self, what: str, data: bytes, size: int) -> bytes:
        if len(data) != size:
            raise BpfError(f"map '{self.name}': {what} is {len(data)} bytes, expected {size}")
        return data

    def _percpu_slot(self) -> int:
        # the kernel lays per-CPU values out in 8-byte aligned slots
        return (self.value_size + 7) & ~7

    def _lookup_raw(self, key: bytes, size: int) -> bytes | None:
        value = ctypes.create_string_buffer(size)
        # keyless maps (queues, stacks) take a NULL key: the kernel rejects any pointer there
        key_arg = self._sized("key", key, self.key_size) if self.key_size else None
        ret = _lib.bpf_map_lookup_elem(self.fd, key_arg, value)
        if ret == -errno.ENOENT:
            return None
        _check(ret, f"lookup in map '{self.name}'")
        return value.raw

    def lookup(self, key: bytes) -> bytes | None:
        """The value stored under key, or None."""
        if self.percpu:
            raise BpfError(f"lookup in map '{self.name}': per-CPU map, use lookup_percpu()")
        return self._lookup_raw(key, self.value_size)

    def lookup_percpu(self, key: bytes) -> list[bytes] | None:
        """One value per possible CPU, or None."""
        slot = self._percpu_slot()
        raw = self._lookup_raw(key, slot * possible_cpus())
        if raw is None:
            return None
        return [raw[i:i + self.value_size] for i in range(0, len(raw), slot)]

    def counter_total(self, index: int) -> int:
        """A per-CPU array of u64 counters: counter `index` summed over the CPUs (0 where the map has none)."""
        return sum(int.from_bytes(value[:8], "little") for value in self.lookup_percpu(index.to_bytes(4, "little"))
                   or [])

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        """Store value under key; for per-CPU maps the value is stored on every CPU."""
        value = self._sized("value", value, self.value_size)
        if self.percpu:
            value = value.ljust(self._percpu_slot(), b"\0") * possible_cpus()
        _check(_lib.bpf_map_update_elem(self.fd, self._sized("key", key, self.key_size), value, flags),
               f"update map '{self.name}'", {errno.E2BIG: f"the map is full ({self.max_entries} entries)"})

    def update_percpu(self, key: bytes, values: list[bytes]) -> None:
        """Store one value per possible CPU (missing CPUs get zeros) in a per-CPU map."""
        slot = self._percpu_slot()
        raw = b"".join(self._sized("value", v, self.value_size).ljust(slot, b"\0") for v in values)
        _check(_lib.bpf_map_update_elem(self.fd, self._sized("key", key, self.key_size),
                                        raw.ljust(slot * possible_cpus(), b"\0"), 0), f"update map '{self.name}'")

    def delete(self, key: bytes) -> bool:
        """Delete key; False if it was not there."""
        ret = _lib.bpf_map_delete_elem(self.fd, self._sized("key", key, self.key_size))
        if ret == -errno.ENOENT:
            return False
        _check(ret, f"delete from map '{self.name}'", {errno.EINVAL: "array entries cannot be deleted"})
        return True

    def keys(self) -> Iterator[bytes]:
        key = None
        following = ctypes.create_string_buffer(self.key_size)
        while True:
            ret = _lib.bpf_map_get_next_key(self.fd, key, following)
            if ret == -errno.ENOENT:
                return
            _check(ret, f"iterate map '{self.name}'")
            key = following.raw
            yield key

    def values(self, chunk: int = 4096) -> Iterator[bytes]:
        """Every value of an array map in index order, `chunk` per system call: an array of a million entries is
        read in a fraction of a second, where a lookup each takes seconds."""
        if self.map_type != BPF_MAP_TYPE_ARRAY:
            raise BpfError(f"map '{self.name}': values() reads array maps only; use items()")
        keys = ctypes.create_string_buffer(self.key_size * chunk)
        values = ctypes.create_string_buffer(self.value_size * chunk)
        after, token = None, ctypes.create_string_buffer(max(self.key_size, 8))
        while True:
            count = _U32(chunk)
            ret = _lib.bpf_map_lookup_batch(self.fd, after, token, keys, values, ctypes.byref(count), None)
            if ret < 0 and ret != -errno.ENOENT:
                _check(ret, f"read map '{self.name}'")
            raw = values.raw
            for i in range(count.value):
                yield raw[i * self.value_size:(i + 1) * self.value_size]
            if ret == -errno.ENOENT:
                return
            after = ctypes.create_string_buffer(token.raw, len(token))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs of a map that is not per-CPU."""
        for key in self.keys():
            value = self.lookup(key)
            if value is not None:
                yield key, value

    def mmap(self) -> mmap.mmap:
        """The whole array as shared memory (maps created with BPF_F_MMAPABLE), writable."""
        if self.map_type != BPF_MAP_TYPE_ARRAY:
            raise BpfError(f"mmap of map '{self.name}': only array maps can be mapped")
        length = ((self.value_size + 7) & ~7) * self.max_entries
        try:
            return mmap.mmap(self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            raise BpfError(f"mmap of map '{self.name}': {error.strerror}; the map needs "
                           "BPF_F_MMAPABLE") from None

    def clear(self) -> None:
        """Delete every entry of a hash map."""
        if self.map_type not in _HASH_TYPES:
            raise BpfError(f"clear map '{self.name}': only hash maps can be cleared")
        for key in list(self.keys()):
            self.delete(key)


BPF_STATS_RUN_TIME = 0


def pin(fd: int, path: str | Path) -> None:
    """Pin a program or map at `path` on a bpffs, replacing what was pinned there."""
    Path(path).unlink(missing_ok=True)
    _check(_lib.bpf_obj_pin(fd, os.fsencode(path)), f"pin at {path}")


def program_run_stats(path: str | Path) -> tuple[int, int]:
    """(run time in ns, runs) of a pinned program while run-time statistics are on (see enable_run_stats)."""
    fd = _check(_lib.bpf_obj_get(os.fsencode(path)), f"open pinned program {path}",
                {errno.ENOENT: "nothing is pinned there; is the translator running?"})
    try:
        return run_stats(fd)
    finally:
        os.close(fd)


def run_stats(fd: int) -> tuple[int, int]:
    """(run time in ns, runs) of the program behind `fd` while run-time statistics are on."""
    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                  if ":\t" in line)
    return int(fields.get("run_time_ns", 0)), int(fields.get("run_cnt", 0))


def enable_run_stats() -> int:
    """Turn on the kernel's per-program run-time statistics for as long as the returned fd stays open."""
    return _check(_lib.bpf_enable_stats(BPF_STATS_RUN_TIME), "enable BPF run-time statistics")


def xdp_md(ingress_ifindex: int = 0, rx_queue_index: int = 0) -> bytes:
    """A struct xdp_md for Program.test_run(ctx=...); data, data_end and data_meta stay 0 (test_run sets data_end)."""
    return struct.pack("6I", 0, 0, 0, ingress_ifindex, rx_queue_index, 0)


def _xdp_ctx(ctx: bytes, data_len: int) -> bytes:
    # the kernel reads ctx.data_end as the length of the linear part (0 would show the program an empty packet,
    # more than len(data) is EINVAL), requires ctx.data_meta to be 0, and takes ctx.data as a metadata prefix of data
    if len(ctx) != XDP_MD_SIZE:
        raise BpfError(f"XDP test run: ctx is {len(ctx)} bytes, expected a {XDP_MD_SIZE}-byte struct xdp_md")
    md = bytearray(ctx)
    struct.pack_into("I", md, 4, data_len)
    return bytes(md)


@dataclass
class TestRun:
    """Result of Program.test_run; for XDP, meta holds the bytes the program put before the packet."""

    retval: int
    data: bytes
    duration_ns: int
    ctx: bytes | None
    meta: bytes = b""


@dataclass(eq=False)
class Program:
    """A loaded BPF program."""

    name: str
    fd: int
    prog_type: int

    def _run(self, opts: _TestRunOpts, what: str, fixes: dict[int, str]) -> None:
        opts.sz = ctypes.sizeof(opts)
        ret = _lib.bpf_prog_test_run_opts(self.fd, ctypes.byref(opts))
        # the kernel looks for a pending signal between bursts, and never after the last repeat ran
        if ret == -errno.EINTR and opts.flags & BPF_F_TEST_XDP_LIVE_FRAMES:
            raise LiveRunInterrupted(f"{what} program '{self.name}': a signal ended it after some of its repeats")
        _check(ret, f"{what} program '{self.name}'", fixes)

    def test_run(self, data: bytes, *, repeat: int = 1, ctx: bytes | None = None, want_ctx: bool = False,
                 data_size_out: int = 8192, flags: int = 0) -> TestRun:
        """Run the program on data in the kernel (BPF_PROG_TEST_RUN) and return what it left behind."""
        xdp = self.prog_type == BPF_PROG_TYPE_XDP
        if xdp:
            # always pass a context so the data/metadata split can be read back from ctx_out.data
            ctx = _xdp_ctx(xdp_md() if ctx is None else ctx, len(data))
        elif want_ctx and ctx is None:
            raise BpfError(f"test run of program '{self.name}': want_ctx needs a ctx to size the output")
        data_out = ctypes.create_string_buffer(data_size_out)
        ctx_out = ctypes.create_string_buffer(len(ctx)) if ctx is not None and (want_ctx or xdp) else None
        opts = _TestRunOpts(data_in=data, data_size_in=len(data), data_out=ctypes.addressof(data_out),
                            data_size_out=data_size_out, repeat=repeat, flags=flags)
        if ctx is not None:
            opts.ctx_in, opts.ctx_size_in = ctx, len(ctx)
        if ctx_out is not None:
            opts.ctx_out, opts.ctx_size_out = ctypes.addressof(ctx_out), len(ctx_out)
        self._run(opts, "test run of", {
            errno.ENOSPC: f"the output exceeds data_size_out={data_size_out}",
            errno.EINVAL: "is data at least 14 bytes, and ctx valid (rx_queue_index exists, egress_ifindex 0)?",
            errno.ENODEV: "ctx names an ingress_ifindex that is not in this network namespace",
        })
        out = data_out.raw[:opts.data_size_out]
        # an XDP run and want_ctx always have a ctx_out (see above)
        meta_len: int = struct.unpack_from("I", ctx_out.raw)[0] if xdp and ctx_out is not None else 0
        return TestRun(retval=opts.retval, data=out[meta_len:], duration_ns=opts.duration,
                       ctx=ctx_out.raw[:opts.ctx_size_out] if want_ctx and ctx_out is not None else None,
                       meta=out[:meta_len])

    def test_run_live(self, data: bytes, *, ifindex: int, repeat: int = 1, batch_size: int = 0,
                      rx_queue: int = 0, ran: Callable[[], int] | None = None) -> int:
        """Run an XDP program on repeat copies of data as if received on ifindex (RX queue `rx_queue`);
        XDP_TX/XDP_REDIRECT really send. A signal (a daemon's reload or stop) may end the run between two bursts;
        the kernel does not say how many repeats ran. With `ran`, which tells from the program's own count how
        many it handled since the call began, the run goes on with the rest, each frame once and in order;
        returns how many times it did. Without, LiveRunInterrupted."""
        ctx = _xdp_ctx(xdp_md(ingress_ifindex=ifindex, rx_queue_index=rx_queue), len(data))
        done = resumed = 0
        while True:
            opts = _TestRunOpts(data_in=data, data_size_in=len(data), ctx_in=ctx, ctx_size_in=len(ctx),
                                repeat=repeat - done, flags=BPF_F_TEST_XDP_LIVE_FRAMES, batch_size=batch_size)
            try:
                self._run(opts, "live-frames run of", {
                    errno.EINVAL: "live frames need an XDP program, a frame of 14 to about 3400 bytes (4 KiB "
                                  "pages) and an RX queue the interface has",
                    errno.E2BIG: "batch_size is at most 256",
                    errno.ENODEV: f"no interface with ifindex {ifindex} in this network namespace",
                })
                return resumed
            except LiveRunInterrupted:
                if ran is None:
                    raise
                before, done = done, ran()
                if done <= before:
                    raise BpfError(f"live-frames run of program '{self.name}': a signal ended a run in which the "
                                   "program counted no repeat") from None
                resumed += 1


class BpfObject:
    """A loaded BPF ELF object; maps with a pin_dir are reused from, or pinned to, that bpffs directory. The maps
    named in `reuse` are those open maps instead (of another loaded object: the two programs then share them);
    they are neither resized nor pinned."""

    def __init__(self, path: str | Path, *, pin_dir: str | Path | None = None,
                 map_sizes: dict[str, int] | None = None, reuse: dict[str, Map] | None = None):
        self.path = Path(path)
        with _libbpf_log() as lines:
            self._obj = _lib.bpf_object__open_file(os.fsencode(self.path), None)
            if not self._obj:
                raise _error(f"open BPF object {self.path}", ctypes.get_errno(), log_lines=lines)
            try:
                self._configure(pin_dir, map_sizes or {}, reuse or {})
                ret = _lib.bpf_object__load(self._obj)
                if ret < 0:
                    raise _error(f"load BPF object {self.path}", -ret, {
                        errno.EACCES: "the verifier rejected a program (see its log below)",
                        errno.EINVAL: "a program or map was rejected, or a pinned map does not match (see below)",
                    }, lines)
            except BaseException:
                self.close()
                raise
        self.maps = {m.name: m for m in self._iter(_lib.bpf_object__next_map, self._map)}
        self.programs = {p.name: p for p in self._iter(_lib.bpf_object__next_program, self._program)}

    def _configure(self, pin_dir: str | Path | None, map_sizes: dict[str, int], reuse: dict[str, Map]) -> None:
        for name, shared in reuse.items():
            handle = _lib.bpf_object__find_map_by_name(self._obj, name.encode())
            if not handle:
                raise BpfError(f"reuse map '{name}' in {self.path}: no such map")
            _check(_lib.bpf_map__reuse_fd(handle, shared.fd), f"reuse map '{name}' (fd {shared.fd}) in {self.path}")
        for name, size in map_sizes.items():
            handle = _lib.bpf_object__find_map_by_name(self._obj, name.encode())
            if not handle:
                raise BpfError(f"resize map '{name}' in {self.path}: no such map")
            _check(_lib.bpf_map__set_max_entries(handle, size), f"resize map '{name}' to {size} in {self.path}")
        if pin_dir is None:
            return
        Path(pin_dir).mkdir(parents=True, exist_ok=True)
        for handle in self._iter(_lib.bpf_object__next_map, lambda h: h):
            name = _lib.bpf_map__name(handle).decode()
            # global-data maps (.rodata, .bss, <obj>.data) are per-load constants and state, never shared
            if "." not in name and name not in reuse:
                _check(_lib.bpf_map__set_pin_path(handle, f"{pin_dir}/{name}".encode()), f"set pin path of '{name}'")

    def _iter(self, next_fn: Callable[[int | None, int | None], int | None],
              wrap: Callable[[int], _T]) -> Iterator[_T]:
        handle = next_fn(self._obj, None)
        while handle:
            yield wrap(handle)
            handle = next_fn(self._obj, handle)

    @staticmethod
    def _map(h: int) -> Map:
        return Map(_lib.bpf_map__name(h).decode(), _lib.bpf_map__fd(h), _lib.bpf_map__key_size(h),
                   _lib.bpf_map__value_size(h), _lib.bpf_map__max_entries(h), _lib.bpf_map__type(h))

    @staticmethod
    def _program(h: int) -> Program:
        return Program(_lib.bpf_program__name(h).decode(), _lib.bpf_program__fd(h), _lib.bpf_program__type(h))

    def close(self) -> None:
        if self._obj:
            _lib.bpf_object__close(self._obj)
            self._obj = None

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RingBuffer:
    """Reads records from a BPF_MAP_TYPE_RINGBUF map."""

    def __init__(self, ring: Map):
        if ring.map_type != BPF_MAP_TYPE_RINGBUF:
            raise BpfError(f"open ring buffer '{ring.name}': not a BPF_MAP_TYPE_RINGBUF map")
        self.name = ring.name
        self._records: list[bytes] = []
        # the C callback must outlive the ring_buffer, so keep it on the instance
        self._callback = _SAMPLE_FN(self._on_sample)
        self._rb = _lib.ring_buffer__new(ring.fd, self._callback, None, None)
        if not self._rb:
            raise _error(f"open ring buffer '{ring.name}'", ctypes.get_errno())

    def _on_sample(self, _ctx: int, data: int, size: int) -> int:
        self._records.append(ctypes.string_at(data, size))
        return 0

    def _take(self, ret: int, op: str) -> list[bytes]:
        # a signal (Ctrl-C) interrupts epoll; return what arrived and let Python handle the signal
        if ret != -errno.EINTR:
            _check(ret, f"{op} ring buffer '{self.name}'")
        records, self._records = self._records, []
        return records

    def poll(self, timeout_ms: int = 0) -> list[bytes]:
        """Wait up to timeout_ms (-1: forever) for records and return all that are ready."""
        return self._take(_lib.ring_buffer__poll(self._rb, timeout_ms), "poll")

    def consume(self) -> list[bytes]:
        """Return every ready record without waiting."""
        return self._take(_lib.ring_buffer__consume(self._rb), "consume")

    def close(self) -> None:
        if self._rb:
            _lib.ring_buffer__free(self._rb)
            self._rb = None

    def __enter__(self) -> RingBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ifname(ifindex: int) -> str:
    try:
        return f"{socket.if_indextoname(ifindex)} (ifindex {ifindex})"
    except OSError:
        return f"ifindex {ifindex}"


class _Rtnl:
    """An IPRoute whose netlink errors become BpfErrors naming the operation, with the kernel's extack text."""

    def __init__(self, op: str, fixes: dict[int, str]):
        self.op, self.fixes = op, {errno.ENODEV: "no such interface in this network namespace", **fixes}

    def __enter__(self) -> _Rtnl:
        # IPRoute opens its socket in the calling thread, hence in that thread's network namespace
        self.ipr = IPRoute(ext_ack=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.ipr.close()

    def __call__(self, method: str, *args: object, ignore: tuple[int, ...] = (), **kwargs: object) -> None:
        try:
            getattr(self.ipr, method)(*args, **kwargs)
        except NetlinkError as e:
            if e.code not in ignore:
                detail = e.args[1] if e.args[1] != os.strerror(e.code) else None
                raise _error(self.op, e.code, self.fixes, detail=detail) from e


def _xdp_attrs(prog_fd: int, flags: int) -> dict[str, list[tuple[str, int]]]:
    return {"attrs": [("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", flags)]}


def attach_xdp(ifindex: int, prog_fd: int, *, mode: str = "native") -> None:
    """Attach an XDP program to ifindex in mode "native" (driver) or "generic" (skb), replacing any in that mode."""
    if mode not in _XDP_MODES:
        raise ValueError(f"XDP mode must be one of {sorted(_XDP_MODES)}, not {mode!r}")
    with _Rtnl(f"attach XDP ({mode}) to {_ifname(ifindex)}", {
        errno.EEXIST: "an XDP program is attached in the other mode; detach_xdp() first",
        errno.EINVAL: "is prog_fd an XDP program?",
        errno.EOPNOTSUPP: "the driver has no native XDP; use mode='generic'",
        errno.ERANGE: "the MTU is too large for native XDP on this driver; lower it",
    }) as rtnl:
        rtnl("link", "set", index=ifindex, xdp=_xdp_attrs(prog_fd, _XDP_MODES[mode]))


def link_xdp(ifindex: int, prog_fd: int) -> int:
    """Attach an XDP program to ifindex through a BPF link (driver mode where the device has it, else generic);
    returns the link's fd. The program stays attached while that fd is open and no longer: closing it, or the
    process ending, even by kill -9, detaches it."""
    return _check(_lib.bpf_link_create(prog_fd, ifindex, BPF_XDP, None), f"link XDP to {_ifname(ifindex)}", {
        errno.EBUSY: "another XDP program is attached there; detach it first",
        errno.EEXIST: "another XDP program is attached there; detach it first",
    })


def attached_xdp(ifindex: int) -> list[tuple[int, str]]:
    """The XDP programs attached to ifindex, native and generic, as (id, name); the kernel keeps 15 characters of
    a name."""
    attached = []
    for flags in _XDP_MODES.values():
        prog_id = _U32(0)
        _check(_lib.bpf_xdp_query_id(ifindex, flags, ctypes.byref(prog_id)), f"query XDP on {_ifname(ifindex)}")
        name = _program_name(prog_id.value) if prog_id.value else None
        if name is not None:
            attached.append((prog_id.value, name))
    return attached


def _program_name(prog_id: int) -> str | None:
    """None where the program is gone (detached since the query)."""
    fd = _lib.bpf_prog_get_fd_by_id(prog_id)
    if fd < 0:
        return None
    try:
        info = _ProgInfo()
        size = _U32(ctypes.sizeof(info))
        _check(_lib.bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)), f"read program {prog_id}")
        return bytes(info.name).decode(errors="replace")
    finally:
        os.close(fd)


def detach_xdp(ifindex: int) -> None:
    """Remove XDP programs from ifindex in both modes (a no-op where none is attached)."""
    # without a mode flag the kernel detaches the native program when the driver has native XDP, which would
    # leave a generic one attached
    with _Rtnl(f"detach XDP from {_ifname(ifindex)}", {}) as rtnl:
        for flags in _XDP_MODES.values():
            rtnl("link", "set", index=ifindex, xdp=_xdp_attrs(-1, flags))


def attach_tc_ingress(ifindex: int, prog_fd: int, name: str = "softdta") -> None:
    """Attach a direct-action tc program to ifindex's ingress (clsact qdisc, created if missing), replacing ours."""
    with _Rtnl(f"attach tc ingress program to {_ifname(ifindex)}",
               {errno.EINVAL: "is prog_fd a BPF_PROG_TYPE_SCHED_CLS program?"}) as rtnl:
        rtnl("tc", "add", "clsact", ifindex, ignore=(errno.EEXIST,))
        # a fixed handle and prio make a second attach replace the filter instead of adding another
        rtnl("tc", "replace-filter", "bpf", ifindex, ":1", fd=prog_fd, name=name, parent="ffff:fff2", prio=1,
             classid=1, direct_action=True)


def detach_tc(ifindex: int) -> None:
    """Remove the clsact qdisc, and with it every tc program, from ifindex (a no-op if there is none)."""
    with _Rtnl(f"detach tc from {_ifname(ifindex)}", {}) as rtnl:
        rtnl("tc", "del", "clsact", ifindex, ignore=(errno.ENOENT, errno.EINVAL))
