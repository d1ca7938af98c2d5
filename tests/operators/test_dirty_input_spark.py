"""Dirty input on Spark: the join -> aggregate pipeline of
tests/operators/_dirty_work.py under each unknown-retractions policy, as in
the harness, checked against Spark SQL over the valid rows; a malformed
change log under each bad-rows setting."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _dirty_work import (
    APPLIED,
    BAD,
    BATCHES,
    CHANGES,
    GOOD_AND_BAD,
    KIND,
    ORDERS,
    RESULT,
    TOTALS,
    USERS,
    batch_sql,
    build,
    changes,
    totals,
    totals_sql,
)
from pyarrow.fs import LocalFileSystem

from operators import InputError, ParquetSink, Pipeline, RelstateQuery
from operators._checkpoint.dead_letters import DeadLetters
from operators._checkpoint.journal import Journal
from operators._checkpoint.location import StateLocation
from operators._tools.demo import materialised, read_batches, write_batches
from operators._tools.inspect import describe
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


def _totals(spark: Any, root: Path, **options: Any) -> ParquetSink:
    """The per-customer totals over the malformed change log, run to the end."""
    if not (root / "changes").exists():
        write_batches(root / "changes", [changes(b) for b in GOOD_AND_BAD], prefix="part")
    pipeline = Pipeline()
    stream = pipeline.source(
        read_batches(spark, root / "changes", CHANGES.append(KIND)), "orders", sequence="seq"
    )
    sink = ParquetSink(str(root / "out"))
    output = totals(pipeline, stream)
    pipeline.start(
        output, sink, str(root / "checkpoint"), 2, trigger={"availableNow": True}, **options
    ).awaitTermination()
    return sink


class TestBadRowsOnSpark:
    def test_malformed_row_kinds_fail_or_are_set_aside(
        self, spark: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
    ) -> None:
        """A file with unknown row kinds fails its batch by default, the
        error naming the source as the user named it, with no Spark ERROR
        traceback printed before it; with bad_rows='set_aside' the query
        finishes, the dead-letter table under the checkpoint holds exactly
        the bad rows, the result equals Spark SQL over the good rows,
        relstate inspect counts them, and a restart changes nothing."""
        capfd.readouterr()
        with pytest.raises(
            InputError,
            match=r"source 'orders' \(input 0 of stage 'per_customer'\): unknown row kind.*"
            "nothing of this batch",
        ):
            _totals(spark, tmp_path / "fail")
        printed = capfd.readouterr().err
        assert "terminated with error" not in printed and "Traceback" not in printed
        root = tmp_path / "set_aside"
        sink = _totals(spark, root, bad_rows="set_aside")
        result = materialised([r.asDict() for r in sink.read(spark).collect()], TOTALS)
        assert result == totals_sql(spark)
        state = root / "checkpoint" / "state"
        dead = DeadLetters(LocalFileSystem(), str(state / "dead-letters"))
        table = dead.read()
        assert {
            (json.loads(r["row"])["row_kind"], json.loads(r["row"])["order_id"], r["batch_id"])
            for r in table.to_pylist()
        } == {(kind, order, 1) for kind, order in BAD}
        assert "rows set aside (in dead-letters/): per_customer 2" in describe(
            StateLocation(str(state))
        )
        output = sorted(map(str, sink.read(spark).collect()))
        _totals(spark, root, bad_rows="set_aside")  # a restart: every batch is done
        assert dead.read().equals(table)
        assert sorted(map(str, sink.read(spark).collect())) == output
