"""The process's heap, kept between the python engine's steps.

A step allocates and frees a few arrays of hundreds of kilobytes each (4,096 frames' rows and columns). glibc maps
a block that large afresh, or trims the freed top of its heap back to the kernel, so every step page-faults its
memory in again: about 290 faults a step of Key-Writes, about 0.1 us of each report's 1.1 us, live
(docs/benchmarks.md). Fixed thresholds keep the freed memory for the next step.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
# Blocks up to glibc's largest threshold on 64 bits (32 MiB, DEFAULT_MMAP_THRESHOLD_MAX) come from the heap, and a
# freed heap top shrinks only past 128 MiB: the engine keeps at most that much memory it no longer uses.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20


def keep_freed_memory() -> bool:
    """Large blocks from the heap, and its freed top kept, for the whole process; False where the C library has
    no `mallopt` (not glibc), which leaves the process as it was."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
