"""The results of a batch group by group in Python: the path of an
aggregate with custom aggregates, whose accumulators only Python can work.
The same rules as ``_results.finish_in_arrow``, which the built-in
aggregates take; the differential tests run both against SQL."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from encoding import Row
from operators._api.changelog import RowKind
from operators._api.metrics import UNKNOWN_RETRACTIONS
from operators._api.operator import OperatorContext
from operators._api.relational import key_tuples
from operators.aggregate._functions import Kind
from operators.aggregate._results import (
    SPECIALS,
    ResultLayout,
    Touched,
    spark_order,
    special_value,
)
from statestore import StateTable

__all__ = ["custom_accumulators", "finish_per_group"]

_SUMMED = (Kind.COUNT, Kind.SUM, Kind.AVG)


def custom_accumulators(
    layout: ResultLayout,
    batch: pa.RecordBatch,
    sign: pa.Array,
    touched: Touched,
    stored: list[Row | None],
) -> dict[int, dict[int, tuple[Any, ...]]]:
    """Each custom aggregate's new accumulator per touched group: its
    stored one (or ``init()``), with the batch's rows accumulated or
    retracted in batch order."""
    customs = [i for i, a in enumerate(layout.aggregates) if a.kind is Kind.CUSTOM]
    if not customs:
        return {}
    groups = [
        touched.index[k]
        for k in key_tuples([batch.column(c) for c in layout.key_columns], batch.num_rows)
    ]
    steps = sign.to_pylist()
    out: dict[int, dict[int, tuple[Any, ...]]] = {}
    for i in customs:
        agg = layout.aggregates[i]
        function = agg.function
        assert function is not None and agg.column is not None
        accs: dict[int, tuple[Any, ...]] = {}
        values = batch.column(agg.column).to_pylist()
        for group, step, value in zip(groups, steps, values, strict=True):
            acc = accs.get(group)
            if acc is None:
                row = stored[group]
                acc = function.init() if row is None else tuple(row[layout.accumulators[i]])
            accs[group] = (
                function.accumulate(acc, value) if step > 0 else function.retract(acc, value)
            )
        out[i] = accs
    return out


def finish_per_group(
    layout: ResultLayout,
    ctx: OperatorContext,
    results: StateTable,
    touched: Touched,
    stored: list[Row | None],
    customs: dict[int, dict[int, tuple[Any, ...]]],
) -> None:
    """Write each touched group's new state and emit its result's change."""
    out: dict[RowKind, list[Row]] = {k: [] for k in RowKind}
    unknown = 0
    deltas = {n: touched.column(n) for n in touched.folded.column_names if not n.startswith("__g")}
    for group, (key, old) in enumerate(zip(touched.keys, stored, strict=True)):
        rows = (0 if old is None else old[layout.keys]) + deltas["__s_sum"][group]
        old_result = None if old is None else _visible(layout, _result(layout, old))
        if rows <= 0:
            unknown -= min(rows, 0)
            if old is not None:
                results.delete(old)
            if old_result is not None:
                out[RowKind.DELETE].append(old_result)
            continue
        new = (
            *key,
            rows,
            *_accumulators(layout, group, touched, deltas, old, customs),
            *_specials(layout, group, deltas, old),
        )
        if old is None:
            results.insert(new)
        elif new != old:
            results.update(old, new)
        new_result = _visible(layout, _result(layout, new))
        if old_result is None:
            if new_result is not None:
                out[RowKind.INSERT].append(new_result)
        elif new_result is None:
            out[RowKind.DELETE].append(old_result)
        elif not _same(old_result, new_result):
            if layout.update_before:
                out[RowKind.UPDATE_BEFORE].append(old_result)
            out[RowKind.UPDATE_AFTER].append(new_result)
    if unknown:
        ctx.count(UNKNOWN_RETRACTIONS, unknown)
    # Groups are independent: each kind goes out as one batch, a group's
    # -U before its +U.
    for kind in (RowKind.DELETE, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.INSERT):
        rows_out = out[kind]
        if rows_out:
            columns = list(zip(*rows_out, strict=True))
            ctx.emit_batch(
                [pa.array(list(c), f.type) for c, f in zip(columns, layout.output, strict=True)],
                kind,
            )


def _accumulators(
    layout: ResultLayout,
    group: int,
    touched: Touched,
    deltas: dict[str, list[Any]],
    old: Row | None,
    customs: dict[int, dict[int, tuple[Any, ...]]],
) -> list[Any]:
    """A group's accumulators after the batch, flattened as stored."""
    out: list[Any] = []
    for i, agg in enumerate(layout.aggregates):
        acc: tuple[Any, ...] = () if old is None else tuple(old[layout.accumulators[i]])
        kind = agg.kind
        if kind is Kind.COUNT_STAR:
            continue
        if kind in _SUMMED:
            count = (acc[-1] if acc else 0) + deltas[f"__c{i}_sum"][group]
            if kind is Kind.COUNT:
                out.append(count)
                continue
            total = (acc[0] if acc else 0) + deltas[f"__v{i}_sum"][group]
            # Without a non-null value left the sum is nothing, not the
            # rounding a float sum kept of what was retracted.
            out.extend((total if count else type(total)(), count))
        elif kind in (Kind.MIN, Kind.MAX):
            current = acc[0] if acc else None
            if not layout.changelog:
                how = "min" if kind is Kind.MIN else "max"
                out.append(_pick(kind, current, deltas[f"__v{i}_{how}"][group]))
                continue
            rescanned, added = touched.extremes[i]
            if group in rescanned:
                out.append(rescanned[group])
            else:
                out.append(_pick(kind, current, added.get(group)))
        elif kind is Kind.COUNT_DISTINCT:
            out.append((acc[0] if acc else 0) + touched.distinct[i].get(group, 0))
        else:
            custom = customs[i].get(group)
            out.extend(acc if custom is None else custom)
    return out


