"""A query's output read by Spark: ParquetSink's commits and schema, the
``relstate-output`` data source as a table and as a stream (exactly once,
across restarts and a driver that dies between writing and committing), and a
callback sink writing idempotently to SQLite."""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators._spark.output_files import COMMITTED_DIR, SCHEMA_FILE
from operators._spark.runner import run_operator
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches
from operators.examples import RunningAggregate
from statestore._faults import inject
from tests.operators._orders_changelog import ORDERS, generate, reference

SCHEMA = pa.schema([("key", pa.int64()), ("row_kind", pa.string())])

Row = tuple[Any, ...]


def _rows(*keys: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(keys, pa.int64()), pa.array(["+I"] * len(keys))], SCHEMA)


def _publish(sink: ParquetSink, batch_id: int, *keys: int, schema: pa.Schema = SCHEMA) -> None:
    staging = sink.stage(batch_id)
    rows = [_rows(*keys)] if schema is SCHEMA else []
    sink.publish(staging, [sink.write_part(staging, 0, schema, rows)], batch_id)


class TestCommits:
    def test_only_committed_batches_are_listed(self, tmp_path: Path) -> None:
        """A published batch is not committed until commit(); committed() lists ids in order."""
        sink = ParquetSink(str(tmp_path / "out"))
        assert sink.committed() == []
        for b in range(3):
            _publish(sink, b, b)
        sink.commit(1)
        sink.commit(0)
        assert sink.committed() == [0, 1]
        marker = tmp_path / "out" / COMMITTED_DIR / f"{1:020d}.json"
        assert marker.exists()

    def test_commit_again_keeps_one_marker(self, tmp_path: Path) -> None:
        """Committing a batch twice (a driver that died after committing) leaves one marker."""
        sink = ParquetSink(str(tmp_path / "out"))
        _publish(sink, 0, 1, 2)
        sink.commit(0)
        sink.commit(0)
        assert sink.committed() == [0]
        assert len(sink.committed_files(0)) == 1

    def test_commit_without_output_is_refused(self, tmp_path: Path) -> None:
        """A batch with no output written cannot be committed."""
        sink = ParquetSink(str(tmp_path / "out"))
        with pytest.raises(FileNotFoundError, match="batch 5 has no output"):
            sink.commit(5)

    def test_schema_is_written_once_in_utc(self, tmp_path: Path) -> None:
        """The first batch records the Arrow schema, timestamps with a zone in UTC;
        a later batch does not change it."""
        sink = ParquetSink(str(tmp_path / "out"))
        assert sink.schema() is None
        paris = pa.timestamp("ms", tz="Europe/Paris")
        zoned = pa.schema([("at", paris), ("row_kind", pa.string())])
        _publish(sink, 0, schema=zoned)
        assert (tmp_path / "out" / SCHEMA_FILE).exists()
        written = sink.schema()
        assert written is not None
        assert written.field("at").type == pa.timestamp("us", tz="UTC")
        _publish(sink, 1, 3)
        assert sink.schema() == written


def _sink_with(tmp_path: Path, batches: dict[int, list[int]], committed: list[int]) -> ParquetSink:
    sink = ParquetSink(str(tmp_path / "out"))
    for b, keys in batches.items():
        _publish(sink, b, *keys)
    for b in committed:
        sink.commit(b)
    return sink


