"""The one declarative description of every wire header, opcode, counter and translator table.

Python codecs (`softdta.wire.codec`), the BPF C header (`bpf/include/softdta_spec.h`) and the P4 definitions
(`p4/softdta_spec.p4`) are all derived from the objects in this module; nothing else spells out a layout.
"""

# The parts; everything is re-exported here, so `softdta.spec.X` names any of it.
from softdta.spec.constants import *  # noqa: F403
from softdta.spec.headers import *  # noqa: F403
from softdta.spec.maps import *  # noqa: F403
from softdta.spec.model import *  # noqa: F403
from softdta.spec.records import *  # noqa: F403
