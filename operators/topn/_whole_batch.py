"""A top-N batch's change of its tops worked in Arrow, for ``ROW_NUMBER()``
(no ties kept) over rows that are all key (no ``row_key``).

The row path reads each touched partition's top before and after the
batch, a Python step per stored row, and compares the two as multisets.
Here the touched partitions' rows are read once, before the batch
(:meth:`~statestore.StateTable.scan_ranges`, one decode), in the row
path's order (partitions as they first appear in the batch, each in key
order). The batch's rows find their stored counts among them by key bytes,
the new counts are written, and the rows after the batch are those read
with the batch's changes laid over them, put back in that order by
partition and key bytes: no second read of what the batch just wrote.
Everything after is columnar: each row repeated by its count, its rank
within its partition, the rows ranked within ``[offset, offset + limit)``,
and the multiset difference of the two tops. It emits what the row path
emits, in its order: every row that left a top (``-D``), then every row
that entered one (``+I``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from encoding import key_equal_values
from operators._api.changelog import RowKind
from operators._api.operator import OperatorContext
from operators._api.relational import (
    counted_rows,
    key_tuples,
    report_unheld,
    run_starts,
    write_counts,
)
from statestore import StateTable

__all__ = ["top_n_batch"]

_SIGN, _BEFORE, _AFTER = "__sign", "__before", "__after"
#: Up to this many stored rows per touched partition, the whole table is
#: read at once rather than a read per partition.
_ROWS_PER_PARTITION = 16


def top_n_batch(
    ctx: OperatorContext,
    table: StateTable,
    rows: pa.Table,
    deltas: pa.Array,
    partition_columns: int,
    offset: int,
    limit: int,
    to_input: Sequence[int],
) -> None:
    """Apply a batch's net changes (``rows`` in the table's column order
    less the count, with their ``deltas``) to ``table`` and emit each
    touched partition's change of its top; ``to_input`` places the stored
    columns in the output's order."""
    rows = counted_rows(table, rows)
    partitions = _Partitions(rows, partition_columns)
    stored = pa.Table.from_batches([_touched(table, partitions)])
    before = _tops(stored, partition_columns, offset, limit)
    stored_keys = table.keys.encode_arrow(stored)
    row_keys = table.keys.encode_arrow(rows)
    at = pc.index_in(row_keys, value_set=stored_keys)
    found = pc.is_valid(at)
    held = pc.fill_null(stored.column(stored.num_columns - 1).take(at), 0).combine_chunks()
    if isinstance(deltas, pa.ChunkedArray):
        deltas = deltas.combine_chunks()
    counts = pc.add(held, deltas)
    write_counts(table, rows, found, counts)
    report_unheld(ctx, rows, counts, partition_columns)
    want = offset + limit
    now = _laid_over(stored, stored_keys, rows, row_keys, at, counts, partitions, want)
    after = _tops(now, partition_columns, offset, limit)
    left, entered = _difference(before, after)
    for kind, out in ((RowKind.DELETE, left), (RowKind.INSERT, entered)):
        if out.num_rows:
            ctx.emit_batch([out.column(i) for i in to_input], kind)


def _laid_over(
    stored: pa.Table,
    stored_keys: pa.Array,
    rows: pa.Table,
    row_keys: pa.Array,
    at: pa.Array,
    counts: pa.Array,
    partitions: _Partitions,
    want: int,
) -> pa.Table:
    """The touched partitions' rows after the batch that can be among the
    first ``want`` copies of their partition, as :func:`_touched` would read
    them now: ``stored`` (read before, with its key bytes) less the rows the
    batch changed (``rows``, found at ``at``), and those of them still held
    at their new ``counts``; partitions in the batch's order, each
    in key order (its rows' key bytes). A stored row the batch left with
    ``want`` copies of its partition's other left rows before it is not
    among them, as the batch's rows only push it further down: it is left
    out before the sort."""
    keep = np.ones(stored.num_rows, dtype=bool)
    keep[at.drop_null().to_numpy()] = False
    keep &= _copies_before(stored, keep, partitions.columns) < want
    kept = stored.filter(pa.array(keep))
    alive = pc.greater(counts, 0)
    changed = pa.Table.from_arrays([*rows.columns, counts], schema=stored.schema).filter(alive)
    ranks = [partitions.ranks(part) for part in (kept, changed)]
    order = pc.sort_indices(
        pa.table(
            {
                "rank": pa.concat_arrays([pa.array(r, pa.int64()) for r in ranks]),
                "key": pa.concat_arrays([stored_keys.filter(keep), row_keys.filter(alive)]),
            }
        ),
        sort_keys=[("rank", "ascending"), ("key", "ascending")],
    )
    return pa.concat_tables([kept, changed]).take(order)


def _copies_before(stored: pa.Table, keep: Any, partition_columns: int) -> Any:
    """Per row of ``stored`` (rows with their count last, each partition's
    together and in key order): how many copies of its partition's rows
    before it that ``keep`` keeps (a numpy array)."""
    counts = stored.column(stored.num_columns - 1).to_numpy(zero_copy_only=False)
    kept_counts = np.where(keep, counts, 0)
    through = np.cumsum(kept_counts)
    starts = run_starts(stored.columns[:partition_columns], stored.num_rows)
    first = np.flatnonzero(starts)
    at_start = (through - kept_counts)[first]
    return through - kept_counts - at_start[np.cumsum(starts) - 1]


