"""A QEMU guest running Linux's soft-RoCE (rdma_rxe): a real RoCE responder for tests on hosts without RDMA.

The host kernel has no RDMA support, but a guest under software emulation (TCG) loads rdma_rxe, and frames the
host sends out of a tap device reach its rxe0.

Image: `ensure_image` builds, once per machine, the Debian kernel package's vmlinuz and an uncompressed newc cpio
of a minbase root filesystem (rdma-core, pyverbs, softdta's Python dependencies, the kernel modules rxe needs).
It lives in CACHE_DIR/<key>, where the key hashes the versions apt offers of those packages: an update rebuilds.

Boot: `Guest.boot` appends a small second cpio (the kernel unpacks concatenated archives in order) with the guest's
/init and this working tree's softdta package, so a code change needs no rebuild. The tap sits in a network
namespace the Guest owns (NAMESPACE_PREFIX + pid), which keeps the host's namespace untouched and lets tests plug
more interfaces (a translator's veth) in next to it. /init brings up rxe0 on eth0 and starts this module's control
server, which runs shell commands for the host: `Guest.run`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TypedDict

from softdta.errors import SoftdtaError
from softdta.kernel.netns import NETNS_DIR, Namespace, in_netns

CACHE_DIR = Path("/var/cache/softdta/rxe-lab")
RUN_DIR = Path("/run/softdta-rxe-lab")  # one folder per guest: qemu.pid, serial.sock, serial.log, initrd.cpio
NAMESPACE_PREFIX = "sdta-rxe-"
TAP = "tap0"
GUEST_MAC = "52:54:00:12:34:56"
GUEST_PYTHONPATH = "/opt/softdta"  # where the softdta package sits in the guest; /init exports it
CONTROL_PORT = 40070
READY_MARKER = "softdta-rxe-lab: ready"
HW_COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
BOOT_TIMEOUT_S = 180.0  # 11 to 16 s on an idle machine; emulation slows down a lot on a busy one
RECIPE = 2  # part of the cache key: bump it when the image build changes

GUEST_PACKAGES = ("rdma-core", "ibverbs-utils", "ibverbs-providers", "python3", "python3-pyverbs", "iproute2",
                  "kmod", "busybox", "python3-numpy", "python3-aiohttp", "python3-uvloop", "python3-prometheus-client",
                  "python3-pyroute2", "python3-rich")
KERNEL_META_PACKAGE = "linux-image-amd64"
# the guest's /init loads these; the image gets them and their dependencies (ib_core, udp_tunnel, virtio, ...);
# rdma_ucm is rdma_cm for userspace (the original-DTA collector of the drop-in tests)
GUEST_MODULES = ("virtio_pci", "virtio_net", "crc32_generic", "ib_uverbs", "rdma_rxe", "rdma_ucm")
# not needed in a guest without udev or iconv users: smaller archive, quicker boot
TRIMMED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt",
           "var/lib/apt/lists", "usr/lib/udev/hwdb.d", "usr/lib/x86_64-linux-gnu/gconv")
HOST_TOOLS = ("qemu-system-x86_64", "debootstrap", "cpio", "apt-get", "apt-cache", "dpkg-deb", "chroot")

GUEST_INIT = f"""#!/bin/sh
# PID 1 of the soft-RoCE lab guest, written by softdta.lab.rxe: rxe0 on eth0, then the control server.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root PYTHONPATH={GUEST_PYTHONPATH}
fail() {{ echo "softdta-rxe-lab: $* failed"; exit 1; }}  # PID 1 exiting panics the kernel: qemu stops
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev || fail mounts
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm || fail mounts
mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /tmp && mount -t debugfs debugfs /sys/kernel/debug || fail mounts
modprobe -a {' '.join(GUEST_MODULES)} || fail modprobe
for arg in $(cat /proc/cmdline); do
    case $arg in guest_ip=*) guest_ip=${{arg#guest_ip=}};; esac
done
ip link set lo up && ip address add "$guest_ip" dev eth0 && ip link set eth0 up || fail "eth0 address $guest_ip"
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0"
python3 -m softdta.lab.rxe "${{guest_ip%/*}}" &
wait  # as PID 1 the shell also reaps the orphans of backgrounded commands
fail "control server"
"""


class RxeLabError(SoftdtaError, RuntimeError):
    """A step of building or booting the lab failed; the message names it and carries its output."""


def _progress(message: str) -> None:
    print(f"rxe-lab: {message}", file=sys.stderr, flush=True)  # stdout may carry a command's JSON


def _run(what: str, argv: list[str], *, cwd: Path | None = None, stdin: IO[bytes] | None = None,
         stdout: IO[bytes] | int = subprocess.PIPE) -> str:
    proc = subprocess.run(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, cwd=cwd)
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout or b"").decode(errors="replace").strip()
        raise RxeLabError(f"{what} failed (exit {proc.returncode}): `{shlex.join(argv)}`\n{output[-3000:]}")
    return proc.stdout.decode() if proc.stdout else ""


# --- the image ----------------------------------------------------------------------------------------------------

def _codename() -> str:
    lines = Path("/etc/os-release").read_text().splitlines()
    fields = {key: value for key, _, value in (line.partition("=") for line in lines if "=" in line)}
    return fields["VERSION_CODENAME"].strip('"')


def apt_mirror(suite: str) -> str:
    """The URI apt fetches `suite` from, in one-line (.list) or deb822 (.sources) format."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]
    for path in filter(Path.is_file, sources):
        for line in path.read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1]
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields: dict[str, str] = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE))
            if "deb" in fields.get("Types", "").split() and suite in fields.get("Suites", "").split():
                return fields["URIs"].split()[0]
    raise RxeLabError(f"no apt source for {suite} in /etc/apt/sources.list or sources.list.d")


