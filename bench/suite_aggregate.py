"""``relstate bench --suite aggregate``: ``GroupAggregate`` against Spark.

Two comparisons:

- over an append stream, against Spark's native streaming aggregation in
  update mode (Spark's default state store), at two sizes, ten times apart:
  relstate's aggregate built with ``update_before=False`` (an upsert stream,
  Spark's update-mode rows), and, as a second row, the default that emits a
  ``-U`` before each ``+U``;
- over a changelog (inserts, updates, deletes), which Spark's streaming
  aggregation cannot take, against recomputing the aggregate over the live
  rows every batch (see ``relational_workload``).

Each comparison checks that both sides did the same work: as many output
rows as Spark's, none a ``-U`` (append, upsert); as many updated groups
(append, with ``-U``); relstate's output, materialised, is the recomputed
table (changelog).
"""

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
    Timed,
    alternate,
    append_stream,
    changelog_stream,
    same_table,
)
from bench.versus import Comparison, Discard, SuiteResult, Work, ceiling, runs, work_of
from operators._spark.session import local_spark
from operators.aggregate import Aggregate, GroupAggregate

__all__ = ["run"]

#: Runs of each side per comparison, alternating; the medians are compared.
REPEATS = 2
_APPEND_AGGREGATES = [
    Aggregate.count(),
    Aggregate.sum("v", "sum_v"),
    Aggregate.min("v", "min_v"),
    Aggregate.max("v", "max_v"),
]
_CHANGELOG_AGGREGATES = [*_APPEND_AGGREGATES, Aggregate.avg("v", "avg_v")]


def _spark_aggregate(frame: Any) -> Any:
    from pyspark.sql import functions as F

    return frame.groupBy("k").agg(
        F.count("*").alias("count"),
        F.sum("v").alias("sum_v"),
        F.min("v").alias("min_v"),
        F.max("v").alias("max_v"),
    )


def _recomputed(live: Any) -> Any:
    from pyspark.sql import functions as F

    total = F.sum(F.col("v") * F.col("n"))
    return live.groupBy("k").agg(
        F.sum("n").alias("count"),
        total.alias("sum_v"),
        F.min("v").alias("min_v"),
        F.max("v").alias("max_v"),
        (total / F.sum("n")).alias("avg_v"),
    )


def _same_rows(mine: Timed, base: Timed) -> bool:
    """Spark's update mode writes one row per changed group and batch; so does
    relstate without ``-U``: a +I for a new group, a +U for a changed one."""
    return "-U" not in mine.rows and sum(mine.rows.values()) == base.rows["update"]


def _updates_match(mine: Timed, base: Timed) -> bool:
    """With ``-U``, relstate writes a -U/+U pair where Spark writes one row:
    as many groups updated, each with its -U."""
    plus = mine.rows.get("+I", 0) + mine.rows.get("+U", 0)
    return plus == base.rows["update"] and mine.rows.get("-U", 0) == mine.rows.get("+U", 0)


