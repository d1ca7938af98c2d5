"""Flink's deduplication (seed 002): keep the first or the last row per key,
by processing time (arrival order) or by an event-time column (row time),
over an insert-only input or, keep-last on processing time, a changelog.

State is one row per key (the kept row, or for keep-first on processing time
only the key), plus, with state TTL, its expiry time and an expiry index. The
emit rules are those of ``operators.dedup._rules``; this module keeps state,
TTL and the mini-batch fold around them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from encoding import Row, TableSchema
from operators._api.changelog import RowKind, row_kinds
from operators._api.metrics import UNKNOWN_RETRACTIONS
from operators._api.operator import Operator, OperatorContext
from operators._api.ttl import expired, expiry_time
from operators.dedup._columns import (
    ExpiryIndex,
    check_columns,
    column_lists,
    expiry_schema,
    reject_changelog,
    rows_of,
)
from operators.dedup._rules import (
    CLEAR,
    KEEP,
    Emitted,
    State,
    first_on_proctime,
    keeps_on_rowtime,
    last_on_changelog,
    last_on_proctime,
    on_rowtime,
)
from operators.dedup._whole_batch import dedup_batch
from operators.errors import InputError
from statestore import ConsistencyMode, StateTable

__all__ = ["Deduplicate"]

#: One arrival to decide: its key, its row, its kind.
_Arrival = tuple[Row, Row, RowKind]

_EXPIRES = "__expires_at"
#: Counters (Spark's name where Spark has one); docs/operators/dedup.md,
#: Metrics. Duplicates and unknown retractions count the same with and
#: without mini-batch.
DROPPED = "numDroppedDuplicateRows"
UNKNOWN = UNKNOWN_RETRACTIONS
IDENTICAL = "numSuppressedIdenticalRows"
FOLDED = "numFoldedRows"


@dataclass(frozen=True)
class _Arrived:
    """A mini-batch's arrivals beyond those its fold decides: each key's
    positions (in fold order), and every row's kind and row time."""

    positions: list[list[int]]
    kinds: list[RowKind]
    times: list[Any] | None


