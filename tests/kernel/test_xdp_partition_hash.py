"""The XDP translator's partition hash (a word at a time, then the tail byte by byte) against the reference
translator at key lengths the random fleet tests may miss: no whole word, a word and a tail, the longest key."""

import random
import time

import pytest

from softdta.core.fleet import assign
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.engines.xdp import XdpTranslator
from softdta.spec import MAX_KEY_LEN, DtaOpcode
from softdta.wire.frames import parse_udp_frame
from tests.kernel.test_xdp_fleet import SLOT_BITS, FleetReporter, fleet_document, members
from tests.kernel.test_xdp_translator import assert_same

pytestmark = pytest.mark.privileged


@pytest.mark.parametrize("key_len", [1, 3, 7, MAX_KEY_LEN])
def test_keys_of_every_shape_land_where_the_reference_sends_them(key_len):
    rng = random.Random(key_len)
    slot_map = assign(members(["c1", "c2", "c3"]), replicas=2, slot_bits=SLOT_BITS)
    document = fleet_document(rng, slot_map, key_len=key_len, data_len=4)
    reference = Translator(Tables.from_dict(document))
    reporter = FleetReporter(rng, reference.tables, key_len, 4)
    with XdpTranslator(Tables.from_dict(document), flush_idle_ns=0) as kernel:
        for index in range(400):
            frame = reporter.frame(rng.choice([DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT, DtaOpcode.POSTCARDING]))
            assert_same(reference.process(frame, time.monotonic_ns()), kernel.process(frame),
                        f"key length {key_len}, report {index}: {parse_udp_frame(frame).payload.hex()}")
