"""Map layouts userspace reads as memory (mmapped maps) find each member where packing puts it."""

from softdta.kernel.maps import map_layout, record
from softdta.spec import MAPS, RECORDS


def test_every_members_offset_is_where_packing_puts_it():
    layouts = [record(entry.name) for entry in RECORDS] + \
        [layout for entry in MAPS for layout in (map_layout(entry.name).key, map_layout(entry.name).value)]
    for layout in layouts:
        zero = layout.unpack(bytes(layout.size))
        for name in layout.names:
            # a 1 in the member's first byte: an integer's lowest (host order is little-endian here)
            packed = layout.pack(**{name: b"\x01" if isinstance(zero[name], bytes) else 1})
            assert packed.index(1) == layout.offsets[name], (layout.names, name)
