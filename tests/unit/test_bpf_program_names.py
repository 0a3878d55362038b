"""Every XDP program softdta attaches is named softdta_*: that is how a daemon tells its own, or a killed one's,
from an operator's program it must not replace (`kernel.owner.own_interface`)."""

import re

from softdta.kernel.resources import BPF_DIR

XDP_PROGRAM = re.compile(r'SEC\("xdp[^"]*"\)\s*\n\s*int\s+(\w+)\s*\(')


def test_every_xdp_program_in_bpf_is_named_softdta():
    names = {source.name: XDP_PROGRAM.findall(source.read_text()) for source in sorted(BPF_DIR.glob("*.c"))}
    assert sum(map(len, names.values())) >= 10, names  # the pattern still finds them
    assert {source: [name for name in found if not name.startswith("softdta_")]
            for source, found in names.items() if any(not name.startswith("softdta_") for name in found)} == {}
