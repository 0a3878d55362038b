"""Taking frames out of an AF_XDP UMEM in one gather (softdta.kernel.xsk.gather_frames), on a UMEM in memory."""

import numpy as np

from softdta.kernel.xsk import FRAME_SIZE, gather_frames


def umem_with(frames_at: dict[int, bytes], chunks: int = 8) -> np.ndarray:
    umem = np.full((chunks, FRAME_SIZE), 0xEE, dtype=np.uint8)
    flat = umem.reshape(-1)
    for addr, frame in frames_at.items():
        flat[addr:addr + len(frame)] = np.frombuffer(frame, dtype=np.uint8)
    return umem


def test_frames_at_one_offset_come_out_whole_in_ring_order():
    frames_at = {5 * FRAME_SIZE + 256: b"\x01" * 60, 1 * FRAME_SIZE + 256: b"\x02" * 82,
                 7 * FRAME_SIZE + 256: b"\x03" * 14}
    addrs = np.array(list(frames_at))
    got = gather_frames(umem_with(frames_at), addrs, np.array([len(f) for f in frames_at.values()]))
    assert list(got) == list(frames_at.values())


def test_frames_at_different_offsets_come_out_whole_even_near_a_chunks_end():
    frames_at = {0 * FRAME_SIZE + 256: b"\x01" * 300, 3 * FRAME_SIZE + FRAME_SIZE - 20: b"\x02" * 20,
                 2 * FRAME_SIZE + 0: b"\x03" * 64, 6 * FRAME_SIZE + 256: b"\x04" * 14}
    addrs = np.array(list(frames_at))
    got = gather_frames(umem_with(frames_at), addrs, np.array([len(f) for f in frames_at.values()]))
    assert list(got) == list(frames_at.values()) and got.rows.shape == (4, 300)
