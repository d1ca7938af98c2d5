"""Order-preserving (memcomparable) encoding of primary keys.

A key is ``table_id (u32, big-endian) | column_1 | column_2 | ...``. Each column's
bytes compare, byte by byte, in the order of its values under that column's
direction and null order, and no column's bytes are a prefix of another value's
bytes of the same column. So plain byte order of whole keys is the order of the
key tuples, and the encoding of a key's first ``i`` values is a byte prefix of the
encoding of the whole key. ``docs/encoding.md`` gives the layout of each type;
the column codecs are in ``_key_column`` and the modules it names.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from encoding._batch import EMPTY_LARGE_BINARY, Bytes2D, batch_column, binary_rows
from encoding._key_bytes import BytesColumn
from encoding._key_column import Column, Decoder
from encoding._key_fixed import BoolColumn, DecimalColumn, FloatColumn, NullColumn
from encoding._key_ints import DateColumn, IntColumn, TimestampColumn
from encoding._schema import KeyColumn, TableSchema
from encoding.errors import DecodingError, EncodingError

__all__ = ["KeyCodec", "key_equal_values", "prefix_successor"]


def key_equal_values(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``column`` with the values a key encodes alike made equal: a float
    column's -0.0 becomes 0.0 and every NaN one NaN, as in the key bytes.
    Arrow's hash joins and group-bys compare floats bit by bit, so a batch's
    keys go through this before they are matched against stored ones."""
    if not pa.types.is_floating(column.type):
        return column
    zeroed = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 + 0.0 is 0.0
    return pc.if_else(pc.is_nan(zeroed), pa.scalar(float("nan"), column.type), zeroed)


def arrow_equal(data_type: pa.DataType) -> bool:
    """Whether Arrow's equality (and so its hash joins and group-bys) of
    values of ``data_type`` is that of their encoded keys: integers,
    strings, binary, booleans, dates and timestamps; not floats (-0.0 and
    NaN, see :func:`key_equal_values`), not nested values."""
    t = pa.types
    return bool(
        t.is_integer(data_type)
        or t.is_string(data_type)
        or t.is_large_string(data_type)
        or t.is_binary(data_type)
        or t.is_large_binary(data_type)
        or t.is_boolean(data_type)
        or t.is_date(data_type)
        or t.is_timestamp(data_type)
    )


