"""``relstate bench --suite topn``: ``TopN`` over a changelog against
recomputing ``ROW_NUMBER() OVER (PARTITION BY k ORDER BY v DESC, id)`` over
the live rows every batch (Spark has no streaming top-N). Each pair of runs
is checked: relstate's output, materialised, is the baseline's last table."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.relational_workload import (
    APPEND,
    CHANGELOG,
    PARTITIONS,
    Sides,
    alternate,
    changelog_stream,
    same_table,
)
from bench.suite_aggregate import REPEATS
from bench.versus import Comparison, SuiteResult, runs
from encoding import Direction, KeyColumn
from operators._spark.session import local_spark
from operators.topn import TopN

__all__ = ["run"]

_N = 10


def _window(live: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # Identical live rows (n > 1) cannot occur: ids are distinct.
    order = Window.partitionBy("k").orderBy(F.col("v").desc(), F.col("id"))
    ranked = live.withColumn("rn", F.row_number().over(order))
    return ranked.filter(F.col("rn") <= _N).select("k", "v", "id")


def run(quick: bool, workdir: Path, progress: Callable[[str], None]) -> SuiteResult:
    """Time both sides on the same files, in one session, at two sizes."""
    plans = (
        [(2_000, 400, 3, 100)]
        if quick
        else [(100_000, 20_000, 5, 2_000), (1_000_000, 20_000, 5, 20_000)]
    )
    repeats = 1 if quick else REPEATS
    progress("starting Spark")
    spark = local_spark("relstate-bench-topn", {"spark.sql.shuffle.partitions": str(PARTITIONS)})
    comparisons: list[Comparison] = []
    readings: list[tuple[str, str]] = []
    operator = TopN(APPEND, [KeyColumn("v", Direction.DESC)], _N, ["k"])
    try:
        sides = Sides(spark, workdir)
        progress("warming up")
        warm = sides.write("warm", changelog_stream(100, 20, 2, 10, seed=1))
        sides.spark_recompute(warm, _window)
        sides.relstate(warm, CHANGELOG, operator, ["k"])
        for initial, changes, batches, keys in plans:
            source = sides.write(
                f"changelog-{initial}", changelog_stream(initial, changes, batches, keys)
            )
            label = (
                f"top {_N} of {keys:,} partitions, {initial:,} rows then {batches - 1} "
                f"batches of {changes:,} changes"
            )
            ours, theirs, mine, base = alternate(
                repeats,
                label,
                partial(sides.relstate, source, CHANGELOG, operator, ["k"]),
                partial(sides.spark_recompute, source, _window),
                lambda m, b: same_table(spark, m, b, ["k", "v", "id"], False),
                progress,
            )
            total = initial + (batches - 1) * changes * 8 // 5
            comparisons.append(
                Comparison.of_runs(
                    label, total, ours, theirs, "Spark recomputing the window each batch"
                )
            )
            readings.append((f"runs, relstate, {initial:,} rows", runs(ours)))
            readings.append((f"runs, recompute, {initial:,} rows", runs(theirs)))
            readings.append((f"top rows at the end, {initial:,} rows", f"{base.rows['table']:,}"))
            readings.append((f"output rows, relstate, {initial:,} rows", str(mine.rows)))
    finally:
        spark.stop()
    description = (
        f"`TopN(order by v desc, limit {_N}, partition by k)` through relstate's runner "
        "over a changelog: a first batch of inserts, then batches of changes (a fifth "
        "inserts, a fifth deletes, the rest updates of `v` as `-U`/`+U` pairs); the rows "
        "column counts changelog rows. The baseline is what Spark offers: a `foreachBatch` "
        "that appends the changes to a log and recomputes `ROW_NUMBER() OVER (PARTITION BY "
        f"k ORDER BY v DESC, id) <= {_N}` over the log's live rows, overwriting the result. "
        f"{PARTITIONS} partitions on both sides, Spark `local[2,3]`; one Parquet file per "
        "batch (`maxFilesPerTrigger=1`), each side one streaming query with an "
        "`availableNow` trigger timed from start to end, a warm-up query of each kind first. "
        f"Each side runs {REPEATS} times alternating and the table compares the medians; each "
        "pair of runs is checked: relstate's output, materialised, is the baseline's last table."
    )
    return SuiteResult(
        suite="topn",
        title="Top-N: relstate against Spark",
        description=description,
        comparisons=comparisons,
        readings=readings,
    )
