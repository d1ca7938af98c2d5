"""``relstate bench --suite fkjoin``: the foreign-key join through the Spark
runner against the naive alternative a Spark user has, a batch join of the
full tables recomputed every micro-batch, as the tables grow.

At each size a left table of N rows (K, FK, payload) and a right table of
N/10 rows are loaded in a first micro-batch; then a fixed number of changes per
batch follow (left rows moving to another FK, as ``-U``/``+U`` pairs, and
right rows updated). relstate's cost per change batch should follow the
changes; the baseline's follows the tables.
"""

from __future__ import annotations

import itertools
import logging
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from operators._bench.versus import Comparison, SuiteResult
from operators._fk_join import FkJoin, run_fk_join
from operators.demo import write_batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run"]

LEFT = pa.schema([("id", pa.int64()), ("fk", pa.int64()), ("payload", pa.string())])
RIGHT = pa.schema([("rid", pa.int64()), ("rval", pa.string())])
BASELINE = "Spark batch join of the full tables"


@dataclass(frozen=True)
class _Plan:
    sizes: tuple[int, ...]
    #: Left rows moved to another FK per batch (two changelog rows each), and
    #: right rows updated per batch.
    left_changes: int
    right_changes: int
    batches: int
    #: Partitions of each stage, and Spark's shuffle partitions: one per core
    #: of the benchmark machine (more only queue their tasks).
    partitions: int = 2


_FULL = _Plan((10_000, 100_000, 300_000, 1_000_000), 1_000, 200, 3)
_QUICK = _Plan((2_000,), 200, 50, 1)


