"""The BPF programs as objects to load: found as the wheel shipped them or built in a checkout, the XDP verdicts they
return, and the error every program driver raises."""

from __future__ import annotations

from pathlib import Path

from softdta.errors import SoftdtaError
from softdta.kernel import bpf_build
from softdta.kernel.resources import BPF_DIR, INSTALLED

TRANSLATOR_SOURCE = BPF_DIR / "translator.bpf.c"
VETH_PEER_SOURCE = BPF_DIR / "veth_peer.bpf.c"  # XDP_PASS for the far end of a lab or test veth pair
LAB_SWITCH_SOURCE = BPF_DIR / "lab_switch.bpf.c"  # the live lab's switch ports (softdta.lab.topology)
FLOOR_SOURCE = BPF_DIR / "floor.bpf.c"  # the benchmarks' bare forwarder and sink (softdta.lab.direct)
REPORTER_SOURCE = BPF_DIR / "reporter.bpf.c"  # the kernel-speed report generator (softdta.kernel.generator)
XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)


class EngineError(SoftdtaError, RuntimeError):
    """The kernel engine cannot be built, loaded or driven; the message says what to do."""


def build_object(source: Path = TRANSLATOR_SOURCE, force: bool = False) -> Path:
    """The BPF object of `source`: as the wheel shipped it, or built (in a checkout) when missing or older than
    its sources."""
    if INSTALLED and source.parent == BPF_DIR and source.name in bpf_build.SHIPPED and not force:
        return BPF_DIR / bpf_build.object_name(source)
    target = source.parent / "build" / bpf_build.object_name(source)
    # any program may include another's source (the benchmarks' do, local.bpf.c does): all of bpf/ counts
    inputs = [source, *BPF_DIR.rglob("*.c"), *BPF_DIR.rglob("*.h")]
    if not force and target.exists() and target.stat().st_mtime >= max(p.stat().st_mtime for p in inputs):
        return target
    try:
        bpf_build.compile_bpf(source, target, BPF_DIR)
    except bpf_build.BuildError as error:
        raise EngineError(str(error)) from None
    return target
