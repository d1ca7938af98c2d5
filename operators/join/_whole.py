"""A changelog join's micro-batch joined whole, in Arrow, at its end
(``StreamingJoin(whole_micro_batch=True)``): inner, left, right or full.

Within a micro-batch the input comes in runs, each of one side's rows, and
the emit rules give a row the other side's rows of its join key as its run
began: the other side does not change within a run. So a row of run ``p``
matches each row of the other side whose appearances before run ``p`` sum
above zero (the stored ones, then +1 for each accumulate and -1 for each
retraction of it in the other side's runs before ``p``), once per
appearance. That is one hash join of the micro-batch's rows against the
other side's stored rows and changes on the join key, a filter on the run
and a sum per pair, all in Arrow: no Python object per row. The pairs come
out as the rules emit them, by input row, and a row's matches in the key
order of the other side's table.

With no condition, an outer side's row (its join key not null: a null
sends the micro-batch to the rules) is associated with every appearance
of the other side's rows of its join key, so what the outer rules add is
counted per join key, in the micro-batch's order:

- a row of an outer side with no match as it comes is emitted padded with
  nulls (``+I``, or ``-D`` for a retraction);
- for each appearance of a match ``m`` of an outer side, a row's pair with
  it is preceded by ``-D`` of ``m`` padded when the row's side had no row
  of the join key before it (``m`` had no association), and followed by
  ``+I`` of ``m`` padded when a retraction leaves the row's side none
  (``m`` has none left): ``-D`` padded, ``+I`` pair, ``-D`` padded, ``+I``
  pair for two appearances;
- pairs are ``+I`` and ``-D`` in an outer join, as the rules make them.

Each side's state is then written as the net change of each identity the
micro-batch touched, and on an outer side each row of a touched join key
gets the other side's appearances of that key as its associations; the
operations are counted as record at a time counts them.

The rules decide otherwise where a row is not a plain accumulate of a row
the side does not hold or retraction of one it does, or an outer side's
stored associations are not what the other side holds (dirty state, left
by applying retractions of rows never stored). A micro-batch with such a
row goes through the rules in its runs' order instead, as without the
option: a null in a row's identity (a null join key matches nothing
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
_INS, _DEL = RowKind.INSERT.value, RowKind.DELETE.value

# The working columns beside a side's input columns (``c0``, ``c1``, ...):
# a row's run, position in the micro-batch, kind and sign; a stored row's
# appearances, associations (outer sides) and position in the rows read.
_RUN, _SEQ, _SIGN, _KIND = "run", "seq", "sign", "kind"
_COUNT, _ASSOCIATIONS, _AT = "count", "associations", "at"


def join_whole(
    ctx: OperatorContext,
    views: Sequence[JoinStateView],
    runs: Sequence[tuple[int, pa.RecordBatch]],
    names: Sequence[Sequence[str]],
    held_rows: int,
) -> bool:
    """Join the micro-batch ``runs`` (each ``(side, batch)``; ``names``:
    each side's input columns) whole, emit its rows and write both sides'
    net changes. Returns ``False``, having done nothing, when a row needs
    the rules row by row (see the module)."""
    sides = [
        _Side(v, ctx.table(v.name), _rows(v, runs, side, names[side]))
        for side, v in enumerate(views)
    ]
    if not all(s.clean() for s in sides):
        return False
    keys = _JoinKeys.of(sides)
    outer = any(v.outer for v in views)
    stored = [s.stored(keys, held_rows, numbered=outer) for s in sides]
    counts: list[_Counts | None] = [None, None]
    if outer:
        counts = [_Counts.of(s, held, keys) for s, held in zip(sides, stored, strict=True)]
        for side, s in enumerate(sides):
            other = counts[1 - side]
            assert other is not None
            if s.view.outer and not _associated(stored[side], other.start):
                return False
    changes = [
        s.net_change(held, None if c is None else c.ids)
        for s, held, c in zip(sides, stored, counts, strict=True)
    ]
    if any(c is None for c in changes):
        return False
    parts = [
        _pairs(sides[side], sides[1 - side], stored[1 - side], side, counts[side])
        for side in (0, 1)
    ]
    _emit(ctx, parts, views[0].width)
    for side, (s, change) in enumerate(zip(sides, changes, strict=True)):
        assert change is not None
        other = counts[1 - side]
        outer_write = None
        if s.view.outer:
            assert other is not None
            # A row of the other side sets the associations of each row it
            # pairs with: once per pair, by the rules.
            set_associations = parts[1 - side].table.num_rows
            outer_write = _OuterWrite(stored[side], other, set_associations)
        change.write(ctx, s, outer_write)
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
            kinds = batch.column(at).cast(pa.string()) if at >= 0 else pa.repeat(pa.scalar(_INS), n)
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
class _JoinKeys:
    """The distinct join keys of both sides' rows in the micro-batch (the
    left's types, columns ``k<i>``), each named by its position: its id."""

    keys: pa.Table

    @classmethod
    def of(cls, sides: Sequence[_Side]) -> _JoinKeys:
        parts = [s.join_keys(s.rows) for s in sides]
        left = parts[0].schema
        both = pa.concat_tables([parts[0], parts[1].cast(left)])
        return cls(both.group_by(both.column_names, use_threads=False).aggregate([]))

    def __len__(self) -> int:
        return int(self.keys.num_rows)

    def ids(self, keys: pa.Table) -> np.ndarray:
        """The id of each join key of ``keys`` (columns ``k<i>``), -1 for one
        the micro-batch's rows do not have (a null matches none)."""
        ids = np.full(keys.num_rows, -1, dtype=np.int64)
        if not keys.num_rows or not len(self):
            return ids
        if keys.num_columns == 1:  # a hash lookup, no join
            values = keys.column(0).cast(self.keys.schema.field(0).type)
            found = pc.index_in(values, value_set=self.keys.column(0).combine_chunks())
            return np.asarray(found.fill_null(-1)).astype(np.int64)
        probe = keys.cast(self.keys.schema).append_column(
            _AT, pa.array(np.arange(keys.num_rows, dtype=np.int64))
        )
        numbered = self.keys.append_column("id", pa.array(np.arange(len(self), dtype=np.int64)))
        found = probe.join(
            numbered, keys=self.keys.column_names, join_type="inner", use_threads=False
        )
        ids[np.asarray(found.column(_AT))] = np.asarray(found.column("id"))
        return ids


@dataclass(frozen=True)
class _Counts:
    """One side's appearances of each join key (by id): as stored
    (``start``), after the micro-batch (``end``) and just before each of its
    micro-batch rows (``before``); and its rows' join key ids."""

    start: np.ndarray
    end: np.ndarray
    before: np.ndarray
    ids: np.ndarray

    @classmethod
    def of(cls, side: _Side, stored: pa.Table, keys: _JoinKeys) -> _Counts:
        at = np.asarray(stored.column("id"))
        known = at >= 0
        weights = np.asarray(stored.column(_COUNT))[known]
        start = np.bincount(at[known], weights=weights, minlength=len(keys)).astype(np.int64)
        ids = keys.ids(side.join_keys(side.rows))
        sign = np.asarray(side.rows.column(_SIGN))
        # Before each row: the stored count and the signs of the rows of its
        # join key before it (the rows come in micro-batch order).
        order = np.argsort(ids, kind="stable")
        sorted_ids, sorted_sign = ids[order], sign[order]
        exclusive = np.cumsum(sorted_sign) - sorted_sign
        first = np.searchsorted(sorted_ids, sorted_ids)
        before = np.empty(len(ids), dtype=np.int64)
        before[order] = start[sorted_ids] + exclusive - exclusive[first]
        end = start + np.bincount(ids, weights=sign, minlength=len(keys)).astype(np.int64)
        return cls(start, end, before, ids)


def _associated(stored: pa.Table, other_start: np.ndarray) -> bool:
    """Whether each stored row of an outer side whose join key the
    micro-batch has holds the other side's appearances of its join key as
    its associations (clean state)."""
    at = np.asarray(stored.column("id"))
    known = at >= 0
    held = np.asarray(stored.column(_ASSOCIATIONS))[known]
    return bool(np.array_equal(held, other_start[at[known]]))


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

    def join_keys(self, rows: pa.Table) -> pa.Table:
        """The join keys of ``rows`` (columns ``c<i>``) as columns ``k<i>``."""
        names = _named(self.view, self.view.join_key_indices)
        return rows.select(names).rename_columns([f"k{i}" for i in range(len(names))])

    def stored(self, keys: _JoinKeys, held_rows: int, numbered: bool) -> pa.Table:
        """The stored rows of the join keys ``keys`` (more, when the table is
        read whole): their columns ``c<i>``, appearances, associations (an
        outer side), position and, if ``numbered``, join key id (-1: not
        one of ``keys``)."""
        table, view = self.table, self.view
        rows = table.row_count
        if not len(keys) or not rows:
            batch = pa.RecordBatch.from_pylist([], schema=table.schema.columns)
        elif len(keys) * _SEEK_RATIO >= rows and rows <= held_rows:
            batch = table.scan_batch()
        else:
            wanted = keys.keys
            columns = [wanted.column(i).to_pylist() for i in range(wanted.num_columns)]
            batch = table.scan_prefixes(zip(*columns, strict=True))
        appearances, associations = view.counts_at
        n = batch.num_rows
        count = (
            pa.array(np.ones(n, dtype=np.int64))
            if appearances is None
            else batch.column(appearances)
        )
        columns = [*(batch.column(i) for i in range(view.width)), count]
        names = [*_input(view), _COUNT]
        if associations is not None:
            columns.append(batch.column(associations))
            names.append(_ASSOCIATIONS)
        stored = pa.table(columns, names=names)
        stored = stored.append_column(_AT, pa.array(np.arange(n, dtype=np.int64)))
        if numbered:
            stored = stored.append_column("id", pa.array(keys.ids(self.join_keys(stored))))
        return stored

    def net_change(self, stored: pa.Table, ids: np.ndarray | None) -> _NetChange | None:
        """Each identity's change over the micro-batch (``ids``: its rows'
        join key ids, in an outer join), checked against the rules: ``None``
        when a row is an upsert or retracts a row the side does not hold
        (or, with a unique key, one with other values)."""
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
        held = _held_of(firsts, stored, identity)
        before_count = np.asarray(held.column(_COUNT).fill_null(0))  # per group
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
            ids=None if ids is None else ids[np.asarray(order)[starts]],
        )


