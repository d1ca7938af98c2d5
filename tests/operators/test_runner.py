"""The Spark runner, on real Spark: results, exactly-once under failures, and
bad input."""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _orders_changelog import ORDERS, generate, reference
from pyarrow.fs import LocalFileSystem

from operators._checkpoint.journal import Journal
from operators._engine.task import state_tables
from operators._spark.runner import run_operator
from operators._spark.session import without_adaptive_execution
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches
from operators.errors import InputError
from operators.examples import RunningAggregate
from statestore import PartitionCheckpoint, StateStore
from statestore._faults import arm

pytestmark = pytest.mark.spark


def _source(root: Path, batches: list[pa.Table]) -> str:
    source = root / "source"
    write_batches(source, batches)
    return str(source)


def _run(
    spark: Any,
    root: Path,
    batches: list[pa.Table],
    partitions: int = 3,
    state_location: str | None = None,
) -> ParquetSink:
    from pyspark.sql.pandas.types import from_arrow_schema

    source = root / "source"
    if not source.exists():
        _source(root, batches)
    stream = spark.readStream.schema(from_arrow_schema(ORDERS)).option("maxFilesPerTrigger", 1)
    sink = ParquetSink(str(root / "output"))
    query = run_operator(
        stream.parquet(str(source)),
        RunningAggregate(),
        keys=["key"],
        partitions=partitions,
        checkpoint=str(root / "checkpoint"),
        sink=sink,
        sequence_column="seq",
        trigger={"availableNow": True},
        state_location=state_location,
    )
    query.awaitTermination()
    assert len(query.history) == len(batches) or root.joinpath("resumed").exists()
    return sink


def _per_batch(spark: Any, sink: ParquetSink) -> list[Counter[tuple[Any, ...]]]:
    out: dict[int, Counter[tuple[Any, ...]]] = {}
    for r in sink.read(spark).collect():
        out.setdefault(r["batch"], Counter())[
            (r["row_kind"], r["key"], r["count"], r["total"])
        ] += 1
    return [out.get(i, Counter()) for i in range(max(out) + 1)] if out else []


@pytest.fixture(scope="module")
def small() -> list[pa.Table]:
    """Three batches of a small orders changelog."""
    return generate(batches=3, orders_per_batch=300, customers=25, seed=3)


