"""Pipelines on Spark: two stages in one query against the harness and
against two queries, a keyed stage feeding a keyless one, crashes between and
inside stages, build-time errors, withWatermark and time zones, and what
Spark's monitoring shows."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _pipeline_job import run
from _pipeline_work import (
    KINDS,
    TOP,
    TOP_COLUMNS,
    SegmentRevenue,
    build,
    build_top,
    changes,
    harness_pipeline,
)
from pyarrow.fs import LocalFileSystem

from bench.revenue_pipeline import ORDERS, revenue_query, sources, write_changes
from operators import (
    InputError,
    Operator,
    OperatorContext,
    ParquetSink,
    Pipeline,
    RowKind,
    RunnerError,
    run_operator,
    stage_progress,
)
from operators._checkpoint.journal import Journal
from operators._checkpoint.location import StateLocation
from operators._spark import runner as _runner
from operators._tools.demo import join_orders, materialised, read_batches, write_batches
from operators._tools.inspect import describe
from operators._tools.repartition import repartition
from operators.examples import RunningAggregate
from operators.testing import PipelineHarness
from statestore import PartitionCheckpoint
from statestore._faults import arm

pytestmark = pytest.mark.spark


def _pickle_by_value() -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# Spark's Python workers cannot import this test module: ship _Echo by value.
_pickle_by_value()

REVENUE = ["key", "count", "total"]
HERE = Path(__file__).parent


def _per_batch(spark: Any, sink: ParquetSink) -> list[Counter[tuple[Any, ...]]]:
    """The sink's rows per batch, as multisets with their row kinds."""
    rows = sink.read(spark).collect()
    batches = sorted({r["batch"] for r in rows})
    return [
        Counter((*(r[c] for c in REVENUE), r["row_kind"]) for r in rows if r["batch"] == b)
        for b in batches
    ]


def _harness(work: list[tuple[pa.Table, pa.Table]], partitions: int = 3) -> list[Counter[Any]]:
    """The revenue stage's output per batch, run by the harness."""
    pipeline, _, revenue = harness_pipeline()
    out = []
    with PipelineHarness(pipeline, partitions) as harness:
        for o, c in work:
            rows = harness.run_batch({"orders": o, "customers": c})[revenue.name].to_pylist()
            out.append(Counter((*(r[k] for k in REVENUE), r["row_kind"]) for r in rows))
    return out


