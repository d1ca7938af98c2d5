"""``relstate bench --suite append_join``: AppendJoin through relstate's
runner against Spark's native stream-stream join, same files, same batches,
same SparkSession, in one run; and the harness's rows per second per
partition as a reading."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

from bench.append_join_workload import (
    AppendWorkload,
    run_harness,
    run_relstate,
    run_spark,
    run_spark_floor,
    write_files,
)
from bench.versus import Comparison, SuiteResult, ceiling, runs, work_of
from operators._api.metrics import EVICTION_TIME, STORE_TIME

__all__ = ["run"]

_SPARK = "Spark stream-stream join"
PARTITIONS = 2
#: Runs of each side outside ``--quick``; the medians are compared. At a
#: larger ``--scale`` a run takes a minute or more, and the spread is smaller.
REPEATS = 5
SCALED_REPEATS = 3


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds / 1e3:.1f} k rows/s"


def run(quick: bool, workdir: Path, progress: Callable[[str], None], scale: int = 1) -> SuiteResult:
    """200,000 rows per side in 5 batches (12,000 in 3 with ``quick``),
    ``scale`` times that."""
    from operators._spark.session import local_spark

    # --quick must end within two minutes on a loaded 2-core machine, where a
    # batch costs seconds whatever its size: fewer rows and fewer batches.
    rows = (12_000 if quick else 200_000) * scale
    workload = AppendWorkload(rows=rows, batches=3) if quick else AppendWorkload(rows=rows)
    sides = workload.sides()
    total = 2 * workload.rows
    progress("harness, one partition")
    harness_seconds, harness_out = run_harness(workload, sides, "rocksdb", workdir / "harness")
    dirs = write_files(sides, workdir / "input")
    progress("starting Spark")
    spark = local_spark(
        "relstate-bench-append-join", {"spark.sql.shuffle.partitions": str(PARTITIONS)}
    )
    if not quick:
        # At the default size each side first runs the whole workload once,
        # not counted: after one small batch both sides' runs still fell run
        # after run (relstate 4.8 s to 2.8 s, Spark 8.5 s to 5.9 s over five),
        # so the median was of runs still warming up. Above it a run is
        # minutes, and one small batch warms both.
        progress("warming up both")
        warming, warm = workload, dirs
        if scale > 1:
            warming = AppendWorkload(rows=2_000, batches=1, seed=2)
            warm = write_files(warming.sides(), workdir / "warm-input")
        run_relstate(spark, warming, warm, workdir / "warm-relstate", PARTITIONS)
        run_spark(spark, warming, warm, workdir / "warm-spark")
    # Each side runs REPEATS times, alternating, and the medians are compared:
    # a shared 2-core machine moves single runs by 10-15%.
    repeats = 1 if quick else REPEATS if scale == 1 else SCALED_REPEATS
    relstate_runs: list[float] = []
    spark_runs: list[float] = []
    floor_runs: list[float] = []
    spark_floor_runs: list[float] = []
    history: list[dict[str, Any]] = []
    for i in range(repeats):
        progress(f"relstate's runner, run {i + 1} of {repeats}")
        seconds, history = run_relstate(
            spark, workload, dirs, workdir / f"relstate-{i}", PARTITIONS
        )
        relstate_runs.append(seconds)
        if not quick:
            progress("the runner around an operator that does nothing")
            floor, _ = run_relstate(
                spark, workload, dirs, workdir / f"discard-{i}", PARTITIONS, discard=True
            )
            floor_runs.append(floor)
            progress("Spark alone: the shuffle into mapInArrow, no operator")
            spark_floor_runs.append(
                run_spark_floor(spark, workload, dirs, workdir / f"floor-{i}", PARTITIONS)
            )
        progress(f"Spark's native join, run {i + 1} of {repeats}")
        spark_runs.append(run_spark(spark, workload, dirs, workdir / f"spark-{i}"))
    spark_out = spark.read.parquet(str(workdir / "spark-0" / "output")).count()
    relstate_out = sum(int(h["metrics"]["numOutputRows"]) for h in history)
    if relstate_out != spark_out:
        raise RuntimeError(
            f"relstate emitted {relstate_out} rows and Spark {spark_out}; the comparison "
            "would not be of the same work"
        )
    batch_ms = [
        f"{h['metrics'].get('allUpdatesTimeMs', 0) + h['metrics'].get(STORE_TIME, 0)}"
        f"+{h['metrics'].get(EVICTION_TIME, 0)}+{h['metrics'].get('commitTimeMs', 0)}"
        for h in history
    ]
    comparison = Comparison.of_runs(
        f"inner join, {workload.batches} batches, {PARTITIONS} partitions",
        total,
        relstate_runs,
        spark_runs,
        _SPARK,
        goal=2.0 if scale == 1 else 1.5,
    )
    readings = [
        (
            "harness, one partition, RocksDB: rows per second",
            f"{_rate(total, harness_seconds)} ({harness_out:,} output rows)",
        ),
        ("output rows (relstate = Spark)", f"{relstate_out:,}"),
        ("runs, relstate", runs(relstate_runs)),
        ("runs, Spark stream-stream join", runs(spark_runs)),
        (
            "relstate per batch (last run): update + eviction + commit ms, summed over partitions",
            ", ".join(batch_ms),
        ),
    ]
    if floor_runs:
        readings.append(
            (
                "runner alone (same files, an operator that keeps and emits nothing), median",
                ceiling(comparison.baseline_seconds, median(floor_runs)),
            )
        )
        readings.append(
            (
                "Spark alone (foreachBatch, shuffle by ad_id, mapInArrow that counts rows), median",
                ceiling(
                    comparison.baseline_seconds,
                    median(spark_floor_runs),
                    "any operator run through foreachBatch and mapInArrow",
                ),
            )
        )
    warm_up = "one small batch" if scale > 1 else "the whole workload once"
    description = f"""
