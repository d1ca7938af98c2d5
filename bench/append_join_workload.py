"""The append-mode join benchmark's workload: two streams of timed events,
the join, and the three ways to run it (harness, relstate's runner, Spark's
own stream-stream join), shared by ``relstate bench --suite append_join`` and
``bench/test_append_join.py``."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.versus import Discard, spark_floor
from operators._api.operator import Operator
from operators.join import AppendJoin, TimeRange
from operators.testing import OperatorHarness

__all__ = [
    "AppendWorkload",
    "make_join",
    "run_harness",
    "run_relstate",
    "run_spark",
    "run_spark_floor",
    "schema",
    "watermarks",
    "write_files",
]

EPOCH_MS = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)


def schema(tz: str | None = "UTC") -> pa.Schema:
    """An event: an ad id, its time, a value."""
    return pa.schema([("ad_id", pa.int64()), ("ts", pa.timestamp("us", tz=tz)), ("v", pa.int64())])


@dataclass(frozen=True)
class AppendWorkload:
    """``rows`` per side in ``batches`` micro-batches; batch b's event times
    fall in ``[b * span, (b + 1) * span)`` ms, keys uniform over ``keys``;
    watermark delay ``delay_ms`` on both sides, range ``±range_ms``."""

    rows: int
    batches: int = 5
    keys: int = 10_000
    span_ms: int = 20_000
    delay_ms: int = 10_000
    range_ms: int = 2_000
    seed: int = 1

    def sides(self) -> tuple[list[pa.Table], list[pa.Table]]:
        """The left and the right input, one table per batch."""
        rng = np.random.default_rng(self.seed)
        per = self.rows // self.batches
        out: tuple[list[pa.Table], list[pa.Table]] = ([], [])
        for b in range(self.batches):
            for side in (0, 1):
                at = EPOCH_MS + b * self.span_ms + rng.integers(0, self.span_ms, per)
                arrays = [
                    pa.array(rng.integers(0, self.keys, per)),
                    pa.array(at * 1000, type=pa.timestamp("us", tz="UTC")),
                    pa.array(np.arange(per) + (b * 2 + side) * per),
                ]
                out[side].append(pa.Table.from_arrays(arrays, schema=schema()))
        return out


def make_join(workload: AppendWorkload, tz: str | None = "UTC") -> AppendJoin:
    """The inner join ``r.ts BETWEEN l.ts - range AND l.ts + range`` on ad_id."""
    return AppendJoin(
        schema(tz),
        schema(tz),
        ["ad_id"],
        ["ad_id"],
        "ts",
        "ts",
        TimeRange(workload.range_ms, workload.range_ms),
        "inner",
        left_prefix="l_",
        right_prefix="r_",
    )


def watermarks(
    workload: AppendWorkload, sides: tuple[list[pa.Table], list[pa.Table]]
) -> list[int | None]:
    """Each batch's watermark by Spark's rule (min over sides of the largest
    event time before it, minus the delay)."""
    marks: list[int | None] = [None]
    for b in range(1, workload.batches):
        seen = [
            max(int(t.column("ts").cast(pa.int64()).to_numpy().max()) // 1000 for t in side[:b])
            for side in sides
        ]
        marks.append(max(min(seen) - workload.delay_ms, marks[-1] or -(2**62)))
    return marks


def run_harness(
    workload: AppendWorkload,
    sides: tuple[list[pa.Table], list[pa.Table]],
    backend: str = "rocksdb",
    path: Path | None = None,
) -> tuple[float, int]:
    """All batches through one harness (one partition): seconds, output rows.
    The joined rows stay in Arrow, as the Spark runner hands them on."""
    op = make_join(workload)
    with OperatorHarness(op, backend=backend, path=path) as h:
        started = time.perf_counter()
        out = 0
        for b, mark in enumerate(watermarks(workload, sides)):
            if mark is not None:
                h.advance_watermark(mark)
            for side in (0, 1):
                for part in sides[side][b].to_batches():
                    out += h.process_arrow(part, side).num_rows
            h.commit()
        out += len(h.output)  # what the closes emitted (padded rows)
        seconds = time.perf_counter() - started
        return seconds, out


def write_files(sides: tuple[list[pa.Table], list[pa.Table]], root: Path) -> tuple[Path, Path]:
    """One Parquet file per batch per side, in order of modification time."""
    from operators._tools.demo import write_batches

    dirs = (root / "left", root / "right")
    for side, directory in enumerate(dirs):
        write_batches(directory, sides[side], prefix=f"side{side}")
    return dirs


def _streams(spark: Any, dirs: tuple[Path, Path]) -> list[Any]:
    from pyspark.sql.pandas.types import from_arrow_schema

    return [
        spark.readStream.schema(from_arrow_schema(schema()))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(d))
        for d in dirs
    ]


def run_spark(spark: Any, workload: AppendWorkload, dirs: tuple[Path, Path], out: Path) -> float:
    """Spark's native stream-stream join of the files, written as Parquet;
    seconds from start to the end of the last batch. Spark's no-data batches
    are off, so that it runs one batch per pair of files, as the runner does."""
    from pyspark.sql import functions as F

    left, right = (
        s.select(*[F.col(c).alias(p + c) for c in ("ad_id", "ts", "v")]).withWatermark(
            f"{p}ts", f"{workload.delay_ms} milliseconds"
        )
        for s, p in zip(_streams(spark, dirs), ("l_", "r_"), strict=True)
    )
    r = workload.range_ms
    condition = F.expr(
        f"l_ad_id = r_ad_id AND r_ts >= l_ts - interval {r} milliseconds "
        f"AND r_ts <= l_ts + interval {r} milliseconds"
    )
    key = "spark.sql.streaming.noDataMicroBatches.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    started = time.perf_counter()
    try:
        query = (
            left.join(right, condition, "inner")
            .writeStream.format("parquet")
            .option("path", str(out / "output"))
            .option("checkpointLocation", str(out / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
    finally:
        spark.conf.set(key, before)
    query.awaitTermination()
    return time.perf_counter() - started


def run_relstate(
    spark: Any,
    workload: AppendWorkload,
    dirs: tuple[Path, Path],
    out: Path,
    partitions: int,
    discard: bool = False,
) -> tuple[float, list[dict[str, Any]]]:
    """relstate's AppendJoin (or, with ``discard``, :class:`Discard`) through
    the runner on the same files, written by ParquetSink: seconds from start
    to the end of the last batch, and the batch history."""
    from operators import ParquetSink, Watermark, run_operator

    join = make_join(workload, tz=spark.conf.get("spark.sql.session.timeZone"))
    op: Operator = Discard(join.inputs, join.output) if discard else join
    started = time.perf_counter()
    query = run_operator(
        _streams(spark, dirs),
        op,
        keys=["ad_id"],
        partitions=partitions,
        checkpoint=str(out / "checkpoint"),
        sink=ParquetSink(str(out / "output")),
        watermarks={s: Watermark("ts", workload.delay_ms) for s in (0, 1)},
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    return time.perf_counter() - started, [dict(h) for h in query.history]


def run_spark_floor(
    spark: Any, workload: AppendWorkload, dirs: tuple[Path, Path], out: Path, partitions: int
) -> float:
    """The Spark-alone floor (:func:`~bench.versus.spark_floor`)
    over the same files, shuffled by the join key: seconds from start to
    end."""
    from pyspark.sql import functions as F

    left, right = _streams(spark, dirs)
    stream = left.withColumn("side", F.lit(0)).unionByName(right.withColumn("side", F.lit(1)))
    floor = spark_floor(stream, "ad_id", partitions, str(out / "checkpoint"))
    if floor.rows != 2 * workload.rows:
        raise RuntimeError(f"the floor job saw {floor.rows} rows of {2 * workload.rows}")
    return floor.seconds
