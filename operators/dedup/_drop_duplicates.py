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

import abc
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from encoding import TableSchema, key_equal_values
from operators._api.operator import Operator, OperatorContext
from operators._api.ttl import live_from
from operators.dedup._columns import (
    ExpiryIndex,
    check_columns,
    check_watermark,
    event_micros,
    expiry_schema,
    reject_changelog,
)
from operators.errors import InputError
from statestore import ConsistencyMode

if TYPE_CHECKING:
    from operators._api.watermark import Watermark

__all__ = ["DropDuplicates", "DropDuplicatesWithinWatermark"]


#: Spark's names for the counters.
DROPPED = "numDroppedDuplicateRows"
LATE = "numRowsDroppedByWatermark"
_EVENT_US = "event_time_us"
#: A row's position in its batch, while the first row of each key is sought.
_ROW = "__row"


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
                raise InputError(
                    f"event-time column {event_time!r} has type "
                    f"{schema.field(event_time).type}; it must be a timestamp"
                )
        self.name = name
        self.columns = list(columns)
        #: Where each column of the state key comes from among ``columns``.
        self.state_order = list(range(len(columns)))
        self.event_time = event_time
        self.inputs = [schema]
        self.output = schema
        #: The names of the state key's columns, in state key order.
        self.key_names = [f.name for f in self.key_fields()]

    def key_fields(self) -> list[pa.Field]:
        """The key columns as state holds them: the event time in microseconds."""
        schema = self.inputs[0]
        return [
            pa.field(c, pa.int64(), nullable=False) if c == self.event_time else schema.field(c)
            for c in self.columns
        ]

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Late rows out, then one multi-get for the batch's distinct keys; the
        first row of each key not stored is emitted and its key stored. The
        batch is worked column by column: no row becomes a Python object."""
        reject_changelog(batch, self.name, "is Spark's append-only deduplication")
        times: npt.NDArray[np.int64] | None = None
        if self.event_time is not None:
            times = event_micros(batch, self.event_time, self.name)
            late_mark = ctx.previous_watermark
            if late_mark is not None:
                kept = times > late_mark * 1000
                late = batch.num_rows - int(np.count_nonzero(kept))
                if late:
                    ctx.count(LATE, late)
                    batch = batch.filter(pa.array(kept))
                    times = times[kept]
        if not batch.num_rows:
            ctx.count(DROPPED, 0)
            return
        keys = self._state_keys(batch, times)
        new = self._unseen_firsts(ctx, keys)
        ctx.count(DROPPED, batch.num_rows - len(new))
        if not len(new):
            return
        self._store(ctx, keys.take(new), None if times is None else times[new])
        out = batch.take(pa.array(new))
        ctx.emit_batch([out.column(n) for n in self.inputs[0].names])

    def _state_keys(self, batch: pa.RecordBatch, times: npt.NDArray[np.int64] | None) -> pa.Table:
        """The batch's keys as state keys them: its key columns in state key
        order, the event time in microseconds, under the state's names."""
        arrays = [
            pa.array(times)
            if self.columns[i] == self.event_time
            else key_equal_values(batch.column(self.columns[i]))
            for i in self.state_order
        ]
        return pa.table(arrays, names=self.key_names)

    def _unseen_firsts(self, ctx: OperatorContext, keys: pa.Table) -> npt.NDArray[np.int64]:
        """The positions, in order, of the first row of each key that state
        has not seen."""
        rows = keys.append_column(_ROW, pa.array(np.arange(keys.num_rows)))
        firsts = rows.group_by(keys.column_names, use_threads=False).aggregate([(_ROW, "min")])
        at = np.sort(np.asarray(firsts.column(f"{_ROW}_min"), dtype=np.int64))
        seen = np.array(ctx.table("seen").contains(keys.take(at)), dtype=bool)
        unseen: npt.NDArray[np.int64] = at[~seen]
        return unseen

    @abc.abstractmethod
    def _store(
        self, ctx: OperatorContext, keys: pa.Table, times: npt.NDArray[np.int64] | None
    ) -> None:
        """Store the new keys (state key columns) with their event times."""

    def check_watermarks(self, watermarks: Mapping[int, Watermark]) -> None:
        """The query's watermark must be on ``event_time`` (see check_watermark)."""
        check_watermark(self.name, self.event_time, watermarks)


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
        fields = self.key_fields()
        if self.evicts:
            # The event time (in microseconds) leads the key: eviction is a
            # range delete of the keys below the watermark.
            others = [f for f in fields if f.name != event_time]
            fields = [pa.field(_EVENT_US, pa.int64(), nullable=False), *others]
            at = list(columns).index(str(event_time))
            self.state_order = [at, *(i for i in range(len(columns)) if i != at)]
        names = [f.name for f in fields]
        self.key_names = names
        # With eviction the event time leads the key; the query's key is in the rest.
        by = names[1:] if self.evicts and len(names) > 1 else None
        self.tables = [TableSchema(1, fields, names, name="seen", partition_by=by)]

    def _store(
        self, ctx: OperatorContext, keys: pa.Table, times: npt.NDArray[np.int64] | None
    ) -> None:
        ctx.table("seen").insert_batch(keys)

    def on_watermark(self, ctx: OperatorContext, watermark: int) -> None:
        """Evict every key whose event time is ``<=`` the watermark."""
        if self.evicts:
            ctx.table("seen").clean_below(live_from(watermark * 1000))


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
            raise InputError(f"delay_ms is a number of milliseconds >= 0, got {delay_ms}")
        self.delay_us = delay_ms * 1000
        fields = self.key_fields()
        seen = [*fields, pa.field("expires_at", pa.int64(), nullable=False)]
        self.tables = [
            TableSchema(1, seen, list(columns), name="seen"),
            expiry_schema(2, fields, "expiry"),
        ]

    def _store(
        self, ctx: OperatorContext, keys: pa.Table, times: npt.NDArray[np.int64] | None
    ) -> None:
        assert times is not None
        expires = pa.array(times + self.delay_us)
        ctx.table("seen").insert_batch(keys.append_column("expires_at", expires))
        ExpiryIndex(ctx.table("expiry")).add_batch(keys, expires)

    def check_watermarks(self, watermarks: Mapping[int, Watermark]) -> None:
        """The query's watermark must be on ``event_time``, with ``delay_ms``."""
        check_watermark(self.name, self.event_time, watermarks, self.delay_us // 1000)

    def on_watermark(self, ctx: OperatorContext, watermark: int) -> None:
        """Evict every key with ``expires_at <= watermark`` through the index."""
        ExpiryIndex(ctx.table("expiry")).expire(watermark * 1000, ctx.table("seen"))