def run(quick: bool, workdir: Path, progress: Callable[[str], None]) -> SuiteResult:
    """Time each comparison's two sides on the same files, in one session."""
    sizes = (4_000,) if quick else (400_000, 4_000_000)
    initial, changes, batches = (2_000, 400, 3) if quick else (200_000, 25_000, 5)
    groups = 200 if quick else 20_000
    repeats = 1 if quick else REPEATS
    progress("starting Spark")
    spark = local_spark(
        "relstate-bench-aggregate", {"spark.sql.shuffle.partitions": str(PARTITIONS)}
    )
    comparisons: list[Comparison] = []
    work: list[Work] = []
    readings: list[tuple[str, str]] = []
    try:
        sides = Sides(spark, workdir)
        appended = GroupAggregate(
            APPEND, ["k"], _APPEND_AGGREGATES, changelog=False, update_before=False
        )
        retracting = GroupAggregate(APPEND, ["k"], _APPEND_AGGREGATES, changelog=False)
        changed = GroupAggregate(APPEND, ["k"], _CHANGELOG_AGGREGATES)
        discard = Discard(appended.inputs, appended.output)
        progress("warming up")
        warm = sides.write("warm", append_stream(200, 20, 1, seed=1))
        warm_changes = sides.write("warm-changes", changelog_stream(100, 20, 2, 10, seed=1))
        sides.spark_update_mode(warm, _spark_aggregate)
        sides.relstate(warm, APPEND, appended, ["k"])
        sides.relstate(warm, APPEND, retracting, ["k"])
        sides.spark_recompute(warm_changes, _recomputed)
        sides.relstate(warm_changes, CHANGELOG, changed, ["k"])
        for rows in sizes:
            keys = rows // 10
            source = sides.write(f"append-{rows}", append_stream(rows, keys, 5))
            label = f"append stream, {rows:,} rows, {keys:,} groups"
            times = 1 if rows > 1_000_000 else repeats
            ours, theirs, mine, base = alternate(
                times,
                f"{label}, upsert",
                partial(sides.relstate, source, APPEND, appended, ["k"]),
                partial(sides.spark_update_mode, source, _spark_aggregate),
                _same_rows,
                progress,
            )
            comparison = Comparison.of_runs(
                f"{label}, upsert (no -U)",
                rows,
                ours,
                theirs,
                "Spark streaming aggregation, update mode",
                1.0,
            )
            comparisons.append(comparison)
            work.append(work_of(comparison, mine.history))
            # The default with -U, against the same Spark runs: the cost of
            # the retractions a downstream stage would need.
            retract_runs = []
            for i in range(times):
                progress(f"{label}: relstate with -U, run {i + 1} of {times}")
                full = sides.relstate(source, APPEND, retracting, ["k"])
                if not _updates_match(full, base):
                    raise RuntimeError(
                        f"{label}: relstate's output with -U {full.rows} does not match "
                        f"Spark's {base.rows}"
                    )
                retract_runs.append(full.seconds)
            with_before = Comparison.of_runs(
                f"{label}, with -U (default)",
                rows,
                retract_runs,
                theirs,
                "Spark streaming aggregation, update mode",
            )
            comparisons.append(with_before)
            work.append(work_of(with_before, full.history))
            readings.append((f"runs, relstate upsert, {rows:,} rows", runs(ours)))
            readings.append((f"runs, relstate with -U, {rows:,} rows", runs(retract_runs)))
            readings.append((f"runs, Spark update mode, {rows:,} rows", runs(theirs)))
            readings.append((f"output rows, Spark update mode, {rows:,} rows", str(base.rows)))
            readings.append((f"output rows, relstate upsert, {rows:,} rows", str(mine.rows)))
            readings.append((f"output rows, relstate with -U, {rows:,} rows", str(full.rows)))
            if not quick:
                progress(f"{label}: the runner around an operator that does nothing")
                floor = sides.relstate(source, APPEND, discard, ["k"]).seconds
                readings.append(
                    (
                        f"runner alone, {rows:,} rows (same files, an operator that keeps "
                        "and emits nothing), one run",
                        ceiling(comparison.baseline_seconds, floor),
                    )
                )
        source = sides.write("changelog", changelog_stream(initial, changes, batches, groups))
        total = initial + (batches - 1) * changes * 8 // 5
        label = (
            f"changelog, {initial:,} rows of state then {batches - 1} batches of "
            f"{changes:,} changes"
        )
        ours, theirs, mine, base = alternate(
            repeats,
            label,
            partial(sides.relstate, source, CHANGELOG, changed, ["k"]),
            lambda: sides.spark_recompute(source, _recomputed),
            lambda m, b: same_table(spark, m, b, ["k", "count", "sum_v", "min_v", "max_v"], True),
            progress,
        )
        comparison = Comparison.of_runs(
            label, total, ours, theirs, "Spark recomputing the aggregate each batch", 1.0
        )
        comparisons.append(comparison)
        work.append(work_of(comparison, mine.history))
        readings.append(("runs, relstate, changelog", runs(ours)))
        readings.append(("runs, recompute, changelog", runs(theirs)))
        readings.append(("groups at the end (relstate = recompute)", f"{base.rows['table']:,}"))
        readings.append(("output rows, relstate, changelog", str(mine.rows)))
    finally:
        spark.stop()
    description = (
        "`GroupAggregate(k; count(*), sum(v), min(v), max(v))` through relstate's runner. "
        "Over an append stream (`changelog=False`: no materialised input) against Spark's "
        "streaming aggregation of the same aggregates in update mode, each batch's updated "
        "groups written to Parquet by `foreachBatch`; rows in 5 batches over a tenth as many "
        "groups. Two relstate rows per size against the same Spark runs: *upsert (no -U)* is "
        "the aggregate built with `update_before=False`, whose output is Spark's update-mode "
        "rows (+I for a new group, +U for a changed one, keyed by the group; checked: as many "
        "rows as Spark's, none a -U), the like-for-like comparison and the one with the goal; "
        "*with -U (default)* emits a -U before each +U, the full changelog a later stage "
        "(a top-N, another aggregate) needs, so it writes about twice Spark's rows (checked: "
        "as many +I and +U as Spark's rows, a -U for each +U). Over a changelog (with "
        "`avg(v)` too, and min/max under retraction from "
        "the materialised input) against what Spark offers for a changelog: a `foreachBatch` "
        "that appends the changes to a log and recomputes the aggregate over the log's live "
        "rows, overwriting the result; the rows column counts changelog rows (an update is "
        f"two). {PARTITIONS} partitions on both sides, Spark `local[2,3]`; one Parquet file "
        "per batch (`maxFilesPerTrigger=1`), each side one streaming query with an "
        "`availableNow` trigger timed from start to end, a warm-up query of each kind first. "
        f"Each side runs {REPEATS} times alternating (once at the largest size) and the "
        "table compares the medians. Each run is checked against its baseline as said above "
        "(append); relstate's output, materialised, is the recomputed table (changelog).\n\n"
        "The operator folds and stores a batch at its close: its update time is "
        "`storeTimeMs`, the fold, the reads of the touched groups and the state writes. "
        "The runner-alone reading runs the same files through relstate's runner with an "
        "operator that keeps and emits nothing: what any operator pays for Spark's "
        "micro-batch, reading the files, the shuffle, Arrow to Python, and opening and "
        "committing the state store. Spark's time over it is the most any operator on "
        "this runner could reach at that size, however fast its own work."
    )
    return SuiteResult(
        suite="aggregate",
        title="Group aggregation: relstate against Spark",
        description=description,
        comparisons=comparisons,
        readings=readings,
        work=work,
    )