@pytest.mark.spark
class TestTableRead:
    def test_reads_committed_batches_with_batch_and_row_kind(
        self, spark: Any, tmp_path: Path
    ) -> None:
        """spark.read of relstate-output gives each committed batch's rows with
        batch and row_kind; an uncommitted batch is left out."""
        sink = _sink_with(tmp_path, {0: [1, 2], 1: [3], 2: [4]}, committed=[0, 1])
        df = spark.read.format("relstate-output").load(sink.path)
        assert df.columns == ["key", "row_kind", "batch"]
        rows = sorted(tuple(r) for r in df.collect())
        assert rows == [(1, "+I", 0), (2, "+I", 0), (3, "+I", 1)]
        assert sorted(tuple(r) for r in sink.read(spark).collect()) == rows

    def test_a_dataframe_given_to_the_sink_reads_back(self, spark: Any, tmp_path: Path) -> None:
        """A batch handed to the sink as a DataFrame (the plain, unstaged path)
        records the schema and reads back once committed."""
        sink = ParquetSink(str(tmp_path / "out"))
        df = spark.createDataFrame([(1, "+I"), (2, "-D")], "key long, row_kind string")
        sink(df, 0)
        assert sink.schema() == pa.schema([("key", pa.int64()), ("row_kind", pa.string())])
        assert sink.read(spark).count() == 0
        sink.commit(0)
        assert sorted(tuple(r) for r in sink.read(spark).collect()) == [(1, "+I", 0), (2, "-D", 0)]

    def test_timestamps_read_in_utc(self, spark: Any, tmp_path: Path) -> None:
        """A timestamp written in another zone reads as the same instant."""
        sink = ParquetSink(str(tmp_path / "out"))
        at = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
        schema = pa.schema([("at", pa.timestamp("ms", tz="Asia/Tokyo")), ("row_kind", pa.string())])
        batch = pa.record_batch([pa.array([at], schema.field("at").type), pa.array(["+I"])], schema)
        staging = sink.stage(0)
        sink.publish(staging, [sink.write_part(staging, 0, schema, [batch])], 0)
        sink.commit(0)
        table = sink.read(spark).toArrow()
        assert table.column("at").cast(pa.int64()).to_pylist() == [int(at.timestamp() * 1e6)]

    def test_no_output_yet_and_bad_options_are_clear_errors(
        self, spark: Any, tmp_path: Path
    ) -> None:
        """A path with no output yet, an unknown option and a bad maxBatchesPerTrigger
        are refused with a message naming them."""
        with pytest.raises(Exception, match="holds no output yet"):
            spark.read.format("relstate-output").load(str(tmp_path / "nothing")).collect()
        sink = _sink_with(tmp_path, {0: [1]}, committed=[0])
        with pytest.raises(Exception, match="unknown option"):
            spark.read.format("relstate-output").option("maxRows", 3).load(sink.path).collect()
        with pytest.raises(Exception, match="maxBatchesPerTrigger must be an integer >= 1"):
            spark.readStream.format("relstate-output").option("maxBatchesPerTrigger", 0).load(
                sink.path
            )


# -- a relstate query and a second query reading its output as a stream ------------