class _Partitions:
    """The partitions a batch touches, in the order they first appear in it
    (the row path's order), and each row's partition's place in it."""

    def __init__(self, rows: pa.Table, columns: int) -> None:
        self.columns = columns
        self._rows = rows
        #: The partition key's values in that order, where it is one column:
        #: Arrow's ``unique`` keeps the order of first appearance.
        self.values: pa.Array | None = None
        if columns == 1:
            self.values = pc.unique(key_equal_values(rows.column(0).combine_chunks()))

    @functools.cached_property
    def keys(self) -> list[tuple[Any, ...]]:
        """The partition keys as tuples, in that order: made only for a read
        per partition, or where the key is more than one column."""
        if self.values is not None:
            return [(v,) for v in self.values.to_pylist()]
        rows = self._rows
        return list(dict.fromkeys(key_tuples(rows.columns[: self.columns], rows.num_rows)))

    @functools.cached_property
    def _rank_of(self) -> dict[tuple[Any, ...], int]:
        """Partition key -> its place in the batch's order."""
        return {p: i for i, p in enumerate(self.keys)}

    def ranks(self, rows: pa.Table) -> Any:
        """Each row's partition's place in the batch's order (a numpy array;
        ``rows`` all of touched partitions, each partition's together): one
        Arrow lookup where the key is one column, else one per run of a
        partition."""
        if self.values is not None:
            column = key_equal_values(rows.column(0).combine_chunks())
            at = pc.index_in(column, value_set=self.values, skip_nulls=False)
            return np.asarray(at.to_numpy(zero_copy_only=False), np.int64)
        rank_of = self._rank_of
        n = rows.num_rows
        starts = run_starts(rows.columns[: self.columns], n)
        first = np.flatnonzero(starts)
        keys = key_tuples(
            [c.take(pa.array(first)) for c in rows.columns[: self.columns]], len(first)
        )
        per_run = np.array([rank_of[k] for k in keys], dtype=np.int64)
        return per_run[np.cumsum(starts) - 1] if n else per_run


def _touched(table: StateTable, partitions: _Partitions) -> pa.RecordBatch:
    """The stored rows of ``partitions``, each partition's together and in
    key order, the partitions in the batch's order: a read per partition,
    or, when they are many of the table's rows and the partition key is one
    column, one read of the whole table matched in Arrow (a row read in a
    scan costs a small part of a read's own cost)."""
    wanted = partitions.values
    if wanted is None or table.row_count > _ROWS_PER_PARTITION * len(wanted):
        return table.scan_ranges([(p, None, None) for p in partitions.keys])
    stored = table.scan_batch()
    rank = pc.index_in(key_equal_values(stored.column(0)), value_set=wanted, skip_nulls=False)
    stored = stored.filter(pc.is_valid(rank))
    return stored.take(pc.sort_indices(rank.drop_null()))


def _tops(stored: pa.Table, partition_columns: int, offset: int, limit: int) -> pa.Table:
    """The rows ranked ``offset`` to ``offset + limit - 1`` in their
    partition, of ``stored`` (rows with their count last, each partition's
    rows together and in key order), each copy of a row on its own, the
    count left out."""
    counts = stored.column(stored.num_columns - 1).to_numpy(zero_copy_only=False)
    copies = np.repeat(np.arange(stored.num_rows, dtype=np.int64), np.maximum(counts, 0))
    rows = stored.select(range(stored.num_columns - 1)).take(copies)
    n = rows.num_rows
    if n == 0:
        return rows
    starts = run_starts(rows.columns[:partition_columns], n)
    first = np.flatnonzero(starts)
    rank = np.arange(n) - first[np.cumsum(starts) - 1]
    return rows.filter(pa.array((rank >= offset) & (rank < offset + limit)))


def _difference(before: pa.Table, after: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The rows of ``before`` not in ``after`` (as many copies as it has
    more), in ``before``'s order, and those of ``after`` not in ``before``,
    in ``after``'s."""
    names = [f"__c{j}" for j in range(before.num_columns)]
    both = pa.concat_tables([before, after.cast(before.schema)]).rename_columns(names)
    n, m = before.num_rows, after.num_rows
    position = np.arange(n + m, dtype=np.int64)
    in_before = position < n
    keys = pa.table({name: key_equal_values(both.column(name)) for name in names})
    keyed = keys.append_column(_SIGN, pa.array(np.where(in_before, 1, -1)))
    keyed = keyed.append_column(
        _BEFORE, pa.array(np.where(in_before, position, n + m), pa.int64())
    ).append_column(_AFTER, pa.array(np.where(in_before, n + m, position), pa.int64()))
    net = keyed.group_by(names, use_threads=False).aggregate(
        [(_SIGN, "sum"), (_BEFORE, "min"), (_AFTER, "min")]
    )
    sign = net.column(f"{_SIGN}_sum").to_numpy()
    out = []
    for more, at in ((sign > 0, f"{_BEFORE}_min"), (sign < 0, f"{_AFTER}_min")):
        where = net.column(at).to_numpy()[more]
        order = np.argsort(where, kind="stable")
        copies = np.repeat(where[order], np.abs(sign[more][order]))
        out.append(both.take(pa.array(copies)).rename_columns(before.column_names))
    return out[0], out[1]