def _candidate_versions(packages: list[str]) -> dict[str, str]:
    versions: dict[str, str] = {}
    package = ""
    for line in _run("reading package versions", ["apt-cache", "policy", *packages]).splitlines():
        if not line.startswith(" "):
            package = line.rstrip(":")
        elif line.strip().startswith("Candidate:"):
            versions[package] = line.split(":", 1)[1].strip()
    unknown = [name for name in packages if versions.get(name, "(none)") == "(none)"]
    if unknown:
        raise RxeLabError(f"apt has no candidate for {', '.join(unknown)}: run apt-get update")
    return versions


def _kernel_package() -> str:
    """The versioned package linux-image-amd64 depends on (linux-image-6.1.0-NN-amd64)."""
    depends = _run("finding the kernel package", ["apt-cache", "depends", KERNEL_META_PACKAGE])
    match = re.search(r"Depends: (linux-image-\S+)", depends)
    if not match:
        raise RxeLabError(f"{KERNEL_META_PACKAGE} depends on no linux-image package:\n{depends}")
    return match.group(1)


class ImageVersions(TypedDict):
    """What an image is made of: the recipe, the Debian suite and mirror, and each package's version."""

    recipe: int
    suite: str
    mirror: str
    packages: dict[str, str]


def image_versions() -> ImageVersions:
    """What the image is made of; its hash is the cache key."""
    codename = _codename()
    return {"recipe": RECIPE, "suite": codename, "mirror": apt_mirror(codename),
            "packages": _candidate_versions([_kernel_package(), *GUEST_PACKAGES])}


def ensure_image(cache_dir: Path = CACHE_DIR) -> Path:
    """The image folder (vmlinuz, rootfs.cpio, versions.json), built unless the cache has it (about a minute)."""
    missing = [tool for tool in HOST_TOOLS if not shutil.which(tool)]
    if missing:
        raise RxeLabError(f"missing {', '.join(missing)}: install qemu-system-x86, debootstrap and cpio "
                          "(scripts/setup.sh does)")
    versions = image_versions()
    key = hashlib.sha256(json.dumps(versions, sort_keys=True).encode()).hexdigest()[:16]
    image = cache_dir / key
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second build waits for the first and then finds its image
        if not (image / "versions.json").exists():
            started = time.monotonic()
            _build_image(image, versions)
            _progress(f"image {image} built in {time.monotonic() - started:.0f} s")
            for stale in cache_dir.iterdir():  # images of older package versions
                if stale.is_dir() and stale != image:
                    shutil.rmtree(stale)
    return image