def _specials(
    layout: ResultLayout, group: int, deltas: dict[str, list[Any]], old: Row | None
) -> list[int]:
    """A group's NaN, +inf and -inf counts of each float sum / avg after the
    batch (an older state's missing counts are 0)."""
    out: list[int] = []
    for i, at in layout.specials.items():
        for j, name in enumerate(SPECIALS):
            before = 0 if old is None else old[at + j] or 0
            out.append(before + deltas[f"__{name}{i}_sum"][group])
    return out


def _result(layout: ResultLayout, state: Row) -> Row:
    """The output row of a stored group state."""
    values: list[Any] = list(state[: layout.keys])
    for i, agg in enumerate(layout.aggregates):
        acc = state[layout.accumulators[i]]
        kind = agg.kind
        if kind is Kind.COUNT_STAR:
            values.append(state[layout.keys])
        elif kind in (Kind.COUNT, Kind.COUNT_DISTINCT, Kind.MIN, Kind.MAX):
            values.append(acc[0])
        elif kind in (Kind.SUM, Kind.AVG):
            special = None
            if i in layout.specials:
                at = layout.specials[i]
                special = special_value(state[at : at + len(SPECIALS)])
            if not acc[1]:
                values.append(None)
            elif special is not None:
                values.append(special)
            else:
                values.append(acc[0] if kind is Kind.SUM else acc[0] / acc[1])
        else:
            assert agg.function is not None
            values.append(agg.function.result(tuple(acc)))
    return tuple(values)


def _visible(layout: ResultLayout, result: Row) -> Row | None:
    """The result if the group passes ``having``, else ``None``."""
    if layout.having is None or layout.having(dict(zip(layout.output.names, result, strict=True))):
        return result
    return None


def _pick(kind: Kind, current: Any, new: Any) -> Any:
    """The min (or max) of two values, ``None`` meaning no value."""
    if current is None:
        return new
    if new is None:
        return current
    pick = min if kind is Kind.MIN else max
    return pick(current, new, key=spark_order)


def _same(a: Row, b: Row) -> bool:
    """Equal results, a NaN equal to a NaN."""
    return all(x == y or (x != x and y != y) for x, y in zip(a, b, strict=True))
