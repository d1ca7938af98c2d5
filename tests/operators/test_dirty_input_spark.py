"""Dirty input on Spark: the join -> aggregate pipeline of
tests/operators/_dirty_work.py under each unknown-retractions policy, as in
the harness, checked against Spark SQL over the valid rows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _dirty_work import APPLIED, BATCHES, KIND, ORDERS, RESULT, USERS, batch_sql, build
from pyarrow.fs import LocalFileSystem

from operators import InputError, ParquetSink, Pipeline, RelstateQuery
from operators._journal import Journal
from operators.demo import materialised, read_batches, write_batches
from statestore import capture_events

pytestmark = pytest.mark.spark


def _start(spark: Any, root: Path, **options: Any) -> tuple[ParquetSink, RelstateQuery]:
    """The pipeline over the scenario's two batches, run to the end."""
    if not (root / "orders").exists():
        write_batches(root / "orders", [o for o, _ in BATCHES], prefix="part")
        write_batches(root / "users", [u for _, u in BATCHES], prefix="part")
    pipeline = Pipeline()
    orders = pipeline.source(read_batches(spark, root / "orders", ORDERS), "orders")
    users = pipeline.source(
        read_batches(spark, root / "users", USERS.append(KIND)), "users", sequence="seq"
    )
    sink = ParquetSink(str(root / "out"))
    query = build(pipeline, orders, users)
    started = pipeline.start(
        query, sink, str(root / "checkpoint"), 2, trigger={"availableNow": True}, **options
    )
    return sink, started


def _result(spark: Any, sink: ParquetSink) -> Counter[Any]:
    return materialised([r.asDict() for r in sink.read(spark).collect()], RESULT)


class TestUnknownRetractionsOnSpark:
    def test_drop_and_apply(self, spark: Any, tmp_path: Path) -> None:
        """Under drop (the default) the result equals Spark SQL over the
        valid rows and the driver warns once, naming the stage and source;
        under apply it is Flink's join's, as in the harness."""
        with capture_events() as events:
            sink, query = _start(spark, tmp_path / "drop")
            query.awaitTermination()
        assert _result(spark, sink) == batch_sql(spark)
        warnings = [e for e in events if e["event"] == "relstate.unknown_retractions"]
        assert [(w["stage"], w["source"], w["batch_id"], w["count"]) for w in warnings] == [
            ("join", "source 'users' (input 1 of stage 'join')", 1, 2)
        ]
        assert query.history[1]["stages"]["join"]["right.numRetractionsOfUnknownRows"] == 2
        sink, query = _start(spark, tmp_path / "apply", unknown_retractions="apply")
        query.awaitTermination()
        assert _result(spark, sink) == APPLIED

    def test_fail_stops_the_batch(self, spark: Any, tmp_path: Path) -> None:
        """Under fail the second batch stops with the InputError naming the
        source, key and row; only the first batch is recorded."""
        _, query = _start(spark, tmp_path, unknown_retractions="fail")
        with pytest.raises(
            InputError,
            match=r"source 'users' \(input 1 of stage 'join'\): a retraction of a row the "
            r"stage does not hold with key \((3|4),\).*nothing of this batch was recorded",
        ):
            query.awaitTermination()
        journal = Journal(LocalFileSystem(), str(tmp_path / "checkpoint" / "state"))
        assert journal.latest() == 0