class TestTwoStages:
    def test_one_query_equals_the_harness_and_two_queries(self, spark: Any, tmp_path: Path) -> None:
        """A changelog join feeding a running aggregate, 3 partitions, 4
        batches of random changelogs, in one query: every batch's output
        equals the harness run of the same pipeline row for row, the batch
        ran as one Spark job (the join, read by the revenue stage alone, runs
        in its job) that took part of the batch's time in the driver
        (``jobs_ms`` within ``duration_ms``), and the two stages run as two queries (the second
        reading the first's output as a stream) give the same output batch
        by batch."""
        work = changes(seed=5, batches=4)
        write_changes(tmp_path, work)
        sink, query = run(spark, tmp_path, query_name="revenue_pipeline")
        got = _per_batch(spark, sink)
        assert got == _harness(work)
        tracker = spark.sparkContext.statusTracker()
        jobs = {
            stage: len(tracker.getJobIdsForGroup(f"relstate:revenue_pipeline:{stage}"))
            for stage in ("join", "revenue")
        }
        assert jobs == {"join": 0, "revenue": len(work)}
        assert query.last_metrics["numOutputRows"] == sum(got[-1].values())
        assert all(0 < b["jobs_ms"] <= b["duration_ms"] for b in query.history)

        # The same two stages as two queries, the second reading the first's output.
        first = Pipeline()
        joined_stream = join_orders(first, *sources(spark, tmp_path, first))
        join_sink = ParquetSink(str(tmp_path / "joined"))
        first.start(
            joined_stream,
            join_sink,
            str(tmp_path / "ck1"),
            3,
            trigger={"availableNow": True},
        ).awaitTermination()
        second_sink = ParquetSink(str(tmp_path / "revenue2"))
        revenue_query(
            spark,
            join_sink.path,
            SegmentRevenue(),
            partitions=3,
            checkpoint=str(tmp_path / "ck2"),
            sink=second_sink,
            trigger={"availableNow": True},
        ).awaitTermination()
        assert _per_batch(spark, second_sink) == got

    def test_more_outputs_each_get_their_stages_rows(self, spark: Any, tmp_path: Path) -> None:
        """more_outputs: the join stage's rows (read by a later stage too) go
        to a sink of their own beside the revenue stage's, both batch for
        batch equal to the harness run of the stages, committed with the
        batch; numOutputRows counts both outputs."""
        work = changes(seed=11, batches=3)
        write_changes(tmp_path, work)
        pipeline = Pipeline()
        joined, revenue = build(pipeline, *sources(spark, tmp_path, pipeline))
        revenue_sink = ParquetSink(str(tmp_path / "revenue"))
        join_sink = ParquetSink(str(tmp_path / "joined"))
        query = pipeline.start(
            revenue,
            revenue_sink,
            str(tmp_path / "checkpoint"),
            3,
            trigger={"availableNow": True},
            more_outputs=[(joined, join_sink)],
        )
        query.awaitTermination()
        got = _per_batch(spark, revenue_sink)
        assert got == _harness(work)
        harness, harness_join, _ = harness_pipeline()
        columns = list(harness_join.schema.names)
        want = []
        with PipelineHarness(harness, 3) as run_by_harness:
            for o, c in work:
                rows = run_by_harness.run_batch({"orders": o, "customers": c})["join"].to_pylist()
                want.append(Counter((*(r[k] for k in columns), r["row_kind"]) for r in rows))
        joined_rows = join_sink.read(spark).collect()
        assert [
            Counter(
                (*(r[k] for k in columns), r["row_kind"]) for r in joined_rows if r["batch"] == b
            )
            for b in range(len(work))
        ] == want
        last = query.history[-1]["metrics"]
        assert last["numOutputRows"] == sum(got[-1].values()) + sum(want[-1].values())

    def test_a_failed_job_leaves_no_frame_cached_by_a_stage_still_being_planned(
        self, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The join stage's job (its rows go to a sink and on to the revenue
        stage) fails while the revenue stage, whose rows a callback sink
        takes and which is therefore cached, is still being planned in the
        driver's planning thread: the batch fails with the job's error, and
        once it has, no frame of the batch is left cached, the revenue
        stage's included."""
        work = changes(seed=13, batches=1)
        write_changes(tmp_path, work)
        planned = threading.Event()
        plan_stage = _runner._Driver._plan_stage

        def slow_plan(self: Any, staged: Any, index: int) -> Any:
            if index == 1:
                time.sleep(1.0)  # outlasts the failing job below
            result = plan_stage(self, staged, index)
            if index == 1:
                planned.set()
            return result

        def failing_job(self: Any, result: Any, batch_id: int, stages: list[int]) -> Any:
            raise RunnerError("the join stage's job failed")

        monkeypatch.setattr(_runner._Driver, "_plan_stage", slow_plan)
        monkeypatch.setattr(_runner._Driver, "_committed", failing_job)
        pipeline = Pipeline()
        joined, revenue = build(pipeline, *sources(spark, tmp_path, pipeline))
        query = pipeline.start(
            revenue,
            lambda rows, batch_id: rows.count(),
            str(tmp_path / "checkpoint"),
            3,
            trigger={"availableNow": True},
            more_outputs=[(joined, ParquetSink(str(tmp_path / "joined")))],
        )
        with pytest.raises(Exception, match="the join stage's job failed"):
            query.awaitTermination()
        assert planned.is_set(), "the revenue stage was planned"
        assert spark._jsparkSession.sharedState().cacheManager().isEmpty()

    def test_state_metrics_reach_progress_and_a_listener(self, spark: Any, tmp_path: Path) -> None:
        """Each stage's state metrics under Spark's names are in the query's
        lastProgress.stateOperators and reach a StreamingQueryListener through
        stage_progress(event.progress), batch by batch."""
        from pyspark.sql.streaming import StreamingQueryListener

        seen: dict[int, list[dict[str, Any]]] = {}

        class Listener(StreamingQueryListener):  # type: ignore[misc]
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                stages = stage_progress(event.progress)
                if stages:
                    seen[event.progress.batchId] = stages

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        listener = Listener()
        spark.streams.addListener(listener)
        try:
            write_changes(tmp_path, changes(seed=9, batches=2))
            _, query = run(spark, tmp_path)
            _wait(lambda: len(seen) == 2)  # the listener bus is asynchronous
        finally:
            spark.streams.removeListener(listener)
        for batch_id, stages in seen.items():
            assert [s["operatorName"] for s in stages] == ["relstate:join", "relstate:revenue"]
            assert stages == query.stage_progress(batch_id)
        last = query.lastProgress
        assert last is not None
        names = [s["operatorName"] for s in last["stateOperators"]]
        assert names == ["relstate:join", "relstate:revenue"]
        revenue = last["stateOperators"][1]
        assert (
            revenue["numRowsTotal"] == query.history[-1]["stages"]["revenue"]["numTotalStateRows"]
        )
        assert revenue["numRowsTotal"] > 0


