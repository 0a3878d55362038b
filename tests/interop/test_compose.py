"""docker-compose.yml for real: `scripts/compose.sh --own-daemon` (what `make compose` runs) starts a Docker daemon
of its own, builds the images with no registry, runs the fleet's verdict (`up --exit-code-from check`) and takes
everything down; the host's links, mounts, firewall, forwarding settings and processes are as they were. About
four minutes: the images are built in the daemon's fresh data root (the debootstrap base is cached)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.common import processes

pytestmark = [pytest.mark.interop, pytest.mark.privileged, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("docker", "docker-compose", "dockerd", "debootstrap", "iptables")
DAEMONS = {"dockerd", "containerd", "containerd-shim"}  # comm: the first 15 characters of containerd-shim-runc-v2
SYSCTLS = ("net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding", "net/bridge/bridge-nf-call-iptables",
           "net/bridge/bridge-nf-call-ip6tables")


@pytest.fixture(autouse=True)
def docker_tools():
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        message = f"{', '.join(missing)} not installed: run make setup (docker.io, docker-compose, debootstrap)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def host_state() -> dict[str, object]:
    """What the compose run must leave as it found it."""
    def lines(*command: str) -> list[str]:
        return sorted(subprocess.run(command, capture_output=True, text=True).stdout.splitlines())
    links = sorted(line.split(": ")[1].split("@")[0] for line in lines("ip", "-o", "link", "show"))
    mounts = sorted(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    sysctls = {name: (Path("/proc/sys") / name).read_text().strip()
               for name in SYSCTLS if (Path("/proc/sys") / name).exists()}
    daemons = sorted(f"{pid} {comm}" for pid, comm in processes().items() if comm in DAEMONS)
    return {"links": links, "mounts": mounts, "iptables": lines("iptables", "-S"),
            "iptables_nat": lines("iptables", "-t", "nat", "-S"), "sysctls": sysctls, "daemons": daemons,
            "routes": lines("ip", "route", "show")}


def compose(**env: str) -> subprocess.CompletedProcess[str]:
    """`scripts/compose.sh --own-daemon` from a plain shell: PATH and HOME only."""
    return subprocess.run(["bash", "scripts/compose.sh", "--own-daemon"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800, env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
                                             **env})


def test_the_compose_verdict_passes_and_leaves_the_host_as_it_found_it():
    before = host_state()
    result = compose()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "check_1" in output and "every key read back as predicted through the router, and every list from " \
                                   "NATS JetStream" in output, output[-6000:]
    assert "reports sent: 3,024 by 2 reporters" in output
    assert host_state() == before


def test_a_daemon_that_cannot_start_says_why_in_one_line():
    before = host_state()
    result = compose(SOFTDTA_DOCKER_STORAGE_DRIVER="no-such-driver")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "compose: dockerd did not start: failed to start daemon: error initializing graphdriver: driver not supported"]
    assert host_state() == before
