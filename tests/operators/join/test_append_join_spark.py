"""AppendJoin against Spark's own stream-stream join, on the same files and
batches: the same rows, batch by batch, for inner, left, right and full
outer joins, with a time range and with equal tumbling windows.

Fairness: Spark runs extra batches without data when the watermark moves
(``spark.sql.streaming.noDataMicroBatches.enabled``), to evict and pad rows
early; relstate's runner runs a batch only when data comes. The test turns
those batches off for Spark's queries (and restores the setting), so that
both run exactly one batch per pair of files, with the same watermark per
batch (Spark's min rule, from the batches before), and every batch's rows
can be compared on their own. Rows still in state at the end are padded by
neither.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import ParquetSink, Watermark, run_operator
from operators._tools.demo import write_batches
from operators.join import AppendJoin, TimeRange, TimeWindows

pytestmark = pytest.mark.spark

BATCHES = 5
#: right.ts BETWEEN left.ts - 2 s AND left.ts + 3 s; watermark delays 1 s
#: (left) and 2 s (right), so the min rule matters.
BEFORE_MS, AFTER_MS = 2_000, 3_000
#: Or both sides in tumbling windows of 5 s, joined on equal windows.
WINDOW_MS = 5_000
#: The time conditions, and the seed of each one's data.
TIMES = {"range": 5, "window": 6}
DELAYS = (1_000, 2_000)
SPARK_HOW = {"inner": "inner", "left": "left_outer", "right": "right_outer", "full": "full_outer"}
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
#: Output rows per batch id, as multisets.
Rows = dict[int, Counter[tuple[Any, ...]]]


def _schema(tz: str | None) -> pa.Schema:
    return pa.schema([("k", pa.string()), ("ts", pa.timestamp("us", tz=tz)), ("v", pa.int64())])


def _data(seed: int) -> tuple[list[pa.Table], list[pa.Table]]:
    """Five batches per side: few keys, times that move 4 s a batch with
    rows up to 9 s behind (some late), duplicates, rows with no partner."""
    rng = random.Random(seed)
    sides: tuple[list[pa.Table], list[pa.Table]] = ([], [])
    serial = 0
    for b in range(BATCHES):
        for side in (0, 1):
            rows = []
            for _ in range(rng.randrange(15, 30)):
                at = 4_000 * b + rng.randrange(-9_000, 3_000)
                rows.append(
                    {
                        # k0, k1 only left, k8, k9 only right: padded rows.
                        "k": f"k{rng.randrange(8) + 2 * side}",
                        "ts": EPOCH + dt.timedelta(milliseconds=at),
                        "v": serial,
                    }
                )
                serial += 1
                if rng.random() < 0.1:
                    rows.append(dict(rows[-1]))
            sides[side].append(pa.Table.from_pylist(rows, _schema("UTC")))
    return sides


def _spark_join(spark: Any, dirs: tuple[Path, Path], how: str, time: str) -> tuple[Any, Rows]:
    """Start Spark's native join of the two directories; the query, and its
    rows per batch id as they come."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(_schema("UTC"))
    frames = []
    for prefix, directory, delay in zip(("l_", "r_"), dirs, DELAYS, strict=True):
        stream = (
            spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))
        )
        renamed = stream.select(*[F.col(c).alias(prefix + c) for c in ("k", "ts", "v")])
        if time == "window":
            # A stream has one event-time column: the watermark goes on a copy
            # of ts, the window over it inherits it, and the copy is dropped.
            # Spark then evicts and pads by window end.
            marked = (
                renamed.withColumn("et", F.col(f"{prefix}ts"))
                .withWatermark("et", f"{delay} milliseconds")
                .withColumn(f"{prefix}w", F.window("et", f"{WINDOW_MS} milliseconds"))
                .drop("et")
            )
        else:
            marked = renamed.withWatermark(f"{prefix}ts", f"{delay} milliseconds")
        frames.append(marked)
    if time == "window":
        condition = F.expr("l_k = r_k AND l_w = r_w")
    else:
        condition = F.expr(
            f"l_k = r_k AND r_ts >= l_ts - interval {BEFORE_MS} milliseconds "
            f"AND r_ts <= l_ts + interval {AFTER_MS} milliseconds"
        )
    columns = [p + c for p in ("l_", "r_") for c in ("k", "ts", "v")]
    joined = frames[0].join(frames[1], condition, SPARK_HOW[how]).select(*columns)
    out: Rows = {}

    def collect(df: Any, batch_id: int) -> None:
        out.setdefault(batch_id, Counter()).update(tuple(r) for r in df.collect())

    key = "spark.sql.streaming.noDataMicroBatches.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        query = joined.writeStream.foreachBatch(collect).trigger(availableNow=True).start()
    finally:
        spark.conf.set(key, before)
    return query, out


