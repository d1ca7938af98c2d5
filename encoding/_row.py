"""The ``row`` layout: the whole row, key columns included, in one value.

:class:`RowCodec` puts the compiled :class:`RowLayout` of a schema behind its
row-at-a-time methods, and encodes and decodes whole batches with numpy and
Arrow compute: a structured numpy array is the fixed part of every value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from encoding._batch import EMPTY_LARGE_BINARY, batch_column, validity_buffer
from encoding._row_layout import RowLayout
from encoding._schema import TableSchema
from encoding._value_columns import (
    FORMAT_VERSION,
    MAX_VAR_LEN,
    ColumnPlan,
    Row,
    column_plan,
    kind_of,
)
from encoding.errors import DecodingError, EncodingError

__all__ = ["RowCodec"]


class RowCodec:
    """The ``row`` layout: the whole row (all columns, key columns included) in
    one value."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self._columns = [column_plan(i, f) for i, f in enumerate(schema.columns)]
        self._layout = RowLayout(schema.name, self._columns, len(self._columns))
        self._encode = self._layout.encode
        self._decode = self._layout.decode
        self._dtype = self._layout.numpy_dtype()

    def encode(self, row: Sequence[Any]) -> bytes:
        """The value of ``row``, a tuple in column order; EncodingError if it does
        not fit the schema."""
        return self._encode(row)

    def decode(self, data: bytes) -> Row:
        """The row in ``data``, in column order; DecodingError if ``data`` is not
        a row value of this table."""
        return self._decode(data)

    def validate(self, row: Sequence[Any]) -> None:
        """Raise EncodingError if ``row`` does not fit, without encoding it."""
        self._layout.validate(row)

    # -- batches ------------------------------------------------------------

    def encode_batch(self, batch: pa.RecordBatch | pa.Table) -> list[bytes]:
        """The value of each row of ``batch``, whose columns are found by name;
        the same bytes as :meth:`encode` gives row by row."""
        arrays = self._arrays_of(batch)
        n = batch.num_rows
        if n == 0:
            return []
        layout = self._layout
        rec = np.zeros(n, self._dtype)
        rec["v"] = FORMAT_VERSION
        rec["n"] = len(self._columns)
        bits = np.zeros((n, layout.bitmap_len), np.uint8)
        tails: list[pa.Array] = []
        for col, arr in zip(self._columns, arrays, strict=True):
            i = col.index
            nulls = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
            if col.kind == "null":
                bits[:, i >> 3] |= 1 << (i & 7)
                continue
            if nulls is not None:
                bits[:, i >> 3] |= nulls.view(np.uint8) << (i & 7)
            if col.code:
                rec[f"f{i}"] = self._stored_array(col, arr, nulls)
                continue
            lengths = pc.binary_length(arr)
            if nulls is not None:
                lengths = pc.fill_null(lengths, 0)
            length_values = lengths.to_numpy(zero_copy_only=False)
            if length_values.max() > MAX_VAR_LEN:
                raise EncodingError(f"{col.describe()} has a value over {MAX_VAR_LEN} bytes")
            rec[f"l{i}"] = length_values
            tail = arr.cast(pa.large_binary())
            tails.append(pc.fill_null(tail, EMPTY_LARGE_BINARY) if nulls is not None else tail)
        rec["bm"] = bits
        size = layout.struct.size
        heads = pa.Array.from_buffers(pa.binary(size), n, [None, pa.py_buffer(rec)])
        heads = heads.cast(pa.large_binary())
        if tails:
            heads = pc.binary_join_element_wise(heads, *tails, EMPTY_LARGE_BINARY)
        # Arrow makes the bytes objects faster than slicing in a Python loop.
        values: list[bytes] = heads.to_pylist()
        return values

    def _arrays_of(self, batch: pa.RecordBatch | pa.Table) -> list[pa.Array]:
        return [self._batch_column(batch, col) for col in self._columns]

    def _batch_column(self, batch: pa.RecordBatch | pa.Table, col: ColumnPlan) -> pa.Array:
        arr = batch_column(
            batch,
            col.name,
            lambda: (
                f"the batch has no column {col.name!r}, or more than one; table "
                f"{self.schema.name!r} needs {self.schema.columns.names}"
            ),
        )
        if arr.type != col.type:
            arr = self._cast(col, arr)
        if not col.nullable and arr.null_count:
            raise EncodingError(
                f"{col.describe()} is not nullable; the batch has {arr.null_count} nulls in it"
            )
        return arr

    @staticmethod
    def _cast(col: ColumnPlan, arr: pa.Array) -> pa.Array:
        try:
            kind = kind_of(arr.type)
        except EncodingError:
            kind = "unsupported"
        # Cast only where encode() would take the values: never bool to int, or
        # float to int, even when Arrow could.
        if kind == col.kind or kind == "null" or (kind, col.kind) == ("int", "float"):
            try:
                return arr.cast(col.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise EncodingError(
                    f"{col.describe()}: the batch column of type {arr.type} does not fit: {exc}"
                ) from None
        raise EncodingError(
            f"{col.describe()}: expected {col.type} values, the batch has {arr.type}"
        )

    @staticmethod
    def _stored_array(
        col: ColumnPlan, arr: pa.Array, nulls: npt.NDArray[np.bool_] | None
    ) -> npt.NDArray[Any]:
        """The stored form of a fixed-width column, nulls as zeros."""
        n = len(arr)
        if col.kind == "dec":
            raw = np.frombuffer(arr.buffers()[1], np.uint8, 16 * (arr.offset + n))
            raw = raw[16 * arr.offset :].reshape(n, 16)
            if nulls is not None:
                raw = raw.copy()
                raw[nulls] = 0
            if col.code == "q":
                return raw.view("<i8")[:, 0]  # the low half: the value fits 64 bits
            return raw.view("V16")[:, 0]
        if col.kind == "date":
            arr = arr.view(pa.int32())
        elif col.kind == "ts":
            arr = arr.view(pa.int64())
        if nulls is not None:
            arr = pc.fill_null(arr, False if col.kind == "bool" else 0)
        values: npt.NDArray[Any] = arr.to_numpy(zero_copy_only=False)
        if col.kind == "float":
            nan = np.isnan(values)
            if nan.any():
                values = np.where(nan, np.array(np.nan, values.dtype), values)
        elif col.bounds is not None and len(values):
            lo, hi = col.bounds
            if values.min() < lo or values.max() > hi:
                raise EncodingError(
                    f"{col.describe()}: expected values in {lo}..{hi} (the range of Python's "
                    f"datetime), the batch has {values.min()}..{values.max()}"
                )
        return values

    def decode_batch(self, values: Sequence[bytes]) -> pa.RecordBatch:
        """The rows in ``values`` as one record batch with the table's columns."""
        n = len(values)
        if n == 0:
            return pa.RecordBatch.from_pylist([], schema=self.schema.columns)
        layout = self._layout
        size = layout.struct.size
        blobs = pa.array(values, pa.large_binary())
        lengths = pc.binary_length(blobs).to_numpy()
        if lengths.min() < size:
            return self._decode_rows(values)
        head_data = pc.binary_slice(blobs, 0, size).buffers()[2]
        rec = np.frombuffer(head_data, self._dtype, n)
        pieces = np.empty((n, 1 + len(layout.var)), np.int64)
        pieces[:, 0] = size
        for k, col in enumerate(layout.var, 1):
            pieces[:, k] = rec[f"l{col.index}"]
        if (
            (rec["v"] != FORMAT_VERSION).any()
            or (rec["n"] != len(self._columns)).any()
            or (pieces.sum(axis=1) != lengths).any()
        ):
            # Values from an older schema, or a bad value to report.
            return self._decode_rows(values)
        bits: npt.NDArray[np.uint8] = rec["bm"]
        arrays = []
        for col in self._columns:
            i = col.index
            nulls = (bits[:, i >> 3] >> (i & 7) & 1).astype(np.bool_)
            validity, _ = validity_buffer(~nulls)
            if col.kind == "null":
                arrays.append(pa.nulls(n))
            elif col.kind == "bool":
                arrays.append(
                    pa.array(rec[f"f{i}"] != 0, mask=nulls if validity is not None else None)
                )
            elif col.code:
                # A copy when the field sits unaligned in the packed record
                # (Arrow's compute warns on, and may mishandle, such buffers).
                stored = np.require(rec[f"f{i}"], requirements=["C", "A"])
                if col.bounds is not None:
                    present = stored[~nulls]
                    lo, hi = col.bounds
                    if len(present) and (present.min() < lo or present.max() > hi):
                        return self._decode_rows(values)
                if col.kind == "dec" and col.code == "q":
                    stored = np.stack([stored, stored >> 63], axis=1)  # sign-extend to 128 bits
                arr = pa.Array.from_buffers(col.type, n, [validity, pa.py_buffer(stored)])
                arrays.append(self._checked(col, arr))
            else:
                arrays.append(self._var_column(col, blobs, pieces, validity))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema.columns)

    def _var_column(
        self,
        col: ColumnPlan,
        blobs: pa.Array,
        pieces: npt.NDArray[np.int64],
        validity: pa.Buffer | None,
    ) -> pa.Array:
        """Column ``col`` cut out of the values in ``blobs``; row r, piece k of
        ``pieces`` is the length of the fixed part (k = 0) or of var field k."""
        n, per_row = pieces.shape
        offsets = np.zeros(n * per_row + 1, np.int64)
        np.cumsum(pieces.ravel(), out=offsets[1:])
        # Every fixed part and var field as one array over the values' own bytes.
        every = pa.Array.from_buffers(
            pa.large_binary(), n * per_row, [None, pa.py_buffer(offsets), blobs.buffers()[2]]
        )
        k = 1 + self._layout.var.index(col)
        mine = pc.take(every, pa.array(np.arange(k, n * per_row, per_row)))
        large = pa.large_string() if col.kind == "str" else pa.large_binary()
        arr = pa.Array.from_buffers(large, n, [validity, *mine.buffers()[1:]])
        return self._checked(col, arr).cast(col.type)

    def _checked(self, col: ColumnPlan, arr: pa.Array) -> pa.Array:
        if col.kind in ("str", "dec"):
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise DecodingError(
                    f"row value of table {self.schema.name!r} is corrupt: {col.describe()}: {exc}"
                ) from None
        return arr

    def _decode_rows(self, values: Sequence[bytes]) -> pa.RecordBatch:
        rows = [self._decode(v) for v in values]
        arrays = [
            pa.array([row[col.index] for row in rows], type=col.type) for col in self._columns
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema.columns)