class Deduplicate(Operator):
    """``ROW_NUMBER() OVER (PARTITION BY key ORDER BY time) = 1`` (Flink).

    ``keep`` is ``"first"`` or ``"last"``. ``order_by=None`` orders by
    processing time (arrival order; give ``sequence_column``, a column of
    ``schema``, to fix the order of a changelog inside a batch); a column
    name orders by that event-time column. ``generate_update_before`` and
    ``generate_insert`` are Flink's flags; ``changelog=True`` accepts
    ``-U``/``-D`` input (keep-last on processing time only). ``state_ttl_ms``
    expires a key that many milliseconds of processing time after its state
    was last written; an expired key behaves as new. ``mini_batch`` folds each
    key's rows of a batch first and touches state once per key; ``False``
    goes record at a time. Both materialise to the same table and count
    duplicates alike; docs/operators/dedup.md has the rules and counters.
    """

    consistency = ConsistencyMode.UNCHECKED

    def __init__(
        self,
        schema: pa.Schema,
        key: Sequence[str],
        keep: str = "last",
        order_by: str | None = None,
        generate_update_before: bool = False,
        generate_insert: bool = True,
        changelog: bool = False,
        state_ttl_ms: int | None = None,
        mini_batch: bool = True,
        sequence_column: str | None = None,
        name: str = "deduplicate",
    ) -> None:
        check_columns(schema, key, "key")
        if keep not in ("first", "last"):
            raise InputError(f"keep is 'first' or 'last', got {keep!r}")
        if order_by is not None:
            check_columns(schema, [order_by], "order_by")
        if sequence_column is not None:
            check_columns(schema, [sequence_column], "sequence")
        if changelog and (keep == "first" or order_by is not None):
            raise InputError(
                "a changelog input is deduplicated keeping the last row on processing time "
                "only (Flink's processLastRowOnChangelog); use keep='last' and order_by=None"
            )
        if state_ttl_ms is not None and state_ttl_ms <= 0:
            raise InputError(f"state_ttl_ms is a positive number of ms or None, got {state_ttl_ms}")
        self.name = name
        self.key = list(key)
        self.partition_keys = (tuple(key),)
        self.keep_last = keep == "last"
        self.order_by = order_by
        self.update_before = generate_update_before
        self.insert = generate_insert
        self.changelog = changelog
        self.ttl = state_ttl_ms
        self.mini_batch = mini_batch
        self.sequence_column = sequence_column
        self.inputs = [schema]
        self.output = schema
        self._key_index = [schema.names.index(k) for k in key]
        self._time_index = None if order_by is None else schema.names.index(order_by)
        # Keep-first on processing time only needs to know that a key was seen.
        self._marker_only = not self.keep_last and order_by is None
        # Keep-last on processing time without either flag needs no state at all.
        self._stateless = (self.keep_last and order_by is None and not changelog) and not (
            generate_update_before or generate_insert
        )
        # An append stream on processing time, folded, without TTL: the
        # rules reduce to one comparison per key, made in Arrow.
        self._whole_batch = (
            mini_batch and not changelog and order_by is None and state_ttl_ms is None
        ) and not self._stateless
        key_fields = [schema.field(k) for k in key]
        stored = key_fields if self._marker_only else list(schema)
        if self.ttl is not None:
            stored = [*stored, pa.field(_EXPIRES, pa.int64(), nullable=False)]
        tables = [TableSchema(1, stored, key, name="rows")]
        if self.ttl is not None:
            tables.append(expiry_schema(2, key_fields, "expiry"))
        self.tables = [] if self._stateless else tables

    # -- the batch ----------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        """With state TTL: delete every key expired by now, through the expiry
        index (the cost is the number of expired keys)."""
        if self.ttl is not None and not self._stateless:
            ExpiryIndex(ctx.table("expiry")).expire(ctx.processing_time, ctx.table("rows"))

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Check the input (before any state is touched), then decide each
        key's arrivals: folded per key (mini-batch) or one by one."""
        if not self.changelog:
            reject_changelog(batch, self.name, "keeps rows by insert order or row time")
        if self.order_by is not None and batch.column(self.order_by).null_count:
            raise InputError(
                f"operator {self.name!r}: order_by column {self.order_by!r} holds nulls; "
                "every row needs a row time"
            )
        if self._whole_batch:
            dedup_batch(
                ctx,
                ctx.table("rows"),
                batch,
                self.key,
                self.inputs[0].names,
                self.keep_last,
                self.update_before,
                (DROPPED, UNKNOWN, IDENTICAL, FOLDED),
            )
            return
        n = batch.num_rows
        kinds = row_kinds(batch) if self.changelog else [RowKind.INSERT] * n
        keys = rows_of(column_lists(batch, self.key), n)
        if not self.mini_batch:
            rows = rows_of(column_lists(batch, self.inputs[0].names), n)
            arrivals = [[a] for a in zip(keys, rows, kinds, strict=True)]
            if self._stateless:
                self._emit_stateless(ctx, arrivals)
            else:
                self._decide(ctx, arrivals)
            return
        times = None if self.order_by is None else batch.column(self.order_by).to_pylist()
        folded = self._fold(keys, kinds, times)
        # Only the rows that reach state become Python tuples.
        needed = sorted({i for kept, _ in folded for i in kept})
        taken = batch.take(pa.array(needed, pa.int64()))
        rows = rows_of(column_lists(taken, self.inputs[0].names), len(needed))
        row_at = dict(zip(needed, rows, strict=True))
        groups = [[(keys[i], row_at[i], kinds[i]) for i in kept] for kept, _ in folded]
        if self._stateless:
            ctx.count(FOLDED, n - len(needed))
            self._emit_stateless(ctx, groups)
        else:
            self._decide(ctx, groups, _Arrived([every for _, every in folded], kinds, times))

    def _emit_stateless(self, ctx: OperatorContext, groups: list[list[_Arrival]]) -> None:
        """Keep-last without either flag: every row is ``+U``, no state."""
        for group in groups:
            for _, row, _ in group:
                ctx.emit(row, RowKind.UPDATE_AFTER)

    def _fold(
        self, keys: list[Row], kinds: list[RowKind], times: list[Any] | None
    ) -> list[tuple[list[int], list[int]]]:
        """Per key, in order of first arrival: the positions of its arrivals
        that reach state, and of all its arrivals. Keep-first keeps its first
        row, keep-last its last, row time the row the rule keeps over the
        batch's others. On a changelog whose last row retracts, the last
        accumulate before it goes too: record at a time that row is emitted
        and then deleted, which also replaces a row downstream still holds
        from state that has expired since."""
        arrivals: dict[Row, list[int]] = {}
        for i, key in enumerate(keys):
            every = arrivals.get(key)
            if every is None:
                arrivals[key] = [i]
            else:
                every.append(i)
        return [(self._kept(every, kinds, times), every) for every in arrivals.values()]

    def _kept(self, every: list[int], kinds: list[RowKind], times: list[Any] | None) -> list[int]:
        """Which of one key's arrivals (positions, in order) reach state."""
        if times is not None:
            best = every[0]
            for i in every[1:]:
                if keeps_on_rowtime(times[best], times[i], self.keep_last):
                    best = i
        else:
            best = every[-1] if self.keep_last else every[0]
        if self.changelog and kinds[best].is_retract:
            accumulates = [i for i in every if kinds[i].is_accumulate]
            if accumulates:
                return [accumulates[-1], best]
        return [best]

    def _decide(
        self,
        ctx: OperatorContext,
        groups: Sequence[Sequence[_Arrival]],
        arrived: _Arrived | None = None,
    ) -> None:
        """Run each group of one key's arrivals against the key's stored row
        (one multi-get for all keys in mini-batch mode, a read per row
        otherwise) and write the key once. ``arrived`` (mini-batch) says
        where all of each key's arrivals were, so that the rows the fold left
        out are counted as record at a time counts them."""
        table = ctx.table("rows")
        expiry = ExpiryIndex(ctx.table("expiry")) if self.ttl is not None else None
        now = ctx.processing_time
        stored_rows: list[Row | None] | None = None
        writes: _Writes | None = None
        if self.mini_batch:
            stored_rows = table.get_rows([g[0][0] for g in groups])
            writes = _Writes()
        counts = dict.fromkeys((DROPPED, UNKNOWN, IDENTICAL, FOLDED), 0)
        example: _Arrival | None = None  # the first retraction of an unknown key
        for i, group in enumerate(groups):
            key = group[0][0]
            stored = stored_rows[i] if stored_rows is not None else table.get_row(key)
            visible = first_visible = self._visible(stored, now)
            final: State = KEEP
            dropped = dict.fromkeys((DROPPED, UNKNOWN, IDENTICAL), 0)
            for arrival in group:
                _, row, kind = arrival
                emitted, state = self._rule(visible, row, kind)
                if not emitted:
                    why = self._dropped_as(kind)
                    dropped[why] += 1
                    if why is UNKNOWN and example is None:
                        example = arrival
                for out_kind, out_row in emitted:
                    ctx.emit(out_row, out_kind)
                if state is not KEEP:
                    final = state
                    visible = None if state is CLEAR else state  # type: ignore[assignment]
            self._write(table, expiry, key, stored, final, now, writes)
            counts[IDENTICAL] += dropped[IDENTICAL]
            if arrived is None:
                counts[DROPPED] += dropped[DROPPED]
                counts[UNKNOWN] += dropped[UNKNOWN]
                continue
            every = arrived.positions[i]
            duplicates, unknown = self._tally(first_visible, arrived, every)
            counts[DROPPED] += duplicates
            counts[UNKNOWN] += unknown
            # Rows record at a time would emit (or suppress), less those the
            # group did: the rows a later one replaced within the batch.
            decided = len(group) - dropped[DROPPED] - dropped[UNKNOWN]
            counts[FOLDED] += len(every) - duplicates - unknown - decided
        if writes is not None:
            writes.apply(table, expiry)
        unknown = counts.pop(UNKNOWN)
        for name, n in counts.items():
            ctx.count(name, n)
        if unknown:
            # Nothing to apply: a key with no row has nothing to retract.
            # (Folded away in mini-batch mode, the example is a row of its key.)
            key, row, _ = example or next(
                (a for g in groups for a in g if a[2].is_retract), groups[0][0]
            )
            ctx.retracted_unknown(0, row, key, unknown)
        else:
            ctx.count(UNKNOWN, 0)

    def _dropped_as(self, kind: RowKind) -> str:
        """The counter of a row the rules drop: a retraction drops only when
        its key has no row; keep-last on processing time only an identical
        row (TTL off); the rest only a duplicate."""
        if kind.is_retract:
            return UNKNOWN
        if self.keep_last and self._time_index is None:
            return IDENTICAL
        return DROPPED

    def _tally(self, visible: Row | None, arrived: _Arrived, every: list[int]) -> tuple[int, int]:
        """How many of one key's arrivals (positions ``every``) record at a
        time would drop as duplicates, and how many retract a key with no
        row, from its visible row on: the rules of ``_rules`` on kinds and
        row times alone, which is all they look at to drop a row."""
        duplicates = unknown = 0
        if self.changelog:
            present = visible is not None
            for i in every:
                kind = arrived.kinds[i]
                if kind.is_retract and not present:
                    unknown += 1
                present = kind.is_accumulate
        elif self._time_index is not None:
            # order_by gives both the row times and their index.
            times = arrived.times
            assert times is not None
            best = None if visible is None else visible[self._time_index]
            for i in every:
                t = times[i]
                if best is None or keeps_on_rowtime(best, t, self.keep_last):
                    best = t
                else:
                    duplicates += 1
        elif not self.keep_last:
            duplicates = len(every) - (visible is None)
        return duplicates, unknown

    def _visible(self, stored: Row | None, now: int) -> Row | None:
        """The kept row of a stored one: ``None`` if absent or expired."""
        if stored is None or self.ttl is None:
            return stored
        if expired(stored[-1], now):
            return None
        return stored[:-1]

    def _rule(self, previous: Row | None, row: Row, kind: RowKind) -> tuple[Emitted, State]:
        ttl = self.ttl is not None
        if self._time_index is not None:
            return on_rowtime(
                previous, row, self._time_index, self.keep_last, self.update_before, self.insert
            )
        if self.changelog:
            return last_on_changelog(previous, row, kind, self.update_before, ttl)
        if self.keep_last:
            return last_on_proctime(previous, row, self.update_before, self.insert, ttl)
        return first_on_proctime(previous, row)

    def _write(
        self,
        table: StateTable,
        expiry: ExpiryIndex | None,
        key: Row,
        stored: Row | None,
        state: State,
        now: int,
        writes: _Writes | None = None,
    ) -> None:
        """Apply a rule's new state to the stored row of ``key``: at once, or,
        given ``writes`` (a mini-batch), when the batch's keys are decided."""
        if state is KEEP:
            return
        old_expiry = None if stored is None or expiry is None else stored[-1]
        if state is CLEAR:
            if stored is None:
                return
            if writes is not None:
                writes.delete(stored, key, old_expiry)
                return
            table.delete(stored)
            if expiry is not None:
                expiry.move(key, old_expiry, None)
            return
        assert isinstance(state, tuple)
        value = key if self._marker_only else state
        new_expiry = None
        if self.ttl is not None:
            new_expiry = expiry_time(now, self.ttl)
            value = (*value, new_expiry)
        if writes is not None:
            writes.put(stored, value, key, old_expiry, new_expiry)
            return
        if stored is None:
            table.insert(value)
        elif stored != value:
            table.update(stored, value)
        if expiry is not None:
            expiry.move(key, old_expiry, new_expiry)


