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

import bisect
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from operators._changelog import RowKind, row_kinds
from operators._operator import Operator, OperatorContext
from operators.errors import InputError
from operators.join._append_state import FLOORS, SIDE_NAMES, SideState, side_state
from operators.join._append_time import TimeRange, TimeWindows, event_time_micros
from operators.join._metrics import (
    EVICTED,
    LATE,
    MATCHED,
    PADDED,
    REMOVED,
    TOTAL,
    UPDATED,
    side_metric,
)
from operators.join._spec import JoinSpec, JoinType, output_schema
from statestore import ConsistencyMode, InconsistencyError, StateTable

__all__ = ["AppendJoin", "JoinCondition"]

#: An extra join condition over a (left row, right row) pair of input tuples.
JoinCondition = Callable[[tuple[Any, ...], tuple[Any, ...]], bool]

#: A seek into the state costs about as much as reading this many rows in order.
_SEEK_ROWS = 10


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
        self.inputs = [left, right]
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
        self.tables = [*(t for s in self.sides for t in (s.rows, s.index)), FLOORS]
        self.output = output_schema(spec, left_prefix, right_prefix)
        # The next free seq of each batch run in progress (by context): seqs
        # only tell apart rows of one key and time in one partition's state.
        self._next_seq: dict[int, int] = {}

    # -- the batch ---------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        self._next_seq[id(ctx)] = ctx.batch_id << 32

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Drop late rows, join the rest with the other side's state, store
        them (step 1 and 2 of the module docstring)."""
        name = SIDE_NAMES[side]
        retractions = sorted({k.value for k in row_kinds(batch)} - {RowKind.INSERT.value})
        if retractions:
            raise InputError(
                f"operator {self.name!r} joins append-only inputs (row kind '+I'); the "
                f"{name} input has row kinds {retractions}. Use the changelog join for them"
            )
        times = event_time_micros(batch.column(self.time_columns[side]), self.time_columns[side])
        late = ctx.previous_watermark
        if late is not None:
            cut = late * 1000
            lateness = self.time.lateness_time
            kept = [i for i, t in enumerate(times) if lateness(t) > cut]
            if len(kept) < len(times):
                ctx.count(side_metric(name, LATE), len(times) - len(kept))
                batch = batch.take(pa.array(kept, type=pa.int64()))
                times = [times[i] for i in kept]
        if batch.num_rows:
            self._join_and_store(ctx, side, batch, times)

    def _join_and_store(
        self, ctx: OperatorContext, side: int, batch: pa.RecordBatch, times: list[int]
    ) -> None:
        mine, other = self.sides[side], self.sides[1 - side]
        other_rows = ctx.table(other.rows.name)
        flag_other = (1 - side) in self.outer_sides
        names = self.inputs[side].names
        keys = [batch.column(names[p]).to_pylist() for p in mine.key_positions]
        # The batch's rows per join key: one scan of the other side per key.
        by_key: dict[tuple[Any, ...], list[int]] = {}
        for i, key in enumerate(zip(*keys, strict=True)):
            by_key.setdefault(key, []).append(i)
        bounds, condition, emit = self.time.other_bounds, self.condition, ctx.emit
        null_keys: list[int] = []
        wanted: dict[tuple[Any, ...], tuple[list[int], list[tuple[int, int]]]] = {}
        for key, members in by_key.items():
            if any(k is None for k in key):
                null_keys += members  # a null key meets nothing (SQL)
            else:
                wanted[key] = (members, [bounds(side, times[i]) for i in members])
        found_by_key = self._candidates(other_rows, other, wanted)
        lookups = [(*wanted[key], c) for key, c in found_by_key.items() if c]
        # Python tuples only of the rows that may match (timestamps are dear).
        needed = sorted(i for members, _, _ in lookups for i in members)
        taken = batch.take(pa.array(needed, type=pa.int64()))
        columns = [taken.column(n).to_pylist() for n in names]
        rows = dict(zip(needed, zip(*columns, strict=True), strict=True))
        found = [False] * batch.num_rows
        matched_pairs = flagged = 0
        for members, spans, candidates in lookups:
            stamps = [c[0] for c in candidates]
            hits: set[int] = set()
            for i, (start, end) in zip(members, spans, strict=True):
                row = rows[i]
                for j in range(bisect.bisect_left(stamps, start), bisect.bisect_right(stamps, end)):
                    theirs = SideState.input_of(candidates[j])
                    pair = (row, theirs) if side == 0 else (theirs, row)
                    if condition is not None and not condition(*pair):
                        continue
                    emit(pair[0] + pair[1])
                    found[i] = True
                    matched_pairs += 1
                    if flag_other and not SideState.matched(candidates[j]):
                        hits.add(j)
            for j in hits:
                other_rows.update(candidates[j], SideState.with_matched(candidates[j]))
                flagged += 1
        if null_keys and side not in self.outer_sides:
            # Only an outer side keeps a null-key row: to pad it at eviction.
            dropped = set(null_keys)
            keep = [i for i in range(batch.num_rows) if i not in dropped]
            batch = batch.take(pa.array(keep, type=pa.int64()))
            times, found = [times[i] for i in keep], [found[i] for i in keep]
        self._store(ctx, side, batch, times, found)
        ctx.count(MATCHED, matched_pairs)
        ctx.count(side_metric(SIDE_NAMES[1 - side], UPDATED), flagged)

    @staticmethod
    def _candidates(
        table: StateTable,
        state: SideState,
        wanted: dict[tuple[Any, ...], tuple[list[int], list[tuple[int, int]]]],
    ) -> dict[tuple[Any, ...], list[tuple[Any, ...]]]:
        """The stored rows of ``table`` in reach of each wanted key's rows,
        in time order: one bounded prefix scan per key, or, when the keys are
        many for the table's size, one pass over the whole table (a seek
        costs about as much as reading ten rows in order)."""
        reach = {
            key: (min(s[0] for s in spans), max(s[1] for s in spans))
            for key, (_, spans) in wanted.items()
        }
        if len(reach) * _SEEK_ROWS < table.row_count:
            return {
                key: list(table.scan(key, start=(lo,), end=(hi + 1,)))
                for key, (lo, hi) in reach.items()
            }
        out: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {key: [] for key in reach}
        positions = [2 + p for p in state.key_positions]
        for row in table.scan():
            key = tuple(row[p] for p in positions)
            bound = reach.get(key)
            if bound is not None and bound[0] <= row[0] <= bound[1]:
                out[key].append(row)
        return out

    def _store(
        self,
        ctx: OperatorContext,
        side: int,
        batch: pa.RecordBatch,
        times: list[int],
        found: list[bool],
    ) -> None:
        """Insert the rows of ``batch`` into the side's tables, two batch
        inserts (no reads: every seq is new)."""
        n = batch.num_rows
        if not n:
            return
        state = self.sides[side]
        first = self._next_seq.get(id(ctx), ctx.batch_id << 32)
        self._next_seq[id(ctx)] = first + n
        bucket = self.time.bucket
        stamps = pa.array([bucket(t) for t in times], type=pa.int64())
        seqs = pa.array(range(first, first + n), type=pa.int64())
        inputs = [batch.column(f.name) for f in self.inputs[side]]
        rows = pa.RecordBatch.from_arrays(
            [stamps, seqs, *inputs, pa.array(found, type=pa.bool_())],
            schema=state.rows.columns,
        )
        keys = [batch.column(self.inputs[side].names[p]) for p in state.key_positions]
        index = pa.RecordBatch.from_arrays([stamps, *keys, seqs], schema=state.index.columns)
        ctx.table(state.rows.name).insert_batch(rows)
        ctx.table(state.index.name).insert_batch(index)
        lowest = pc.min(stamps).as_py()
        floor = self._floor(ctx, side)
        if floor is None or lowest < floor:
            ctx.table(FLOORS.name).upsert((side, lowest))
        ctx.count(side_metric(SIDE_NAMES[side], UPDATED), n)

    def close(self, ctx: OperatorContext) -> None:
        """Evict each side's rows at or below its state watermark (step 3);
        count the state."""
        self._next_seq.pop(id(ctx), None)
        started = time.perf_counter_ns()
        for side in (0, 1):
            if ctx.watermark is not None:
                self._evict(ctx, side, self.time.state_watermark(side, ctx.watermark))
        # The runner's allRemovalsTimeMs covers timers and on_watermark only.
        ctx.count("evictionTimeMs", (time.perf_counter_ns() - started) // 1_000_000)
        for side in (0, 1):
            rows = ctx.table(self.sides[side].rows.name)
            ctx.count(side_metric(SIDE_NAMES[side], TOTAL), rows.row_count)

    @staticmethod
    def _floor(ctx: OperatorContext, side: int) -> int | None:
        row = ctx.table(FLOORS.name).get_row((side,))
        return None if row is None else int(row[1])

    def _evict(self, ctx: OperatorContext, side: int, cut: int) -> None:
        state = self.sides[side]
        index = ctx.table(state.index.name)
        floor = self._floor(ctx, side)
        if floor is None or floor > cut:
            return
        entries = list(index.scan(start=(floor,), end=(cut + 1,)))
        # Nothing at or below the cut is left: the floor moves above it.
        ctx.table(FLOORS.name).upsert((side, cut + 1))
        if not entries:
            return
        table = ctx.table(state.rows.name)
        pks = [state.pk_of_index(e) for e in entries]
        found = table.get_rows(pks)
        stored = [row for row in found if row is not None]
        if len(stored) < len(found):
            missing = next(pk for pk, row in zip(pks, found, strict=True) if row is None)
            raise InconsistencyError(
                f"operator {self.name!r}: the {SIDE_NAMES[side]} index names row {missing!r}, "
                "which is not stored; the state is corrupt, restore an earlier checkpoint",
                state.rows.name,
                missing,
            )
        columns = list(zip(*stored, strict=True))
        table.delete_batch(
            pa.RecordBatch.from_arrays(
                [
                    pa.array(c, type=f.type)
                    for c, f in zip(columns, state.rows.columns, strict=True)
                ],
                schema=state.rows.columns,
            )
        )
        padded = 0
        if side in self.outer_sides:
            padding = (None,) * self.sides[1 - side].width
            for row in stored:
                if not SideState.matched(row):
                    theirs = SideState.input_of(row)
                    ctx.emit(theirs + padding if side == 0 else padding + theirs)
                    padded += 1
        index.clean_below(cut + 1, start=floor)
        name = SIDE_NAMES[side]
        ctx.count(side_metric(name, EVICTED), len(stored))
        ctx.count(side_metric(name, REMOVED), len(stored))
        ctx.count(PADDED, padded)