def _run_top(spark: Any, root: Path, partitions: int) -> tuple[ParquetSink, Any]:
    """Revenue per customer then the keyless top over the order files under
    ``root``, to the end; the top's sink and the query."""
    pipeline = Pipeline()
    frame = read_batches(spark, root / "orders", ORDERS.append(KINDS))
    orders = pipeline.source(frame, "orders", sequence="seq")
    _, top = build_top(pipeline, orders)
    sink = ParquetSink(str(root / "top"))
    query = pipeline.start(
        top,
        sink,
        checkpoint=str(root / "checkpoint"),
        partitions=partitions,
        trigger={"availableNow": True},
        query_name="top_pipeline",
    )
    query.awaitTermination()
    return sink, query


def _top_by_batch(spark: Any, sink: ParquetSink, batches: int) -> list[Counter[tuple[Any, ...]]]:
    """The top's output rows of each batch (with their row kinds)."""
    rows = sink.read(spark).collect()
    return [
        Counter((*(r[c] for c in TOP_COLUMNS), r["row_kind"]) for r in rows if r["batch"] == b)
        for b in range(batches)
    ]


def _top_harness(work: list[tuple[pa.Table, pa.Table]]) -> list[Counter[tuple[Any, ...]]]:
    """The keyless top's output per batch, run by the harness (3 partitions
    for the keyed stage)."""
    pipeline = Pipeline()
    orders = pipeline.source(ORDERS.append(KINDS), "orders", sequence="seq")
    _, top = build_top(pipeline, orders)
    out = []
    with PipelineHarness(pipeline, 3) as harness:
        for o, _ in work:
            rows = harness.run_batch({"orders": o})[top.name].to_pylist()
            out.append(Counter((*(r[c] for c in TOP_COLUMNS), r["row_kind"]) for r in rows))
    return out


def _top_by_sql(spark: Any, work: list[tuple[pa.Table, pa.Table]]) -> Counter[tuple[Any, ...]]:
    """The top customers by Spark batch SQL over the materialised orders."""
    live = materialised(
        [r for o, _ in work for r in o.to_pylist()], ["order_id", "customer", "amount"]
    )
    frame = spark.createDataFrame(
        list(live.elements()), "order_id long, customer long, amount long"
    )
    frame.createOrReplaceTempView("keyless_orders")
    rows = spark.sql(
        "SELECT customer, orders, revenue FROM (SELECT *, ROW_NUMBER() OVER (ORDER BY "
        "revenue DESC, customer) AS rank FROM (SELECT customer, COUNT(*) AS orders, "
        "SUM(amount) AS revenue FROM keyless_orders GROUP BY customer)) "
        f"WHERE rank <= {TOP}"
    ).collect()
    return Counter(tuple(r) for r in rows)


def _materialised_top(batches: list[Counter[tuple[Any, ...]]]) -> Counter[tuple[Any, ...]]:
    net: Counter[tuple[Any, ...]] = Counter()
    for batch in batches:
        for (*row, kind), n in batch.items():
            net[tuple(row)] += n if RowKind(kind).is_accumulate else -n
    return +net


