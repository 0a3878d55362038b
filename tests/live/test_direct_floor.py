"""The benchmarks' floor (softdta.lab.direct, `bare`): the bare forwarder gives every report the length of the WRITE
the translator makes of it and sends it to the sink, which takes every one; nothing is left behind."""

import os

import pytest

from softdta.lab.direct import DATA_LEN, DirectPath
from softdta.spec import FloorCounter

pytestmark = pytest.mark.privileged


def test_the_floor_forwards_every_report_as_a_write_sized_frame_to_the_sink():
    with DirectPath(queues=2, keys=64, bare=True) as direct:
        prefix = direct.prefix
        result = direct.step(20_000, 0.2)
        counts = direct.floor_counts()
        write_len = direct.write_len
    assert result["lossless"] and result["sent"] > 0 and result["executed"] == result["sent"], result
    assert counts[FloorCounter.FORWARDED] == counts[FloorCounter.SUNK] == result["sent"]
    assert counts[FloorCounter.SUNK_BYTES] == result["sent"] * write_len
    # Ethernet, IPv4, UDP, BTH, RETH, the slot (a 4-byte checksum, the key's data), iCRC
    assert write_len == 14 + 20 + 8 + 12 + 16 + 4 + DATA_LEN + 4, write_len
    assert not [name for name in os.listdir("/run/netns") if name.startswith(prefix)]
