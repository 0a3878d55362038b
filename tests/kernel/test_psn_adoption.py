"""Both live engines adopt an advertised PSN the same way (docs/protocol.md, "Queue-pair PSNs"): a PSN that
frames in flight explain is not adopted, any other is, with a log line and the PSN_ADOPTED counter."""

import pytest

from softdta.core.tables import Tables
from softdta.engines.python import PythonEngine
from softdta.engines.xdp import XdpTranslator
from softdta.spec import PSN_MASK, DtaOpcode, TranslatorCounter
from softdta.wire import dta
from tests.common import COLLECTOR_IP, EXAMPLE_TABLES

pytestmark = pytest.mark.privileged


def _next_psn(engine, qp) -> int:
    return engine.qp_state(qp)["next_psn"]


def _counted(engine) -> int:
    return engine.counts()[TranslatorCounter.PSN_ADOPTED]


@pytest.mark.parametrize("engine_class", [XdpTranslator, PythonEngine], ids=["xdp", "python"])
def test_an_advertised_psn_is_adopted_unless_frames_in_flight_explain_it(engine_class, reporter, capfd):
    tables = Tables.from_toml(EXAMPLE_TABLES)
    key_write = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp
    with engine_class(tables) as engine:
        for key in range(10):
            engine.process(reporter.frame(dta.key_write(key, key, 2)), 0)
        assert _next_psn(engine, key_write) == (key_write.start_psn + 20) & PSN_MASK
        in_flight = Tables.from_toml(EXAMPLE_TABLES)  # UC: [start, next] may still be on the way
        in_flight.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp.start_psn = (key_write.start_psn + 12) & PSN_MASK
        engine.apply(in_flight)
        assert _next_psn(engine, key_write) == (key_write.start_psn + 20) & PSN_MASK and _counted(engine) == 0
        restarted = Tables.from_toml(EXAMPLE_TABLES)  # a collector whose QP expects a PSN never sent
        restarted.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp.start_psn = (key_write.start_psn + 500) & PSN_MASK
        engine.apply(restarted)
        assert _next_psn(engine, key_write) == (key_write.start_psn + 500) & PSN_MASK and _counted(engine) == 1
        engine.apply(restarted)  # the same advertisement again says nothing new
        assert _counted(engine) == 1
        frames = engine.process(reporter.frame(dta.key_write(99, 1, 1)), 0).frames
        assert len(frames) == 1
    assert f"adopts its collector's PSN {(key_write.start_psn + 500) & PSN_MASK}" in capfd.readouterr().out
