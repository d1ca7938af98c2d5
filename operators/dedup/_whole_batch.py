"""Deduplication of a whole batch in Arrow, for the common case: an append
stream on processing time, folded per key (mini-batch), no state TTL.

There each key's fold keeps one row (its first or its last arrival), and
the rules of ``_rules`` reduce to what one comparison with the stored row
decides, for every key at once:

- keep first (``first_on_proctime``): a key not stored emits its first row
  as ``+I`` and is stored; any other row is a duplicate;
- keep last (``last_on_proctime`` with a flag): a key not stored emits
  ``+I``; one whose stored row equals the kept row emits nothing; any other
  emits ``-U`` stored (with update-before) and ``+U`` kept.

Rows come out grouped by kind, as the aggregate's Arrow path emits them:
every ``-U``, then every ``+U``, then every ``+I``, each group in the order of
the keys' first arrivals; so per key the order is the row path's. The
counters are those the row path counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators._api.changelog import RowKind
from operators._api.operator import OperatorContext
from statestore import StateTable

__all__ = ["dedup_batch"]

_POS = "__pos"


def dedup_batch(
    ctx: OperatorContext,
    table: StateTable,
    batch: pa.RecordBatch,
    key: Sequence[str],
    names: Sequence[str],
    keep_last: bool,
    update_before: bool,
    counters: tuple[str, str, str, str],
) -> None:
    """Deduplicate ``batch`` (insert-only; its columns ``names`` are the
    output's) against ``table`` (the stored row, or for keep-first the key,
    of each key) and emit the result.
    ``counters`` names the dropped, unknown, identical and folded counts."""
    dropped, unknown, identical, folded = counters
    n = batch.num_rows
    positions = pa.array(np.arange(n, dtype=np.int64))
    indexed = pa.Table.from_batches([batch]).select(list(key)).append_column(_POS, positions)
    grouped = indexed.group_by(list(key), use_threads=False).aggregate(
        [(_POS, "min"), (_POS, "max")]
    )
    # Keys in the order of their first arrival, as the row path folds them.
    grouped = grouped.take(pc.sort_indices(grouped.column(f"{_POS}_min")))
    kept_at = grouped.column(f"{_POS}_max" if keep_last else f"{_POS}_min").combine_chunks()
    kept = batch.select(names).take(kept_at)
    keys = kept.select(list(key))
    stored, found = table.get_batch(keys)
    new = pc.invert(found)
    inserted = kept.filter(new)
    if not keep_last:
        _emit(ctx, inserted, RowKind.INSERT)
        if inserted.num_rows:
            table.insert_batch(inserted.select(list(key)))
        counts = {dropped: n - inserted.num_rows, unknown: 0, identical: 0, folded: 0}
    else:
        old = kept.filter(found)
        changed = pc.invert(_equal_rows(old, stored))
        after = old.filter(changed)
        if update_before:
            _emit(ctx, stored.filter(changed), RowKind.UPDATE_BEFORE)
        _emit(ctx, after, RowKind.UPDATE_AFTER)
        _emit(ctx, inserted, RowKind.INSERT)
        if after.num_rows:
            table.update_batch(after)
        if inserted.num_rows:
            table.insert_batch(inserted)
        counts = {
            dropped: 0,
            unknown: 0,
            identical: old.num_rows - after.num_rows,
            folded: n - kept.num_rows,
        }
    for name, value in counts.items():
        ctx.count(name, value)


def _equal_rows(a: pa.RecordBatch, b: pa.RecordBatch) -> pa.BooleanArray:
    """Per row, whether ``a``'s and ``b``'s rows are equal as Python tuples
    of their values are (a null equals a null; NaN equals nothing)."""
    same = pa.array(np.ones(a.num_rows, dtype=bool))
    for name in a.schema.names:
        x, y = a.column(name), b.column(name)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        equal = pc.fill_null(pc.equal(x, y), False)
        same = pc.and_(same, pc.or_(equal, both_null))
    return same


def _emit(ctx: OperatorContext, rows: pa.Table | pa.RecordBatch, kind: RowKind) -> None:
    if rows.num_rows:
        ctx.emit_batch(rows.columns, kind)
