"""``relstate bench --suite dedup``: relstate's deduplication against Spark's.

Three comparisons, each side on the same Parquet files read one per batch
(``maxFilesPerTrigger=1``), in one Spark session, timed from query start to
its end (``availableNow``), output written to Parquet on both sides:

- ``DropDuplicates(k, ts)`` against Spark's ``dropDuplicates(["k", "ts"])``
  with a watermark, on Spark's default HDFS-backed state store and on its
  RocksDB provider (what Spark users run for large state);
- ``DropDuplicatesWithinWatermark(k)`` against Spark's
  ``dropDuplicatesWithinWatermark(["k"])``, on both state stores;
- keep-first written on relstate (``Deduplicate(keep="first")``) against the
  same logic as a ``transformWithStateInPandas`` processor on Spark's RocksDB
  state store provider.

Spark runs without no-data batches so that both sides run the same batches
(see tests/operators/dedup/test_drop_duplicates_spark.py).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import BooleanType, StructField, StructType

from bench.versus import (
    Comparison,
    Discard,
    SuiteResult,
    Work,
    ceiling,
    runs,
    spark_floor,
    work_of,
)
from operators._spark.runner import RelstateQuery, Watermark, run_operator
from operators._spark.session import local_spark
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches
from operators.dedup import Deduplicate, DropDuplicates, DropDuplicatesWithinWatermark

__all__ = ["KeepFirstProcessor", "events", "run"]

_EPOCH_MS = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
#: Event times are 10 ms apart per key; the watermark delay spans 1.5 batches'
#: worth of keys, so state is evicted as the stream moves on.
_STEP_MS = 10
_PARTITIONS = 4
#: Runs of each side of the comparisons with Spark's native operators,
#: alternating; the medians are compared.
REPEATS = 3
_NO_DATA = "spark.sql.streaming.noDataMicroBatches.enabled"
_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def schema(tz: str = "UTC") -> pa.Schema:
    """``(k, ts, v)``; Spark hands ``ts`` to Python in the session time zone."""
    return pa.schema(
        [
            pa.field("k", pa.int64()),
            pa.field("ts", pa.timestamp("us", tz=tz), nullable=False),
            pa.field("v", pa.int64()),
        ]
    )


def events(rows: int, keys: int, batches: int, seed: int = 0) -> list[pa.Table]:
    """``rows`` rows over exactly ``keys`` keys in ``batches`` batches. Keys
    come in ranges, one per batch, each key once in its own batch; the other
    rows repeat keys of this range and the one before. A key's event time is
    fixed (``k * 10 ms``), so a repeat is a duplicate for every operator."""
    if rows < keys:
        raise ValueError(f"{rows} rows cannot hold {keys} distinct keys")
    rng = np.random.default_rng(seed)
    per_range, per_batch = keys // batches, rows // batches
    out = []
    for b in range(batches):
        last = b == batches - 1
        low, high = b * per_range, keys if last else (b + 1) * per_range
        count = rows - per_batch * (batches - 1) if last else per_batch
        repeats = rng.integers(max(0, b - 1) * per_range, high, count - (high - low))
        k = np.concatenate([np.arange(low, high), repeats])
        rng.shuffle(k)
        out.append(
            pa.table(
                {
                    "k": pa.array(k, pa.int64()),
                    "ts": pa.array((_EPOCH_MS + k * _STEP_MS) * 1000, pa.timestamp("us", tz="UTC")),
                    "v": pa.array(rng.integers(0, 1_000_000, len(k)), pa.int64()),
                }
            )
        )
    return out


class KeepFirstProcessor(StatefulProcessor):
    """Keep-first per key as a ``transformWithStateInPandas`` processor: one
    value state per key that says it was seen; the first row of an unseen key
    goes out."""

    def init(self, handle: Any) -> None:
        self.seen = handle.getValueState("seen", StructType([StructField("seen", BooleanType())]))

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        if not self.seen.exists():
            self.seen.update((True,))
            yield next(rows).head(1)

    def close(self) -> None:
        """Nothing to release."""


def _stream(spark: Any, source: Path, tz: str) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return (
        spark.readStream.schema(from_arrow_schema(schema(tz)))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )


def _timed(start: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    query = start()
    query.awaitTermination()
    return time.perf_counter() - began, query


def _spark_query(spark: Any, frame: Any, work: Path, conf: dict[str, str]) -> Any:
    before = {k: spark.conf.get(k) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        return (
            frame.writeStream.format("parquet")
            .option("path", str(work / "output"))
            .option("checkpointLocation", str(work / "checkpoint"))
            .outputMode("append")
            .trigger(availableNow=True)
            .start()
        )
    finally:
        for k, v in before.items():
            spark.conf.set(k, v)


#: Each comparison: the operator kind, its label, the baseline and the goal.
_COMPARISONS = (
    ("drop", "dropDuplicates(k, ts) + watermark", "Spark dropDuplicates", 1.0),
    (
        "drop_rocksdb",
        "dropDuplicates(k, ts) + watermark",
        "Spark dropDuplicates, RocksDB provider",
        2.0,
    ),
    ("within", "dropDuplicatesWithinWatermark(k)", "Spark dropDuplicatesWithinWatermark", 1.0),
    (
        "within_rocksdb",
        "dropDuplicatesWithinWatermark(k)",
        "Spark dropDuplicatesWithinWatermark, RocksDB provider",
        2.0,
    ),
    ("first", "keep-first per key", "transformWithStateInPandas, RocksDB provider", 25.0),
)
#: The names of a comparison's readings (relstate's, the baseline's) where
#: they are not its label and baseline.
_READING_NAMES = {
    "drop_rocksdb": ("dropDuplicates(k, ts) + watermark", "Spark dropDuplicates on RocksDB"),
    "within_rocksdb": (
        "dropDuplicatesWithinWatermark(k)",
        "Spark dropDuplicatesWithinWatermark on RocksDB",
    ),
    "first": ("keep-first", "transformWithStateInPandas keep-first"),
}

#: One timed query: seconds from start to end, the query, its output rows.
_Timed = tuple[float, Any, int]


class _Sides:
    """Starts each side's query on one source, and counts what it wrote."""

    def __init__(self, spark: Any, source: Path, workdir: Path, delay_ms: int) -> None:
        self.spark = spark
        self.source = source
        self.workdir = workdir
        self.delay_ms = delay_ms
        self.tz = spark.conf.get("spark.sql.session.timeZone")
        self.runs = 0

    def _work(self, label: str) -> Path:
        self.runs += 1
        return self.workdir / f"{self.runs:02d}-{label}"

    def spark_side(self, kind: str) -> _Timed:
        """Spark's side of comparison ``kind``."""
        if kind == "first":
            return self.spark_keep_first()
        return self.spark_dedup(within=kind.startswith("within"), rocksdb=kind.endswith("rocksdb"))

    def _spark_timed(self, frame: Any, label: str, conf: dict[str, str]) -> _Timed:
        work = self._work(label)
        seconds, query = _timed(lambda: _spark_query(self.spark, frame, work, conf))
        return seconds, query, int(self.spark.read.parquet(str(work / "output")).count())

    def spark_dedup(self, within: bool, rocksdb: bool = False) -> _Timed:
        frame = _stream(self.spark, self.source, self.tz).withWatermark(
            "ts", f"{self.delay_ms} milliseconds"
        )
        frame = (
            frame.dropDuplicatesWithinWatermark(["k"])
            if within
            else frame.dropDuplicates(["k", "ts"])
        )
        conf = {_NO_DATA: "false", **({_PROVIDER: _ROCKSDB} if rocksdb else {})}
        return self._spark_timed(frame, "spark", conf)

    def spark_keep_first(self) -> _Timed:
        from pyspark.sql.pandas.types import from_arrow_schema

        frame = (
            _stream(self.spark, self.source, self.tz)
            .groupBy("k")
            .transformWithStateInPandas(
                statefulProcessor=KeepFirstProcessor(),
                outputStructType=from_arrow_schema(schema(self.tz)),
                outputMode="Append",
                timeMode="None",
            )
        )
        return self._spark_timed(frame, "tws", {_NO_DATA: "false", _PROVIDER: _ROCKSDB})

    def spark_alone(self) -> float:
        """The Spark-alone floor over the source, start to end
        (:func:`~bench.versus.spark_floor`)."""
        work = self._work("spark-alone")
        stream = _stream(self.spark, self.source, self.tz)
        return spark_floor(stream, "k", _PARTITIONS, str(work / "checkpoint")).seconds

    def relstate(self, operator: Any) -> _Timed:
        work = self._work("relstate")
        seconds, query = _timed(
            lambda: run_operator(
                _stream(self.spark, self.source, self.tz),
                operator,
                keys=["k"],
                partitions=_PARTITIONS,
                checkpoint=str(work / "checkpoint"),
                sink=ParquetSink(str(work / "output")),
                watermarks={0: Watermark("ts", self.delay_ms)},
                trigger={"availableNow": True},
            )
        )
        return seconds, query, sum(int(h["metrics"]["numOutputRows"]) for h in query.history)


