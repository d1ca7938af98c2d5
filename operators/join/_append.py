"""``AppendJoin``: Spark's stream-stream join (append mode) over state tables.

Two append-only inputs with event times, an equi-join plus a time range or
equal windows. Per micro-batch, as Spark's StreamingSymmetricHashJoinExec
does (docs/operators/join.md, "Append mode"):

1. A row at or below the previous batch's watermark is late: dropped (with
   windows, a row whose window ends at or below it).
2. Any other row joins the other side's stored rows (key, time range, extra
   condition) and is stored with a matched flag; the flag of each stored row
   it meets is set.
3. At the end of the batch each side's rows at or below its state watermark
   (from this batch's watermark and the time condition) are evicted; on an
   outer side an evicted row that never matched comes out null-padded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from encoding import key_equal_values
from operators._api.changelog import RowKind, kinds_in
from operators._api.metrics import (
    EVICTED,
    EVICTION_TIME,
    LATE,
    MATCHED,
    PADDED,
    REMOVED,
    STORE_TIME,
    TOTAL,
    UPDATED,
    side_metric,
)
from operators._api.operator import Operator, OperatorContext
from operators.errors import InputError
from operators.join._append_state import FLOORS, SIDE_NAMES, SideState, side_state
from operators.join._append_time import TimeRange, TimeWindows, event_time_micros
from operators.join._spec import JoinSpec, JoinType, output_schema
from statestore import ConsistencyMode, StateTable

__all__ = ["AppendJoin", "JoinCondition"]

#: An extra join condition over a (left row, right row) pair of input tuples.
JoinCondition = Callable[[tuple[Any, ...], tuple[Any, ...]], bool]

#: A bounded scan costs about as much as reading this many rows of one
#: ordered pass.
_SEEK_ROWS = 20


class AppendJoin(Operator):
    """An append-mode stream-stream join: a drop-in for Spark's native one.

    ``left`` and ``right`` are the input schemas (side 0 and 1); they join on
    ``left_keys`` = ``right_keys`` (pairwise, equal types) and on ``time``:
    a :class:`TimeRange` over the event-time columns ``left_time`` and
    ``right_time``, or :class:`TimeWindows`. ``condition`` is an optional
    extra predicate over (left row, right row) tuples. Output rows are the
    left columns then the right ones, renamed with ``left_prefix`` /
    ``right_prefix``; a padded side's columns are nullable.
    """

    consistency = ConsistencyMode.UNCHECKED

    def __init__(
        self,
        left: pa.Schema,
        right: pa.Schema,
        left_keys: Sequence[str],
        right_keys: Sequence[str],
        left_time: str,
        right_time: str,
        time: TimeRange | TimeWindows,
        join_type: JoinType | str = "inner",
        condition: JoinCondition | None = None,
        left_prefix: str = "",
        right_prefix: str = "",
        name: str = "append_join",
    ) -> None:
        self.name = name
        spec = JoinSpec.of(join_type, left, right, left_keys, right_keys)
        self.join_type = spec.join_type
        self.outer_sides: tuple[int, ...] = tuple(s for s in (0, 1) if spec.is_outer(s))
        self.time = time
        self.condition = condition
        self.inputs: list[pa.Schema] = [left, right]
        keys = spec.keys
        times = (left_time, right_time)
        for side, (schema, column) in enumerate(zip(self.inputs, times, strict=True)):
            if column not in schema.names:
                raise InputError(
                    f"the {SIDE_NAMES[side]} input has no event-time column {column!r}; its "
                    f"columns are {schema.names}"
                )
        self.time_columns = (left_time, right_time)
        self.sides = (side_state(0, left, keys[0]), side_state(1, right, keys[1]))
        self.tables = [*(s.rows for s in self.sides), FLOORS]
        self.output = output_schema(spec, left_prefix, right_prefix)
        # What each batch run in progress (by context) holds back until its
        # close: see _Run.
        self._runs: dict[int, _Run] = {}

    def output_watermark(self, watermark: int | None) -> int | None:
        """A joined row carries both sides' event times, and a side's stored
        row can still be emitted until it falls below that side's state
        watermark: the output watermark is the least of the two state
        watermarks (ms) and the input one, as Spark's stream-stream join
        gives a later stateful operator."""
        if watermark is None:
            return None
        cuts = [self.time.state_watermark(side, watermark) // 1000 for side in (0, 1)]
        return min(watermark, *cuts)

    def watermark_rows(self, batch: pa.RecordBatch, side: int) -> pa.BooleanArray | None:
        """A row whose join key is null can meet nothing; Spark filters such
        rows out before its watermark on every side that is not outer, and so
        they do not count towards the watermark here either."""
        if side in self.outer_sides:
            return None
        null_key = _any_null(self._key_columns(batch, side))
        return None if null_key is None else pc.invert(null_key)

    def _key_columns(self, batch: pa.RecordBatch, side: int) -> list[pa.Array]:
        """The join key columns of an input batch of ``side``."""
        names = self.inputs[side].names
        return [batch.column(names[p]) for p in self.sides[side].key_positions]

    # -- the batch ---------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        self._runs[id(ctx)] = _Run(ctx.batch_id << 32)

    def _run(self, ctx: OperatorContext) -> _Run:
        run = self._runs.get(id(ctx))
        if run is None:
            run = self._runs[id(ctx)] = _Run(ctx.batch_id << 32)
        return run

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Drop late rows, join the rest with the other side's state, store
        them (step 1 and 2 of the module docstring), a batch at a time."""
        name = SIDE_NAMES[side]
        retractions = sorted(k.value for k in kinds_in(batch) - {RowKind.INSERT})
        if retractions:
            raise InputError(
                f"operator {self.name!r} joins append-only inputs (row kind '+I'); the "
                f"{name} input has row kinds {retractions}. Use the changelog join for them"
            )
        times = event_time_micros(batch.column(self.time_columns[side]), self.time_columns[side])
        late = ctx.previous_watermark
        if late is not None:
            kept = self.time.lateness_time(times) > late * 1000
            dropped = len(kept) - int(np.count_nonzero(kept))
            if dropped:
                ctx.count(side_metric(name, LATE), dropped)
                batch = batch.filter(pa.array(kept))
                times = times[kept]
        if batch.num_rows:
            self._join_and_store(ctx, side, batch, times)

    def _join_and_store(
        self, ctx: OperatorContext, side: int, batch: pa.RecordBatch, times: npt.NDArray[np.int64]
    ) -> None:
        run = self._run(ctx)
        other = self.sides[1 - side]
        other_rows = ctx.table(other.rows.name)
        keys = [key_equal_values(k) for k in self._key_columns(batch, side)]
        null_key = _any_null(keys)
        lo, hi = self.time.other_bounds(side, times)
        probe = pa.table(
            {
                **{_key(i): k for i, k in enumerate(keys)},
                _ROW: np.arange(batch.num_rows),
                _LO: lo,
                _HI: hi,
            }
        )
        if null_key is not None:
            probe = probe.filter(pc.invert(null_key))  # a null key meets nothing (SQL)
        stored, stored_flags = self._candidates(run, 1 - side, other_rows, probe)
        held = run.held[1 - side]
        candidates = _concat_rows(other.rows.columns, [stored, *held.rows])
        mine_at, theirs_at = self._pairs(side, batch, probe, candidates, other, (lo, hi))
        if len(mine_at):
            here = batch.take(mine_at)
            there = candidates.take(theirs_at)
            pair: tuple[pa.RecordBatch, pa.RecordBatch] = (
                (here, there) if side == 0 else (there, here)
            )
            ctx.emit_batch(
                [
                    *(pair[0].column(n) for n in self.inputs[0].names),
                    *(pair[1].column(n) for n in self.inputs[1].names),
                ]
            )
        found = np.zeros(batch.num_rows, dtype=bool)
        found[mine_at] = True
        flagged = 0
        if (1 - side) in self.outer_sides and len(theirs_at):
            flagged = self._flag_matched(other_rows, stored, stored_flags, held, theirs_at)
        if null_key is not None and side not in self.outer_sides:
            # Only an outer side keeps a null-key row: to pad it at eviction.
            keep = np.asarray(pc.invert(null_key))
            batch, times, found = batch.filter(pa.array(keep)), times[keep], found[keep]
        self._hold(run, side, batch, times, found)
        ctx.count(MATCHED, len(mine_at))
        ctx.count(side_metric(SIDE_NAMES[side], UPDATED), batch.num_rows)
        ctx.count(side_metric(SIDE_NAMES[1 - side], UPDATED), flagged)

    def _pairs(
        self,
        side: int,
        batch: pa.RecordBatch,
        probe: pa.Table,
        candidates: pa.RecordBatch,
        other: SideState,
        bounds: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The matching (batch row, candidate row) positions, ordered by batch
        row then by the candidate's key order: a hash join on the key alone
        (no payload but the positions), the time range (``bounds``, per batch
        row) and the order in numpy, then the extra condition. A batch row's
        candidates share its join key, so their key order is that of (time,
        seq), whether they are stored or held back in this batch."""
        names = [_key(i) for i in range(len(other.key_positions))]
        if not probe.num_rows or not candidates.num_rows:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        stored = pa.table(
            {
                **{
                    name: key_equal_values(candidates.column(p + 2))
                    for name, p in zip(names, other.key_positions, strict=True)
                },
                _CANDIDATE: np.arange(candidates.num_rows),
            }
        )
        joined = probe.select([*names, _ROW]).join(
            stored, names, join_type="inner", use_threads=False
        )
        mine_at = _positions(joined.column(_ROW))
        theirs_at = _positions(joined.column(_CANDIDATE))
        times = np.asarray(candidates.column(0), dtype=np.int64)[theirs_at]
        lo, hi = bounds
        met = (times >= lo[mine_at]) & (times <= hi[mine_at])
        mine_at, theirs_at, times = mine_at[met], theirs_at[met], times[met]
        seqs = np.asarray(candidates.column(1), dtype=np.int64)[theirs_at]
        order = np.lexsort((seqs, times, mine_at))
        mine_at, theirs_at = mine_at[order], theirs_at[order]
        if self.condition is None or not len(mine_at):
            return mine_at, theirs_at
        rows = _tuples(batch.take(mine_at), self.inputs[side].names)
        others = _tuples(candidates.take(theirs_at), self.inputs[1 - side].names)
        condition = self.condition
        if side == 0:
            keep = [condition(r, o) for r, o in zip(rows, others, strict=True)]
        else:
            keep = [condition(o, r) for r, o in zip(rows, others, strict=True)]
        mask = np.array(keep, dtype=bool)
        return mine_at[mask], theirs_at[mask]

    @staticmethod
    def _candidates(
        run: _Run, side: int, table: StateTable, probe: pa.Table
    ) -> tuple[pa.RecordBatch, npt.NDArray[np.bool_]]:
        """The committed rows of ``table`` (``side``'s) that the probe's rows
        may meet, and their matched flags. The time leads the table's key, so
        the rows within the probe's time ranges are read by one range scan
        per run of overlapping ranges or, when those runs are many for the
        table's size, by one scan from the least time reached to the greatest
        (a bounded scan costs about as much as reading :data:`_SEEK_ROWS`
        rows of one pass). One span of times read is kept per batch: a later
        probe reads only the times it reaches beyond it. The table holds no
        row of this batch yet: those are held back (:class:`_Run`)."""
        if not probe.num_rows:
            return _concat_rows(table.schema.columns, []), np.zeros(0, dtype=bool)
        los = np.asarray(probe.column(_LO), dtype=np.int64)
        his = np.asarray(probe.column(_HI), dtype=np.int64)
        lo, hi = int(los.min()), int(his.max())
        span = run.span[side]
        if span is None:
            starts, ends = _runs_of(los, his)
            if len(starts) * _SEEK_ROWS < table.row_count:
                rows = table.scan_ranges(
                    ((), (int(a),), (int(b) + 1,)) for a, b in zip(starts, ends, strict=True)
                )
                flags = _flags(rows)
                if len(starts) == 1:  # the one run is the span
                    run.span[side] = (lo, hi, rows, flags)
                return rows, flags
            span = (lo, lo - 1, _concat_rows(table.schema.columns, []), np.zeros(0, dtype=bool))
        first, last, rows, flags = span
        if first <= lo and hi <= last:
            return rows, flags
        # The flags are kept apart, so that matches set them in place; those
        # of the rows read before keep what this batch's matches set.
        parts, marks = [rows], [flags]
        if lo < first:
            below = table.scan_batch(start=(lo,), end=(first,))
            parts.insert(0, below)
            marks.insert(0, _flags(below))
        if hi > last:
            above = table.scan_batch(start=(last + 1,), end=(hi + 1,))
            parts.append(above)
            marks.append(_flags(above))
        rows = _concat_rows(table.schema.columns, parts)
        flags = np.concatenate(marks)
        run.span[side] = (min(lo, first), max(hi, last), rows, flags)
        return rows, flags

    @staticmethod
    def _flag_matched(
        table: StateTable,
        stored: pa.RecordBatch,
        stored_flags: npt.NDArray[np.bool_],
        held: _Held,
        met: npt.NDArray[np.int64],
    ) -> int:
        """Set the matched flag of the candidates at ``met`` that lack it:
        in the table for a committed row, in place for a held-back one;
        returns how many changed."""
        met = np.unique(met)
        n = stored.num_rows
        at = met[met < n]
        first = at[~stored_flags[at]]
        if len(first):
            rows = stored.take(first)
            rows = rows.set_column(
                rows.num_columns - 1,
                rows.schema.field(rows.num_columns - 1),
                pa.array(np.ones(len(first), dtype=bool)),
            )
            table.update_batch(rows)
            stored_flags[first] = True
        mine = met[met >= n] - n
        new = mine[~held.flags[mine]]
        held.flags[new] = True
        return len(first) + len(new)

    def _hold(
        self,
        run: _Run,
        side: int,
        batch: pa.RecordBatch,
        times: npt.NDArray[np.int64],
        found: npt.NDArray[np.bool_],
    ) -> None:
        """Hold the rows of ``batch`` back as ``side``'s rows of this batch
        (each with a new seq), to be stored at the close: until then the
        tables take no write, so that their reads need no merge."""
        n = batch.num_rows
        if not n:
            return
        state = self.sides[side]
        first = run.next_seq
        run.next_seq = first + n
        buckets = self.time.bucket(times)
        stamps = pa.array(buckets, type=pa.int64())
        seqs = pa.array(np.arange(first, first + n, dtype=np.int64))
        inputs = [batch.column(f.name) for f in self.inputs[side]]
        rows = pa.RecordBatch.from_arrays(
            [stamps, seqs, *inputs, pa.array(found, type=pa.bool_())],
            schema=state.rows.columns,
        )
        held = run.held[side]
        held.rows.append(rows)
        held.flags = np.concatenate([held.flags, found])
        held.buckets = np.concatenate([held.buckets, np.asarray(buckets, dtype=np.int64)])

    def _store(self, ctx: OperatorContext, side: int, held: _Held, at: slice | None) -> None:
        """Insert the held-back rows of ``side`` (those ``at``, or all) into
        its table, one batch insert (no reads: every seq is new)."""
        if not held.rows:
            return
        state = self.sides[side]
        rows = _concat_rows(state.rows.columns, held.rows)
        flags = pa.array(held.flags, type=pa.bool_())
        rows = rows.set_column(rows.num_columns - 1, state.rows.columns.field(-1), flags)
        buckets = held.buckets
        if at is not None:
            rows, buckets = rows.filter(at), buckets[at]
        if not len(buckets):
            return
        ctx.table(state.rows.name).insert_batch(rows)
        lowest = int(np.min(buckets))
        floor = self._floor(ctx, side)
        if floor is None or lowest < floor:
            ctx.table(FLOORS.name).upsert((side, lowest))

    def close(self, ctx: OperatorContext) -> None:
        """Store the batch's rows, evict each side's rows at or below its
        state watermark (step 3); count the state. A held-back row that is
        evicted at once is stored before the eviction, the others after it,
        so that the eviction's reads merge no more than they must."""
        run = self._runs.pop(id(ctx), None) or _Run(0)
        stored = evicted = 0
        started = time.perf_counter_ns()
        cuts: list[int | None] = [None, None]
        for side in (0, 1):
            held = run.held[side]
            if ctx.watermark is None:
                continue
            cut = self.time.state_watermark(side, ctx.watermark)
            cuts[side] = cut
            early = held.buckets <= cut
            if early.any():
                self._store(ctx, side, held, pa.array(early))
        stored += time.perf_counter_ns() - started
        for side, at in enumerate(cuts):
            if at is not None:
                started = time.perf_counter_ns()
                self._evict(ctx, side, at)
                evicted += time.perf_counter_ns() - started
        started = time.perf_counter_ns()
        for side, at in enumerate(cuts):
            held = run.held[side]
            if at is None:
                self._store(ctx, side, held, None)
            else:
                late = held.buckets > at
                if late.any():
                    self._store(ctx, side, held, pa.array(late))
        stored += time.perf_counter_ns() - started
        # The runner's allUpdatesTimeMs and allRemovalsTimeMs see neither.
        ctx.count(STORE_TIME, stored // 1_000_000)
        ctx.count(EVICTION_TIME, evicted // 1_000_000)
        for side in (0, 1):
            rows = ctx.table(self.sides[side].rows.name)
            ctx.count(side_metric(SIDE_NAMES[side], TOTAL), rows.row_count)

    @staticmethod
    def _floor(ctx: OperatorContext, side: int) -> int | None:
        row = ctx.table(FLOORS.name).get_row((side,))
        return None if row is None else int(row[1])

    def _evict(self, ctx: OperatorContext, side: int, cut: int) -> None:
        """Remove ``side``'s rows stored at or below ``cut``: the time leads
        their key, so an inner side's go by one range delete, never read; an
        outer side's are read first by one range scan, to pad the unmatched."""
        table = ctx.table(self.sides[side].rows.name)
        floor = self._floor(ctx, side)
        if floor is None or floor > cut:
            return
        padded = 0
        if side in self.outer_sides:
            evicting = table.scan_batch(start=(floor,), end=(cut + 1,))
            padded = self._pad_unmatched(ctx, side, evicting)
        evicted = table.clean_below(cut + 1, start=floor)
        # Nothing at or below the cut is left: the floor moves above it.
        ctx.table(FLOORS.name).upsert((side, cut + 1))
        if not evicted:
            return
        name = SIDE_NAMES[side]
        ctx.count(side_metric(name, EVICTED), evicted)
        ctx.count(side_metric(name, REMOVED), evicted)
        ctx.count(PADDED, padded)

    def _pad_unmatched(self, ctx: OperatorContext, side: int, stored: pa.RecordBatch) -> int:
        """Emit the ``stored`` rows of outer ``side`` (being evicted) that
        never matched, padded with nulls; returns how many."""
        unmatched = stored.filter(pc.invert(stored.column(stored.num_columns - 1)))
        if not unmatched.num_rows:
            return 0
        n = int(unmatched.num_rows)
        mine = [unmatched.column(f.name) for f in self.inputs[side]]
        padding = [pa.nulls(n, type=f.type) for f in self.inputs[1 - side]]
        ctx.emit_batch([*mine, *padding] if side == 0 else [*padding, *mine])
        return n


#: Column names of the hash join between a batch and the stored rows.
_ROW, _LO, _HI = "__row", "__lo", "__hi"
_CANDIDATE = "__candidate"


class _Held:
    """One side's rows of the batch in progress, held back until its close:
    the rows as the table takes them, and per row its matched flag (set in
    place as the other side meets it) and its time."""

    __slots__ = ("buckets", "flags", "rows")

    def __init__(self) -> None:
        self.rows: list[pa.RecordBatch] = []
        self.flags: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)
        self.buckets: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)


class _Run:
    """What one batch run (one context) keeps between its calls: the next
    free seq (seqs only tell apart rows of one key and time in one
    partition's state), each side's held-back rows, and each side's last
    committed rows read by one scan: their least and greatest time reached
    (inclusive), the rows and their matched flags."""

    __slots__ = ("held", "next_seq", "span")

    def __init__(self, next_seq: int) -> None:
        self.next_seq = next_seq
        self.held = (_Held(), _Held())
        self.span: list[_Span | None] = [None, None]


#: Committed rows of one side read by one scan: from, to (µs, inclusive),
#: the rows, their matched flags.
_Span = tuple[int, int, pa.RecordBatch, npt.NDArray[np.bool_]]


def _runs_of(
    los: npt.NDArray[np.int64], his: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The inclusive ranges ``[los[i], his[i]]`` merged where they overlap
    or touch: the starts and ends of the disjoint runs, in order."""
    order = np.argsort(los, kind="stable")
    los, his = los[order], his[order]
    reach = np.maximum.accumulate(his)
    # A run starts where a range begins past every earlier range's end + 1.
    new = np.ones(len(los), dtype=bool)
    new[1:] = los[1:] > reach[:-1] + 1
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, len(los) - 1)
    return los[firsts], reach[lasts]


def _positions(column: pa.ChunkedArray) -> npt.NDArray[np.int64]:
    """A column of row positions (int64, no nulls) as a numpy array."""
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _flags(rows: pa.RecordBatch) -> npt.NDArray[np.bool_]:
    """The matched flags (the last column) of stored rows, as a writable array."""
    return np.array(rows.column(rows.num_columns - 1), dtype=bool)


def _concat_rows(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """``batches`` of ``schema`` as one batch."""
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return pa.concat_batches(batches)


def _key(i: int) -> str:
    """The name of join key column ``i`` on both sides of the hash join."""
    return f"__key{i}"


def _any_null(columns: Sequence[pa.Array]) -> pa.BooleanArray | None:
    """Which rows have a null in any of ``columns`` (``None``: no row has)."""
    masks = [c.is_null() for c in columns if c.null_count]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = pc.or_(out, m)
    return out


def _tuples(batch: pa.RecordBatch, names: Sequence[str]) -> list[tuple[Any, ...]]:
    """The named columns of ``batch`` as row tuples (for the extra condition)."""
    return list(zip(*(batch.column(n).to_pylist() for n in names), strict=True))