def _write(spark: Any, root: Path, sink: Any, trigger_files: int = 1) -> Any:
    """Run RunningAggregate over every source file not yet read (availableNow)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    stream = (
        spark.readStream.schema(from_arrow_schema(ORDERS))
        .option("maxFilesPerTrigger", trigger_files)
        .parquet(str(root / "source"))
    )
    return run_operator(
        stream,
        RunningAggregate(),
        keys=["key"],
        partitions=2,
        checkpoint=str(root / "checkpoint"),
        sink=sink,
        sequence_column="seq",
        trigger={"availableNow": True},
    )


def _follow(spark: Any, root: Path, sink: ParquetSink, max_batches: int | None = 1) -> None:
    """The second query: reads the output as a stream (availableNow) and writes
    each of its micro-batches to reader_batch=<id>, replacing it on a re-run."""
    reader = spark.readStream.format("relstate-output")
    if max_batches is not None:
        reader = reader.option("maxBatchesPerTrigger", max_batches)

    def keep(df: Any, reader_batch: int) -> None:
        df.write.mode("overwrite").parquet(str(root / "followed" / f"reader_batch={reader_batch}"))

    query = (
        reader.load(sink.path)
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(root / "follower-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _followed(root: Path) -> list[dict[str, Any]]:
    if not (root / "followed").exists():
        return []
    return pq.read_table(root / "followed").to_pylist()


def _by_batch(rows: list[dict[str, Any]]) -> list[Counter[Row]]:
    out: dict[int, Counter[Row]] = {}
    for r in rows:
        row = (r["row_kind"], r["key"], r["count"], r["total"])
        out.setdefault(r["batch"], Counter())[row] += 1
    return [out.get(i, Counter()) for i in range(max(out) + 1)] if out else []


@pytest.fixture(scope="module")
def orders() -> list[pa.Table]:
    """Four batches of a small orders changelog."""
    return generate(batches=4, orders_per_batch=120, customers=15, seed=11)


def _add_source(root: Path, batches: list[pa.Table], start: int) -> None:
    """Write batches[start:] as source files numbered from start, each a second
    newer than the last (Spark's file source takes them in that order)."""
    now = time.time()
    for i, table in enumerate(batches[start:], start):
        path = root / "source" / f"orders-{i:04d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (now + i, now + i))


@pytest.mark.spark
class TestStreamRead:
    def test_every_row_once_across_restarts_of_both(
        self, spark: Any, tmp_path: Path, orders: list[pa.Table]
    ) -> None:
        """A second query follows the output as a stream: stopped and started
        again with the writer, it reads every row exactly once, one writer batch
        per trigger under maxBatchesPerTrigger=1."""
        sink = ParquetSink(str(tmp_path / "out"))
        write_batches(tmp_path / "source", orders[:2])
        _write(spark, tmp_path, sink).awaitTermination()
        _follow(spark, tmp_path, sink)
        assert _by_batch(_followed(tmp_path)) == reference(orders)[:2]
        _add_source(tmp_path, orders, 2)
        _write(spark, tmp_path, sink).awaitTermination()
        _follow(spark, tmp_path, sink)
        rows = _followed(tmp_path)
        assert sink.committed() == [0, 1, 2, 3]
        assert _by_batch(rows) == reference(orders)
        per_trigger = Counter((r["reader_batch"], r["batch"]) for r in rows)
        triggers: dict[int, set[int]] = {}
        for reader_batch, batch in per_trigger:
            triggers.setdefault(reader_batch, set()).add(batch)
        assert sorted(triggers.values(), key=min) == [{0}, {1}, {2}, {3}]
        # The table read agrees with the stream read.
        table = [r.asDict() for r in sink.read(spark).collect()]
        assert _by_batch(table) == reference(orders)

    def test_an_uncommitted_batch_is_read_once_committed(
        self, spark: Any, tmp_path: Path, orders: list[pa.Table]
    ) -> None:
        """The writer's driver fails after writing batch 1 and before recording
        and committing it: the follower does not see batch 1; once the writer
        ran it again and committed it, the follower reads it once."""
        sink = ParquetSink(str(tmp_path / "out"))
        write_batches(tmp_path / "source", orders[:3])
        with inject("runner.driver_after_sink", nth=2), pytest.raises(Exception, match="fault"):
            _write(spark, tmp_path, sink).awaitTermination()
        assert (tmp_path / "out" / "batch=1").exists()
        assert sink.committed() == [0]
        _follow(spark, tmp_path, sink, max_batches=None)
        assert _by_batch(_followed(tmp_path)) == reference(orders)[:1]
        _write(spark, tmp_path, sink).awaitTermination()
        assert sink.committed() == [0, 1, 2]
        _follow(spark, tmp_path, sink, max_batches=None)
        assert _by_batch(_followed(tmp_path)) == reference(orders)[:3]


# -- a callback sink writing to a database, idempotent by batch id -------------------


class SQLiteSink:
    """A foreachBatch-style sink: each batch's rows replace that batch's rows
    in one transaction, so a batch given again (it ran again) is kept once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS aggregates (batch_id INTEGER NOT NULL, "
                "row_kind TEXT NOT NULL, key TEXT, count INTEGER, total INTEGER)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS by_batch ON aggregates (batch_id)")

    def __call__(self, output: Any, batch_id: int) -> None:
        rows = [
            (batch_id, r["row_kind"], r["key"], r["count"], r["total"]) for r in output.collect()
        ]
        with sqlite3.connect(self.path) as db:  # one transaction: delete, then insert
            db.execute("DELETE FROM aggregates WHERE batch_id = ?", (batch_id,))
            db.executemany("INSERT INTO aggregates VALUES (?, ?, ?, ?, ?)", rows)

    def rows(self) -> list[dict[str, Any]]:
        with sqlite3.connect(self.path) as db:
            cursor = db.execute("SELECT batch_id, row_kind, key, count, total FROM aggregates")
            names = ["batch", "row_kind", "key", "count", "total"]
            return [dict(zip(names, row, strict=True)) for row in cursor]


@pytest.mark.spark
class TestCallbackSink:
    def test_sqlite_sink_keeps_a_rerun_batch_once(
        self, spark: Any, tmp_path: Path, orders: list[pa.Table]
    ) -> None:
        """The driver fails after the callback wrote batch 1 and before the batch
        was recorded; the restarted query gives batch 1 to the callback again,
        and SQLite holds every batch's rows once."""
        sink = SQLiteSink(tmp_path / "out.db")
        calls: list[int] = []

        def callback(output: Any, batch_id: int) -> None:
            calls.append(batch_id)
            sink(output, batch_id)

        write_batches(tmp_path / "source", orders[:3])
        with inject("runner.driver_after_sink", nth=2), pytest.raises(Exception, match="fault"):
            _write(spark, tmp_path, callback).awaitTermination()
        _write(spark, tmp_path, callback).awaitTermination()
        assert calls == [0, 1, 1, 2]
        assert _by_batch(sink.rows()) == reference(orders)[:3]