def _build_image(image: Path, versions: ImageVersions) -> None:
    work = image.with_name(image.name + ".partial")  # left behind on failure, for a look; removed by the next try
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        kernel_package = next(name for name in versions["packages"] if name.startswith("linux-image-"))
        _progress(f"downloading {kernel_package}")
        _run("downloading the guest kernel", ["apt-get", "download", "-q", kernel_package], cwd=work)
        _run("unpacking the guest kernel", ["dpkg-deb", "-x", next(work.glob("*.deb")).name, "kernel"], cwd=work)
        kernel_version = next((work / "kernel/lib/modules").iterdir()).name
        rootfs = work / "rootfs"
        _progress(f"debootstrap {versions['suite']} from {versions['mirror']} (about 40 s)")
        _run("debootstrap of the guest root filesystem",
             ["debootstrap", "--variant=minbase", f"--include={','.join(GUEST_PACKAGES)}", versions["suite"],
              str(rootfs), versions["mirror"]])
        _progress(f"adding kernel {kernel_version}'s modules")
        modules = rootfs / "lib/modules" / kernel_version  # the host has no depmod: the guest's makes the indexes
        modules.parent.mkdir(parents=True, exist_ok=True)
        (work / "kernel/lib/modules" / kernel_version).rename(modules)
        depmod = ["chroot", str(rootfs), "/sbin/depmod", kernel_version]
        _run("depmod in the guest root filesystem", depmod)
        _prune_modules(modules)
        _run("depmod after pruning the modules", depmod)
        for folder in TRIMMED:
            shutil.rmtree(rootfs / folder, ignore_errors=True)
        _progress("packing rootfs.cpio")
        _pack_cpio(rootfs, work / "rootfs.cpio")
        image.mkdir()
        (work / "rootfs.cpio").rename(image / "rootfs.cpio")
        shutil.copyfile(work / "kernel/boot" / f"vmlinuz-{kernel_version}", image / "vmlinuz")
        (image / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")  # written last: marks it done
    except RxeLabError as error:
        raise RxeLabError(f"building the rxe lab image in {work}: {error}") from None
    shutil.rmtree(work)


def _prune_modules(modules: Path) -> None:
    """Keep GUEST_MODULES and what they depend on; modules.dep must be current."""
    needs: dict[str, list[str]] = {}  # module path -> every path it needs (modules.dep lists indirect ones too)
    for line in (modules / "modules.dep").read_text().splitlines():
        module, _, dependencies = line.partition(":")
        needs[module] = dependencies.split()
    by_name = {Path(path).name.removesuffix(".ko").replace("-", "_"): path for path in needs}
    builtin = {Path(path).name.removesuffix(".ko") for path in (modules / "modules.builtin").read_text().split()}
    wanted = set()
    for name in GUEST_MODULES:
        if name in by_name:
            wanted |= {by_name[name], *needs[by_name[name]]}
        elif name not in builtin:
            raise RxeLabError(f"the guest kernel has no module {name}")
    for path in needs.keys() - wanted:
        (modules / path).unlink()
    for folder, _, _ in sorted(os.walk(modules / "kernel"), reverse=True):  # deepest first
        if not os.listdir(folder):
            os.rmdir(folder)


def _pack_cpio(directory: Path, archive: Path) -> None:
    with archive.open("wb") as out:
        find = subprocess.Popen(["find", ".", "-print0"], cwd=directory, stdout=subprocess.PIPE)
        listing = find.stdout
        assert listing is not None  # stdout=PIPE
        _run(f"packing {archive.name}", ["cpio", "--null", "--create", "--format=newc", "--quiet"], cwd=directory,
             stdin=listing, stdout=out)
        listing.close()
        if find.wait() != 0:
            raise RxeLabError(f"packing {archive.name}: listing {directory} failed (exit {find.returncode})")


# --- the guest ----------------------------------------------------------------------------------------------------

class Guest:
    """One lab guest (one per process): a tap in namespace `namespace`, qemu, and the guest's control server.

    `with Guest().boot() as guest:` ... `guest.run("ibv_devices")`. The host side of the link is `host_ip` on TAP
    in the namespace; the guest is `guest_ip` with MAC GUEST_MAC, and rxe0's RoCEv2 GID index 1 is ::ffff:guest_ip.
    """

    def __init__(self, image: Path | None = None, namespace: str | None = None,
                 run_dir: Path | None = None) -> None:
        """By default the guest owns its namespace and run folder (removed by `close` or `cleanup`). With
        `namespace` (which must exist) and `run_dir` it lives in someone else's, as in `softdta lab up --collector
        rxe`, which also outlives the process that booted it: `close` then leaves the namespace alone."""
        self.image = image
        self.name = namespace or f"{NAMESPACE_PREFIX}{os.getpid()}"
        self.owns_namespace = namespace is None
        self.namespace = Namespace(self.name)
        self.run_dir = run_dir or RUN_DIR / self.name
        self.process: subprocess.Popen[bytes] | None = None
        self.host_ip = self.guest_ip = self.host_mac = ""

    def __enter__(self) -> Guest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def boot(self, host_ip: str = "10.77.2.1/24", guest_ip: str = "10.77.2.2", bridge: str | None = None) -> Guest:
        """Build or find the image, boot the guest and wait until its control server listens; 11 to 16 s.

        With `bridge` (a bridge in the namespace) the tap becomes its port and `host_ip` goes on the bridge, so
        the guest sits on that bridge's network."""
        image = self.image or ensure_image()
        started = time.monotonic()
        self.host_ip, prefix = host_ip.split("/")
        self.guest_ip = guest_ip
        host_side = bridge or TAP
        try:
            self.run_dir.mkdir(parents=True)
            initrd = self._pack_initrd(image / "rootfs.cpio")
            if self.owns_namespace:
                Namespace.create(self.name)
            self.namespace.run("ip", "tuntap", "add", "dev", TAP, "mode", "tap")
            if bridge:
                self.namespace.run("ip", "link", "set", TAP, "master", bridge)
            self.namespace.run("ip", "address", "add", host_ip, "dev", host_side)
            self.namespace.run("ip", "link", "set", TAP, "up")
            self.host_mac = json.loads(self.namespace.run("ip", "-j", "link", "show", host_side).stdout)[0]["address"]
            self.process = self._start_qemu(image / "vmlinuz", initrd, f"{guest_ip}/{prefix}")
            self._wait_until_ready(self.process)
        except BaseException:
            self.close()
            raise
        _progress(f"guest {guest_ip} ready in {time.monotonic() - started:.1f} s (namespace {self.name})")
        return self

    def _pack_initrd(self, rootfs_cpio: Path) -> Path:
        """rootfs.cpio followed by a cpio with /init and softdta (without its compiled files)."""
        overlay = self.run_dir / "overlay"
        overlay.mkdir()
        (overlay / "init").write_text(GUEST_INIT)
        (overlay / "init").chmod(0o755)
        shutil.copytree(Path(__file__).parents[1], overlay / GUEST_PYTHONPATH.lstrip("/") / "softdta",
                        ignore=shutil.ignore_patterns("__pycache__"))
        _pack_cpio(overlay, self.run_dir / "overlay.cpio")
        shutil.rmtree(overlay)
        initrd = self.run_dir / "initrd.cpio"
        shutil.copyfile(rootfs_cpio, initrd)
        with initrd.open("ab") as out, (self.run_dir / "overlay.cpio").open("rb") as source:
            shutil.copyfileobj(source, out)
        return initrd

    def _start_qemu(self, vmlinuz: Path, initrd: Path, guest_cidr: str) -> subprocess.Popen[bytes]:
        serial = f"socket,id=ser0,path={self.run_dir / 'serial.sock'},server=on,wait=off," \
                 f"logfile={self.run_dir / 'serial.log'}"
        qemu = ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2",
                "-m", "1024",  # with 512 MB the initramfs does not unpack
                "-kernel", str(vmlinuz), "-initrd", str(initrd),
                "-append", f"console=ttyS0 rdinit=/init panic=-1 guest_ip={guest_cidr}",
                "-netdev", f"tap,id=n0,ifname={TAP},script=no,downscript=no",
                "-device", f"virtio-net-pci,netdev=n0,mac={GUEST_MAC},romfile=",
                "-chardev", serial, "-serial", "chardev:ser0", "-display", "none", "-monitor", "none",
                "-no-reboot",  # a guest panic (its /init failed) ends qemu instead of booting again
                "-pidfile", str(self.run_dir / "qemu.pid")]
        with (self.run_dir / "qemu.log").open("wb") as log:  # qemu's own complaints; the guest's go to serial.log
            return subprocess.Popen(["ip", "netns", "exec", self.name, *qemu], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_until_ready(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        serial_log = self.run_dir / "serial.log"
        while time.monotonic() < deadline:
            console = serial_log.read_text(errors="replace") if serial_log.exists() else ""
            if READY_MARKER in console:
                return
            if process.poll() is not None:
                raise RxeLabError(f"qemu exited (status {process.returncode}) before the guest was ready:\n"
                                  f"{self._logs()}")
            time.sleep(0.2)
        raise RxeLabError(f"the guest was not ready after {BOOT_TIMEOUT_S:.0f} s:\n{self._logs()}")

    def _logs(self) -> str:
        """qemu's complaints, what /init said (it prefixes its lines) and the end of the console."""
        qemu_log, serial_log = self.run_dir / "qemu.log", self.run_dir / "serial.log"
        console = serial_log.read_text(errors="replace") if serial_log.exists() else ""
        init_said = [line for line in console.splitlines() if line.startswith("softdta-rxe-lab:")]
        return "\n".join(filter(None, [qemu_log.read_text(errors="replace").strip(), *init_said, "console ends with:",
                                        console[-3000:]]))

    def run(self, command: str, timeout: float = 60.0) -> tuple[int, str]:
        """Run `command` with sh in the guest: (exit status, stdout and stderr together); 124 on timeout.

        Redirect the output of commands left running in the background, or the reply waits for them."""
        with in_netns(self.name):
            connection = socket.create_connection((self.guest_ip, CONTROL_PORT), timeout=timeout + 10)
        with connection, connection.makefile("rwb") as stream:
            stream.write(json.dumps({"cmd": command, "timeout": timeout}).encode() + b"\n")
            stream.flush()
            reply = stream.readline()
        if not reply:
            raise RxeLabError(f"the guest's control server closed the connection running {command!r}")
        result = json.loads(reply)
        return result["rc"], result["out"]

    def hw_counters(self) -> dict[str, int]:
        """rxe0's counters (rcvd_pkts, sent_pkts, rcvd_seq_err, ...) by name."""
        status, output = self.run(f"grep -H . {HW_COUNTERS}/*")
        if status != 0:
            raise RxeLabError(f"reading {HW_COUNTERS} in the guest failed: {output}")
        return {Path(path).name: int(value) for path, value in
                (line.rsplit(":", 1) for line in output.splitlines())}

    def send(self, frame: bytes) -> None:
        """Send an Ethernet frame out of the host's end of the tap: the guest's eth0 receives it."""
        with in_netns(self.name):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        with sock:
            sock.bind((TAP, 0))
            sock.send(frame)

    def close(self) -> None:
        """Stop qemu, delete the tap (with the namespace, if the guest owns it) and the run folder; safe to call
        again, also from a process other than the one that booted the guest."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        else:
            stop_qemu(self.run_dir)
        if self.owns_namespace:
            self.namespace.delete()
        elif (NETNS_DIR / self.name).exists():
            self.namespace.run("ip", "link", "del", TAP, check=False)
        shutil.rmtree(self.run_dir, ignore_errors=True)


def process_alive(pid: int) -> bool:
    """A zombie counts as gone: it only waits for its parent to collect its exit status."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the command name, which may hold spaces


def stop_qemu(run_dir: Path) -> None:
    """Kill the qemu whose pid file is in `run_dir`, if it still runs."""
    pidfile = run_dir / "qemu.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        comm = Path(f"/proc/{pid}/comm")
        if comm.exists() and comm.read_text().startswith("qemu"):  # the pid may have been reused meanwhile
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while process_alive(pid) and time.monotonic() < deadline:  # the tap stays busy until qemu is gone
                time.sleep(0.05)


def cleanup() -> list[str]:
    """Remove what guests of processes that are gone left behind (a crashed run): qemu, namespace, run folder.
    Guests of live processes, such as another test session's, are left alone. Returns the names removed."""
    names = {path.name for path in RUN_DIR.glob(NAMESPACE_PREFIX + "*")}
    if NETNS_DIR.is_dir():
        names |= {name for name in os.listdir(NETNS_DIR) if name.startswith(NAMESPACE_PREFIX)}
    removed = []
    for name in sorted(names):
        owner = name.removeprefix(NAMESPACE_PREFIX)
        if owner.isdigit() and process_alive(int(owner)):
            continue
        stop_qemu(RUN_DIR / name)
        Namespace(name).delete()
        shutil.rmtree(RUN_DIR / name, ignore_errors=True)
        removed.append(name)
    return removed


# --- in the guest -------------------------------------------------------------------------------------------------

class _CommandHandler(socketserver.StreamRequestHandler):
    """One JSON request per line, {"cmd": ..., "timeout": seconds}, answered by {"rc": ..., "out": ...}."""

    def handle(self) -> None:
        for line in self.rfile:
            request = json.loads(line)
            with subprocess.Popen(request["cmd"], shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, start_new_session=True) as proc:
                try:
                    output, _ = proc.communicate(timeout=request.get("timeout"))
                    status = proc.returncode
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)  # the whole command, not only its shell
                    output, _ = proc.communicate()
                    status = 124
            self.wfile.write(json.dumps({"rc": status, "out": output.decode(errors="replace")}).encode() + b"\n")


class _ControlServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = daemon_threads = True


def serve(address: str, port: int = CONTROL_PORT) -> None:
    """The guest's control server, started by /init. No authentication: it listens on the private lab link only."""
    with _ControlServer((address, port), _CommandHandler) as server:
        print(READY_MARKER, flush=True)
        server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1])
