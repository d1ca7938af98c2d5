"""Spark's state-row metrics over an operator's tables: auxiliary tables (an
index beside the rows it points at, the timers) do not count."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from encoding import TableSchema
from operators._api.changelog import RowKind
from operators._api.operator import Operator, OperatorContext, TimeDomain, Timer
from operators._engine.task import TIMERS
from operators.testing import OperatorHarness

KEY = pa.field("k", pa.int64(), nullable=False)
TIME = pa.field("t", pa.int64(), nullable=False)


class Indexed(Operator):
    """Stores ``(k, t)`` rows with an auxiliary index ``(t, k)`` and a timer
    per row; ``-D`` deletes the row and its index entry."""

    name = "indexed"
    inputs = (pa.schema([KEY, TIME]),)
    output = pa.schema([KEY])
    tables = (
        TableSchema(1, [KEY, TIME], ["k"], name="rows"),
        TableSchema(2, [TIME, KEY], ["t", "k"], name="by_time", auxiliary=True),
    )

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        k, t = row
        if kind.is_retract:
            ctx.table("rows").delete(row)
            ctx.table("by_time").delete((t, k))
            return
        ctx.table("rows").insert(row)
        ctx.table("by_time").insert((t, k))
        ctx.register_timer(Timer(t, str(k), TimeDomain.PROCESSING_TIME))


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each test runs on the in-memory backend and on RocksDB."""
    return str(request.param)


class TestStateMetrics:
    def test_auxiliary_tables_do_not_count(self, backend: str) -> None:
        """A key with an index entry and a timer counts as one state row when
        written and one when removed."""
        with OperatorHarness(Indexed(), backend=backend) as h:
            h.set_processing_time(0)
            h.process_rows([(1, 10), (2, 20)])
            h.commit()
            m = h.last_metrics
            assert (m["numTotalStateRows"], m["numUpdatedStateRows"]) == (2, 2)
            h.process_rows([(1, 10)], [RowKind.DELETE])
            h.commit()
            m = h.last_metrics
            assert (m["numTotalStateRows"], m["numRemovedStateRows"]) == (1, 1)
            assert h.table("by_time").row_count == 1

    def test_marks(self) -> None:
        """The timer table is auxiliary; a table is not unless marked, and a
        schema change keeps the mark."""
        assert TIMERS.auxiliary
        rows, index = Indexed.tables
        assert not rows.auxiliary
        assert index.with_columns(pa.schema([TIME, KEY, pa.field("x", pa.int8())])).auxiliary