def _relstate_join(
    spark: Any, dirs: tuple[Path, Path], how: str, time: str, work: Path
) -> tuple[Any, ParquetSink, AppendJoin]:
    """Start relstate's AppendJoin through the runner; the query, its sink
    and the operator."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = _schema(spark.conf.get("spark.sql.session.timeZone"))
    streams = [
        spark.readStream.schema(from_arrow_schema(_schema("UTC")))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(d))
        for d in dirs
    ]
    op = AppendJoin(
        schema,
        schema,
        ["k"],
        ["k"],
        "ts",
        "ts",
        TimeWindows(WINDOW_MS) if time == "window" else TimeRange(BEFORE_MS, AFTER_MS),
        how,
        left_prefix="l_",
        right_prefix="r_",
    )
    sink = ParquetSink(str(work / "output"))
    query = run_operator(
        streams,
        op,
        keys=["k"],
        partitions=2,
        checkpoint=str(work / "checkpoint"),
        sink=sink,
        watermarks={side: Watermark("ts", delay) for side, delay in enumerate(DELAYS)},
        trigger={"availableNow": True},
    )
    return query, sink, op


def _read(spark: Any, sink: ParquetSink, op: AppendJoin) -> Rows:
    out: Rows = {}
    names = [f.name for f in op.output]
    for r in sink.read(spark).collect():
        out.setdefault(r["batch"], Counter())[tuple(r[n] for n in names)] += 1
    return out


@pytest.fixture(scope="module", params=list(TIMES))
def results(
    request: pytest.FixtureRequest, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Rows, Rows, list[dict[str, Any]]]]:
    """Per join type: Spark's rows, relstate's rows, relstate's batch history,
    for one time condition (range or windows).

    One data set serves the four join types, and the eight queries run at
    once (a streaming query mostly waits), to keep the test short."""
    time = request.param
    root = tmp_path_factory.mktemp(f"append-join-{time}")
    left, right = _data(seed=TIMES[time])
    dirs = (root / "left", root / "right")
    write_batches(dirs[0], left, prefix="left")
    write_batches(dirs[1], right, prefix="right")
    started = {}
    for how in SPARK_HOW:
        started[how] = (
            _spark_join(spark, dirs, how, time),
            # Not beside the inputs: a query dir named 'left' would be the left input's.
            _relstate_join(spark, dirs, how, time, root / "queries" / how),
        )
    out = {}
    for how, ((spark_query, expected), (query, sink, op)) in started.items():
        spark_query.awaitTermination()
        query.awaitTermination()
        out[how] = (expected, _read(spark, sink, op), query.history)
    return out


def _with_null_keys(tables: list[pa.Table], seed: int) -> list[pa.Table]:
    """The batches plus a few rows with a null key each, one at the batch's
    earliest event time and the others 30 s past its latest. Spark drops the
    null-key rows of an inner join before its watermark sees them, and so
    does relstate (AppendJoin.watermark_rows): were they counted, the late
    ones would move the watermark 30 s ahead and make later rows late."""
    rng = random.Random(seed)
    out = []
    for b, table in enumerate(tables):
        times = table.column("ts").to_pylist()
        ahead = max(times) + dt.timedelta(seconds=30)
        nulls = [
            {"k": None, "ts": min(times) if i == 0 else ahead, "v": -100 * b - i}
            for i in range(rng.randrange(2, 5))
        ]
        out.append(pa.concat_tables([table, pa.Table.from_pylist(nulls, _schema("UTC"))]))
    return out


@pytest.fixture(scope="module")
def null_key_results(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Rows, Rows, list[dict[str, Any]]]:
    """An inner range join of inputs with null keys on both sides: Spark's
    rows, relstate's rows, relstate's batch history."""
    root = tmp_path_factory.mktemp("append-join-null-keys")
    left, right = _data(seed=TIMES["range"])
    dirs = (root / "left", root / "right")
    write_batches(dirs[0], _with_null_keys(left, 1), prefix="left")
    write_batches(dirs[1], _with_null_keys(right, 2), prefix="right")
    spark_query, expected = _spark_join(spark, dirs, "inner", "range")
    query, sink, op = _relstate_join(spark, dirs, "inner", "range", root / "queries")
    spark_query.awaitTermination()
    query.awaitTermination()
    return expected, _read(spark, sink, op), query.history


class TestAppendJoinAgainstSpark:
    @pytest.mark.parametrize("how", list(SPARK_HOW))
    def test_same_rows_per_batch_as_spark(
        self, results: dict[str, tuple[Rows, Rows, list[dict[str, Any]]]], how: str
    ) -> None:
        """Per batch, relstate's rows equal Spark's native join's, as multisets,
        with a time range and with windows; the data makes matches, late rows
        and (outer joins) padded rows."""
        expected, got, history = results[how]
        assert len(history) == BATCHES
        nonempty = {b: c for b, c in expected.items() if c}
        matched = sum(1 for c in nonempty.values() for row in c if None not in row)
        assert matched > 0, "the data must make matches"
        assert {b: c for b, c in got.items() if c} == nonempty
        late = sum(
            h["metrics"].get(f"{side}.numRowsDroppedByWatermark", 0)
            for h in history
            for side in ("left", "right")
        )
        assert late > 0, "the data must hold late rows"
        padded = sum(1 for c in nonempty.values() for row in c if None in row)
        assert (padded > 0) == (how != "inner"), "outer joins must pad some rows"

    def test_inner_join_with_null_keys(
        self, null_key_results: tuple[Rows, Rows, list[dict[str, Any]]]
    ) -> None:
        """Rows with a null join key on both sides meet nothing, in Spark's
        inner join as in relstate's: per batch the same rows (none with a
        null key)."""
        expected, got, history = null_key_results
        assert len(history) == BATCHES
        nonempty = {b: c for b, c in expected.items() if c}
        assert nonempty, "the data must make matches"
        assert {b: c for b, c in got.items() if c} == nonempty
        assert not any(row[0] is None or row[3] is None for c in nonempty.values() for row in c)
