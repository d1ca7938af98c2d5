"""Per-key running aggregates over a changelog, with retraction.

For each key: the count and sum of the values of the rows that currently
exist. A retraction (``-U``/``-D``) takes its row back out. The output is a
changelog of the aggregate row per key: ``+I`` for a new key, ``-U``/``+U`` when
it changes, ``-D`` when its last row is retracted.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from encoding import TableSchema
from operators._api.changelog import RowKind
from operators._api.operator import Operator, OperatorContext
from statestore import ConsistencyMode

__all__ = ["RunningAggregate"]


class RunningAggregate(Operator):
    """``SELECT key, COUNT(*), SUM(value) GROUP BY key`` over a changelog."""

    # Every write follows a get_row of its key, so the table need not read the
    # key again to check the write (tests run it strict all the same).
    consistency = ConsistencyMode.UNCHECKED

    def __init__(self, key_type: pa.DataType | None = None, name: str = "running_aggregate"):
        key_type = pa.string() if key_type is None else key_type
        self.name = name
        self.inputs = [pa.schema([("key", key_type), ("value", pa.int64())])]
        self.output = pa.schema([("key", key_type), ("count", pa.int64()), ("total", pa.int64())])
        self.tables = [
            TableSchema(
                1,
                pa.schema(
                    [
                        pa.field("key", key_type),
                        pa.field("count", pa.int64(), nullable=False),
                        pa.field("total", pa.int64(), nullable=False),
                    ]
                ),
                ["key"],
                name="aggregates",
            )
        ]

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        key, value = row
        table = ctx.table("aggregates")
        old = table.get_row((key,))
        count, total = (0, 0) if old is None else (old[1], old[2])
        sign = 1 if kind.is_accumulate else -1
        count, total = count + sign, total + sign * (value or 0)
        if old is None and sign < 0:
            ctx.count("retractionsOfUnknownKeys")
            ctx.log.warning("running_aggregate.unknown_retraction", key=repr(key))
            return
        new = (key, count, total)
        if old is None:
            table.insert(new)
            ctx.emit(new, RowKind.INSERT)
        elif count == 0:
            table.delete(old)
            ctx.emit(old, RowKind.DELETE)
        else:
            table.update(old, new)
            ctx.emit(old, RowKind.UPDATE_BEFORE)
            ctx.emit(new, RowKind.UPDATE_AFTER)
