"""Spark's streaming deduplication: ``dropDuplicates(cols)``
(``StreamingDeduplicateExec``) and ``dropDuplicatesWithinWatermark(cols)``
(``StreamingDeduplicateWithinWatermarkExec``), with Spark's exact rules:

- a row is late, and dropped, when its event time is ``<=`` the *previous*
  batch's watermark (Spark judges late rows by the watermark of the batch
  before, and evicts state at the current one);
- the first row of a key is emitted and its key stored; every later row of
  the key is a duplicate and dropped;
- ``DropDuplicates`` with the event-time column among its key columns evicts a
  key once its event time is ``<=`` the watermark; ``DropDuplicatesWithinWatermark``
  evicts a key once ``event time + delay <= watermark``, after which the same
  key is emitted again.

Spark scans its whole state to evict. Here eviction costs what it evicts: the
event time leads the state key of ``DropDuplicates`` (one range delete), and
``DropDuplicatesWithinWatermark`` keeps an expiry index ``(expires_at, key)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from encoding import TableSchema
from operators._operator import Operator, OperatorContext
from operators.dedup._columns import (
    ExpiryIndex,
    check_columns,
    column_lists,
    event_micros,
    expiry_schema,
    reject_changelog,
    rows_of,
)
from statestore import ConsistencyMode

__all__ = ["DropDuplicates", "DropDuplicatesWithinWatermark"]

Row = tuple[Any, ...]

#: Spark's names for the counters.
DROPPED = "numDroppedDuplicateRows"
LATE = "numRowsDroppedByWatermark"
_EVENT_US = "event_time_us"


class _FirstRowPerKey(Operator):
    """What both of Spark's operators share: drop late rows, emit the first row
    of each key not in state, store it; the subclass says what a stored key
    holds and how it is evicted."""

    consistency = ConsistencyMode.UNCHECKED

    def __init__(
        self, schema: pa.Schema, columns: Sequence[str], event_time: str | None, name: str
    ) -> None:
        check_columns(schema, columns, "deduplication")
        if event_time is not None:
            check_columns(schema, [event_time], "event-time")
            if not pa.types.is_timestamp(schema.field(event_time).type):
                raise ValueError(
                    f"event-time column {event_time!r} has type "
                    f"{schema.field(event_time).type}; it must be a timestamp"
                )
        self.name = name
        self.columns = list(columns)
        self.event_time = event_time
        self.inputs = [schema]
        self.output = schema

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Late rows out, then one multi-get for the batch's distinct keys; the
        first row of each key not stored is emitted and its key stored."""
        reject_changelog(batch, self.name, "is Spark's append-only deduplication")
        n = batch.num_rows
        rows = rows_of(column_lists(batch, self.inputs[0].names), n)
        keys = rows_of(column_lists(batch, self.columns), n)
        times: list[int] | None = None
        if self.event_time is not None:
            times = event_micros(batch, self.event_time, self.name)
            late_mark = ctx.previous_watermark
            if late_mark is not None:
                bound = late_mark * 1000
                kept = [i for i, t in enumerate(times) if t > bound]
                if len(kept) < n:
                    ctx.count(LATE, n - len(kept))
                    rows = [rows[i] for i in kept]
                    keys = [keys[i] for i in kept]
                    times = [times[i] for i in kept]
        first: dict[Row, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        state_keys = [self._state_key(key, times, i) for key, i in first.items()]
        stored = ctx.table("seen").get_rows(state_keys)
        new = [i for i, s in zip(first.values(), stored, strict=True) if s is None]
        ctx.count(DROPPED, len(rows) - len(new))
        if new:
            self._store(ctx, [keys[i] for i in new], [times[i] for i in new] if times else None)
            for i in new:
                ctx.emit(rows[i])

    def _state_key(self, key: Row, times: list[int] | None, i: int) -> Row:
        return key

    def _store(self, ctx: OperatorContext, keys: list[Row], times: list[int] | None) -> None:
        raise NotImplementedError


class DropDuplicates(_FirstRowPerKey):
    """Spark's ``withWatermark(event_time, ...).dropDuplicates(columns)``, or
    without ``event_time`` a plain ``dropDuplicates(columns)``.

    With ``event_time`` late rows are dropped; when ``event_time`` is also one
    of ``columns``, a key is evicted once its event time is ``<=`` the
    watermark (else state grows with the number of keys, as in Spark)."""

    def __init__(
        self,
        schema: pa.Schema,
        columns: Sequence[str],
        event_time: str | None = None,
        name: str = "drop_duplicates",
    ) -> None:
        super().__init__(schema, columns, event_time, name)
        self.evicts = event_time is not None and event_time in columns
        fields = [schema.field(c) for c in columns]
        if self.evicts:
            # The event time (in microseconds) leads the key: eviction is a
            # range delete of the keys below the watermark.
            others = [f for f in fields if f.name != event_time]
            fields = [pa.field(_EVENT_US, pa.int64(), nullable=False), *others]
            self._others = [i for i, c in enumerate(columns) if c != event_time]
        self.tables = [TableSchema(1, fields, [f.name for f in fields], name="seen")]

    def _state_key(self, key: Row, times: list[int] | None, i: int) -> Row:
        if not self.evicts:
            return key
        assert times is not None
        return (times[i], *(key[j] for j in self._others))

    def _store(self, ctx: OperatorContext, keys: list[Row], times: list[int] | None) -> None:
        table = ctx.table("seen")
        for i, key in enumerate(keys):
            table.insert(self._state_key(key, times, i))

    def on_watermark(self, ctx: OperatorContext, watermark: int) -> None:
        """Evict every key whose event time is ``<=`` the watermark."""
        if self.evicts:
            ctx.table("seen").clean_below(watermark * 1000 + 1)


class DropDuplicatesWithinWatermark(_FirstRowPerKey):
    """Spark's ``withWatermark(event_time, delay).dropDuplicatesWithinWatermark(columns)``:
    a key's entry expires at its first row's event time + ``delay_ms``; once
    the watermark reaches that, the key is evicted and its next row emitted
    again. Rows are late as for :class:`DropDuplicates`."""

    def __init__(
        self,
        schema: pa.Schema,
        columns: Sequence[str],
        event_time: str,
        delay_ms: int,
        name: str = "drop_duplicates_within_watermark",
    ) -> None:
        super().__init__(schema, columns, event_time, name)
        if delay_ms < 0:
            raise ValueError(f"delay_ms is a number of milliseconds >= 0, got {delay_ms}")
        self.delay_us = delay_ms * 1000
        fields = [schema.field(c) for c in columns]
        seen = [*fields, pa.field("expires_at", pa.int64(), nullable=False)]
        self.tables = [
            TableSchema(1, seen, list(columns), name="seen"),
            expiry_schema(2, fields, "expiry"),
        ]

    def _store(self, ctx: OperatorContext, keys: list[Row], times: list[int] | None) -> None:
        assert times is not None
        table = ctx.table("seen")
        index = ExpiryIndex(ctx.table("expiry"))
        for key, t in zip(keys, times, strict=True):
            expires = t + self.delay_us
            table.insert((*key, expires))
            index.move(key, None, expires)

    def on_watermark(self, ctx: OperatorContext, watermark: int) -> None:
        """Evict every key with ``expires_at <= watermark`` through the index."""
        ExpiryIndex(ctx.table("expiry")).expire(watermark * 1000, ctx.table("seen"))