class TestKeylessStage:
    def test_keyed_stage_then_keyless_top(self, spark: Any, tmp_path: Path) -> None:
        """Revenue per customer on 3 partitions feeding a keyless top-3, 4
        batches in one query: every batch's output equals the harness, the
        end result equals Spark's ROW_NUMBER() over all customers, the top's
        state is one partition recorded as such, and its stateOperators
        entry reports one state store instance."""
        work = changes(seed=7, batches=4)
        write_batches(tmp_path / "orders", [o for o, _ in work], prefix="part")
        sink, query = _run_top(spark, tmp_path, 3)
        got = _top_by_batch(spark, sink, len(work))
        assert got == _top_harness(work)
        assert _materialised_top(got) == _top_by_sql(spark, work)
        location = StateLocation(str(tmp_path / "checkpoint"))
        shape = location.query()
        assert shape is not None
        assert shape.stage_partitions() == {"customer_revenue": 3, "top_customers": 1}
        assert location.partitions("top_customers") == [0]
        assert location.partitions("customer_revenue") == [0, 1, 2]
        record = location.record(len(work) - 1)
        assert record is not None and list(record.winners_of("top_customers")) == [0]
        progress = query.stage_progress(len(work) - 1)
        assert [(p["operatorName"], p["numStateStoreInstances"]) for p in progress] == [
            ("relstate:customer_revenue", 3),
            ("relstate:top_customers", 1),
        ]

    def test_repartition_keeps_the_keyless_stage_and_the_query_resumes(
        self, spark: Any, tmp_path: Path
    ) -> None:
        """Repartitioning a stopped query from 3 to 2 moves the keyed stage
        and carries the keyless top's one partition over as it was (inspect
        says so); the query then resumes on 2 partitions and every batch's
        output still equals the harness, the end result Spark SQL."""
        work = changes(seed=8, batches=5)
        write_batches(tmp_path / "orders", [o for o, _ in work[:3]], prefix="part")
        _run_top(spark, tmp_path, 3)
        checkpoint = str(tmp_path / "checkpoint")
        result = repartition(checkpoint, 2)
        assert result.keyless == ("top_customers",)
        location = StateLocation(checkpoint)
        assert location.partitions("top_customers") == [0]
        assert location.partitions("customer_revenue") == [0, 1]
        text = describe(location)
        assert "query: 2 partitions" in text and "top_customers (no key, 1 partition)" in text
        # Files newer than the first three, under names of their own.
        write_batches(tmp_path / "orders", [o for o, _ in work[3:]], prefix="later")
        sink, _ = _run_top(spark, tmp_path, 2)
        got = _top_by_batch(spark, sink, len(work))
        assert got == _top_harness(work)
        assert _materialised_top(got) == _top_by_sql(spark, work)


def _wait(done: Any, seconds: float = 30) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done()


class TestCrashes:
    @pytest.mark.parametrize(
        "point", ["runner.driver_between_stages@2", "runner.driver_after_sink@2"]
    )
    def test_driver_killed_then_resumed(self, spark: Any, tmp_path: Path, point: str) -> None:
        """The driver SIGKILLed between the two stages' jobs of batch 1 (after
        the join committed; the join's rows also go to a sink, so it runs as
        a job of its own), or after batch 1's output and before its record;
        run again, every batch's output equals the harness run: nothing lost
        or doubled."""
        work = changes(seed=21, batches=3)
        write_changes(tmp_path, work)
        env = {**os.environ, "RELSTATE_FAULT": point, "PYTHONPATH": os.pathsep.join(sys.path)}
        env.pop("RELSTATE_FAULT_DIR", None)
        between = "between_stages" in point
        done = subprocess.run(
            [
                sys.executable,
                str(HERE / "_pipeline_job.py"),
                str(tmp_path),
                *(["--joined-too"] if between else []),
            ],
            env=env,
            capture_output=True,
            timeout=600,
        )
        assert done.returncode == -9, done.stderr.decode()[-2000:]
        location = str(tmp_path / "checkpoint" / "state")
        assert Journal(LocalFileSystem(), location).latest() == 0
        if between:
            # The join committed batch 1 in every partition, the aggregate in none.
            assert all(PartitionCheckpoint(location, "join", p).commits(1) for p in range(3))
            assert not any(PartitionCheckpoint(location, "revenue", p).commits(1) for p in range(3))
        sink, _ = run(spark, tmp_path, joined_too=between)
        assert _per_batch(spark, sink) == _harness(work)

    def test_second_stage_task_killed_after_commit(
        self, spark: Any, tmp_path: Path, fault_dir: Path
    ) -> None:
        """A task of the second stage dies after its commit and Spark retries
        it (local[2,3]): two attempts of that partition's version, the batch
        record names one, and the output equals the harness run."""
        work = changes(seed=33, batches=2)
        write_changes(tmp_path, work)
        arm(str(fault_dir), "runner.later_stage_after_commit")
        sink, _ = run(spark, tmp_path)
        assert not (fault_dir / "runner.later_stage_after_commit").exists(), "it must fire"
        location = str(tmp_path / "checkpoint" / "state")
        attempts = [len(PartitionCheckpoint(location, "revenue", p).commits(0)) for p in range(3)]
        assert sorted(attempts) == [1, 1, 2]
        assert _per_batch(spark, sink) == _harness(work)


