"""Arrow arrays for the batch paths of the codecs: a batch's columns by name,
and arrays as numpy buffers and back.

The batch paths encode and decode whole columns with numpy and Arrow compute,
never a Python call per row; these are the pieces they share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from encoding.errors import EncodingError

__all__ = [
    "EMPTY_LARGE_BINARY",
    "Bytes2D",
    "Mask",
    "Positions",
    "batch_column",
    "binary_rows",
    "fixed_array",
    "fixed_values",
    "gather",
    "invert_values",
    "validity",
    "validity_buffer",
]

Bytes2D = npt.NDArray[np.uint8]
Positions = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

#: The separator of ``pc.binary_join_element_wise`` that joins with nothing.
EMPTY_LARGE_BINARY = pa.scalar(b"", pa.large_binary())


def batch_column(
    batch: pa.RecordBatch | pa.Table, name: str, missing: Callable[[], str]
) -> pa.Array:
    """Column ``name`` of ``batch`` as one array (chunks combined).

    ``EncodingError(missing())`` when the batch has no column of that name, or
    more than one.
    """
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise EncodingError(missing())
    arr = batch.column(index)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr


def validity(arr: pa.Array) -> Mask | None:
    """The validity of ``arr`` as a bool array, ``None`` when it has no nulls."""
    if arr.null_count == 0:
        return None
    mask: Mask = arr.is_valid().to_numpy(zero_copy_only=False)
    return mask


def validity_buffer(valid: Mask) -> tuple[pa.Buffer | None, int]:
    """An Arrow validity bitmap for ``valid`` and its null count."""
    null_count = int(valid.size - np.count_nonzero(valid))
    if null_count == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), null_count


def fixed_values(arr: pa.Array, dtype: str) -> npt.NDArray[Any]:
    """The fixed-width data buffer of ``arr`` as numpy values (no copy)."""
    n, offset = len(arr), arr.offset
    values: npt.NDArray[Any] = np.frombuffer(arr.buffers()[1], dtype=dtype, count=offset + n)[
        offset:
    ]
    return values


def fixed_array(dtype: pa.DataType, data: npt.NDArray[Any], valid: Mask) -> pa.Array:
    """The Arrow array of type ``dtype`` over the fixed-width values ``data``
    (zeros in null rows) with validity ``valid``."""
    bitmap, null_count = validity_buffer(valid)
    return pa.Array.from_buffers(dtype, len(valid), [bitmap, pa.py_buffer(data)], null_count)


def binary_rows(matrix: Bytes2D) -> pa.Array:
    """The rows of a byte matrix as a large_binary array (no per-row Python)."""
    n, width = matrix.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
    data = np.ascontiguousarray(matrix)
    return pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def gather(data: Bytes2D, starts: Positions, lengths: Positions) -> tuple[Bytes2D, Positions]:
    """The bytes ``data[starts[i] : starts[i] + lengths[i]]`` of every i, concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.uint8), lengths
    run_starts = np.cumsum(lengths) - lengths
    index = np.arange(total, dtype=np.int64) + np.repeat(starts - run_starts, lengths)
    return data[index], lengths


def invert_values(arr: pa.Array) -> pa.Array:
    """``arr`` (large_binary) with every byte of its values inverted."""
    bitmap, offsets, data = arr.buffers()
    if data is None:
        return arr
    inverted = np.bitwise_not(np.frombuffer(data, dtype=np.uint8))
    return pa.Array.from_buffers(
        arr.type, len(arr), [bitmap, offsets, pa.py_buffer(inverted)],
        arr.null_count, arr.offset,
    )  # fmt: skip
