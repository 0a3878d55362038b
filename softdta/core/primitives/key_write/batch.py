"""Key-Write's vector path: its reports' data, with the key's checksum, written into their slots a batch at a time;
and the Key-Writes that plug-ins ask for (`KeyWrites`), merged among them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from softdta.core.tables import QueuePair, Structure
from softdta.core.vector import KeyedPath, KeyedPiece
from softdta.spec import KEY_CHECKSUM_LEN, MAX_REDUNDANCY
from softdta.wire.columns import Rows
from softdta.wire.hashing import key_hashes_rows

if TYPE_CHECKING:
    from softdta.core.primitives.base import KeyWrites


class KeyWritePath(KeyedPath):
    carries_data: ClassVar[bool] = True
    takes_writes: ClassVar[bool] = True

    def frames_of(self, qp: QueuePair, structure: Structure, va: npt.NDArray[np.uint64],
                  immediate: npt.NDArray[np.bool_], checksums: npt.NDArray[np.uint32],
                  values: npt.NDArray[Any]) -> Sequence[bytes]:
        return self.frames.writes(qp, va, immediate, checksums, write_payloads(checksums, values))

    def writes(self, writes: KeyWrites, positions: npt.NDArray[np.int64],
               immediate: npt.NDArray[np.bool_]) -> KeyedPiece:
        structure = writes.structure
        order = np.argsort(writes.rows, kind="stable")
        rows, keys, data = writes.rows[order], writes.keys[order], writes.data[order]
        if keys.shape[1:] != (structure.key_len,) or data.shape[1:] != (structure.data_len,) or \
                not 1 <= writes.redundancy <= MAX_REDUNDANCY:
            raise ValueError(f"translate_batch asked for Key-Writes that {structure.name} cannot take: keys "
                             f"{keys.shape}, data {data.shape}, redundancy {writes.redundancy}")
        checksums, slot_hashes = key_hashes_rows(np.ascontiguousarray(keys), writes.redundancy, structure.key_hash)
        return KeyedPiece(structure, positions[rows], np.full(len(rows), writes.redundancy), immediate[rows],
                          checksums, slot_hashes, np.ascontiguousarray(data), reports=False)


def write_payloads(checksums: npt.NDArray[np.uint32], data: Rows) -> Rows:
    """checksum ‖ data, per row: what a Key-Write writes into a slot."""
    payloads = np.empty((len(data), KEY_CHECKSUM_LEN + data.shape[1]), dtype=np.uint8)
    payloads[:, :KEY_CHECKSUM_LEN] = checksums.astype("<u4").view(np.uint8).reshape(-1, KEY_CHECKSUM_LEN)
    payloads[:, KEY_CHECKSUM_LEN:] = data
    return payloads
