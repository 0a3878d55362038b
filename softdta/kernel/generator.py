"""Reports at kernel speed: bpf/reporter.bpf.c run by BPF_PROG_TEST_RUN in live-frames mode on the reporter's
interface (the mechanism of xdp-trafficgen). One system call sends thousands of reports, each built in the kernel
from the template of a softdta.core.generator plan, which predicts every one of them (in a fleet, with its
slot's collector as destination). The AF_PACKET TX ring (softdta.kernel.tx_ring) is the fallback.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from softdta.core.generator import GeneratorPlan
from softdta.kernel.bpf import BpfError, BpfObject, link_xdp
from softdta.kernel.maps import record
from softdta.kernel.netns import in_netns
from softdta.kernel.programs import REPORTER_SOURCE, EngineError, build_object
from softdta.kernel.tx_ring import SendResult

_LAYOUT = record("report_generator_value")
_DESTINATION = record("report_destination")
_KEY = bytes(4)
CALL_REPORTS = 4096  # reports per system call at full speed: a few milliseconds of them
PACED_CALL_S = 0.001  # at a given rate, a call sends this long's worth: a call costs about 0.1 ms, and one call
# is one burst at the generator's own speed (the rate holds over calls, not within one)
BURST = 64  # reports the kernel sends before it flushes them to the interface: a quarter of a veth ring


class KernelReporter:
    """Sends a plan's reports out of `interface` (in namespace `netns`); report i is `plan.report_at(i)`, and
    `sent` counts every report the program put on the wire, across runs."""

    def __init__(self, plan: GeneratorPlan, interface: str, netns: str | None = None, holder: str = "lo"):
        """`holder`: an interface of the namespace whose XDP hook keeps the program in the dispatcher (see
        _keep_dispatched); each generator of a namespace needs its own."""
        self.plan, self.netns, self.holder = plan, netns, holder
        self.resumed = 0  # runs a signal ended early, each resumed with the reports it did not send
        try:
            with self._inside():
                self.ifindex = socket.if_nametoindex(interface)
        except OSError:
            raise EngineError(f"interface {interface!r} does not exist{' in ' + netns if netns else ''}; "
                              "give the reporter's interface") from None
        self._object = BpfObject(build_object(REPORTER_SOURCE),
                                 map_sizes={"report_destinations": max(1, len(plan.destinations))})
        self._link = -1
        try:
            self._map = self._object.maps["report_generator"]
            self._write_destinations()
            self._map.update(_KEY, _LAYOUT.pack(**plan.config(), ifindex=self.ifindex))
            self._program = self._object.programs["softdta_report"]
            self._keep_dispatched()
        except BaseException:
            self.close()
            raise

    def _write_destinations(self) -> None:
        """Each key's destination and IPv4 checksum (a fleet's slot map applied), in one copy into the map."""
        if not len(self.plan.destinations):
            return
        entries = np.zeros(len(self.plan.destinations), dtype=np.dtype({
            "names": ["ip", "checksum"], "formats": ["=u4", "=u2"],
            "offsets": [_DESTINATION.offsets["ip"], _DESTINATION.offsets["checksum"]], "itemsize": _DESTINATION.size}))
        entries["ip"], entries["checksum"] = self.plan.destinations, self.plan.checksums
        with self._object.maps["report_destinations"].mmap() as memory:
            memory[:entries.nbytes] = entries.tobytes()

    @property
    def linked(self) -> bool:
        """Whether calls are cheap: see _keep_dispatched."""
        return self._link >= 0

    def _keep_dispatched(self) -> None:
        """Keep the program in the kernel's XDP dispatcher for as long as this generator lives.

        A test run of more than one frame adds the program to the dispatcher and takes it out again, and each
        change waits for an RCU grace period: 24 ms per call on this machine, whatever the count. A program
        attached somewhere stays in the dispatcher, and then a call costs 0.1 ms. So the program is linked to
        the holder (the namespace's loopback by default), where it passes every frame (it sends only in a test
        run on `ifindex`); the link ends with this object, or with the process. Where that fails (another XDP
        program on the holder), calls stay correct and cost the grace periods."""
        with self._inside():
            holder = socket.if_nametoindex(self.holder)
            if self.ifindex == holder:
                return
            try:
                self._link = link_xdp(holder, self._program.fd)
            except BpfError:
                pass

    def close(self) -> None:
        if self._link >= 0:
            os.close(self._link)
            self._link = -1
        self._object.close()

    def __enter__(self) -> KernelReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _inside(self) -> AbstractContextManager[None]:
        return in_netns(self.netns) if self.netns else nullcontext()

    @property
    def sent(self) -> int:
        value = self._map.lookup(_KEY)
        assert value is not None  # an array map always has its entry
        return int(_LAYOUT.unpack(value)["next_index"])

    def send(self, count: int) -> None:
        """Send the next `count` reports, in at most BURST-report bursts."""
        with self._inside():
            self._send_here(count)

    def _send_here(self, count: int) -> None:
        # in the interface's namespace: the kernel finds ifindex in the calling thread's
        before = self.sent
        try:
            self.resumed += self._program.test_run_live(self.plan.frame, ifindex=self.ifindex, repeat=count,
                                                        batch_size=BURST, ran=lambda: self.sent - before)
        except BpfError as error:
            raise EngineError(f"kernel report generator: {error}; run as root, or use --engine python") from None
        if self.sent - before != count:
            raise EngineError(f"the kernel report generator sent {self.sent - before} of {count} reports: its "
                              "template does not fit the frame; this is a bug")

    def run(self, *, rate: float = 0.0, count: int | None = None, seconds: float | None = None) -> SendResult:
        """Send `count` reports, or send for `seconds`, at `rate` reports/s at most (0: as fast as it can)."""
        if count is None and seconds is None:
            raise EngineError("give a number of reports or a duration")
        per_call = CALL_REPORTS if not rate else max(1, min(CALL_REPORTS, int(rate * PACED_CALL_S)))
        sent, started = 0, time.perf_counter()
        with self._inside():  # once: entering a namespace costs more than a call's worth of reports
            while (count is None or sent < count) and (seconds is None or time.perf_counter() - started < seconds):
                step = per_call if count is None else min(per_call, count - sent)
                self._send_here(step)
                sent += step
                ahead = sent / rate - (time.perf_counter() - started) if rate else 0.0
                if ahead > 0:
                    time.sleep(ahead)
        return SendResult(sent, time.perf_counter() - started)
