"""The results of a batch of built-in aggregates, column at a time in Arrow.

The same rules as ``GroupAggregate._finish`` (which serves custom
aggregates, one group at a time in Python): each touched group's stored
state (one multi-get), its new state from the folded deltas, its result
before and after, and one batch write and one emitted batch per row kind.
Per-row Python is what decides the speed of an operator; here there is
none but for a ``having`` filter.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from encoding import Row, arrow_equal
from operators._api.changelog import RowKind
from operators._api.operator import OperatorContext
from operators._api.relational import aligned, key_tuples, pylists, report_unheld
from operators.aggregate._functions import Aggregate, Kind
from statestore import StateTable

__all__ = [
    "SPECIALS",
    "ResultLayout",
    "Touched",
    "finish_in_arrow",
    "max_nan_greatest",
    "spark_above",
    "spark_order",
    "special_value",
    "stored_states",
]


class Touched:
    """A batch's effect on its groups (by group index, in key order): the
    folded batch, one row per group, and what the
    value columns' counts found."""

    def __init__(self, folded: pa.Table, groups: list[str]) -> None:
        self.folded = folded
        self._groups = groups
        #: min/max over a changelog: per aggregate position, the new extreme
        #: of each group that lost a value (found by a scan), and the extreme
        #: of the values each other group gained (to merge with its stored one).
        self.extremes: dict[int, tuple[dict[int, Any], dict[int, Any]]] = {}
        #: count(distinct): per aggregate position, group -> change of the count.
        self.distinct: dict[int, dict[int, int]] = {}
        self._states: tuple[pa.Table, pa.Table, pa.BooleanArray] | None = None

    def states(self, results: StateTable) -> tuple[pa.Table, pa.Table, pa.BooleanArray]:
        """:func:`stored_states` of every touched group, read once a batch:
        the batch writes the results table only at its end."""
        if self._states is None:
            self._states = stored_states(results, self.folded)
        return self._states

    def rows_after(self, results: StateTable) -> pa.Array | pa.ChunkedArray:
        """Each touched group's row count after the batch: its stored count
        (none for a new group) plus the batch's net rows. At zero or below
        the group is gone."""
        old = self.states(results)[1]
        stored = old.column(len(results.schema.primary_key))
        return pc.add(pc.fill_null(stored, 0), self.folded.column("__s_sum"))

    @functools.cached_property
    def keys(self) -> list[Row]:
        """The group keys as tuples."""
        return key_tuples([self.folded.column(g) for g in self._groups], self.folded.num_rows)

    @functools.cached_property
    def index(self) -> dict[Row, int]:
        """Group key -> group index."""
        return {k: i for i, k in enumerate(self.keys)}

    def positions(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> Any:
        """The group index of each row of ``columns`` (the group key columns
        of rows whose groups are all touched), as a numpy array: one Arrow
        hash lookup where the key is one column that Arrow compares as its
        key bytes do, else a lookup per row in :attr:`index`."""
        if len(columns) == 1 and arrow_equal(columns[0].type):
            groups = self.folded.column(self._groups[0])
            at = pc.index_in(columns[0], value_set=groups, skip_nulls=False)
            return np.asarray(at.to_numpy(zero_copy_only=False), np.int64)
        rows = len(columns[0]) if columns else 0
        index = self.index
        return np.fromiter((index[k] for k in key_tuples(columns, rows)), np.int64, rows)

    def column(self, name: str) -> list[Any]:
        """A folded column as a Python list."""
        return pylists([self.folded.column(name)])[0]


_SUMMED = (Kind.COUNT, Kind.SUM, Kind.AVG)
#: What a float sum over a changelog counts beside its finite sum, in this
#: order: NaN rows, +inf rows, -inf rows.
SPECIALS = ("nan", "pinf", "ninf")


@dataclass(frozen=True)
class ResultLayout:
    """Where a group's results row keeps what, and what its result is: built
    once by :class:`~operators.aggregate.GroupAggregate`, read by both ways
    of finishing a batch (:func:`finish_in_arrow`, and per group when an
    aggregate is custom)."""

    key_columns: tuple[str, ...]
    aggregates: tuple[Aggregate, ...]
    #: The result: the group's key columns, then one column per aggregate.
    output: pa.Schema
    #: Per aggregate, where its accumulator sits in a results row.
    accumulators: tuple[slice, ...]
    #: Per float sum / avg over a changelog, where its counts of NaN, +inf
    #: and -inf rows sit in a results row: at the end, nullable, so that a
    #: checkpoint written before them loads (its rows read them as 0).
    specials: Mapping[int, int]
    changelog: bool
    having: Callable[[Mapping[str, Any]], bool] | None
    #: Whether a changed result is retracted (``-U``) before its ``+U``.
    update_before: bool

    @property
    def keys(self) -> int:
        """How many key columns lead a results row."""
        return len(self.key_columns)


def finish_in_arrow(
    ctx: OperatorContext,
    results: StateTable,
    touched: Touched,
    layout: ResultLayout,
) -> None:
    """Write each ``touched`` group's new state and emit its result's
    change, as ``layout`` says (no ``-U`` of a changed result without
    ``update_before``, only its ``+U``)."""
    aggregates, output, specials = layout.aggregates, layout.output, layout.specials
    changelog, having, update_before = layout.changelog, layout.having, layout.update_before
    folded, extremes, distinct = touched.folded, touched.extremes, touched.distinct
    n = folded.num_rows
    state_schema = results.schema.columns
    k = len(results.schema.primary_key)
    keys, old, found = touched.states(results)
    rows = touched.rows_after(results)
    new_columns: list[pa.Array | pa.ChunkedArray] = [*keys.columns, rows]
    position = k + 1
    for i, agg in enumerate(aggregates):
        kind = agg.kind
        if kind is Kind.COUNT_STAR:
            continue
        if kind in _SUMMED:
            count = pc.add(
                _zeroed(old.column(position + (kind is not Kind.COUNT))),
                folded.column(f"__c{i}_sum"),
            )
            if kind is not Kind.COUNT:
                total = pc.add(_zeroed(old.column(position)), folded.column(f"__v{i}_sum"))
                zero = pa.scalar(0, total.type)
                # Without a non-null value left the sum is nothing, not the
                # rounding a float sum kept of what was retracted.
                new_columns.append(pc.if_else(pc.equal(count, 0), zero, total))
            new_columns.append(count)
        elif kind in (Kind.MIN, Kind.MAX):
            current = old.column(position)
            how = "min" if kind is Kind.MIN else "max"
            if not changelog:
                new_columns.append(_extreme(how, current, folded.column(f"__v{i}_{how}")))
            else:
                rescanned, gained = extremes[i]
                typ = current.type
                merged = _extreme(how, current, _spread(gained, n, typ))
                mask = pc.is_valid(_spread(dict.fromkeys(rescanned, True), n, pa.bool_()))
                new_columns.append(pc.if_else(mask, _spread(rescanned, n, typ), merged))
        else:  # COUNT_DISTINCT
            steps = pc.fill_null(_spread(distinct[i], n, pa.int64()), 0)
            new_columns.append(pc.add(_zeroed(old.column(position)), steps))
        position += _width(kind)
    for i, at in specials.items():
        for j, name in enumerate(SPECIALS):
            new_columns.append(
                pc.add(_zeroed(old.column(at + j)), folded.column(f"__{name}{i}_sum"))
            )
    new = pa.table(new_columns, schema=state_schema)
    alive = pc.greater(rows, 0)
    # A group holds counts, not rows: a retraction is known to be of a row
    # it does not hold when the group's row count would go below zero.
    report_unheld(ctx, keys, rows, k)
    old_result = _result(old, aggregates, output, k, specials)
    new_result = _result(new, aggregates, output, k, specials)
    old_visible, new_visible = found, alive
    if having is not None:
        old_visible = pc.and_(found, _passes(having, old_result, found))
        new_visible = pc.and_(alive, _passes(having, new_result, alive))
    changed = _differs(old_result, new_result)
    inserted = pc.and_(pc.invert(old_visible), new_visible)
    deleted = pc.and_(old_visible, pc.invert(new_visible))
    updated = pc.and_(pc.and_(old_visible, new_visible), changed)
    # State: new groups inserted, gone ones deleted, changed ones updated.
    results.insert_batch(new.filter(pc.and_(pc.invert(found), alive)))
    results.delete_keys(keys.filter(pc.and_(found, pc.invert(alive))))
    results.update_batch(new.filter(pc.and_(pc.and_(found, alive), _differs(old, new))))
    for row_kind, table in (
        (RowKind.DELETE, old_result.filter(deleted)),
        (RowKind.UPDATE_BEFORE, old_result.filter(updated) if update_before else None),
        (RowKind.UPDATE_AFTER, new_result.filter(updated)),
        (RowKind.INSERT, new_result.filter(inserted)),
    ):
        if table is not None and table.num_rows:
            ctx.emit_batch(table.columns, row_kind)


def _width(kind: Kind) -> int:
    """How many stored columns an aggregate's accumulator has (not custom)."""
    return 2 if kind in (Kind.SUM, Kind.AVG) else 1


def stored_states(
    results: StateTable, folded: pa.Table
) -> tuple[pa.Table, pa.Table, pa.BooleanArray]:
    """The group keys of ``folded`` as the results table's key columns, the
    groups' stored states at their places (null rows where none), and
    whether each was found: one batch read."""
    state_schema = results.schema.columns
    k = len(results.schema.primary_key)
    groups = folded.select([f"__g{j}" for j in range(k)])
    keys = groups.rename_columns(state_schema.names[:k]).cast(
        pa.schema([state_schema.field(j) for j in range(k)])
    )
    stored, found = results.get_batch(keys)
    return keys, aligned(stored, found, keys.num_rows), found


def _spread(values: Mapping[int, Any], n: int, typ: pa.DataType) -> pa.Array:
    """A column of ``n`` rows: ``values[g]`` at row ``g``, null elsewhere."""
    if not values:
        return pa.nulls(n, typ)
    rows = np.fromiter(values.keys(), np.int64, len(values))
    index = np.full(n, -1, np.int64)
    index[rows] = np.arange(len(values))
    taken = pa.array(index, mask=index < 0)
    return pa.array(list(values.values()), typ).take(taken)


def _zeroed(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.fill_null(column, pa.scalar(0, column.type))


def _extreme(how: str, a: Any, b: Any) -> Any:
    """The element-wise min (or max) of two columns, nulls left out, NaN
    above every value (Spark's order; Arrow's kernels skip NaN, which gives
    the min but not the max). Booleans and zoned timestamps, which Arrow's
    element-wise kernels do not take, are worked as their integers, which
    order alike."""
    typ = a.type
    if pa.types.is_boolean(typ) or (pa.types.is_timestamp(typ) and typ.tz is not None):
        whole = pa.int8() if pa.types.is_boolean(typ) else pa.int64()
        return pc.cast(_extreme(how, pc.cast(a, whole), pc.cast(b, whole)), typ)
    if how == "min":
        return pc.min_element_wise(a, b, skip_nulls=True)
    out = pc.max_element_wise(a, b, skip_nulls=True)
    if not pa.types.is_floating(out.type):
        return out
    nan = pc.or_(pc.fill_null(pc.is_nan(a), False), pc.fill_null(pc.is_nan(b), False))
    return pc.if_else(nan, pa.scalar(float("nan"), out.type), out)


def max_nan_greatest(table: pa.Table, value: str, flag: str) -> pa.Table:
    """``table`` with its hash-``max`` column ``value`` NaN where the group's
    ``any`` of is-NaN column ``flag`` holds, and ``flag`` dropped: Arrow's
    hash max skips NaN, Spark's max is NaN when a NaN is there. (Its hash min
    is already Spark's: NaN only when every value is NaN.)"""
    column = table.column(value)
    nan = pc.fill_null(table.column(flag), False)
    fixed = pc.if_else(nan, pa.scalar(float("nan"), column.type), column)
    where = table.column_names.index(value)
    return table.set_column(where, value, fixed).drop_columns([flag])


def spark_above(a: pa.Array, b: pa.Array) -> pa.Array:
    """Element-wise ``a > b`` of non-null values in Spark's order (NaN above
    every number and equal to itself, -0.0 equal to 0.0): Arrow's ``>``,
    with NaN over a number added for floats."""
    above = pc.greater(a, b)
    if not pa.types.is_floating(a.type):
        return above
    return pc.or_(above, pc.and_(pc.is_nan(a), pc.invert(pc.is_nan(b))))


def spark_order(value: Any) -> tuple[bool, Any]:
    """A sort key of a non-null value in Spark's order: NaN above every
    number (and equal to itself), -0.0 equal to 0.0 as ``==`` has it."""
    nan = isinstance(value, float) and value != value
    return (nan, 0.0 if nan else value)


def _result(
    state: pa.Table,
    aggregates: Sequence[Aggregate],
    output: pa.Schema,
    k: int,
    specials: Mapping[int, int],
) -> pa.Table:
    """The output rows of stored states (null rows for none)."""
    columns = [state.column(j) for j in range(k)]
    position = k + 1
    for i, agg in enumerate(aggregates):
        kind = agg.kind
        if kind is Kind.COUNT_STAR:
            columns.append(state.column(k))
            continue
        first = state.column(position)
        if kind is Kind.SUM:
            count = state.column(position + 1)
            total = _with_specials(state, specials.get(i), first)
            columns.append(pc.if_else(pc.greater(count, 0), total, pa.scalar(None, first.type)))
        elif kind is Kind.AVG:
            count = state.column(position + 1)
            mean = pc.divide(pc.cast(first, pa.float64()), pc.cast(count, pa.float64()))
            mean = _with_specials(state, specials.get(i), mean)
            columns.append(pc.if_else(pc.greater(count, 0), mean, pa.scalar(None, pa.float64())))
        else:
            columns.append(first)
        position += _width(kind)
    return pa.table(columns, schema=output)


def _with_specials(state: pa.Table, at: int | None, finite: Any) -> Any:
    """A float sum's (or mean's) value given its NaN, +inf and -inf counts at
    ``at``: NaN with a NaN or both infinities, else the infinity there is,
    else ``finite``, which the finite values give."""
    if at is None:
        return finite
    nan, pinf, ninf = (pc.greater(_zeroed(state.column(at + j)), 0) for j in range(3))
    typ = pa.float64()
    out = pc.if_else(ninf, pa.scalar(float("-inf"), typ), finite)
    out = pc.if_else(pinf, pa.scalar(float("inf"), typ), out)
    return pc.if_else(pc.or_(nan, pc.and_(pinf, ninf)), pa.scalar(float("nan"), typ), out)


def special_value(counts: Sequence[int | None]) -> float | None:
    """The value of a float sum or mean that its NaN, +inf and -inf counts
    decide (``None``: none, its finite part is its value)."""
    nan, pinf, ninf = ((c or 0) > 0 for c in counts)
    if nan or (pinf and ninf):
        return float("nan")
    if pinf:
        return float("inf")
    if ninf:
        return float("-inf")
    return None


def _differs(a: pa.Table, b: pa.Table) -> pa.ChunkedArray:
    """Per row, whether any column differs (a null differs from a value, a
    NaN equals a NaN)."""
    out = None
    for x, y in zip(a.columns, b.columns, strict=True):
        valid_x, valid_y = pc.is_valid(x), pc.is_valid(y)
        unequal = pc.fill_null(pc.not_equal(x, y), False)
        if pa.types.is_floating(x.type):
            both_nan = pc.and_(pc.fill_null(pc.is_nan(x), False), pc.fill_null(pc.is_nan(y), False))
            unequal = pc.and_(unequal, pc.invert(both_nan))
        column = pc.or_(pc.not_equal(valid_x, valid_y), unequal)
        out = column if out is None else pc.or_(out, column)
    assert out is not None
    return out


def _passes(having: Callable[[Mapping[str, Any]], bool], result: pa.Table, where: Any) -> pa.Array:
    """``having`` of each result row (``False`` where ``where`` does not hold)."""
    names = result.column_names
    present = pc.fill_null(where, False).to_pylist()
    rows = zip(*(c.to_pylist() for c in result.columns), strict=True)
    return pa.array(
        [
            bool(p) and bool(having(dict(zip(names, r, strict=True))))
            for p, r in zip(present, rows, strict=True)
        ],
        pa.bool_(),
    )
