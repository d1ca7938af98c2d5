"""Synthetic state for the benchmark: mixed-type rows under a ``(group, id)`` key.

Every group holds :data:`GROUP_SIZE` rows, so a prefix scan of one group reads
about ten rows, the shape of join state with a few matches per join key. Rows
come in random key order, as a stream's updates do.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa

from encoding import TableSchema, ValueLayout

__all__ = [
    "GROUP_SIZE",
    "arrow_schema",
    "epochs",
    "key_samples",
    "make_batch",
    "prefix_samples",
    "rows_of",
    "table_schema",
]

GROUP_SIZE = 10
KEY = ("group", "id")
#: Value columns cycle through these types.
_VALUE_TYPES = (pa.int64(), pa.float64(), pa.string())
#: Strings are drawn from a pool of this many, 6 to 60 characters long.
_POOL_SIZE = 1000


def arrow_schema(columns: int) -> pa.Schema:
    """Two int64 key columns and ``columns - 2`` value columns (int, float, string...)."""
    if columns < 3:
        raise ValueError(f"a benchmark row has at least 3 columns (2 key, 1 value), got {columns}")
    fields = [pa.field(name, pa.int64(), nullable=False) for name in KEY]
    fields += [pa.field(f"v{i}", _VALUE_TYPES[i % 3]) for i in range(columns - 2)]
    return pa.schema(fields)


def table_schema(columns: int, layout: ValueLayout = ValueLayout.ROW) -> TableSchema:
    """The benchmark table with ``columns`` columns in ``layout``."""
    return TableSchema(1, arrow_schema(columns), KEY, layout=layout, name=f"bench_{columns}")


def make_batch(rows: int, columns: int, seed: int) -> pa.RecordBatch:
    """``rows`` rows in random key order: keys ``(p // 10, p % 10)`` for a
    permutation ``p`` of ``range(rows)``, values random."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(rows).astype(np.int64)
    pool = pa.array(
        [f"{i:06d}-" + "abcdefghij"[i % 10] * (i % 54) for i in range(_POOL_SIZE)], pa.string()
    )
    arrays: list[pa.Array] = [pa.array(perm // GROUP_SIZE), pa.array(perm % GROUP_SIZE)]
    for dtype in arrow_schema(columns).types[2:]:
        if dtype == pa.int64():
            arrays.append(pa.array(rng.integers(-(2**40), 2**40, rows)))
        elif dtype == pa.float64():
            arrays.append(pa.array(rng.random(rows) * 1e6))
        else:
            arrays.append(pool.take(pa.array(rng.integers(0, _POOL_SIZE, rows))))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(columns))


def rows_of(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """The rows of ``batch`` as tuples in column order."""
    return list(zip(*(column.to_pylist() for column in batch.columns), strict=True))


def epochs(batch: pa.RecordBatch, count: int) -> list[pa.RecordBatch]:
    """``batch`` cut into ``count`` consecutive slices of (nearly) equal size."""
    bounds = np.linspace(0, batch.num_rows, count + 1).astype(int)
    return [batch.slice(int(a), int(b - a)) for a, b in itertools.pairwise(bounds)]


def key_samples(rows: int, count: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """``count`` random primary keys among the ``rows`` of :func:`make_batch`."""
    picks = rng.integers(0, rows, count)
    return [(int(p) // GROUP_SIZE, int(p) % GROUP_SIZE) for p in picks]


def prefix_samples(rows: int, count: int, rng: np.random.Generator) -> list[tuple[int]]:
    """``count`` random one-column key prefixes (groups) of :func:`make_batch`."""
    groups = -(-rows // GROUP_SIZE)
    return [(int(g),) for g in rng.integers(0, groups, count)]
