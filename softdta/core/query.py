"""What every query over collector memory shares (sans-IO): keys as rows, the JSON fields of a request parsed into
typed values, and `StructureQuery`, the kind of query a primitive declares (`Primitive.query`). Each primitive's
engine and answers are in its package's `queries.py`; the query service only routes requests to them."""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, Protocol, Self, TypeAlias, TypeVar, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from softdta.core.regions import Region
from softdta.core.tables import Structure
from softdta.errors import SoftdtaError
from softdta.wire.hashing import keys_to_rows

BLANK = -1
MAX_KEYS = 100_000  # per request: the answer takes some 400 bytes a key

# Keys as the queries take them: (count, key_len) uint8 rows, integers, or byte strings.
Keys: TypeAlias = np.ndarray | Sequence[int] | Sequence[bytes]


def as_key_rows(keys: Keys, key_len: int = 4) -> np.ndarray:
    """Keys as a (count, key_len) uint8 array: accepts such an array, integers, or a list of bytes."""
    if isinstance(keys, np.ndarray) and keys.ndim == 2 and keys.dtype == np.uint8:
        return keys
    if len(keys) and isinstance(keys[0], (bytes, bytearray)):
        return np.frombuffer(b"".join(cast(Sequence[bytes], keys)), dtype=np.uint8).reshape(len(keys), key_len)
    return keys_to_rows(keys, key_len)


class QueryError(SoftdtaError, ValueError):
    """A request a query cannot take; the message says what to send instead (the query service answers 400)."""


class Answer(Protocol):
    def json(self) -> dict[str, Any]:
        """The answer as the query service sends it (JSON-ready: lists, ints, strings, None)."""
        ...


@runtime_checkable
class RowsAnswer(Answer, Protocol):
    """An answer that also has a binary form: one fixed-size row per key, in the order asked (what the query
    service sends for a request of key rows, collector.service.ROWS_CONTENT_TYPE)."""

    def rows(self) -> bytes: ...


RegionT = TypeVar("RegionT", bound=Region)


class StructureQuery(abc.ABC, Generic[RegionT]):
    """One query over a structure of a primitive, which names it as `Primitive.query`.

    The query service routes `<primitive name>/<structure name>` to it: a POST of a JSON object with its
    `required_fields` (and any of its `optional_fields`), or a GET when it declares no fields. `parse` turns the
    fields into the typed query, raising QueryError for anything it cannot take; `answer` reads the structure's
    region (`Primitive.region`) and returns an `Answer`. Both are sans-IO; the service runs `answer` on its query
    thread.
    """

    required_fields: ClassVar[tuple[str, ...]] = ()
    optional_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def takes_body(cls) -> bool:
        return bool(cls.required_fields or cls.optional_fields)

    @classmethod
    @abc.abstractmethod
    def parse(cls, fields: dict[str, Any], structure: Structure, name: str) -> Self:
        """The query that `fields` (a request's JSON object, its fields checked) asks of `structure`, called
        `name` in answers and errors."""

    @classmethod
    def from_json(cls, raw: bytes | bytearray, structure: Structure, name: str) -> Self:
        """`parse` of a request's body, which must be a JSON object of this query's fields."""
        return cls.parse(json_object(raw, cls.required_fields, cls.optional_fields), structure, name)

    @abc.abstractmethod
    def answer(self, region: RegionT) -> Answer:
        """The answer, read from the structure's region now."""


# --------------------------------------------------------------------------------------------------
# A request's JSON fields, checked: every problem a QueryError that says what to send instead


def json_object(raw: bytes | bytearray, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, deep nesting
        reason = "it nests too deeply" if isinstance(error, RecursionError) else error
        raise QueryError(f"body is not valid JSON: {reason}") from None
    if not isinstance(body, dict):
        raise QueryError(f"body must be a JSON object, got {type(body).__name__}")
    return checked_fields(body, required, optional)


def checked_fields(body: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """`body` if it has every `required` field and no other than the `optional` ones."""
    unknown = sorted(body.keys() - set(required) - set(optional))
    if unknown:
        raise QueryError(f"unknown field(s) {unknown}; this endpoint takes {list(required + optional)}")
    missing = [field for field in required if field not in body]
    if missing:
        raise QueryError(f"missing field(s) {missing}")
    return body


def integer(value: Any, field: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:  # type(), not isinstance: JSON true is no integer
        raise QueryError(f"{field} must be an integer in {low}..{high}, got {json.dumps(value)}")
    return value


def key_rows(keys: Any, structure: Structure, name: str) -> npt.NDArray[np.uint8]:
    """Keys given as hex strings (wire order) or integers (their big-endian bytes), as (count, key_len) uint8
    rows in wire order."""
    key_len = structure.key_len
    if isinstance(keys, np.ndarray):  # already rows: the binary form of a request
        if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != key_len or not keys.shape[0]:
            raise QueryError(f"the body must be whole keys of {name}'s key_len, {key_len} bytes each")
        if keys.shape[0] > MAX_KEYS:
            raise QueryError(f"{keys.shape[0]:,} keys in one request; send at most {MAX_KEYS:,} at a time")
        return keys
    if not isinstance(keys, list) or not keys:
        raise QueryError("keys must be a non-empty list of hex strings (wire order) or integers")
    if len(keys) > MAX_KEYS:
        raise QueryError(f"{len(keys):,} keys in one request; send at most {MAX_KEYS:,} at a time")
    wire = bytearray()
    for index, key in enumerate(keys):
        if isinstance(key, str):
            try:
                raw = bytes.fromhex(key)
            except ValueError:
                raise QueryError(f"keys[{index}] {key!r} is not a hex string") from None
        elif type(key) is int and 0 <= key < 1 << 8 * key_len:
            raw = key.to_bytes(key_len, "big")
        elif type(key) is int:
            raise QueryError(f"keys[{index}] {key} does not fit in {name}'s key_len of {key_len} bytes")
        else:
            raise QueryError(f"keys[{index}] must be a hex string or an integer, got {json.dumps(key)}")
        if len(raw) != key_len:
            raise QueryError(f"keys[{index}] {key!r} is {len(raw)} bytes; {name} has key_len {key_len} "
                             f"({2 * key_len} hex digits)")
        wire += raw
    return np.frombuffer(bytes(wire), dtype=np.uint8).reshape(len(keys), key_len)


def hex_rows(raw: bytes, width: int) -> list[str]:
    """`raw` cut into hex strings of `width` bytes each."""
    text = raw.hex()
    return [text[start:start + 2 * width] for start in range(0, len(text), 2 * width)]