def _held_of(firsts: pa.Table, stored: pa.Table, identity: list[str]) -> pa.Table:
    """For each identity of ``firsts`` (one a group, in group order), the
    stored row with it (all of ``stored``'s columns; nulls where none)."""
    group = "group"
    probe = firsts.append_column(group, pa.array(np.arange(firsts.num_rows, dtype=np.int64)))
    found = probe.join(
        stored,
        keys=identity,
        join_type="left outer",
        coalesce_keys=True,
        use_threads=False,
    )
    found = found.take(pc.sort_indices(found.column(group)))
    return found.select(stored.column_names)


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
    after; the operations record at a time counts."""

    last: pa.Table
    held: pa.Table
    before: np.ndarray
    after: np.ndarray
    inserted: int
    updated: int
    deleted: int
    #: Each identity's join key id, in an outer join.
    ids: np.ndarray | None

    def write(self, ctx: OperatorContext, side: _Side, outer: _OuterWrite | None) -> None:
        """Write the net change as one batch delete, update and insert, and
        count the operations as record at a time does. On an outer side
        (``outer``), each row of a join key the micro-batch has holds the
        other side's appearances of it after the micro-batch as its
        associations: written with the net change of the rows it touched,
        and, for the stored rows it did not touch, where the other side's
        count moved (the rest hold it already, as checked)."""
        view, table = side.view, side.table
        columns = _input(view)
        before, after = self.before, self.after
        stayed = (before > 0) & (after > 0)
        changed = after != before
        if view.has_unique_key and stayed.any():
            same = _same_rows(self.last, self.held, columns, stayed)
            changed |= stayed & ~same
        old = new = None
        moved = pa.table({})
        if outer is not None:
            old = np.asarray(self.held.column(_ASSOCIATIONS).fill_null(-1))
            assert self.ids is not None
            new = outer.other.end[self.ids]
            changed |= stayed & (new != old)
            moved = outer.moved(self.held)
        deletes = np.flatnonzero((before > 0) & (after == 0))
        updates = np.flatnonzero(stayed & changed)
        inserts = np.flatnonzero((before == 0) & (after > 0))
        appearances, _ = view.counts_at
        schema = table.schema.columns

        def stored(
            rows: pa.Table, at: np.ndarray, counts: np.ndarray, associations: np.ndarray | None
        ) -> pa.RecordBatch:
            picked = rows.select(columns).take(pa.array(at, pa.int64()))
            arrays = [picked.column(c).combine_chunks() for c in columns]
            if appearances is not None:
                arrays.append(pa.array(counts[at], pa.int64()))
            if associations is not None:
                arrays.append(pa.array(associations[at], pa.int64()))
            return pa.RecordBatch.from_arrays(
                [a.cast(f.type) for a, f in zip(arrays, schema, strict=True)], schema=schema
            )

        if len(deletes):
            table.delete_batch(stored(self.held, deletes, before, old))
        if len(updates):
            table.update_batch(stored(self.last, updates, after, new))
        if moved.num_rows:
            assert outer is not None
            everyone = np.arange(moved.num_rows)
            counts = np.asarray(moved.column(_COUNT))
            table.update_batch(stored(moved, everyone, counts, outer.associations(moved)))
        if len(inserts):
            table.insert_batch(stored(self.last, inserts, after, new))
        updated = self.updated + (0 if outer is None else outer.set_associations)
        metrics = table.metrics
        metrics.inserted += self.inserted - len(inserts)
        metrics.updated += updated - len(updates) - moved.num_rows
        metrics.deleted += self.deleted - len(deletes)
        view.count(ctx, self.inserted + updated, self.deleted)


@dataclass(frozen=True)
class _OuterWrite:
    """What an outer side's write needs beyond its net change: the rows it
    read (``stored``), the other side's counts and how many times the rules
    set an association of its rows."""

    stored: pa.Table
    other: _Counts
    set_associations: int

    def moved(self, held: pa.Table) -> pa.Table:
        """The stored rows the micro-batch did not touch (not in ``held``,
        the stored rows of its identities) whose join key the other side's
        rows changed: their associations change."""
        ids = np.asarray(self.stored.column("id"))
        known = ids >= 0
        other = self.other
        moved = np.zeros(len(ids), dtype=bool)
        moved[known] = other.end[ids[known]] != other.start[ids[known]]
        moved[np.asarray(held.column(_AT).drop_null())] = False
        return self.stored.filter(pa.array(moved))

    def associations(self, rows: pa.Table) -> np.ndarray:
        """The associations of stored ``rows`` after the micro-batch."""
        ends: np.ndarray = self.other.end[np.asarray(rows.column("id"))]
        return ends


def _same_rows(a: pa.Table, b: pa.Table, columns: list[str], where: np.ndarray) -> np.ndarray:
    """Per row, whether ``a``'s and ``b``'s ``columns`` are equal, where
    ``where`` (else ``False``)."""
    same = where.copy()
    for name in columns:
        same &= _same(a.column(name), b.column(name))
    return same


@dataclass(frozen=True)
class _Pairs:
    """What one side's rows emit: the pairs they make (``table``: output
    columns ``o<i>``, the input row's position, the other row's key bytes,
    the pair's multiplicity and kind, whether it toggles the other row's
    padded row, the input row's sign and side) and, on an outer side, the
    rows with no match, padded (``padded``: output columns, position, kind)."""

    table: pa.Table
    padded: pa.Table


def _pairs(
    probe: _Side,
    other: _Side,
    stored: pa.Table,
    side: int,
    counts: _Counts | None,
) -> _Pairs:
    """The pairs ``probe``'s rows (of ``side``) make with ``other``'s rows,
    each with its multiplicity, position and the other row's key bytes;
    ``counts``: the probe side's counts in an outer join (``None``: an
    inner one)."""
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
                    stored.column(_COUNT),
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
    multiplicity = np.asarray(grouped.column("t_sign_sum"))
    key_names = ov.table.key_names
    identity = pa.RecordBatch.from_arrays(
        [grouped.column(f"t{i}").combine_chunks() for i in ov.identity_indices],
        names=list(key_names),
    )
    order = other.table.keys.encode_arrow(identity)
    own = [mine.column(f"c{i}") for i in range(pv.width)]
    theirs = [grouped.column(c) for c in t_columns]
    columns = [*own, *theirs] if side == LEFT else [*theirs, *own]
    sign = np.asarray(mine.column(_SIGN))
    if counts is None:
        kind = mine.column(_KIND)
        toggle = np.zeros(len(at), dtype=bool)
    else:  # an outer join: pairs are +I and -D
        kind = pa.array(np.where(sign > 0, _INS, _DEL))
        # The other row had no association before an accumulate, or has
        # none after a retraction: its padded row goes or comes.
        before = counts.before[at]
        toggle = np.where(sign > 0, before == 0, before == 1) & ov.outer
    names = _output(len(columns))
    pairs = pa.table(
        [
            *columns,
            grouped.column(_SEQ),
            order,
            pa.array(multiplicity),
            kind,
            pa.array(toggle),
            pa.array(sign),
            pa.array(np.full(len(at), side, dtype=np.int8)),
        ],
        names=[*names, _SEQ, "order", _COUNT, _KIND, "toggle", _SIGN, "side"],
    )
    alone = np.zeros(rows.num_rows, dtype=bool)
    if pv.outer:
        matches = np.bincount(at, weights=multiplicity, minlength=rows.num_rows)
        alone = matches == 0
    lonely = rows.filter(pa.array(alone))
    n = lonely.num_rows
    mine_padded = [lonely.column(f"c{i}") for i in range(pv.width)]
    nulls = [pa.nulls(n, f.type) for f in list(ov.table.columns)[: ov.width]]
    padded_columns = [*mine_padded, *nulls] if side == LEFT else [*nulls, *mine_padded]
    padded_kind = pc.if_else(pc.greater(lonely.column(_SIGN), 0), _INS, _DEL)
    padded = pa.table(
        [*padded_columns, lonely.column(_SEQ), padded_kind], names=[*names, _SEQ, _KIND]
    )
    return _Pairs(pairs, padded)


def _output(width: int) -> list[str]:
    return [f"o{i}" for i in range(width)]


def _emit(ctx: OperatorContext, parts: Sequence[_Pairs], left_width: int) -> None:
    """Emit the rows as the rules do: by input row, its own row padded if
    it has no match, else its matches in key order, each as many times as
    it appears, between the other row padded going and coming where a
    match toggles it."""
    pairs = pa.concat_tables([p.table for p in parts])
    padded = pa.concat_tables([p.padded for p in parts])
    if not pairs.num_rows and not padded.num_rows:
        return
    pairs = pairs.take(pc.sort_indices(pairs, [(_SEQ, "ascending"), ("order", "ascending")]))
    names = [c for c in padded.column_names if c != _SEQ]
    width = len(names) - 1
    n = pairs.num_rows
    counts = np.asarray(pairs.column(_COUNT))
    toggle = np.asarray(pairs.column("toggle"))
    pair = np.arange(n)
    if toggle.any() or counts.max(initial=0) > 1:
        lengths = counts * (1 + toggle)
        pair = np.repeat(pair, lengths)
        # Within a pair's rows: its other row padded goes (-D) before each
        # accumulated appearance and comes (+I) after each retracted one.
        within = np.arange(len(pair)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        accumulate = np.asarray(pairs.column(_SIGN))[pair] > 0
        is_padded = toggle[pair] & ((within % 2 == 0) == accumulate)
        toggled = np.cumsum(toggle) - 1
        source = np.where(is_padded, n + toggled[pair], pair)
    else:
        source = pair
    sources = [
        pairs.select(names),
        _others_padded(pairs.filter(pa.array(toggle)), names, left_width),
    ]
    if padded.num_rows:
        seq = np.concatenate(
            [np.asarray(pairs.column(_SEQ))[pair], np.asarray(padded.column(_SEQ))]
        )
        start = n + int(toggle.sum())
        source = np.concatenate([source, np.arange(start, start + padded.num_rows)])
        source = source[np.argsort(seq, kind="stable")]
        sources.append(padded.select(names))
    table = pa.concat_tables([t.cast(sources[0].schema) for t in sources])
    out = table.take(pa.array(source, pa.int64()))
    ctx.emit_batch([out.column(i) for i in range(width)], out.column(_KIND).combine_chunks())


def _others_padded(toggled: pa.Table, names: list[str], left_width: int) -> pa.Table:
    """The other row of each pair of ``toggled`` padded with nulls, with the
    kind it goes (``-D``, before an accumulate's pair) or comes with (``+I``,
    after a retraction's)."""
    own_left = pc.equal(toggled.column("side"), LEFT)
    columns = []
    for i, name in enumerate(names[:-1]):
        column = toggled.column(name)
        own = own_left if i < left_width else pc.invert(own_left)
        columns.append(pc.if_else(own, pa.scalar(None, column.type), column))
    kind = pc.if_else(pc.greater(toggled.column(_SIGN), 0), _DEL, _INS)
    return pa.table([*columns, kind], names=names)
