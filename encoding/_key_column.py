"""The codec of one key column: what every column type shares.

Each column type (``_key_ints``, ``_key_fixed``, ``_key_bytes``) builds a
scalar encoder and decoder once, as closures over precompiled
:class:`struct.Struct` objects, and has array forms for the batch paths. The
byte layout of each type is in ``docs/encoding.md``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from encoding._batch import Bytes2D, Mask, Positions, validity
from encoding._schema import Direction, KeyColumn, NullOrder
from encoding.errors import DecodingError, EncodingError

__all__ = ["Column", "Decoder", "Encoder", "FixedColumn"]

Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes, int], tuple[Any, int]]


class Column(abc.ABC):
    """The codec of one key column: scalar encoder and decoder, array forms.

    Subclasses implement one type family. ``width`` is the number of value
    bytes of a fixed-width column, ``None`` for strings and binary.
    """

    width: int | None = None

    def __init__(self, table: str, key: KeyColumn, field: pa.Field) -> None:
        self.name = key.name
        self.dtype = field.type
        self.nullable = bool(field.nullable)
        self.desc = key.direction is Direction.DESC
        # The null marker is never inverted: nulls FIRST/LAST hold in both directions.
        first = key.null_order is NullOrder.FIRST
        self.present, self.null = (1, 0) if first else (0, 1)
        self.where = f"key column {key.name!r} ({field.type}) of table {table!r}"

    # -- errors ---------------------------------------------------------------

    def mismatch(self, expected: str, value: Any) -> EncodingError:
        """The error for a value that does not fit the column."""
        return EncodingError(
            f"{self.where} expects {expected}, got {value!r} ({type(value).__name__})"
        )

    def null_error(self) -> EncodingError:
        """The error for a None in a non-nullable column."""
        return EncodingError(
            f"{self.where} is not nullable, got None; give it a value or make the field nullable"
        )

    def corrupt(self, what: str) -> DecodingError:
        """The error for stored bytes this column cannot have written."""
        return DecodingError(f"{self.where}: {what}")

    def null_bytes(self, head: bytes) -> bytes:
        """``head`` plus the encoding of a null, or raise if nulls are not allowed."""
        if not self.nullable:
            raise self.null_error()
        return head + bytes([self.null]) + bytes(self.width or 0)

    def check_nulls(self, arr: pa.Array) -> Mask | None:
        """The validity of a batch column; raise if it has nulls it may not."""
        valid = validity(arr)
        if valid is not None and not self.nullable:
            raise EncodingError(
                f"{self.where} is not nullable, but the batch column has {arr.null_count} nulls"
            )
        return valid

    def check_markers(self, markers: Bytes2D) -> Mask:
        """Which decoded null markers say present; raise on a marker that is
        neither, or on a null where nulls are not allowed."""
        valid: Mask = markers == self.present
        if not valid.all() and (not self.nullable or not ((markers == self.null) | valid).all()):
            raise self.corrupt("bad null marker")
        return valid

    # -- to implement -----------------------------------------------------------

    @abc.abstractmethod
    def encoder(self, head: bytes) -> Encoder:
        """A function from one value to ``head`` plus the value's key bytes."""
        ...

    @abc.abstractmethod
    def decoder(self) -> Decoder:
        """A function from (key bytes, position) to (value, position after it)."""
        ...

    @abc.abstractmethod
    def encode_array(self, arr: pa.Array) -> Bytes2D | pa.Array:
        """Key bytes of every row: an (n, 1 + width) matrix, or a binary array."""
        ...

    @abc.abstractmethod
    def decode_array(
        self, data: Bytes2D, pos: Positions, ends: Positions
    ) -> tuple[pa.Array, Positions]:
        """Decode this column of many keys laid end to end in ``data``.

        ``pos`` is where the column starts in each key, ``ends`` where each key
        ends; returns the column and where the next one starts.
        """
        ...


class FixedColumn(Column):
    """A column whose present values all take ``width`` bytes.

    A null is the null marker followed by ``width`` zero bytes, so that every
    row of a batch has the same width and a batch is one numpy matrix.
    """

    width: int = 0

    def markers(self, valid: Mask | None, n: int) -> Bytes2D:
        """An (n, 1 + width) matrix with the markers set and the values to fill."""
        matrix = np.zeros((n, 1 + self.width), dtype=np.uint8)
        matrix[:, 0] = self.present
        if valid is not None:
            matrix[~valid, 0] = self.null
        return matrix

    def encode_array(self, arr: pa.Array) -> Bytes2D:
        valid = self.check_nulls(arr)
        matrix = self.markers(valid, len(arr))
        if self.width:
            matrix[:, 1:] = self.value_bytes(arr, valid)
            if valid is not None:
                matrix[~valid, 1:] = 0
        return matrix

    @abc.abstractmethod
    def value_bytes(self, arr: pa.Array, valid: Mask | None) -> Bytes2D:
        """The (n, width) value bytes of every row (anything in null rows)."""
        ...

    def decode_array(
        self, data: Bytes2D, pos: Positions, ends: Positions
    ) -> tuple[pa.Array, Positions]:
        size = 1 + self.width
        if (pos + size > ends).any():
            raise self.corrupt("key is truncated")
        valid = self.check_markers(data[pos])
        values = data[(pos + 1)[:, None] + np.arange(self.width)]
        if values[~valid].any():
            raise self.corrupt("a null has non-zero padding")
        return self.array_from(values, valid), pos + size

    @abc.abstractmethod
    def array_from(self, values: Bytes2D, valid: Mask) -> pa.Array:
        """The Arrow column from the (n, width) value bytes and the validity."""
        ...