def _operators(tz: str, delay_ms: int) -> dict[str, Any]:
    s = schema(tz)
    drop = DropDuplicates(s, ["k", "ts"], event_time="ts")
    within = DropDuplicatesWithinWatermark(s, ["k"], event_time="ts", delay_ms=delay_ms)
    return {
        "drop": drop,
        "drop_rocksdb": drop,
        "within": within,
        "within_rocksdb": within,
        "first": Deduplicate(s, ["k"], keep="first"),
    }


def _batch_ms(query: Any) -> str:
    """The mean wall time of a query's batches, and of the batch body (for
    relstate's ``foreachBatch`` query, the whole runner's batch), from the
    progress reports (dicts, Spark's as a :class:`RelstateQuery`'s)."""
    reports = [p["durationMs"] for p in query.recentProgress]
    if not reports:
        return "no batches"
    total = sum(r.get("triggerExecution", 0) for r in reports) / len(reports)
    body = sum(r.get("addBatch", 0) for r in reports) / len(reports)
    return f"{total:.0f} ms per batch ({body:.0f} ms in addBatch)"


def _profile(query: RelstateQuery) -> str:
    """Where relstate's time went, summed over batches and partitions."""
    totals: dict[str, int] = {}
    for record in query.history:
        for k in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs"):
            totals[k] = totals.get(k, 0) + int(record["metrics"].get(k, 0))
    return (
        f"operator {totals['allUpdatesTimeMs'] / 1000:.2f} s, eviction "
        f"{totals['allRemovalsTimeMs'] / 1000:.2f} s, state commit "
        f"{totals['commitTimeMs'] / 1000:.2f} s (task seconds over {_PARTITIONS} partitions)"
    )


