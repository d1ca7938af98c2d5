"""relstate's DropDuplicates and DropDuplicatesWithinWatermark against Spark's
own dropDuplicates and dropDuplicatesWithinWatermark, on the same files.

Random append-only batches, one Parquet file each with its own modification
time, read with ``maxFilesPerTrigger=1`` so that batch ``i`` is file ``i`` on
both sides; event times that fall behind the watermark make late rows.

No-data batches: Spark runs an extra batch without input when the watermark
has moved and a stateful operator could evict (``shouldRunAnotherBatch``).
relstate's runner is a ``foreachBatch`` with no stateful operator in Spark's
plan, so Spark never plans such a batch for it; relstate evicts at the next
batch that has data instead, which changes no output row (eviction emits
nothing in either operator, and the late-row bound is the watermark of the
batch before, which a no-data batch would only have raised to the value the
next data batch computes anyway). With every file present from the start no
no-data batch falls between data batches, only one after the last; Spark's
queries here run with ``spark.sql.streaming.noDataMicroBatches.enabled=false``
so that both sides run exactly the same batches, and batch ids line up.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import Watermark
from operators._runner import run_operator
from operators._sinks import ParquetSink
from operators.dedup import DropDuplicates, DropDuplicatesWithinWatermark
from operators.demo import write_batches

pytestmark = pytest.mark.spark


def events_schema(tz: str) -> pa.Schema:
    """The input: Spark's watermark needs a TIMESTAMP (with time zone), which
    reaches Python workers as microseconds in the session's time zone."""
    return pa.schema(
        [
            pa.field("k", pa.int64()),
            pa.field("ts", pa.timestamp("us", tz=tz), nullable=False),
            pa.field("v", pa.int64()),
        ]
    )


SCHEMA = events_schema("UTC")
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DELAY_MS = 150

Batches = list[Counter[tuple[Any, ...]]]


def random_batches(seed: int, n: int = 5) -> list[pa.Table]:
    """``n`` batches of up to 20 keys. Within a batch a key has one event time
    (its duplicates there are equal rows, so no output depends on the order of
    rows inside a batch); across batches times repeat on a 50 ms grid and fall
    up to 700 ms behind, which makes duplicates, evictions and late rows."""
    rng = random.Random(seed)
    batches = []
    for b in range(n):
        clock = 200 * (b + 1)
        rows = []
        for k in rng.sample(range(20), 12):
            t = clock + rng.choice([-700, -500, -300, -150, -100, -50, 0, 50])
            ts = EPOCH + dt.timedelta(milliseconds=max(t, 0))
            for _ in range(rng.choice([1, 1, 2, 3])):
                rows.append({"k": k, "ts": ts, "v": k * 1000 + t})
        rng.shuffle(rows)
        batches.append(pa.Table.from_pylist(rows, SCHEMA))
    return batches


def _stream(spark: Any, source: Path) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return (
        spark.readStream.schema(from_arrow_schema(SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )


def _row(r: Any) -> tuple[Any, ...]:
    return (r["k"], r["ts"], r["v"])


#: The operators compared: Spark's call, by a name for the test ids.
MODES = {
    "dropDuplicates(k, ts)": ("dropDuplicates", ["k", "ts"]),
    "dropDuplicates(k)": ("dropDuplicates", ["k"]),
    "dropDuplicatesWithinWatermark(k)": ("dropDuplicatesWithinWatermark", ["k"]),
}


def run_spark(spark: Any, source: Path, checkpoint: Path, mode: str) -> tuple[Batches, Any]:
    """Spark's native operator; each batch's rows, and the query."""
    method, keys = MODES[mode]
    frame = _stream(spark, source).withWatermark("ts", f"{DELAY_MS} milliseconds")
    frame = getattr(frame, method)(keys)
    collected: dict[int, Counter[tuple[Any, ...]]] = {}

    def collect(batch: Any, batch_id: int) -> None:
        collected[batch_id] = Counter(_row(r) for r in batch.collect())

    key = "spark.sql.streaming.noDataMicroBatches.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        query = (
            frame.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        spark.conf.set(key, before)
    return [collected.get(i, Counter()) for i in range(max(collected) + 1)], query


def run_relstate(spark: Any, source: Path, root: Path, mode: str) -> tuple[Batches, Any]:
    """relstate's operator through the runner; each batch's rows, and the query."""
    schema = events_schema(spark.conf.get("spark.sql.session.timeZone"))
    method, keys = MODES[mode]
    operator = (
        DropDuplicatesWithinWatermark(schema, keys, event_time="ts", delay_ms=DELAY_MS)
        if method == "dropDuplicatesWithinWatermark"
        else DropDuplicates(schema, keys, event_time="ts")
    )
    sink = ParquetSink(str(root / "output"))
    query = run_operator(
        _stream(spark, source),
        operator,
        keys=["k"],
        partitions=2,
        checkpoint=str(root / "checkpoint"),
        sink=sink,
        watermarks={0: Watermark("ts", DELAY_MS)},
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    got: dict[int, Counter[tuple[Any, ...]]] = {}
    for r in sink.read(spark).collect():
        assert r["row_kind"] == "+I"
        got.setdefault(r["batch"], Counter())[_row(r)] += 1
    return [got.get(i, Counter()) for i in range(len(query.history))], query


def spark_counters(query: Any) -> tuple[int, int]:
    """Rows Spark dropped as late and as duplicates, over all batches."""
    late = duplicates = 0
    for progress in query.recentProgress:
        for op in json.loads(progress.json)["stateOperators"]:
            late += op["numRowsDroppedByWatermark"]
            duplicates += op["customMetrics"].get("numDroppedDuplicateRows", 0)
    return late, duplicates


class TestAgainstSpark:
    @pytest.mark.parametrize(("mode", "seed"), [(m, 7 + 4 * i) for i, m in enumerate(MODES)])
    def test_same_rows_per_batch_as_spark(
        self, spark: Any, tmp_path: Path, mode: str, seed: int
    ) -> None:
        """Every batch outputs the same rows as Spark's native operator, and the
        rows dropped as late and as duplicates add up to Spark's counts; for
        dropDuplicates with and without the event time in the key, and for
        dropDuplicatesWithinWatermark."""
        batches = random_batches(seed)
        source = tmp_path / "source"
        write_batches(source, batches, prefix="events")
        expected, spark_query = run_spark(spark, source, tmp_path / "spark", mode)
        got, query = run_relstate(spark, source, tmp_path / "relstate", mode)
        assert len(expected) == len(batches)
        assert got == expected
        late, duplicates = spark_counters(spark_query)
        ours = [b["metrics"] for b in query.history]
        assert sum(m.get("numRowsDroppedByWatermark", 0) for m in ours) == late
        assert sum(m.get("numDroppedDuplicateRows", 0) for m in ours) == duplicates
        assert late > 0 and duplicates > 0, "the input must have late rows and duplicates"