class TestSparkNativeInputs:
    def test_build_errors_come_before_the_query_starts(self, spark: Any, tmp_path: Path) -> None:
        """A wrong column type, a missing key column, keys of two types and
        an unknown trigger option are each an InputError from the call that
        builds the query; no checkpoint is written."""
        frame = spark.readStream.format("rate").load()  # timestamp, value (long)
        strings = frame.selectExpr("cast(value as string) as key", "value")
        pipeline = Pipeline()
        text = pipeline.source(
            frame.selectExpr("cast(value as string) as key", "cast(value as string) as value")
        )
        with pytest.raises(InputError, match="has type string, the operator expects int64"):
            pipeline.stage(RunningAggregate(), text, keys=["key"])
        with pytest.raises(InputError, match=r"no key column\(s\) \['nope'\]"):
            run_operator(
                strings,
                RunningAggregate(),
                ["nope"],
                2,
                str(tmp_path / "ck"),
                ParquetSink(str(tmp_path / "o")),
            )
        with pytest.raises(InputError, match="trigger takes one of"):
            run_operator(
                strings,
                RunningAggregate(),
                ["key"],
                2,
                str(tmp_path / "ck"),
                ParquetSink(str(tmp_path / "o")),
                trigger={"continuous": "1 second"},
            )
        assert not (tmp_path / "ck").exists()

    def test_with_watermark_and_a_session_time_zone(self, spark: Any, tmp_path: Path) -> None:
        """withWatermark on the input is the query's watermark (no
        Watermark(...) given), and the operator sees the input's instants
        in UTC whatever the session time zone is."""
        import datetime as dt

        import pyarrow.parquet as pq

        utc = dt.UTC
        times = [dt.datetime(2026, 1, 1, 12, 0, s, tzinfo=utc) for s in (10, 40)]
        (tmp_path / "in").mkdir()
        for i, t in enumerate(times):
            table = pa.table({"key": ["a"], "ts": pa.array([t], pa.timestamp("us", tz="UTC"))})
            pq.write_table(table, tmp_path / "in" / f"part-{i}.parquet")
            os.utime(tmp_path / "in" / f"part-{i}.parquet", (1e9 + i, 1e9 + i))
        before = spark.conf.get("spark.sql.session.timeZone")
        spark.conf.set("spark.sql.session.timeZone", "America/New_York")
        try:
            frame = (
                spark.readStream.schema("key string, ts timestamp")
                .option("maxFilesPerTrigger", 1)
                .parquet(str(tmp_path / "in"))
                .withWatermark("ts", "10 seconds")
            )
            pipeline = Pipeline()
            events = pipeline.source(frame, "events")
            echoed = pipeline.stage(_Echo(events.schema), events, keys=["key"])
            sink = ParquetSink(str(tmp_path / "out"))
            query = pipeline.start(
                echoed, sink, str(tmp_path / "ck"), 2, trigger={"availableNow": True}
            )
            query.awaitTermination()
        finally:
            spark.conf.set("spark.sql.session.timeZone", before)
        seen = sorted(r["seen_utc"] for r in sink.read(spark).collect())
        assert seen == [t.isoformat() for t in times]
        first_ms = int(times[0].timestamp() * 1000)
        assert [h["watermark"] for h in query.history] == [None, first_ms - 10_000]


class _Echo(Operator):
    """Emits each row's event time as the operator sees it, in ISO form."""

    name = "echo"

    def __init__(self, schema: pa.Schema) -> None:
        self.inputs = [schema]
        self.output = pa.schema([("key", pa.string()), ("seen_utc", pa.string())])

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        ctx.emit((row[0], row[1].isoformat()), kind)
