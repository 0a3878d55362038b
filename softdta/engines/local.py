"""Local translation: the collector runs the translator's XDP program itself, with the XDP responder's memory as
its target.

bpf/local.bpf.c is translator.bpf.c built with SOFTDTA_LOCAL: where the translator would build a RoCEv2 frame it
executes the request instead, with the responder's code (bpf/include/execute.h) into the responder's maps, which
it shares (libbpf map reuse). A report to DTA_PORT reaching the responder's program goes on to the local program
by a tail call (map responder_local); without one installed the responder passes it up, as before. The arena,
the Append rings' write counts, the completions and the responder's counters end as the translator and responder
would leave them, so the collector's queries, persistence and metrics need nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from softdta.core.control_plane import DEFAULT_FLUSH_IDLE_NS
from softdta.core.tables import Tables
from softdta.engines.xdp import XdpTranslator
from softdta.kernel.bpf import xdp_md
from softdta.kernel.resources import BPF_DIR

if TYPE_CHECKING:
    from softdta.collector.xdp_responder import XdpResponder

LOCAL_SOURCE = BPF_DIR / "local.bpf.c"
SHARED_MAPS = ("arena", "responder_config", "responder_qp", "responder_counters", "ring_writes", "completions")
_SLOT = bytes(4)


class LocalTranslator(XdpTranslator):
    """The translator's program on `responder`'s memory: `tables` are the collector's own structures, as a
    translator connected to it would hold them (their QPs' remote QPNs are the responder's). `install` makes the
    responder's program hand it the reports it receives. `source` may name a program that includes
    bpf/local.bpf.c's parts and adds to it (the benchmarks do)."""

    def __init__(self, responder: XdpResponder, tables: Tables, *, pin_dir: str | Path | None = None,
                 flush_idle_ns: int = DEFAULT_FLUSH_IDLE_NS, source: Path = LOCAL_SOURCE) -> None:
        super().__init__(tables, pin_dir=pin_dir, flush_idle_ns=flush_idle_ns, source=source,
                         reuse={name: responder.maps[name] for name in SHARED_MAPS})
        self.responder = responder

    def install(self) -> None:
        """Reports to DTA_PORT that reach the responder's program are translated here from now on."""
        self.responder.maps["responder_local"].update(_SLOT, self.xdp.fd.to_bytes(4, "little"))

    def uninstall(self) -> None:
        self.responder.maps["responder_local"].delete(_SLOT)

    def tick(self) -> None:
        """One control-plane step: flush what is idle (into the memory: nothing is sent), and run again the
        essential reports parked while a QP could not take them."""
        self.flush()
        for _, ifindex, rx_queue, frame in self.take_deferred():
            self.xdp.test_run(frame, ctx=xdp_md(ingress_ifindex=ifindex, rx_queue_index=rx_queue))
            self.reinjected += 1

    def close(self) -> None:
        self.uninstall()
        super().close()

    def __enter__(self) -> LocalTranslator:
        return self