def prefix_successor(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string that starts with ``prefix``.

    ``None`` when there is none: ``prefix`` is empty or all ``0xFF``.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


#: What a column decoder raises on bytes it cannot read (besides DecodingError).
_DECODE_FAILURES = (struct.error, IndexError, ValueError, OverflowError)


def _reader(decoders: Sequence[Decoder]) -> Callable[[bytes], tuple[tuple[Any, ...], int]]:
    """Decoding of every key column after the table id: (key, end).

    Unrolled for one and two columns, the common keys.
    """
    if len(decoders) == 1:
        (first,) = decoders

        def read_one(data: bytes) -> tuple[tuple[Any, ...], int]:
            value, end = first(data, 4)
            return (value,), end

        return read_one
    if len(decoders) == 2:
        first, second = decoders

        def read_two(data: bytes) -> tuple[tuple[Any, ...], int]:
            value, pos = first(data, 4)
            other, end = second(data, pos)
            return (value, other), end

        return read_two

    def read(data: bytes) -> tuple[tuple[Any, ...], int]:
        pos, values = 4, []
        for decode in decoders:
            value, pos = decode(data, pos)
            values.append(value)
        return tuple(values), pos

    return read


def _column(table: str, key: KeyColumn, field: pa.Field) -> Column:
    """The codec of one key column, by its Arrow type."""
    dtype = field.type
    if pa.types.is_integer(dtype):
        return IntColumn(table, key, field, dtype.bit_width, pa.types.is_signed_integer(dtype))
    if pa.types.is_floating(dtype):
        return FloatColumn(table, key, field, dtype.bit_width)
    if pa.types.is_boolean(dtype):
        return BoolColumn(table, key, field)
    if pa.types.is_date32(dtype):
        return DateColumn(table, key, field)
    if pa.types.is_timestamp(dtype):
        return TimestampColumn(table, key, field)
    if pa.types.is_decimal128(dtype):
        return DecimalColumn(table, key, field)
    if pa.types.is_null(dtype):
        return NullColumn(table, key, field)
    return BytesColumn(table, key, field)


class KeyCodec:
    """Encodes and decodes the primary keys of one table.

    One encoder and one decoder per key column are built here, once, so that
    encoding a key costs a call per column and little else.
    """

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        #: The table id as 4 bytes, big-endian: the first bytes of every key.
        self.prefix: bytes = schema.prefix
        self._columns = [
            _column(schema.name, key, schema.columns.field(index))
            for key, index in zip(schema.primary_key, schema.key_indices, strict=True)
        ]
        # The first encoder writes the table prefix too: one concatenation less.
        self._encoders = [
            column.encoder(self.prefix if i == 0 else b"") for i, column in enumerate(self._columns)
        ]
        self._first = self._encoders[0]
        self._second = self._encoders[1] if len(self._encoders) > 1 else None
        decoders = [column.decoder() for column in self._columns]
        self._only = decoders[0] if len(decoders) == 1 else None
        self._read = _reader(decoders)
        self._prefix_bytes = np.frombuffer(self.prefix, dtype=np.uint8)

    def encode(self, key: Sequence[Any]) -> bytes:
        """The bytes of ``key``: the values of the first ``len(key)`` key columns.

        A shorter key encodes to a byte prefix of a longer one with the same first
        values, which is what prefix scans rely on.
        """
        try:
            size = len(key)
        except TypeError:
            raise EncodingError(f"a key is a sequence of values, got {key!r}") from None
        if size == 1:
            return self._first(key[0])
        if size == 2 and self._second is not None:
            return self._first(key[0]) + self._second(key[1])
        if size == 0:
            return self.prefix
        if size > len(self._encoders):
            raise EncodingError(
                f"table {self.schema.name!r} has {len(self._encoders)} key columns "
                f"{list(self.schema.key_names)}, got {size} values: {key!r}"
            )
        return b"".join([encode(value) for encode, value in zip(self._encoders, key, strict=False)])

    def decode(self, data: bytes) -> tuple[Any, ...]:
        """The full key that ``data`` encodes; nothing may follow it."""
        if data[:4] != self.prefix:
            raise self._wrong_table(data)
        try:
            if self._only is not None:  # a call less for the most common key
                value, end = self._only(data, 4)
                key: tuple[Any, ...] = (value,)
            else:
                key, end = self._read(data)
        except DecodingError:
            raise
        except _DECODE_FAILURES as exc:
            raise self._undecodable(data, exc) from exc
        if end != len(data):
            raise DecodingError(
                f"key of table {self.schema.name!r} has {len(data) - end} bytes "
                f"after its last column: {data.hex()}"
            )
        return key

    def decode_prefix(self, data: bytes) -> tuple[tuple[Any, ...], int]:
        """The full key at the start of ``data`` and how many bytes it takes.

        Bytes may follow the key (a cell key ends with a column id).
        """
        if data[:4] != self.prefix:
            raise self._wrong_table(data)
        try:
            return self._read(data)
        except DecodingError:
            raise
        except _DECODE_FAILURES as exc:
            raise self._undecodable(data, exc) from exc

    def _undecodable(self, data: bytes, exc: Exception) -> DecodingError:
        return DecodingError(
            f"cannot decode a key of table {self.schema.name!r} from {data[:64].hex()}: {exc}"
        )

    def _wrong_table(self, data: bytes) -> DecodingError:
        if len(data) < 4:
            return DecodingError(
                f"a key is at least 4 bytes (the table id), got {len(data)}: {data.hex()}"
            )
        found = int.from_bytes(data[:4], "big")
        return DecodingError(
            f"key belongs to table id {found}, not to table {self.schema.name!r} "
            f"(id {self.schema.table_id})"
        )

    def encode_batch(self, batch: pa.RecordBatch | pa.Table) -> list[bytes]:
        """The key bytes of every row of ``batch``, as :meth:`encode` gives them.

        Key columns are found by name and must have exactly the schema's types.
        """
        keys: list[bytes] = self.encode_arrow(batch).to_pylist()
        return keys

    def encode_arrow(self, batch: pa.RecordBatch | pa.Table) -> pa.Array:
        """:meth:`encode_batch` as one Arrow ``large_binary`` array: for keys
        compared or sorted in Arrow (binary values sort as their bytes do,
        in key order)."""
        arrays = [self._batch_column(batch, column) for column in self._columns]
        n = batch.num_rows
        if n == 0:
            return pa.array([], pa.large_binary())
        # Runs of fixed-width columns become one numpy matrix; strings become
        # Arrow binary arrays; Arrow concatenates the pieces row by row.
        pieces: list[pa.Array] = []
        run: list[Bytes2D] = [np.broadcast_to(self._prefix_bytes, (n, 4))]
        for column, arr in zip(self._columns, arrays, strict=True):
            piece = column.encode_array(arr)
            if isinstance(piece, np.ndarray):
                run.append(piece)
                continue
            if run:
                pieces.append(binary_rows(np.hstack(run)))
                run = []
            pieces.append(piece)
        if run:
            pieces.append(binary_rows(np.hstack(run)))
        keys = (
            pieces[0]
            if len(pieces) == 1
            else pc.binary_join_element_wise(*pieces, EMPTY_LARGE_BINARY)
        )
        return keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys

    def _batch_column(self, batch: pa.RecordBatch | pa.Table, column: Column) -> pa.Array:
        arr = batch_column(
            batch,
            column.name,
            lambda: (
                f"{column.where} is missing from the batch, or named twice in it; "
                f"the batch has columns {batch.schema.names}"
            ),
        )
        if arr.type != column.dtype:
            raise EncodingError(
                f"{column.where} has type {arr.type} in the batch; cast it to "
                f"{column.dtype} first (key columns must have exactly their type)"
            )
        return arr

    def decode_batch(self, keys: Sequence[bytes]) -> list[pa.Array]:
        """The key columns of many full keys, one Arrow array per key column."""
        if not keys:
            return [pa.array([], column.dtype) for column in self._columns]
        try:
            binary = pa.array(keys, pa.large_binary())
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DecodingError(f"keys must be bytes ({exc})") from None
        if binary.null_count:
            raise DecodingError("keys must be bytes, got None")
        _, offset_buffer, data_buffer = binary.buffers()
        offsets = np.frombuffer(offset_buffer, dtype=np.int64)[: len(keys) + 1]
        data: Bytes2D = (
            np.frombuffer(data_buffer, dtype=np.uint8)
            if data_buffer is not None
            else np.zeros(0, dtype=np.uint8)
        )
        starts, ends = offsets[:-1], offsets[1:]
        too_short = np.flatnonzero(ends - starts < 4)
        if too_short.size:
            raise self._wrong_table(keys[int(too_short[0])])
        table_ids = data[starts[:, None] + np.arange(4)]
        wrong = np.flatnonzero((table_ids != self._prefix_bytes).any(axis=1))
        if wrong.size:
            raise self._wrong_table(keys[int(wrong[0])])
        pos = starts + 4
        columns = []
        for column in self._columns:
            array, pos = column.decode_array(data, pos, ends)
            columns.append(array)
        trailing = np.flatnonzero(pos != ends)
        if trailing.size:
            raise DecodingError(
                f"key of table {self.schema.name!r} has bytes after its last "
                f"column: {keys[int(trailing[0])].hex()}"
            )
        return columns