class _Writes:
    """A mini-batch's writes, collected per key and applied as batch writes
    (each key is written once per mini-batch, so their order does not
    matter): the rows table's inserts, updates and deletes, and the expiry
    index's moves."""

    __slots__ = ("deletes", "expiry_in", "expiry_out", "inserts", "updates")

    def __init__(self) -> None:
        self.inserts: list[Row] = []
        self.updates: list[Row] = []
        self.deletes: list[Row] = []
        self.expiry_out: list[Row] = []
        self.expiry_in: list[Row] = []

    def put(
        self, stored: Row | None, value: Row, key: Row, old: int | None, new: int | None
    ) -> None:
        """Store ``value`` for ``key`` over ``stored``; its expiry moves from
        ``old`` to ``new``."""
        if stored is None:
            self.inserts.append(value)
        elif stored != value:
            self.updates.append(value)
        self._move(key, old, new)

    def delete(self, stored: Row, key: Row, old: int | None) -> None:
        """Delete ``stored``, the row of ``key`` that expired at ``old``."""
        self.deletes.append(stored)
        self._move(key, old, None)

    def _move(self, key: Row, old: int | None, new: int | None) -> None:
        if old == new:
            return
        if old is not None:
            self.expiry_out.append((old, *key))
        if new is not None:
            self.expiry_in.append((new, *key))

    def apply(self, table: StateTable, expiry: ExpiryIndex | None) -> None:
        """Write everything collected: one batch write of each kind."""
        columns = table.schema.columns
        if self.deletes:
            table.delete_batch(_batch(columns, self.deletes))
        if self.updates:
            table.update_batch(_batch(columns, self.updates))
        if self.inserts:
            table.insert_batch(_batch(columns, self.inserts))
        if expiry is None:
            return
        index = expiry.index
        if self.expiry_out:
            index.delete_batch(_batch(index.schema.columns, self.expiry_out))
        if self.expiry_in:
            index.insert_batch(_batch(index.schema.columns, self.expiry_in))


def _batch(schema: pa.Schema, rows: Sequence[Row]) -> pa.RecordBatch:
    """Row tuples in ``schema``'s column order as one Arrow batch."""
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)],
        schema=schema,
    )
