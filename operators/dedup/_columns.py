"""Column helpers the deduplication operators share: input checks, key tuples,
event times in microseconds, and the expiry index that makes eviction cost
what it evicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from encoding import Row, TableSchema
from operators._api.changelog import RowKind, kinds_in
from operators._api.ttl import live_from
from operators.errors import InputError
from statestore import StateTable

if TYPE_CHECKING:
    from operators._api.watermark import Watermark

__all__ = [
    "ExpiryIndex",
    "check_columns",
    "check_watermark",
    "column_lists",
    "event_micros",
    "expiry_schema",
    "reject_changelog",
    "rows_of",
]


_MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}


def check_columns(schema: pa.Schema, names: Sequence[str], what: str) -> None:
    """Raise ``ValueError`` unless every name is a column of ``schema``."""
    if not names:
        raise InputError(f"name at least one {what} column")
    missing = [n for n in names if n not in schema.names]
    if missing:
        raise InputError(f"{what} column(s) {missing} are not in the input {schema.names}")
    if len(set(names)) != len(names):
        raise InputError(f"{what} columns {list(names)} name a column twice")


def check_watermark(
    operator: str,
    event_time: str | None,
    watermarks: Mapping[int, Watermark],
    delay_ms: int | None = None,
) -> None:
    """Raise :class:`InputError` unless the query's watermark on the input
    is on ``event_time`` (none without one) and, given ``delay_ms``, has that
    delay. Spark takes the event time, and the delay of
    ``dropDuplicatesWithinWatermark``, from ``withWatermark``; relstate's
    operators take them as arguments, so a mismatch would quietly give other
    rows than Spark."""
    mark = watermarks.get(0)
    if event_time is None:
        if mark is not None:
            raise InputError(
                f"operator {operator!r} has no event_time, but the query has a watermark on "
                f"{mark.column!r}; Spark's dropDuplicates drops rows late against it, so give "
                f"event_time={mark.column!r}, or run without the watermark"
            )
        return
    if mark is None:
        raise InputError(
            f"operator {operator!r} drops late rows and evicts by event time {event_time!r}, "
            "but the query has no watermark, so it would do neither; run it with "
            f"watermarks={{0: Watermark({event_time!r}, delay_ms)}}"
        )
    if mark.column != event_time:
        raise InputError(
            f"operator {operator!r} takes its event time from {event_time!r}, but the query's "
            f"watermark is on {mark.column!r}; put both on the same column"
        )
    if delay_ms is not None and mark.delay_ms != delay_ms:
        raise InputError(
            f"operator {operator!r} expires a key {delay_ms} ms after its event time, but the "
            f"watermark's delay is {mark.delay_ms} ms; Spark uses the watermark's delay for "
            f"both, so give delay_ms={mark.delay_ms}"
        )


def reject_changelog(batch: pa.RecordBatch, operator: str, why: str) -> None:
    """Raise :class:`InputError` if ``batch`` carries a row kind other than
    ``+I``; called before the batch touches state. An unknown row kind or a
    null raises ``EncodingError`` (see :func:`kinds_in`)."""
    kinds = kinds_in(batch)
    if kinds - {RowKind.INSERT}:
        raise InputError(
            f"operator {operator!r} {why}, so it takes an insert-only input (row kind "
            f"'+I'); this batch has row kinds {sorted(k.value for k in kinds)}. "
            "Deduplicate a changelog "
            "with keep='last' on processing time and changelog=True"
        )


def column_lists(batch: pa.RecordBatch, names: Sequence[str]) -> list[list[Any]]:
    """The named columns of ``batch`` as Python lists."""
    return [batch.column(n).to_pylist() for n in names]


def rows_of(columns: list[list[Any]], n: int) -> list[Row]:
    """Row tuples from column lists (``n`` empty tuples for no columns)."""
    return list(zip(*columns, strict=True)) if columns else [()] * n


def event_micros(batch: pa.RecordBatch, column: str, operator: str) -> npt.NDArray[np.int64]:
    """The event-time column as microseconds since the epoch (Spark's unit).

    Nulls are refused: a row without an event time can be neither late nor
    evicted."""
    array = batch.column(column)
    if array.null_count:
        raise InputError(
            f"operator {operator!r}: event-time column {column!r} holds nulls; every row "
            "needs an event time (filter or fill them first)"
        )
    kind = array.type
    if not pa.types.is_timestamp(kind):
        raise InputError(
            f"operator {operator!r}: event-time column {column!r} has type {kind}; "
            "expected a timestamp"
        )
    values = np.asarray(pc.cast(array, pa.int64()), dtype=np.int64)
    if kind.unit == "ns":
        # Spark's timestamps are microseconds; nanoseconds lose their last digits.
        return values // 1000
    return values * _MICROS_PER_UNIT[kind.unit]


def expiry_schema(table_id: int, key_fields: Sequence[pa.Field], name: str) -> TableSchema:
    """An index of ``(expires_at, key...)``: the keys that expire first come
    first, so eviction is a range scan of what expires and one range delete.
    Auxiliary: its entries are not state rows of their own."""
    fields = [pa.field("expires_at", pa.int64(), nullable=False), *key_fields]
    keys = [f.name for f in key_fields]
    return TableSchema(
        table_id, fields, [f.name for f in fields], name=name, partition_by=keys, auxiliary=True
    )


class ExpiryIndex:
    """The expiry index of a table keyed by ``key``: one entry per stored key
    at the time it expires, kept exact by every write."""

    def __init__(self, index: StateTable) -> None:
        self.index = index

    def move(self, key: Row, old: int | None, new: int | None) -> None:
        """Key ``key`` no longer expires at ``old`` but at ``new`` (``None``:
        not stored)."""
        if old == new:
            return
        if old is not None:
            self.index.delete((old, *key))
        if new is not None:
            self.index.insert((new, *key))

    def add_batch(self, keys: pa.Table, expires: pa.Array) -> None:
        """Enter the keys ``keys`` (the table's key columns, under their names),
        not yet in the index, to expire at ``expires`` (one time a key)."""
        self.index.insert_batch(keys.add_column(0, "expires_at", expires))

    def expire(self, now: int, table: StateTable) -> int:
        """Delete from ``table`` every key expired at ``now`` (its time is
        ``<= now``, :mod:`operators._api.ttl`), and their entries; returns how
        many keys were deleted."""
        live = live_from(now)
        # The entries carry the table's key columns under their names.
        expired = self.index.scan_batch(end=(live,))
        if not expired.num_rows:
            return 0
        table.delete_keys(expired)
        self.index.clean_below(live)
        return int(expired.num_rows)
