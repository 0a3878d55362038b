"""Key-Increment's vector path: its reports' counters added into their slots a batch at a time (Fetch&Add)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from softdta.core.tables import QueuePair, Structure
from softdta.core.vector import KeyedPath


class KeyIncrementPath(KeyedPath):
    carries_data: ClassVar[bool] = False

    def frames_of(self, qp: QueuePair, structure: Structure, va: npt.NDArray[np.uint64],
                  immediate: npt.NDArray[np.bool_], checksums: npt.NDArray[np.uint32],
                  values: npt.NDArray[Any]) -> Sequence[bytes]:
        return self.frames.fetch_adds(qp, va, values)
