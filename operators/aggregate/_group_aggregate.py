"""``SELECT keys, aggregates FROM input GROUP BY keys [HAVING ...]`` over a
changelog or an append stream, with an upsert changelog out.

State (docs/operators/aggregate.md):

- ``results``: one row per group, its key, its row count and each
  aggregate's accumulator (a count, a sum and a count, the current min);
- ``values_<col>``: ``(group, value) -> rows`` of a column that a
  ``count(distinct)`` or a ``min`` / ``max`` over a changelog aggregates,
  one table for all of them (Flink's ``MapView`` of value counts in its
  min / max with retraction): when the current min is retracted, the next
  one is the least value left in the group; a value's count leaving or
  returning to zero moves the group's distinct count.

A batch is folded first: every aggregate but a custom one is a sum of signed
deltas, worked per group in Arrow; each touched group's state is read once,
written once, and its result emitted only if it changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from encoding import KeyColumn, TableSchema, key_equal_values
from operators._api.changelog import non_inserts
from operators._api.operator import Operator, OperatorContext
from operators._api.relational import (
    Pending,
    add_counts,
    ascending,
    check_names,
    net_changes,
    pylists,
    report_unheld,
    signs,
)
from operators.aggregate._functions import Aggregate, Kind
from operators.aggregate._per_group import custom_accumulators, finish_per_group
from operators.aggregate._results import (
    SPECIALS,
    ResultLayout,
    Touched,
    finish_in_arrow,
    max_nan_greatest,
    spark_above,
)
from operators.errors import InputError
from statestore import ConsistencyMode, StateTable

__all__ = ["GroupAggregate"]


#: Milliseconds of the batch's fold and state writes at its close (the join's name).
STORE_TIME = "storeTimeMs"
_ROWS = "__rows"
_VALUE = "__value"
_COUNT = "__n"
_SUMMED = (Kind.COUNT, Kind.SUM, Kind.AVG)


class GroupAggregate(Operator):
    """A SQL group aggregate with retractions.

    ``schema`` is the input's; ``group_by`` its group key columns (what the
    query is partitioned by, :attr:`key_columns`); ``aggregates`` the output
    columns after the keys (see :class:`Aggregate`). ``having`` keeps the
    groups whose result (a mapping of output column to value) it accepts.
    ``changelog=False`` takes an append stream only (a retraction is an
    error), which needs no value counts for ``min`` / ``max``.

    The output is an upsert changelog keyed by the group: ``+I`` when a group
    appears (or starts to pass ``having``), ``-U`` / ``+U`` when its result
    changes, ``-D`` when its last row is retracted (or it stops passing
    ``having``); nothing for a group whose result the batch left as it was.
    ``update_before=False`` leaves out the ``-U`` rows, as Flink's group
    aggregate does when no consumer needs them (``generateUpdateBefore``)
    and as Spark's update mode writes: a ``+U`` then replaces its group's
    row (:attr:`output_upsert_key` is the group key), and a pipeline refuses
    a stage that reads it and needs retractions.
    """

    consistency = ConsistencyMode.UNCHECKED

    def __init__(
        self,
        schema: pa.Schema,
        group_by: Sequence[str],
        aggregates: Sequence[Aggregate],
        having: Callable[[Mapping[str, Any]], bool] | None = None,
        changelog: bool = True,
        name: str = "group_aggregate",
        update_before: bool = True,
    ) -> None:
        if not group_by:
            raise InputError(
                "name at least one group_by column (for a global aggregate, group by a "
                "constant column)"
            )
        check_names(schema, group_by, "group_by")
        untyped = [k for k in group_by if pa.types.is_null(schema.field(k).type)]
        if untyped:
            raise InputError(
                f"group_by columns {untyped} are of Arrow's null type: every group key "
                "would be null; give the column the type of the values it will hold"
            )
        if not aggregates:
            raise InputError("give at least one aggregate")
        names = [*group_by, *(a.name for a in aggregates)]
        if len(set(names)) != len(names):
            raise InputError(f"output columns {names} name a column twice")
        aggregated = sorted({a.column for a in aggregates if a.column is not None})
        check_names(schema, aggregated, "aggregate")
        self.name = name
        self.key_columns = tuple(group_by)
        self.partition_keys = (self.key_columns,)
        self.aggregates = list(aggregates)
        self.having = having
        self.changelog = changelog
        self.update_before = update_before
        self.output_upsert_key = None if update_before else tuple(group_by)
        self.inputs = [schema]
        self._pending = Pending()
        key_fields = [schema.field(k) for k in group_by]
        input_types = [
            None if a.column is None else schema.field(a.column).type for a in aggregates
        ]
        self.output = pa.schema(
            [
                *key_fields,
                *(
                    pa.field(a.name, a.result_type(t))
                    for a, t in zip(aggregates, input_types, strict=True)
                ),
            ]
        )
        state: list[pa.Field] = [*key_fields, pa.field(_ROWS, pa.int64(), nullable=False)]
        accumulators: list[slice] = []
        for i, (agg, t) in enumerate(zip(aggregates, input_types, strict=True)):
            fields = _acc_fields(i, agg, t)
            accumulators.append(slice(len(state), len(state) + len(fields)))
            state.extend(fields)
        specials: dict[int, int] = {}
        for i, (agg, t) in enumerate(zip(aggregates, input_types, strict=True)):
            if changelog and agg.kind in (Kind.SUM, Kind.AVG) and pa.types.is_floating(t):
                specials[i] = len(state)
                state.extend(pa.field(f"__a{i}_{n}", pa.int64()) for n in SPECIALS)
        self.layout = ResultLayout(
            key_columns=self.key_columns,
            aggregates=tuple(aggregates),
            output=self.output,
            accumulators=tuple(accumulators),
            specials=specials,
            changelog=changelog,
            having=having,
            update_before=update_before,
        )
        tables = [TableSchema(1, state, list(group_by), name="results")]
        #: Per value column that a min / max over a changelog or a
        #: count(distinct) aggregates: the name of its value counts table.
        self._values: dict[str, str] = {}
        for agg in aggregates:
            column = agg.column
            assert column is not None or agg.kind is Kind.COUNT_STAR
            counted = agg.kind is Kind.COUNT_DISTINCT or (
                agg.kind in (Kind.MIN, Kind.MAX) and changelog
            )
            if not counted or column is None or column in self._values:
                continue
            self._values[column] = table_name = f"values_{column}"
            tables.append(
                TableSchema(
                    len(tables) + 1,
                    [
                        *key_fields,
                        pa.field(_VALUE, schema.field(column).type),
                        pa.field(_COUNT, pa.int64(), nullable=False),
                    ],
                    [*group_by, KeyColumn(_VALUE)],
                    name=table_name,
                )
            )
        self.tables = tables

    # -- a batch ------------------------------------------------------------------------

    def rejected_rows(self, batch: pa.RecordBatch, side: int) -> pa.Array | None:
        """Built for an append-only input, a retraction is a row it cannot take."""
        if self.changelog:
            return None
        return non_inserts(batch, "a retraction in an append-only input (changelog=False)")

    def open(self, ctx: OperatorContext) -> None:
        """A micro-batch begins: nothing gathered yet."""
        self._pending.start(ctx)

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Check a chunk of the micro-batch's rows and gather it: the batch
        is folded as a whole at :meth:`close`."""
        signs(batch, self.name, self.changelog)  # bad row kinds fail here
        self._pending.add(ctx, batch)

    def close(self, ctx: OperatorContext) -> None:
        """Fold the micro-batch per group, update the state of each group it
        touched once, and emit the results that changed; the time it takes
        counts in ``storeTimeMs`` (the runner's ``allUpdatesTimeMs`` times
        only the gathering)."""
        started = time.perf_counter_ns()
        self._close(ctx)
        ctx.count(STORE_TIME, (time.perf_counter_ns() - started) // 1_000_000)

    def _close(self, ctx: OperatorContext) -> None:
        batch = self._pending.take(ctx)
        if batch is None:
            return
        sign = signs(batch, self.name, self.changelog)
        touched = self._fold(batch, sign)
        results = ctx.table("results")
        for column, table_name in self._values.items():
            self._apply_values(ctx, ctx.table(table_name), batch, sign, column, touched)
        self._clear_emptied(ctx, touched)
        if not any(a.kind is Kind.CUSTOM for a in self.aggregates):
            finish_in_arrow(ctx, results, touched, self.layout)
            return
        stored = results.get_rows(touched.keys)
        customs = custom_accumulators(self.layout, batch, sign, touched, stored)
        finish_per_group(self.layout, ctx, results, touched, stored, customs)

    def _fold(self, batch: pa.RecordBatch, sign: pa.Array) -> Touched:
        """The touched groups, in key order, with each summed
        aggregate's delta and each append-only min / max's batch extreme."""
        columns: dict[str, pa.Array] = {
            f"__g{j}": key_equal_values(batch.column(k)) for j, k in enumerate(self.key_columns)
        }
        columns["__s"] = sign
        spec: list[tuple[str, str]] = [("__s", "sum")]
        nans: list[int] = []  # append-only float maxima: Arrow's hash max skips NaN
        for i, agg in enumerate(self.aggregates):
            if agg.kind in _SUMMED:
                assert agg.column is not None
                column = batch.column(agg.column)
                columns[f"__c{i}"] = pc.if_else(pc.is_valid(column), sign, 0)
                spec.append((f"__c{i}", "sum"))
                if agg.kind is not Kind.COUNT:
                    kind = _sum_type(column.type)
                    values = pc.fill_null(pc.cast(column, kind), pa.scalar(0, kind))
                    if i in self.layout.specials:
                        # The finite values are summed; NaN and each infinity
                        # are counted, so that a retraction takes them back.
                        for name, rows in zip(SPECIALS, _special_rows(values), strict=True):
                            columns[f"__{name}{i}"] = pc.if_else(rows, sign, 0)
                            spec.append((f"__{name}{i}", "sum"))
                        values = pc.if_else(pc.is_finite(values), values, 0.0)
                    columns[f"__v{i}"] = pc.multiply(values, pc.cast(sign, kind))
                    spec.append((f"__v{i}", "sum"))
            elif agg.kind in (Kind.MIN, Kind.MAX) and not self.changelog:
                assert agg.column is not None
                column = batch.column(agg.column)
                columns[f"__v{i}"] = column
                spec.append((f"__v{i}", "min" if agg.kind is Kind.MIN else "max"))
                if agg.kind is Kind.MAX and pa.types.is_floating(column.type):
                    nans.append(i)
                    columns[f"__nan{i}"] = pc.is_nan(column)
                    spec.append((f"__nan{i}", "any"))
        groups = [f"__g{j}" for j in range(self.layout.keys)]
        folded = pa.table(columns).group_by(groups, use_threads=False).aggregate(spec)
        for i in nans:
            folded = max_nan_greatest(folded, f"__v{i}_max", f"__nan{i}_any")
        # In key order, the groups' reads and writes find their places in
        # RocksDB near the last one: a multi-get of sorted keys takes about
        # half the time of one of keys in arrival order.
        if folded.num_rows > 1:
            folded = folded.sort_by([(g, "ascending") for g in groups])
        return Touched(folded, groups)

    def _apply_values(
        self,
        ctx: OperatorContext,
        table: StateTable,
        batch: pa.RecordBatch,
        sign: pa.Array,
        column: str,
        touched: Touched,
    ) -> None:
        """Apply the batch to a value column's counts, ``(group, value) ->
        rows``, and from them work out its min / max and count(distinct):

        - a min / max is the batch's new values against the stored extreme,
          or, for a group that lost it, the least (min) or greatest (max)
          value left once the batch applies (:meth:`_ends`, read before the
          batch is written);
        - a value whose count leaves zero adds one to its group's distinct
          count, one whose count returns to zero takes one away.

        A retraction of a value the group does not hold is reported to the
        stage's policy (``report_unheld``)."""
        arrays = [*(batch.column(k) for k in self.key_columns), batch.column(column)]
        net = ascending(net_changes(arrays, sign, pc.is_valid(batch.column(column))))
        extremes = [
            i
            for i, agg in enumerate(self.aggregates)
            if agg.column == column and agg.kind in (Kind.MIN, Kind.MAX) and self.changelog
        ]
        rescans, won = self._lost_extremes(ctx, net, extremes, touched) if extremes else ({}, None)
        needed = np.unique(np.concatenate([np.empty(0, np.int64), *rescans.values()])).tolist()
        rows = pa.table(net.columns[:-1], names=table.schema.columns.names[:-1])
        read = None
        if needed:
            # The groups' rows, read before the batch is written (so none of
            # its writes is merged over the read): for their new extremes,
            # and the counts of the batch's rows in them, not looked up again.
            stored = table.scan_prefixes([touched.keys[g] for g in needed])
            wanted = np.zeros(touched.folded.num_rows, dtype=bool)
            wanted[needed] = True
            under = wanted[touched.positions(net.columns[: self.layout.keys])]
            read = (stored, under)
        ends = self._ends(touched, net, read)
        before, after = add_counts(table, rows, net.column("__s_sum"), read)
        report_unheld(ctx, rows, after, self.layout.keys)
        for i, at in rescans.items():
            assert won is not None
            is_min = self.aggregates[i].kind is Kind.MIN
            rescanned = {g: ends.get(g, (None, None))[0 if is_min else 1] for g in at.tolist()}
            gained, values = won[0], pylists([won[1] if is_min else won[2]])[0]
            touched.extremes[i] = (
                rescanned,
                {g: v for g, v in zip(gained.tolist(), values, strict=True) if g not in rescanned},
            )
        if any(a.kind is Kind.COUNT_DISTINCT and a.column == column for a in self.aggregates):
            change = self._distinct_steps(rows, before, after, touched)
            for i, agg in enumerate(self.aggregates):
                if agg.kind is Kind.COUNT_DISTINCT and agg.column == column:
                    touched.distinct[i] = change

    def _clear_emptied(self, ctx: OperatorContext, touched: Touched) -> None:
        """Delete what the value columns' counts still hold of the groups
        whose row count the batch left at zero or below (the results table
        holds no row of them), as Flink clears a group's accumulators then.
        On a clean changelog nothing is left by then; after a retraction of
        a value a group did not hold (counted when it came), its row count
        falls while its counts stay, and what they hold would be the min,
        max and distinct count of the group's next rows."""
        if not self._values:
            return
        k = self.layout.keys
        rows = touched.rows_after(ctx.table("results"))
        emptied = np.flatnonzero(pc.less_equal(rows, 0).to_numpy(zero_copy_only=False))
        if not len(emptied):
            return
        prefixes = [touched.keys[g] for g in emptied.tolist()]
        for table_name in self._values.values():
            table = ctx.table(table_name)
            left = table.scan_prefixes(prefixes)
            if left.num_rows:
                table.delete_keys(left.select(range(k + 1)))

    def _lost_extremes(
        self, ctx: OperatorContext, net: pa.Table, extremes: list[int], touched: Touched
    ) -> tuple[dict[int, np.ndarray], tuple[np.ndarray, pa.Array, pa.Array]]:
        """Of the min / max aggregates ``extremes`` (indices) over one
        column: per aggregate, the touched groups (indices) that lost a
        value not strictly beyond their stored extreme, and need a rescan;
        and the groups that gained values, with the least and greatest
        value each gained."""
        groups = [f"__k{j}" for j in range(self.layout.keys)]
        value = f"__k{self.layout.keys}"
        delta = net.column("__s_sum")
        spans = []
        for rows in (net.filter(pc.less(delta, 0)), net.filter(pc.greater(delta, 0))):
            span = _spans(rows, groups, value)
            at = touched.positions([span.column(g) for g in groups])
            spans.append((at, span.column(f"{value}_min"), span.column(f"{value}_max")))
        (lost, lost_min, lost_max), won = spans
        # Compare what each group lost with its stored extreme.
        stored = touched.states(ctx.table("results"))[1].take(pa.array(lost, pa.int64()))
        rescans: dict[int, np.ndarray] = {}
        for i in extremes:
            current = stored.column(self.layout.accumulators[i].start).combine_chunks()
            beyond = (
                spark_above(lost_min, current)
                if self.aggregates[i].kind is Kind.MIN
                else spark_above(current, lost_max)
            )
            kept = pc.fill_null(beyond, False).to_numpy(zero_copy_only=False)
            rescans[i] = lost[~kept]
        return rescans, won

    def _ends(
        self, touched: Touched, net: pa.Table, read: tuple[pa.RecordBatch, Any] | None
    ) -> dict[int, tuple[Any, Any]]:
        """Of each rescanned group (``read``: the rows of a value column's
        counts read for them, and which of the batch's ``net`` changes fall
        in them) left holding a value once the changes apply: its least and
        greatest value. The changes are added to the rows read in Arrow: a
        value stays while its count is above zero, as ``add_counts`` keeps
        it."""
        if read is None:
            return {}
        k = self.layout.keys
        names = net.column_names
        stored, under = read
        changes = net.filter(pa.array(under))
        rows = pa.concat_tables(
            [pa.table(stored.columns, names=names), pa.table(changes.columns, names=names)]
        )
        counted = rows.group_by(names[:-1], use_threads=False).aggregate([(names[-1], "sum")])
        alive = counted.filter(pc.greater(counted.column(f"{names[-1]}_sum"), 0))
        value = names[k]
        ends = _spans(alive, names[:k], value)
        at = touched.positions([ends.column(g) for g in names[:k]])
        low, high = pylists([ends.column(f"{value}_min"), ends.column(f"{value}_max")])
        return dict(zip(at.tolist(), zip(low, high, strict=True), strict=True))

    def _distinct_steps(
        self, rows: pa.Table, before: pa.Array, after: pa.Array, touched: Touched
    ) -> dict[int, int]:
        """Per touched group (index) whose count(distinct) the batch moved:
        by how much, from each value's count ``before`` and ``after`` it."""
        # +1 where a value's count leaves zero, -1 where it returns to it.
        step = pc.subtract(
            pc.cast(pc.greater(after, 0), pa.int64()), pc.cast(pc.greater(before, 0), pa.int64())
        )
        moved = pc.not_equal(step, 0)
        groups = touched.positions(rows.filter(moved).columns[: self.layout.keys])
        up = step.filter(moved).to_numpy(zero_copy_only=False) > 0
        n = touched.folded.num_rows
        steps = np.bincount(groups[up], minlength=n) - np.bincount(groups[~up], minlength=n)
        changed = np.flatnonzero(steps)
        return dict(zip(changed.tolist(), steps[changed].tolist(), strict=True))


def _spans(rows: pa.Table, groups: Sequence[str], value: str) -> pa.Table:
    """Per group of ``rows`` (its key columns ``groups``): the least and the
    greatest of its column ``value`` (``<value>_min``, ``<value>_max``), in
    Spark's order: NaN above every number."""
    spec = [(value, "min"), (value, "max")]
    floating = pa.types.is_floating(rows.column(value).type)
    if floating:
        rows = rows.append_column("__nan", pc.is_nan(rows.column(value)))
        spec.append(("__nan", "any"))
    span = rows.group_by(list(groups), use_threads=False).aggregate(spec)
    return max_nan_greatest(span, f"{value}_max", "__nan_any") if floating else span


def _acc_fields(i: int, agg: Aggregate, input_type: pa.DataType | None) -> list[pa.Field]:
    """The stored accumulator of aggregate ``i``."""
    n = pa.field(f"__a{i}_n", pa.int64(), nullable=False)
    if agg.kind is Kind.COUNT_STAR:
        return []
    if agg.kind in (Kind.COUNT, Kind.COUNT_DISTINCT):
        return [n]
    assert input_type is not None
    if agg.kind in (Kind.SUM, Kind.AVG):
        return [pa.field(f"__a{i}_sum", _sum_type(input_type), nullable=False), n]
    if agg.kind in (Kind.MIN, Kind.MAX):
        return [pa.field(f"__a{i}_v", input_type)]
    assert agg.function is not None
    return [
        pa.field(f"__a{i}_{f.name}", f.type, f.nullable)
        for f in agg.function.state_fields(input_type)
    ]


def _special_rows(values: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Which rows are NaN, +inf, -inf (in the order of ``SPECIALS``)."""
    return (
        pc.is_nan(values),
        pc.equal(values, float("inf")),
        pc.equal(values, float("-inf")),
    )


def _sum_type(input_type: pa.DataType) -> pa.DataType:
    """What a sum of ``input_type`` adds up in: ``bigint`` or ``double``."""
    return pa.float64() if pa.types.is_floating(input_type) else pa.int64()
