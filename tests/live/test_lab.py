"""The live lab and `softdta demo`, run as a user runs them (root: namespaces, XDP)."""

import json
import os
import subprocess
import sys

import pytest

from softdta.engines.python import IO_DROPS, IO_STATS
from softdta.kernel.netns import Namespace
from softdta.lab import rxe as rxe_lab
from softdta.lab import topology as lab
from softdta.lab.demo import BURST_COPIES

pytestmark = pytest.mark.privileged

SOFTDTA = [sys.executable, "-m", "softdta.cli"]


def softdta(*args, check=True, timeout=300):
    result = subprocess.run(SOFTDTA + list(args), capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture
def clean_lab():
    softdta("lab", "down")
    yield
    softdta("lab", "down")
    assert not [name for name in os.listdir("/run/netns") if name.startswith(lab.PREFIX)]
    assert not lab.PIN_DIR.exists() and not lab.STATE_DIR.exists()


def realtime_napi_priorities() -> dict[str, int]:
    """The SCHED_FIFO priority of each interface's NAPI thread that runs at a real-time priority."""
    priorities = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
            if comm.startswith("napi/") and os.sched_getscheduler(int(pid)) == os.SCHED_FIFO:
                priorities[comm[len("napi/"):].rsplit("-", 1)[0]] = os.sched_getparam(int(pid)).sched_priority
        except (OSError, ProcessLookupError):
            pass
    return priorities


def test_lab_up_status_down_leaves_nothing_behind(clean_lab):
    softdta("lab", "up", "--reporters", "2")
    status = json.loads(softdta("lab", "status", "--json").stdout)
    assert status["up"] and status["translator"]["running"] and status["collector"]["running"]
    assert status["namespaces"] == sorted(lab.PREFIX + n for n in ("c", "r1", "r2", "sw", "t"))
    assert {qp["state"] for qp in status["translator"]["qps"]} == {"active"}
    ports = ["c0", "sw-c", "sw-r1", "sw-r2", "sw-t", "t0"]
    assert realtime_napi_priorities() == dict.fromkeys(ports, lab.NAPI_PRIORITY)
    again = softdta("lab", "up", check=False)
    assert again.returncode == 2 and "already up" in again.stderr
    assert "lab down; removed" in softdta("lab", "down").stdout
    assert "removed nothing" in softdta("lab", "down").stdout  # idempotent
    assert not json.loads(softdta("lab", "status", "--json").stdout)["up"]


def test_lab_runs_the_python_engine_and_says_so(clean_lab):
    softdta("lab", "up", "--reporters", "1", "--engine", "python")
    status = json.loads(softdta("lab", "status", "--json").stdout)
    # its frames leave through its socket, which a queueing discipline on t0 makes wait for room on the link
    engine = status["translator"]["engine"]
    assert status["translator"]["running"] and {key: engine[key] for key in ("name", "io", "transmit")} == {
        "name": "python", "io": "AF_XDP copy", "transmit": "packet I/O"}
    assert "frames out AF_XDP socket because --transmit socket asks for it" in \
        (lab.STATE_DIR / "translator.log").read_text()
    assert "pfifo" in Namespace(lab.PREFIX + "t").run("tc", "qdisc", "show", "dev", "t0").stdout
    # past the switch its frames queue at the collector's port, which passes them on from the bridge, and the
    # reports and replies to it at its own port
    for port in ("sw-c", "sw-t"):
        assert "pfifo" in Namespace(lab.PREFIX + "sw").run("tc", "qdisc", "show", "dev", port).stdout
    ports = ["c0", "sw-c", "sw-r1", "t0"]
    assert realtime_napi_priorities() == {**dict.fromkeys(ports, lab.NAPI_PRIORITY), "sw-t": lab.NAPI_PRIORITY - 1}
    # its socket's drops by reason, steps and wake-ups: nothing sent, nothing dropped, nothing translated
    assert set(engine["io_stats"]) == set(IO_STATS)
    assert not any(engine["io_stats"][name] for name in (*IO_DROPS, "steps", "wakeups")), engine["io_stats"]
    assert {qp["state"] for qp in status["translator"]["qps"]} == {"active"}
    assert "translator (python, AF_XDP copy, frames out through packet I/O) running" in \
        softdta("lab", "status").stdout
    # it translates ahead of the lab's other processes on these cores, as a box of its own would
    assert os.getpriority(os.PRIO_PROCESS, lab.read_state().translator_pid) == lab.PYTHON_ENGINE_NICE < 0


def test_lab_down_cleans_up_after_a_crash(clean_lab):
    """A lab whose processes died and whose state file is gone is still found by its names and removed."""
    softdta("lab", "up", "--reporters", "1")
    state = lab.read_state()
    for pid in (state.translator_pid, state.collector_pid):
        os.kill(pid, 9)
    (lab.STATE_DIR / "state.json").unlink()
    assert "no lab is up (stray namespaces" in softdta("lab", "status").stdout
    softdta("lab", "down")


@pytest.mark.interop
def test_the_soft_roce_lab_comes_up_and_goes_down_with_its_guest(clean_lab):
    """The collector is the kernel's rdma_rxe in a QEMU guest bridged into the collector namespace."""
    softdta("lab", "up", "--reporters", "1", "--collector", "rxe")
    status = json.loads(softdta("lab", "status", "--json").stdout)
    assert status["collector"]["kind"] == "rxe" and status["collector"]["running"]
    assert status["translator"]["running"]
    assert {qp["state"] for qp in status["translator"]["qps"]} == {"active"}
    assert "(rxe) running" in softdta("lab", "status").stdout
    softdta("lab", "down")
    assert not rxe_lab.process_alive(status["collector"]["qemu_pid"])


@pytest.mark.parametrize("collector,scale,engine", [("xdp", "0.15", "xdp"), ("xdp", "0.15", "python"),
                                                    pytest.param("rxe", "0.1", "xdp", marks=pytest.mark.interop)])
def test_demo_accounts_for_every_report_of_every_primitive(clean_lab, collector, scale, engine):
    result = softdta("demo", "--json", "--scale", scale, "--reporters", "2", "--collector", collector,
                     "--engine", engine, "--burst-seconds", "1", check=False)
    summary = json.loads(result.stdout)
    assert result.returncode == 0, json.dumps({key: summary[key] for key in ("problems", "link_drops", "translator",
                                                                             "collector", "queries")})
    assert summary["problems"] == []
    sent, received = summary["reports_sent"], summary["translator"]["received"]
    assert set(sent) == {"key-write", "key-increment", "append", "postcarding", "sketch-merge"}
    # nothing lost anywhere, no excuse: every report translated, every request executed, every reply taken
    assert sent == received and not summary["translator"]["drops"] and not summary["collector"]["drops"]
    queries = summary["queries"]
    assert queries["append"]["entries_recovered"] == queries["append"]["entries_sent"]
    assert queries["append"]["lists_in_exact_order"] == queries["append"]["lists"]
    if collector == "xdp":  # the Append entries came back through the JetStream stream the collector exports to
        export = summary["export"]
        assert export["entries"] == export["acknowledged"] == queries["append"]["entries_sent"]
        assert export["duplicates_stored"] == 0 and export["gaps"] == 0 and export["messages"] > 0
    assert queries["key_increment"]["under_counted"] == 0
    assert queries["sketch_merge"]["matches_sum_of_reporters"]
    assert queries["key_write"]["success"] >= queries["key_write"]["expected"] - 0.01
    assert queries["postcarding"]["decoded_exactly"] / queries["postcarding"]["paths"] >= \
        queries["postcarding"]["expected"] - 0.01
    assert summary["translator"]["acks_from_collector"] > 0
    assert summary["translator"]["cpu_ns_per_report"] > 0
    assert summary["translator"]["engine"]["name"] == engine
    if engine == "python":
        assert summary["translator"]["engine"]["io"] == "AF_XDP copy"  # veth: no zero-copy, and no fallback
        assert summary["translator"]["engine"]["transmit"] == "packet I/O"
        io = summary["translator"]["engine"]["io_stats"]
        assert not any(io[name] for name in IO_DROPS) and 0 < io["wakeups"] <= io["steps"]
        assert summary["senders"] == "XDP"  # the reporters send the mix from XDP, not from Python
    else:
        assert summary["senders"] == "AF_PACKET TX rings"
    burst = summary["burst"]
    if (collector, engine) != ("xdp", "xdp"):
        assert burst is None  # the burst is the XDP translator's and the XDP responder's
        return
    # a second at the default rate, both copies of every report executed and every key read back right
    assert burst["offered"] == 1_000_000 and burst["sent"] > 0 and burst["executed"] == BURST_COPIES * burst["sent"]
    assert not burst["lost"] and burst["keys"]["keys"] == min(burst["sent"], 8192)
    assert burst["keys"]["success"] >= burst["keys"]["expected"] - 0.01


def test_bench_quick_writes_every_comparison_and_its_plots(tmp_path):
    result = softdta("bench", "--quick", "--out", str(tmp_path), timeout=600)
    assert "Python reference" in result.stdout
    results = json.loads((tmp_path / "comparison.json").read_text())
    translator = results["translator_ns_per_report"]
    primitives = {"key-write", "key-increment", "append", "postcarding", "sketch-merge"}
    assert set(translator["xdp"]) == primitives == set(translator["reference_python"])
    for name in primitives:  # the kernel path beats the Python model it is checked against, by far
        assert translator["xdp"][name]["median"] * 10 < translator["reference_python"][name]["median"]
    engines = results["translator_python_engine"]  # Key-Write N=1 through the python engine, live
    for io in ("af_xdp", "af_packet", "af_xdp_mixed"):
        assert engines[io]["received"] == engines[io]["sent"] and engines[io]["reports_per_s_per_core"] > 0
        assert engines["xdp"]["median"] * 3 < engines[io]["median"]  # 6-10x on Key-Write in full runs
    assert engines["af_xdp"]["transmit"] == engines["af_xdp_mixed"]["transmit"] == "XDP"  # the far end runs XDP
    live = results["translator_live_lab"]  # a step with any link drop is not lossless, whatever was translated
    for step in live["steps"]:
        assert step["lossless"] == (step["translated"] == step["sent"] and step["link_drops"] == 0), step
    assert live["max_lossless_reports_per_s"] == max([s["achieved"] for s in live["steps"] if s["lossless"]] or [0])
    kernel = results["translator_live_lab_kernel_generator"]  # lossless: every report executed, nothing dropped
    assert kernel["steps"][0]["sent"] > 5_000
    for step in kernel["steps"]:
        assert step["lossless"] == (step["lost"] == {}), step
        assert not step["lossless"] or step["executed"] == step["sent"], step
    collector = results["collector_cpu_ns_per_report"]
    assert set(collector["xdp_responder_kernel"]) == {"uc-write-8", "uc-write-64", "rc-write-64-acked", "rc-fetch-add"}
    assert collector["python_asyncio"]["median"] > 0 and collector["c_epoll"]["median"] > 0
    writes = results["memory_writes_per_report"]
    assert writes["key-write"] == 2 and writes["key-increment"] == 2  # N = 2: one request per copy
    assert writes["append"] < 1 and writes["postcarding"] < 1
    assert {row["n"] for row in results["query_success"]} == {1, 2, 4}
    assert (tmp_path / "query_success.png").stat().st_size > 10_000
    assert (tmp_path / "translator.png").stat().st_size > 10_000