def run(quick: bool, workdir: Path, progress: Callable[[str], None], scale: int = 1) -> SuiteResult:
    """Time each comparison's two sides on the same files, in one session,
    at ``scale`` times the default size. Above 1 the keep-first comparison
    is left out: its baseline takes twenty times relstate's time, many
    minutes at that size."""
    rows, keys, n = (4_000, 2_000, 2) if quick else (200_000, 100_000, 5)
    rows, keys = rows * scale, keys * scale
    kinds = [c for c in _COMPARISONS if scale == 1 or c[0] != "first"]
    delay_ms = (keys // n) * _STEP_MS * 3 // 2
    progress("starting Spark")
    spark = local_spark("relstate-bench-dedup", {"spark.sql.shuffle.partitions": str(_PARTITIONS)})
    try:
        warm = workdir / "warm"
        write_batches(warm, events(200, 100, 1, seed=1), prefix="events")
        source = workdir / "source"
        write_batches(source, events(rows, keys, n), prefix="events")
        sides = _Sides(spark, warm, workdir, delay_ms)
        # Every kind of query once on a small input, each side, so that no
        # timed query pays for its first start (classes, Python workers).
        for kind, label, *_ in kinds:
            progress(f"warming up {label}")
            sides.spark_side(kind)
            sides.relstate(_operators(sides.tz, delay_ms)[kind])
        sides.source = source
        comparisons = []
        readings = []
        work: list[Work] = []
        progress("the runner around an operator that does nothing")
        discard = Discard([schema(sides.tz)], schema(sides.tz))
        floor_runs = [sides.relstate(discard)[0]]
        progress("Spark alone: the micro-batch, the shuffle into mapInArrow")
        alone_runs = [sides.spark_alone()]
        for kind, label, baseline, goal in kinds:
            ours_name, theirs_name = _READING_NAMES.get(kind, (label, baseline))
            # Medians of several alternating runs, but for the slow baseline
            # (a single run of it takes over a minute, twenty times relstate's).
            repeats = 1 if quick or kind == "first" else REPEATS
            ours_runs, theirs_runs = [], []
            for i in range(repeats):
                progress(f"{label}: {baseline}, run {i + 1} of {repeats}")
                spark_s, native, theirs = sides.spark_side(kind)
                progress(f"{label}: relstate, run {i + 1} of {repeats}")
                ours_s, query, ours = sides.relstate(_operators(sides.tz, delay_ms)[kind])
                if ours != theirs:
                    raise RuntimeError(
                        f"{label}: relstate emitted {ours:,} rows and {baseline} {theirs:,}; "
                        "the comparison would not be of the same work"
                    )
                ours_runs.append(ours_s)
                theirs_runs.append(spark_s)
                if kind == "drop" and not quick:
                    progress("the runner around an operator that does nothing")
                    floor_runs.append(sides.relstate(discard)[0])
                    progress("Spark alone: the micro-batch, the shuffle into mapInArrow")
                    alone_runs.append(sides.spark_alone())
            comparison = Comparison.of_runs(
                label, rows, ours_runs, theirs_runs, baseline, goal=goal
            )
            comparisons.append(comparison)
            work.append(work_of(comparison, query.history))
            if repeats > 1:
                readings.append((f"runs, relstate {ours_name}", runs(ours_runs)))
                readings.append((f"runs, {theirs_name}", runs(theirs_runs)))
            readings.append((f"relstate {ours_name} (last run)", _profile(query)))
            readings.append((f"batches, relstate {ours_name} (last run)", _batch_ms(query)))
            readings.append((f"batches, {theirs_name} (last run)", _batch_ms(native)))
            readings.append((f"output rows, {ours_name} (relstate = baseline)", f"{ours:,}"))
            if kind != "first":
                readings.append(
                    (
                        f"runner alone, median, against {theirs_name}",
                        ceiling(comparison.baseline_seconds, median(floor_runs)),
                    )
                )
                readings.append(
                    (
                        f"Spark alone, median, against {theirs_name}",
                        ceiling(
                            comparison.baseline_seconds,
                            median(alone_runs),
                            "any operator run through foreachBatch and mapInArrow",
                        ),
                    )
                )
    finally:
        spark.stop()
    description = (
        f"{rows:,} rows over {keys:,} distinct keys in {n} batches (one Parquet file "
        f"each, `maxFilesPerTrigger=1`), watermark delay {delay_ms / 1000:.0f} s, "
        f"{_PARTITIONS} partitions on both sides, Spark `local[2,3]` (two cores). Each side "
        "is one streaming query with an `availableNow` trigger, timed from start to end, "
        "writing its output to Parquet; a warm-up query of every kind runs first on each side, and "
        "each comparison checks that both sides emitted the same number of rows. Against "
        f"Spark's native operators each side runs {REPEATS} times, alternating, and the "
        "table compares the medians. The runner-alone reading runs the same files through "
        "relstate's runner with an operator that keeps and emits nothing: what any "
        "operator pays for Spark's micro-batch, the shuffle and the state store's open and "
        "commit; the baseline's time over it is the most any operator on this runner could "
        "reach at this size. The Spark-alone reading runs the same files through Spark's "
        "micro-batch with `foreachBatch`, each batch shuffled by `k` into `mapInArrow` "
        "tasks that only count the rows and write nothing: the baseline's time over it is "
        "the most any operator run through `foreachBatch` and `mapInArrow` could reach, "
        "on any runner. Spark's "
        "native operators run on its default state store and, as a second baseline, on "
        "its RocksDB provider (`spark.sql.streaming.stateStore.providerClass` = "
        "`RocksDBStateStoreProvider`); the `transformWithStateInPandas` "
        "processor uses the RocksDB provider (it requires it). No-data batches are off "
        "on Spark's side so both run the same batches."
        + (
            ""
            if scale == 1
            else " At this scale the keep-first comparison is left out: its baseline alone "
            "would take about twenty times relstate's time, many minutes."
        )
    )
    return SuiteResult(
        suite="dedup",
        title="Deduplication: relstate against Spark",
        description=description,
        comparisons=comparisons,
        readings=readings,
        work=work,
    )