def _changelogs(n: int, plan: _Plan, seed: int) -> tuple[list[pa.Table], list[pa.Table]]:
    """The initial tables, then ``plan.batches`` batches of changes, as
    changelogs (columns, ``seq``, ``row_kind``) for each side."""
    rng = random.Random(seed)
    fks = max(n // 10, 1)
    seq = iter(range(1, 10**12))
    left = {k: (k, k % fks, f"p{k}") for k in range(n)}
    right = {f: (f, f"r{f}.0") for f in range(fks)}
    lefts = [_table(LEFT, [(*r, next(seq), "+I") for r in left.values()])]
    rights = [_table(RIGHT, [(*r, next(seq), "+I") for r in right.values()])]
    for b in range(1, plan.batches + 1):
        rows: list[tuple[Any, ...]] = []
        for k in rng.sample(range(n), plan.left_changes):
            old, new = left[k], (k, rng.randrange(fks), f"p{k}.{b}")
            rows += [(*old, next(seq), "-U"), (*new, next(seq), "+U")]
            left[k] = new
        lefts.append(_table(LEFT, rows))
        changed = [(f, f"r{f}.{b}") for f in rng.sample(range(fks), min(plan.right_changes, fks))]
        rights.append(_table(RIGHT, [(*r, next(seq), "+U") for r in changed]))
    return lefts, rights


def _table(schema: pa.Schema, rows: list[tuple[Any, ...]]) -> pa.Table:
    full = pa.schema([*schema, ("seq", pa.int64()), ("row_kind", pa.string())])
    return pa.Table.from_pylist([dict(zip(full.names, r, strict=True)) for r in rows], full)


class _TimingSink:
    """Writes each batch's output to Parquet and notes when it finished."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.finished: list[float] = []

    def __call__(self, output: DataFrame, batch_id: int) -> None:
        output.write.mode("overwrite").parquet(str(self.path / f"batch={batch_id}"))
        self.finished.append(time.perf_counter())


def _relstate(
    spark: SparkSession, root: Path, join: FkJoin, partitions: int
) -> tuple[float, list[float]]:
    """The initial load's time and each change batch's, through the runner."""
    from pyspark.sql.pandas.types import from_arrow_schema

    streams = []
    for side, schema in ((0, LEFT), (1, RIGHT)):
        full = pa.schema([*schema, ("seq", pa.int64()), ("row_kind", pa.string())])
        streams.append(
            spark.readStream.schema(from_arrow_schema(full))
            .option("maxFilesPerTrigger", 1)
            .parquet(str(root / f"in{side}"))
        )
    sink = _TimingSink(root / "out")
    started = time.perf_counter()
    query = run_fk_join(
        streams[0],
        streams[1],
        join,
        partitions=partitions,
        checkpoint=str(root / "ck"),
        sink=sink,
        trigger={"availableNow": True},
        log_level=logging.WARNING,
    )
    query.awaitTermination()
    ends = [started, *sink.finished]
    times = [b - a for a, b in itertools.pairwise(ends)]
    return times[0], times[1:]


def _current(spark: SparkSession, paths: list[str]) -> DataFrame:
    """A table as it stands after the changelog files ``paths``: the newest
    row per key, deletes dropped."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    changes = spark.read.parquet(*paths)
    key = changes.columns[0]
    newest = Window.partitionBy(key).orderBy(F.col("seq").desc())
    return (
        changes.withColumn("__n", F.row_number().over(newest))
        .where((F.col("__n") == 1) & (F.col("row_kind") != "-D"))
        .drop("__n", "seq", "row_kind")
    )


def _baseline(spark: SparkSession, root: Path, batches: int) -> list[float]:
    """Each change batch's time for the naive alternative: rebuild both
    tables from their changelogs and write their full left join."""
    times = []
    for b in range(1, batches + 1):
        started = time.perf_counter()
        left, right = (
            _current(spark, sorted(str(p) for p in (root / f"in{s}").glob("*.parquet"))[: b + 1])
            for s in (0, 1)
        )
        joined = left.join(right, left["fk"] == right["rid"], "left")
        joined.write.mode("overwrite").parquet(str(root / "baseline"))
        times.append(time.perf_counter() - started)
    return times


def run(quick: bool, workdir: Path, progress: Callable[[str], None]) -> SuiteResult:
    """Time both at each size; one comparison per size."""
    from operators._spark import local_spark

    plan = _QUICK if quick else _FULL
    shuffle = {"spark.sql.shuffle.partitions": str(plan.partitions)}
    spark = local_spark("relstate-bench-fkjoin", shuffle)
    join = FkJoin(LEFT, ["id"], RIGHT, "rid", "fk", how="left")
    changes = 2 * plan.left_changes + plan.right_changes
    comparisons, readings = [], []
    for n in plan.sizes:
        root = workdir / f"n{n}"
        shutil.rmtree(root, ignore_errors=True)
        lefts, rights = _changelogs(n, plan, seed=n)
        write_batches(root / "in0", lefts, prefix="part")
        write_batches(root / "in1", rights, prefix="part")
        progress(f"{n:,} left rows: relstate")
        load, ours = _relstate(spark, root, join, plan.partitions)
        progress(f"{n:,} left rows: {BASELINE}")
        theirs = _baseline(spark, root, plan.batches)
        comparisons.append(
            Comparison(
                f"{n:,} left + {n // 10:,} right rows, one change batch",
                changes,
                sum(ours) / len(ours),
                sum(theirs) / len(theirs),
                BASELINE,
                goal=1.0 if n >= 100_000 else None,
            )
        )
        readings.append((f"{n:,} rows: initial load through relstate", f"{load:.2f} s"))
        readings.append((f"{n:,} rows: relstate per batch", _seconds(ours)))
        readings.append((f"{n:,} rows: baseline per batch", _seconds(theirs)))
    spark.stop()
    return SuiteResult(
        suite="fkjoin",
        title="Foreign-key join: relstate vs recomputing the join",
        description=__doc__ or "",
        comparisons=comparisons,
        readings=readings,
    )


def _seconds(times: list[float]) -> str:
    return ", ".join(f"{t:.2f} s" for t in times)