class TestRunner:
    def test_output_equals_record_at_a_time(
        self, spark: Any, tmp_path: Path, small: list[pa.Table]
    ) -> None:
        """Each batch's output through Spark equals the operator run record at a
        time in memory, and the state holds one row per live customer."""
        sink = _run(spark, tmp_path, small)
        expected = reference(small)
        assert _per_batch(spark, sink) == expected
        orders: dict[int, tuple[str, int]] = {}
        for table in small:
            for r in table.to_pylist():
                if r["row_kind"] in ("+I", "+U"):
                    orders[r["order_id"]] = (r["key"], r["value"])
                else:
                    del orders[r["order_id"]]
        live: dict[str, tuple[int, int]] = {}
        for customer, amount in orders.values():
            count, total = live.get(customer, (0, 0))
            live[customer] = (count + 1, total + amount)
        stored: dict[str, tuple[int, int]] = {}
        last = len(small) - 1
        for partition in range(3):
            with StateStore(
                str(tmp_path / "checkpoint" / "state"),
                "running_aggregate",
                partition,
                state_tables(RunningAggregate()),
            ) as store:
                store.load(last)
                stored.update({k: (c, t) for k, c, t in store.table("aggregates").scan()})
        assert stored == live

    @pytest.mark.parametrize("where", ["local", "s3"])
    def test_task_dies_after_commit_and_is_retried(
        self,
        spark: Any,
        tmp_path: Path,
        small: list[pa.Table],
        fault_dir: Path,
        where: str,
        request: pytest.FixtureRequest,
    ) -> None:
        """A task killed after committing its partition is retried: the batch
        has two attempts of that version, the recorded winner is the retry's,
        output and state equal a run with no failure, and the batch's output
        holds one part per partition (the dead attempt's part is left out);
        with the state on a local disk and on S3 (a moto server on loopback)."""
        location = str(tmp_path / "checkpoint" / "state")
        if where == "s3":
            location = request.getfixturevalue("s3").uri()
        arm(str(fault_dir), "runner.task_after_commit")
        sink = _run(spark, tmp_path, small, state_location=location)
        assert not (fault_dir / "runner.task_after_commit").exists(), "the fault must fire"
        assert _per_batch(spark, sink) == reference(small)
        attempts = [
            len(PartitionCheckpoint(location, "running_aggregate", p).commits(0)) for p in range(3)
        ]
        assert sorted(attempts) == [1, 1, 2]
        # The dead attempt wrote its part too; only the winners' are published.
        parts = sorted(p.name[:10] for p in (tmp_path / "output" / "batch=0").glob("part-*"))
        assert parts == [f"part-{i:05d}" for i in range(3)]

    def test_resume_after_stop_continues(
        self, spark: Any, tmp_path: Path, small: list[pa.Table]
    ) -> None:
        """A query stopped and started again on its checkpoint goes on from the
        next batch, with state carried over."""
        _run(spark, tmp_path, small[:2])
        more = tmp_path / "source" / "orders-0002.parquet"
        pq.write_table(small[2], more)  # newer than the first two: written after them
        tmp_path.joinpath("resumed").touch()
        sink = _run(spark, tmp_path, small)
        assert _per_batch(spark, sink) == reference(small)

    def test_a_stage_task_is_made_once_and_each_batch_reaches_it(
        self,
        spark: Any,
        tmp_path: Path,
        small: list[pa.Table],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The stage's Python task (its UDF) is made in the first batch only,
        not again for each batch, and each batch's tasks still run that batch
        (its id, its previous winners, its staging directory come with the
        job): the output of every batch is the reference's."""
        import pyspark.sql.pandas.functions as functions

        made: list[object] = []
        real = functions.pandas_udf

        def counted(*args: Any, **kwargs: Any) -> Any:
            made.append(args[0])
            return real(*args, **kwargs)

        monkeypatch.setattr(functions, "pandas_udf", counted)
        sink = _run(spark, tmp_path, small)
        assert len(made) == 1
        assert _per_batch(spark, sink) == reference(small)

    def test_every_batch_has_its_winner_records_when_the_query_ends(
        self,
        spark: Any,
        tmp_path: Path,
        small: list[pa.Table],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The winner records are written after the batch, in a thread of
        their own, and the query's end waits for them: once
        ``awaitTermination`` returns, every recorded batch's partitions name
        the recorded commit as their winner, though each write was slowed to
        outlast the batch's end."""
        real = Journal.record_winners
        threads: list[str] = []

        def slow(journal: Journal, record: Any) -> None:
            threads.append(threading.current_thread().name)
            time.sleep(0.5)
            real(journal, record)

        monkeypatch.setattr(Journal, "record_winners", slow)
        _run(spark, tmp_path, small)
        assert len(threads) == len(small)
        assert all(t.startswith("relstate-winners") for t in threads)
        location = str(tmp_path / "checkpoint" / "state")
        journal = Journal(LocalFileSystem(), location)
        recorded = journal.batches()
        assert recorded[-1] == len(small) - 1
        for batch_id in recorded:
            record = journal.record(batch_id)
            assert record is not None
            for p, commit_id in record.winners_of("running_aggregate").items():
                checkpoint = PartitionCheckpoint(location, "running_aggregate", p)
                assert checkpoint.winner(batch_id) == commit_id

    def test_a_restarted_query_writes_the_winner_records_its_last_run_left_out(
        self,
        spark: Any,
        tmp_path: Path,
        small: list[pa.Table],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A driver that died after recording a batch may not have written its
        winner records (here removed by hand after the first run): the next
        run writes them before its first batch runs, so they are there when
        that batch is recorded."""
        _run(spark, tmp_path, small[:2])
        location = str(tmp_path / "checkpoint" / "state")
        removed = list(Path(location).glob(f"running_aggregate/*/winners/{1:020d}.json"))
        assert len(removed) == 3
        for path in removed:
            path.unlink()
        record = Journal(LocalFileSystem(), location).record(1)
        assert record is not None
        winners = record.winners_of("running_aggregate")
        found: list[dict[int, str | None]] = []
        real = Journal.write

        def write(journal: Journal, batch: Any) -> None:
            found.append(
                {
                    p: PartitionCheckpoint(location, "running_aggregate", p).winner(1)
                    for p in winners
                }
            )
            real(journal, batch)

        monkeypatch.setattr(Journal, "write", write)
        pq.write_table(small[2], tmp_path / "source" / "orders-0002.parquet")
        tmp_path.joinpath("resumed").touch()
        _run(spark, tmp_path, small)
        assert found == [winners]

    def test_tasks_run_without_adaptive_execution_and_the_setting_returns(self, spark: Any) -> None:
        """The runner's task job runs with adaptive execution off, and the
        session's setting is as it was afterwards, also after a failed job."""
        key = "spark.sql.adaptive.enabled"
        before = spark.conf.get(key)
        spark.conf.set(key, "true")
        try:
            with without_adaptive_execution(spark):
                assert spark.conf.get(key) == "false"
            assert spark.conf.get(key) == "true"
            with pytest.raises(RuntimeError), without_adaptive_execution(spark):
                raise RuntimeError("the job failed")
            assert spark.conf.get(key) == "true"
        finally:
            spark.conf.set(key, before)


class TestBadInput:
    def test_unknown_row_kind_fails_the_batch(self, spark: Any, tmp_path: Path) -> None:
        """An unknown row kind fails the batch with the InputError itself
        (not Spark's wrapper); the partition that holds it commits nothing and
        the batch is not recorded, so no reader or later run sees it (what
        other partitions committed is an attempt nothing loads)."""
        bad = pa.Table.from_pylist(
            [{"order_id": 1, "key": "c", "value": 5, "row_kind": "+X", "seq": 0}], ORDERS
        )
        with pytest.raises(
            InputError, match=r"unknown row kind.*nothing of this batch was recorded"
        ):
            _run(spark, tmp_path, [bad])
        state = tmp_path / "checkpoint" / "state"
        assert Journal(LocalFileSystem(), str(state)).latest() is None
        held = [
            p
            for p in range(3)
            if PartitionCheckpoint(str(state), "running_aggregate", p).versions()
        ]
        assert len(held) < 3

    def test_changed_partition_count_is_refused(
        self, spark: Any, tmp_path: Path, small: list[pa.Table]
    ) -> None:
        """Restarting a checkpoint with another partition count is a clear error."""
        _run(spark, tmp_path, small[:1], partitions=3)
        with pytest.raises(InputError, match="partitions"):
            _run(spark, tmp_path, small[:1], partitions=4)

    def test_unfinished_repartition_is_refused(
        self, spark: Any, tmp_path: Path, small: list[pa.Table]
    ) -> None:
        """A query does not start on state whose repartition was interrupted
        (its journal is there), and writes nothing there."""
        _run(spark, tmp_path, small[:1], partitions=3)
        state = tmp_path / "checkpoint" / "state"
        shutil.move(state, tmp_path / "checkpoint" / "state.repartition")
        (tmp_path / "checkpoint" / "state.repartition.json").write_text("{}")
        with pytest.raises(InputError, match="being repartitioned"):
            _run(spark, tmp_path, small[:1], partitions=4)
        assert not state.exists()

    def test_missing_key_column(self, spark: Any, tmp_path: Path) -> None:
        """A key column the input does not have is refused before the query starts."""
        stream = spark.readStream.schema("key string, value long").parquet(str(tmp_path))
        with pytest.raises(InputError, match="no key column"):
            run_operator(
                stream,
                RunningAggregate(),
                keys=["customer"],
                partitions=2,
                checkpoint=str(tmp_path / "ck"),
                sink=ParquetSink(str(tmp_path / "out")),
            )

    def test_key_type_change_is_refused(
        self, spark: Any, tmp_path: Path, small: list[pa.Table]
    ) -> None:
        """Restarting with the key column of another type is a clear error."""
        _run(spark, tmp_path, small[:1])
        stream = spark.readStream.schema("key long, value long").parquet(str(tmp_path / "source"))
        with pytest.raises(InputError, match="key types"):
            run_operator(
                stream,
                RunningAggregate(key_type=pa.int64()),
                keys=["key"],
                partitions=3,
                checkpoint=str(tmp_path / "checkpoint"),
                sink=ParquetSink(str(tmp_path / "out2")),
            )


class TestWatermarks:
    def test_sessions_follow_spark_watermark_rule(self, spark: Any, tmp_path: Path) -> None:
        """With an event-time watermark, each batch's output equals the harness
        run at the watermark Spark's rule gives (max event time seen in earlier
        batches minus the delay), and the batch records carry that watermark."""
        import datetime as dt

        from pyspark.sql.pandas.types import from_arrow_schema

        from operators import Watermark
        from operators.examples import Sessions
        from operators.testing import OperatorHarness

        gap, delay = 1_000, 2_000
        schema = pa.schema(
            [
                pa.field("user", pa.string(), nullable=False),
                pa.field("ts", pa.timestamp("us"), nullable=False),
                pa.field("value", pa.int64(), nullable=False),
            ]
        )
        epoch = dt.datetime(2026, 1, 1)
        times = [[0, 300, 5_000, 5_500], [9_000, 2_800, 12_000], [20_000, 9_500], [40_000]]
        batches = [
            pa.Table.from_pylist(
                [
                    {"user": u, "ts": epoch + dt.timedelta(milliseconds=t), "value": 1}
                    for t in ts
                    for u in ("ann", "bob")
                ],
                schema,
            )
            for ts in times
        ]
        source = tmp_path / "source"
        write_batches(source, batches, prefix="events")
        stream = (
            spark.readStream.schema(from_arrow_schema(schema))
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
        )
        sink = ParquetSink(str(tmp_path / "output"))
        query = run_operator(
            stream,
            Sessions(gap=gap),
            keys=["user"],
            partitions=2,
            checkpoint=str(tmp_path / "checkpoint"),
            sink=sink,
            watermarks={0: Watermark("ts", delay)},
            trigger={"availableNow": True},
        )
        query.awaitTermination()

        base = int(epoch.replace(tzinfo=dt.UTC).timestamp() * 1000)
        expected_marks: list[int | None] = [None]
        seen = -(2**63)
        for ts in times[:-1]:
            seen = max(seen, base + max(ts))
            expected_marks.append(max(seen - delay, expected_marks[-1] or -(2**63)))
        assert [r["watermark"] for r in query.history] == expected_marks

        expected = []
        with OperatorHarness(Sessions(gap=gap)) as harness:
            for mark, table in zip(expected_marks, batches, strict=True):
                emitted = [] if mark is None else harness.advance_watermark(mark)
                emitted += harness.process_rows([tuple(r.values()) for r in table.to_pylist()])
                harness.commit()
                expected.append(Counter((k.value, *row) for k, row in emitted))
        got: dict[int, Counter[tuple[Any, ...]]] = {}
        for r in sink.read(spark).collect():
            row = (r["row_kind"], r["user"], r["start"], r["end"], r["count"], r["total"])
            got.setdefault(r["batch"], Counter())[row] += 1
        assert [got.get(i, Counter()) for i in range(len(batches))] == expected
        assert sum(sum(c.values()) for c in expected) > 0, "some session must close"
        assert query.last_metrics["numOutputRows"] == sum(expected[-1].values())
