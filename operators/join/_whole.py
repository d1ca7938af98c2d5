"""An inner join's micro-batch joined whole, in Arrow, at its end
(``StreamingJoin(whole_micro_batch=True)``).

Within a micro-batch the input comes in runs, each of one side's rows, and
the emit rules give a row the other side's rows of its join key as its run
began: the other side does not change within a run. So a row of run ``p``
matches each row of the other side whose appearances before run ``p`` sum
above zero (the stored ones, then +1 for each accumulate and -1 for each
retraction of it in the other side's runs before ``p``), once per
appearance. That is one hash join of the micro-batch's rows against the
other side's stored rows and changes on the join key, a filter on the run
and a sum per pair, all in Arrow: no Python object per row. The pairs come
out as the rules emit them, each with its input row's kind: by input row,
and a row's matches in the key order of the other side's table. Each side's
state is then written as the net change of each identity the micro-batch
touched, and counted as record at a time counts it.

The rules decide otherwise where a row is not a plain accumulate of a row
the side does not hold or retraction of one it does. A micro-batch with
such a row goes through the rules in its runs' order instead, as without
the option: a null in a row's identity (a null join key matches nothing
unless null-safe; without a unique key the identity is the whole row), an
upsert (an accumulate whose unique key is held), a retraction of a row the
side does not hold (the stage's policy decides) or one whose values differ
from the held row's (bit for bit: the rules emit the held row), an
unknown row kind. The differential tests in
tests/operators/join/test_join_whole.py hold both to the same output and
state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators._api.changelog import ROW_KIND, RowKind, all_known_kinds
from operators._api.operator import OperatorContext
from operators.join._batch import key_runs
from operators.join._spec import LEFT
from operators.join._views import JoinStateView
from statestore import StateTable

__all__ = ["join_whole"]

#: A side's table is read whole when it holds at most this many rows for
#: each distinct join key the micro-batch asks: one seek per join key costs
#: about as much as reading this many rows in one scan.
_SEEK_RATIO = 8

_ACCUMULATES = pa.array([RowKind.INSERT.value, RowKind.UPDATE_AFTER.value])

# The working columns beside a side's input columns (``c0``, ``c1``, ...).
_RUN, _SEQ, _SIGN, _KIND = "run", "seq", "sign", "kind"


def join_whole(
    ctx: OperatorContext,
    views: Sequence[JoinStateView],
    runs: Sequence[tuple[int, pa.RecordBatch]],
    names: Sequence[Sequence[str]],
    held_rows: int,
) -> bool:
    """Join the micro-batch ``runs`` (each ``(side, batch)``; ``names``:
    each side's input columns) whole, emit its pairs and write both sides'
    net changes. Returns ``False``, having done nothing, when a row needs
    the rules row by row (see the module)."""
    sides = [
        _Side(v, ctx.table(v.name), _rows(v, runs, side, names[side]))
        for side, v in enumerate(views)
    ]
    if not all(s.clean() for s in sides):
        return False
    wanted = _join_keys(sides)
    stored = [s.stored(wanted, held_rows) for s in sides]
    changes = [s.net_change(held) for s, held in zip(sides, stored, strict=True)]
    if any(c is None for c in changes):
        return False
    pairs = [_pairs(sides[side], sides[1 - side], stored[1 - side], side) for side in (0, 1)]
    _emit(ctx, pa.concat_tables(pairs))
    for s, change in zip(sides, changes, strict=True):
        assert change is not None
        change.write(ctx, s)
    return True


def _rows(
    view: JoinStateView,
    runs: Sequence[tuple[int, pa.RecordBatch]],
    side: int,
    names: Sequence[str],
) -> pa.Table:
    """The rows of ``side`` in ``runs``, its input columns (``names``)
    renamed ``c<i>``, with their run, position in the micro-batch, kind
    and sign (+1 accumulate, -1 retract)."""
    fields = list(view.table.columns)[: view.width]
    parts: list[pa.Table] = []
    seq = 0
    for run, (s, batch) in enumerate(runs):
        n = batch.num_rows
        if s == side and n:
            at = batch.schema.get_field_index(ROW_KIND)
            kinds = (
                batch.column(at).cast(pa.string())
                if at >= 0
                else pa.repeat(pa.scalar(RowKind.INSERT.value), n)
            )
            parts.append(
                pa.table(
                    [
                        *(batch.column(c).cast(f.type) for c, f in zip(names, fields, strict=True)),
                        pa.array(np.full(n, run, dtype=np.int64)),
                        pa.array(np.arange(seq, seq + n, dtype=np.int64)),
                        kinds,
                    ],
                    names=[*_input(view), _RUN, _SEQ, _KIND],
                )
            )
        seq += n
    if parts:
        table = pa.concat_tables(parts).combine_chunks()
    else:
        table = pa.table(
            [
                *(pa.array([], f.type) for f in fields),
                *(pa.array([], pa.int64()) for _ in (_RUN, _SEQ)),
                pa.array([], pa.string()),
            ],
            names=[*_input(view), _RUN, _SEQ, _KIND],
        )
    sign = pc.if_else(pc.is_in(table.column(_KIND), value_set=_ACCUMULATES), 1, -1)
    return table.append_column(_SIGN, sign.cast(pa.int64()))


def _input(view: JoinStateView) -> list[str]:
    return _named(view, range(view.width))


def _named(view: JoinStateView, indices: Sequence[int]) -> list[str]:
    return [f"c{i}" for i in indices]


@dataclass(frozen=True)
class _Side:
    """One side: its view, its table and its micro-batch rows (the input
    columns as ``c<i>``, then each row's run, position, kind and sign)."""

    view: JoinStateView
    table: StateTable
    rows: pa.Table

    def clean(self) -> bool:
        """Whether no row has a null in its identity (the join key
        included) or an unknown kind."""
        rows = self.rows
        if any(rows.column(c).null_count for c in _named(self.view, self.view.identity_indices)):
            return False
        return all_known_kinds(rows.column(_KIND))

    def stored(self, wanted: pa.Table, held_rows: int) -> pa.Table:
        """The stored rows of the join keys ``wanted`` (more, when the table
        is read whole), their columns ``c<i>`` and ``count`` (appearances)."""
        table, view = self.table, self.view
        rows = table.row_count
        if not wanted.num_rows or not rows:
            batch = pa.RecordBatch.from_pylist([], schema=table.schema.columns)
        elif wanted.num_rows * _SEEK_RATIO >= rows and rows <= held_rows:
            batch = table.scan_batch()
        else:
            keys = [wanted.column(i).to_pylist() for i in range(wanted.num_columns)]
            batch = table.scan_prefixes(zip(*keys, strict=True))
        appearances, _ = view.counts_at
        count = (
            pa.array(np.ones(batch.num_rows, dtype=np.int64))
            if appearances is None
            else batch.column(appearances)
        )
        columns = [batch.column(i) for i in range(view.width)]
        return pa.table([*columns, count], names=[*_input(view), "count"])

    def net_change(self, stored: pa.Table) -> _NetChange | None:
        """Each identity's change over the micro-batch, checked against the
        rules: ``None`` when a row is an upsert or retracts a row the side
        does not hold (or, with a unique key, one with other values)."""
        view, rows = self.view, self.rows
        identity = _named(view, view.identity_indices)
        order = pc.sort_indices(rows, [(c, "ascending") for c in identity] + [(_SEQ, "ascending")])
        events = rows.take(order)
        n = events.num_rows
        first, past = key_runs([events.column(c) for c in identity]) if n else ([], [])
        starts = np.array(first, dtype=np.int64)
        stops = np.array(past, dtype=np.int64)
        group = np.repeat(np.arange(len(starts)), stops - starts)
        firsts = events.take(pa.array(starts, pa.int64())).select(identity)
        held = _held_of(firsts, stored, identity, _input(view))
        before_count = np.asarray(held.column("count").fill_null(0))  # per group
        sign = np.asarray(events.column(_SIGN))
        inclusive = np.cumsum(sign)
        exclusive = inclusive - sign
        base = exclusive[starts]
        before = before_count[group] + exclusive - base[group]
        accumulate = sign > 0
        if np.any(~accumulate & (before <= 0)):
            return None  # a retraction of a row the side does not hold
        if view.has_unique_key:
            if np.any(accumulate & (before >= 1)):
                return None  # an upsert
            if not _retractions_match(events, held, starts, group, ~accumulate, _input(view)):
                return None
        after = before_count + inclusive[stops - 1] - base
        inserted = int(np.sum(accumulate & (before == 0)))
        deleted = int(np.sum(~accumulate & (before == 1)))
        return _NetChange(
            last=events.take(pa.array(stops - 1, pa.int64())).select(_input(view)),
            held=held,
            before=before_count,
            after=after,
            inserted=inserted,
            updated=n - inserted - deleted,
            deleted=deleted,
        )


def _held_of(
    firsts: pa.Table, stored: pa.Table, identity: list[str], columns: list[str]
) -> pa.Table:
    """For each identity of ``firsts`` (one a group, in group order), the
    stored row with it (``columns`` and ``count``; nulls where none)."""
    at = "group"
    probe = firsts.append_column(at, pa.array(np.arange(firsts.num_rows, dtype=np.int64)))
    found = probe.join(
        stored.select([*columns, "count"]),
        keys=identity,
        join_type="left outer",
        coalesce_keys=True,
        use_threads=False,
    )
    found = found.take(pc.sort_indices(found.column(at)))
    return found.select([*columns, "count"])


def _retractions_match(
    events: pa.Table,
    held: pa.Table,
    starts: np.ndarray,
    group: np.ndarray,
    retract: np.ndarray,
    columns: list[str],
) -> bool:
    """Whether each retraction (``retract``) of ``events`` names the row its
    identity holds as it comes, value for value and bit for bit (a float
    -0.0 is not 0.0, a NaN matches nothing): the event before it in its
    group (an accumulate), or the stored row (``held``) for a group's
    first. The rules emit the held row, so only then is the input's the
    same."""
    at = np.flatnonzero(retract)
    if not len(at):
        return True
    first = np.isin(at, starts)
    mine = events.select(columns).take(pa.array(at, pa.int64()))
    earlier = events.select(columns).take(pa.array(np.where(first, 0, at - 1), pa.int64()))
    stored = held.select(columns).take(pa.array(group[at], pa.int64()))
    for name in columns:
        theirs = pc.if_else(pa.array(first), stored.column(name), earlier.column(name))
        if not _same(mine.column(name), theirs, bitwise=True).all():
            return False
    return True


def _same(
    a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array, bitwise: bool = False
) -> np.ndarray:
    """Per row, whether ``a`` and ``b`` hold the same value as Python's
    ``==`` says (a null is a null; -0.0 is 0.0, NaN is nothing), or with
    ``bitwise`` also the same float sign."""
    equal = pc.fill_null(pc.equal(a, b), False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    same = np.asarray(_array(pc.or_(equal, both_null)), dtype=bool)
    if bitwise and pa.types.is_floating(a.type):
        zero = pa.scalar(0, a.type)
        signs = [np.signbit(np.asarray(_array(pc.fill_null(x, zero)))) for x in (a, b)]
        same &= signs[0] == signs[1]
    return same


def _array(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


@dataclass(frozen=True)
class _NetChange:
    """Each identity's change over a micro-batch, one a group: its row
    after (``last``), its stored row (``held``), its appearances before and
    after; and the operations record at a time counts."""

    last: pa.Table
    held: pa.Table
    before: np.ndarray
    after: np.ndarray
    inserted: int
    updated: int
    deleted: int

    def write(self, ctx: OperatorContext, side: _Side) -> None:
        """Write the net change as one batch delete, update and insert, and
        count the operations as record at a time does."""
        view, table = side.view, side.table
        columns = _input(view)
        before, after = self.before, self.after
        stayed = (before > 0) & (after > 0)
        changed = after != before
        if view.has_unique_key and stayed.any():
            same = _same_rows(self.last, self.held, columns, stayed)
            changed |= stayed & ~same
        deletes = np.flatnonzero((before > 0) & (after == 0))
        updates = np.flatnonzero(stayed & changed)
        inserts = np.flatnonzero((before == 0) & (after > 0))
        schema = table.schema.columns
        appearances, _ = view.counts_at

        def stored(rows: pa.Table, at: np.ndarray, counts: np.ndarray) -> pa.RecordBatch:
            picked = rows.select(columns).take(pa.array(at, pa.int64()))
            arrays = [picked.column(c).combine_chunks() for c in columns]
            if appearances is not None:
                arrays.append(pa.array(counts[at], pa.int64()))
            return pa.RecordBatch.from_arrays(
                [a.cast(f.type) for a, f in zip(arrays, schema, strict=True)], schema=schema
            )

        if len(deletes):
            table.delete_batch(stored(self.held, deletes, before))
        if len(updates):
            table.update_batch(stored(self.last, updates, after))
        if len(inserts):
            table.insert_batch(stored(self.last, inserts, after))
        metrics = table.metrics
        metrics.inserted += self.inserted - len(inserts)
        metrics.updated += self.updated - len(updates)
        metrics.deleted += self.deleted - len(deletes)
        view.count(ctx, self.inserted + self.updated, self.deleted)


def _same_rows(a: pa.Table, b: pa.Table, columns: list[str], where: np.ndarray) -> np.ndarray:
    """Per row, whether ``a``'s and ``b``'s ``columns`` are equal, where
    ``where`` (else ``False``)."""
    same = where.copy()
    for name in columns:
        same &= _same(a.column(name), b.column(name))
    return same


def _join_keys(sides: Sequence[_Side]) -> pa.Table:
    """The distinct join keys of both sides' rows, as the left's types
    (columns ``k<i>``)."""
    parts = []
    for s in sides:
        names = _named(s.view, s.view.join_key_indices)
        keys = s.rows.select(names).rename_columns([f"k{i}" for i in range(len(names))])
        parts.append(keys)
    left = parts[0].schema
    both = pa.concat_tables([parts[0], parts[1].cast(left)])
    return both.group_by(both.column_names, use_threads=False).aggregate([])


def _pairs(probe: _Side, other: _Side, stored: pa.Table, side: int) -> pa.Table:
    """The pairs ``probe``'s rows (of ``side``) make with ``other``'s rows,
    each with its multiplicity, position and the other row's key bytes."""
    pv, ov = probe.view, other.view
    p_keys = [f"p{i}" for i in pv.join_key_indices]
    t_keys = [f"t{i}" for i in ov.join_key_indices]
    t_columns = [f"t{i}" for i in range(ov.width)]
    rows = probe.rows
    probing = pa.table(
        [
            *(rows.column(f"c{i}") for i in pv.join_key_indices),
            rows.column(_RUN),
            rows.column(_SEQ),
        ],
        names=[*p_keys, "p_run", _SEQ],
    )
    timeline = pa.concat_tables(
        [
            pa.table(
                [
                    *(stored.column(f"c{i}") for i in range(ov.width)),
                    pa.array(np.full(stored.num_rows, -1, dtype=np.int64)),
                    stored.column("count"),
                ],
                names=[*t_columns, "t_run", "t_sign"],
            ),
            pa.table(
                [
                    *(other.rows.column(f"c{i}") for i in range(ov.width)),
                    other.rows.column(_RUN),
                    other.rows.column(_SIGN),
                ],
                names=[*t_columns, "t_run", "t_sign"],
            ),
        ]
    )
    joined = probing.join(
        timeline,
        keys=p_keys,
        right_keys=t_keys,
        join_type="inner",
        coalesce_keys=False,
        use_threads=False,
    )
    joined = joined.filter(pc.less(joined.column("t_run"), joined.column("p_run")))
    grouped = joined.group_by([_SEQ, *t_columns], use_threads=False).aggregate([("t_sign", "sum")])
    grouped = grouped.filter(pc.greater(grouped.column("t_sign_sum"), 0))
    at = np.searchsorted(np.asarray(rows.column(_SEQ)), np.asarray(grouped.column(_SEQ)))
    mine = rows.take(pa.array(at, pa.int64()))
    theirs = [grouped.column(c) for c in t_columns]
    key_names = ov.table.key_names
    identity = pa.RecordBatch.from_arrays(
        [grouped.column(f"t{i}").combine_chunks() for i in ov.identity_indices],
        names=list(key_names),
    )
    order = other.table.keys.encode_arrow(identity)
    own = [mine.column(f"c{i}") for i in range(pv.width)]
    columns = [*own, *theirs] if side == LEFT else [*theirs, *own]
    return pa.table(
        [
            *columns,
            grouped.column(_SEQ),
            order,
            grouped.column("t_sign_sum"),
            mine.column(_KIND),
        ],
        names=[*(f"o{i}" for i in range(len(columns))), _SEQ, "order", "count", _KIND],
    )


def _emit(ctx: OperatorContext, pairs: pa.Table) -> None:
    """Emit ``pairs`` as the rules do: by input row, a row's matches in
    key order, each as many times as it appears."""
    if not pairs.num_rows:
        return
    order = pc.sort_indices(pairs, [(_SEQ, "ascending"), ("order", "ascending")])
    counts = np.asarray(pairs.column("count").take(order))
    picked = np.asarray(order)
    if counts.max() > 1:
        picked = np.repeat(picked, counts)
    out = pairs.take(pa.array(picked, pa.int64()))
    n = out.num_columns - 4
    ctx.emit_batch([out.column(i) for i in range(n)], out.column(_KIND).combine_chunks())