Two streams of events `(ad_id, ts, v)`, {workload.rows:,} rows per side in
{workload.batches} micro-batches (one Parquet file per side per batch, read with
`maxFilesPerTrigger=1`), event times moving {workload.span_ms // 1000} s per batch,
ad ids from {workload.keys:,} values. Inner join on `ad_id` and
`r.ts BETWEEN l.ts - {workload.range_ms // 1000} s AND l.ts + {workload.range_ms // 1000} s`,
watermark delay {workload.delay_ms // 1000} s on both sides.

Both run in one local SparkSession ({PARTITIONS} shuffle partitions, the JVM
started before timing; outside `--quick` both first run {warm_up}, not
counted, to warm the JVM and the Python workers, and relstate runs first, which
favours Spark if anything), trigger
`availableNow`, Spark's no-data batches off so that both run one batch per pair
of files: **{_SPARK}** writes its output with
the Parquet file sink; relstate's `AppendJoin` runs through `run_operator`
({PARTITIONS} partitions, RocksDB state checkpointed per batch) and writes
through `ParquetSink`. Time is wall time from `start()` to the end of the last
batch; outside `--quick` each side runs {repeats} times, alternating, and the
table compares the medians. Both emit the same number of rows (checked). The
harness reading is the same data through `OperatorHarness` on one partition
(RocksDB), commits included, the joined rows kept in Arrow as the Spark
runner hands them on (`process_arrow`), not turned into Python rows.

The runner-alone reading runs the same files through relstate's runner with an
operator that keeps and emits nothing: what any operator pays for Spark's
micro-batch, reading the files, the shuffle, Arrow to Python, and opening and
committing the state store. Spark's time over it is the most any operator on
this runner could reach at this size, however fast its own work.

The Spark-alone reading is the same without relstate at all: Spark's
micro-batch over the same files, each batch handed to `foreachBatch`,
shuffled by `ad_id` into {PARTITIONS} tasks and given to Python by
`mapInArrow`, which only counts the rows. Any operator that runs inside
Spark's executors this way pays at least that, so Spark's join time over it
bounds the speed-up of every such operator, relstate's or not.
"""
    logging.getLogger("py4j").setLevel(logging.ERROR)
    return SuiteResult(
        suite="append_join",
        title="Append-mode join: AppendJoin against Spark's stream-stream join",
        description=description,
        comparisons=[comparison],
        readings=readings,
        work=[work_of(comparison, history)],
    )
