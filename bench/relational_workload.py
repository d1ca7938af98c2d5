"""Data and timed queries of the ``aggregate`` and ``topn`` suites.

The data: an append stream of ``(k, v, id)`` rows, or a changelog of such
rows (a first batch of inserts, then batches of inserts, updates of ``v``
as ``-U``/``+U`` pairs and deletes). Each side of a comparison is one
streaming query over the same Parquet files read one per batch
(``maxFilesPerTrigger=1``), timed from start to end (``availableNow``),
writing its output to Parquet.

The baselines: Spark's native streaming aggregation in update mode (append
input only: Spark's aggregation takes no retractions), and, for a changelog,
what a Spark user has instead: a ``foreachBatch`` that appends the batch to a
log of every change and recomputes the result over the live rows of the log
(an aggregate, or a window function) into a table it overwrites.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from operators._api.changelog import ROW_KIND
from operators._spark.runner import run_operator
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches

__all__ = [
    "APPEND",
    "CHANGELOG",
    "Sides",
    "Timed",
    "alternate",
    "append_stream",
    "changelog_stream",
    "live_rows",
    "same_table",
]

APPEND = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("id", pa.int64())])
CHANGELOG = pa.schema([*APPEND, (ROW_KIND, pa.string())])
#: Partitions on both sides: one per core of the benchmark machine.
PARTITIONS = 2


def append_stream(rows: int, keys: int, batches: int, seed: int = 0) -> list[pa.Table]:
    """``rows`` inserts over ``keys`` keys in ``batches`` equal batches."""
    rng = np.random.default_rng(seed)
    per = rows // batches
    out = []
    for b in range(batches):
        out.append(
            pa.table(
                {
                    "k": pa.array(rng.integers(0, keys, per), pa.int64()),
                    "v": pa.array(rng.integers(0, 1_000_000, per), pa.int64()),
                    "id": pa.array(np.arange(b * per, (b + 1) * per), pa.int64()),
                }
            )
        )
    return out


def changelog_stream(
    initial: int, changes: int, batches: int, keys: int, seed: int = 0
) -> list[pa.Table]:
    """A first batch of ``initial`` inserts, then ``batches - 1`` batches of
    ``changes`` changes each: a fifth inserts, a fifth deletes, the rest
    updates of ``v`` (two rows each), on distinct live rows per batch."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, keys, initial)
    v = rng.integers(0, 1_000_000, initial)
    live_k, live_v = dict(enumerate(k.tolist())), dict(enumerate(v.tolist()))
    out = [_table(k, v, np.arange(initial), ["+I"] * initial)]
    next_id = initial
    for _ in range(batches - 1):
        inserts = deletes = changes // 5
        updates = changes - inserts - deletes
        ids = np.array(list(live_k), np.int64)
        chosen = rng.choice(ids, deletes + updates, replace=False).tolist()
        rk: list[int] = []
        rv: list[int] = []
        rid: list[int] = []
        kinds: list[str] = []
        for i in chosen[:deletes]:
            rk.append(live_k.pop(i))
            rv.append(live_v.pop(i))
            rid.append(i)
            kinds.append("-D")
        for i, new in zip(
            chosen[deletes:], rng.integers(0, 1_000_000, updates).tolist(), strict=True
        ):
            rk += [live_k[i], live_k[i]]
            rv += [live_v[i], new]
            rid += [i, i]
            kinds += ["-U", "+U"]
            live_v[i] = new
        for key, new in zip(
            rng.integers(0, keys, inserts).tolist(),
            rng.integers(0, 1_000_000, inserts).tolist(),
            strict=True,
        ):
            live_k[next_id], live_v[next_id] = key, new
            rk.append(key)
            rv.append(new)
            rid.append(next_id)
            kinds.append("+I")
            next_id += 1
        out.append(_table(np.array(rk), np.array(rv), np.array(rid), kinds))
    return out


def _table(k: Any, v: Any, ids: Any, kinds: list[str]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array(k, pa.int64()),
            pa.array(v, pa.int64()),
            pa.array(ids, pa.int64()),
            pa.array(kinds, pa.string()),
        ],
        schema=CHANGELOG,
    )


@dataclass
class Timed:
    """One timed query: seconds from start to end, and its output rows by
    row kind (for a recomputing baseline, ``"table"``: the final table's rows)."""

    seconds: float
    rows: dict[str, int]
    #: Where the query wrote its output.
    path: str = ""
    #: relstate's batches (their metrics), for where its time went.
    history: list[dict[str, Any]] = field(default_factory=list)


class Sides:
    """Starts each side's query on a source directory, in one session."""

    def __init__(self, spark: Any, workdir: Path) -> None:
        self.spark = spark
        self.workdir = workdir
        self.runs = 0

    def write(self, name: str, batches: list[pa.Table]) -> Path:
        """Write a source (one Parquet file per batch); its directory."""
        path = self.workdir / name
        write_batches(path, batches, prefix="rows")
        return path

    def _work(self, label: str) -> Path:
        self.runs += 1
        return self.workdir / f"{self.runs:02d}-{label}"

    def _stream(self, source: Path, schema: pa.Schema) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return (
            self.spark.readStream.schema(from_arrow_schema(schema))
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
        )

    def relstate(self, source: Path, schema: pa.Schema, operator: Any, keys: list[str]) -> Timed:
        """``operator`` through relstate's runner, the source read with
        ``schema`` (:data:`CHANGELOG` for a changelog: without its row-kind
        column every row would be an insert); its output rows by kind (none
        counted for an operator that emits nothing, such as ``Discard``)."""
        work = self._work("relstate")
        began = time.perf_counter()
        query = run_operator(
            self._stream(source, schema),
            operator,
            keys=keys,
            partitions=PARTITIONS,
            checkpoint=str(work / "checkpoint"),
            sink=ParquetSink(str(work / "output")),
            trigger={"availableNow": True},
        )
        query.awaitTermination()
        seconds = time.perf_counter() - began
        history: list[dict[str, Any]] = [dict(h) for h in query.history]
        if not any(int(h["metrics"].get("numOutputRows", 0)) for h in history):
            return Timed(seconds, {}, "", history)
        counts = self.spark.read.parquet(str(work / "output")).groupBy(ROW_KIND).count()
        rows = {r[0]: int(r[1]) for r in counts.collect()}
        return Timed(seconds, rows, str(work / "output"), history)

    def spark_update_mode(self, source: Path, aggregate: Callable[[Any], Any]) -> Timed:
        """Spark's streaming aggregation in update mode, each batch's updated
        rows written to Parquet (``foreachBatch``, as update mode has no file sink)."""
        work = self._work("spark")
        out = str(work / "output")

        def write(frame: Any, batch_id: int) -> None:
            frame.write.mode("append").parquet(out)

        began = time.perf_counter()
        query = (
            aggregate(self._stream(source, APPEND))
            .writeStream.outputMode("update")
            .foreachBatch(write)
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = time.perf_counter() - began
        return Timed(seconds, {"update": int(self.spark.read.parquet(out).count())})

    def spark_recompute(self, source: Path, compute: Callable[[Any], Any]) -> Timed:
        """Per batch: append the changes to a log, recompute ``compute`` over
        the log's live rows (net count above zero) and overwrite the result."""
        from pyspark.sql import functions as F

        work = self._work("recompute")
        log, out = str(work / "log"), str(work / "output")
        spark = self.spark

        def recompute(frame: Any, batch_id: int) -> None:
            frame.write.mode("append").parquet(log)
            sign = F.when(F.col(ROW_KIND).isin("+I", "+U"), 1).otherwise(-1)
            live = (
                spark.read.parquet(log)
                .groupBy("k", "v", "id")
                .agg(F.sum(sign).alias("n"))
                .filter("n > 0")
            )
            compute(live).write.mode("overwrite").parquet(out)

        began = time.perf_counter()
        query = (
            self._stream(source, CHANGELOG)
            .writeStream.foreachBatch(recompute)
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = time.perf_counter() - began
        return Timed(seconds, {"table": int(self.spark.read.parquet(out).count())}, out)


def same_table(spark: Any, mine: Timed, base: Timed, columns: list[str], upsert: bool) -> bool:
    """Whether relstate's output, materialised, is the baseline's last table
    (on ``columns``): an upsert changelog keyed by ``k`` (its latest row per
    key, unless that is a ``-D``), or a changelog of rows (``+I`` adds one
    copy, ``-D`` takes one away)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    out = spark.read.parquet(mine.path)
    if upsert:
        latest = Window.partitionBy("k").orderBy(F.col("batch").desc(), F.col(ROW_KIND).desc())
        table = (
            out.filter(F.col(ROW_KIND) != "-U")
            .withColumn("rn", F.row_number().over(latest))
            .filter((F.col("rn") == 1) & (F.col(ROW_KIND) != "-D"))
            .select(*columns)
        )
    else:
        sign = F.when(F.col(ROW_KIND) == "+I", 1).otherwise(-1)
        counted = out.groupBy(*columns).agg(F.sum(sign).alias("n")).filter("n > 0")
        table = counted.select(*columns, F.explode(F.sequence(F.lit(1), F.col("n")))).drop("col")
    theirs = spark.read.parquet(base.path).select(*columns)
    return bool(table.exceptAll(theirs).isEmpty() and theirs.exceptAll(table).isEmpty())


def live_rows(timed: Timed) -> int:
    """The rows an upsert or top-N changelog leaves: inserts less deletes."""
    return timed.rows.get("+I", 0) - timed.rows.get("-D", 0)


def alternate(
    repeats: int,
    label: str,
    ours: Callable[[], Timed],
    theirs: Callable[[], Timed],
    same: Callable[[Timed, Timed], bool],
    progress: Callable[[str], None],
) -> tuple[list[float], list[float], Timed, Timed]:
    """Run both sides ``repeats`` times, alternating; check each pair did the same work."""
    ours_runs, theirs_runs = [], []
    for i in range(repeats):
        progress(f"{label}: baseline, run {i + 1} of {repeats}")
        base = theirs()
        progress(f"{label}: relstate, run {i + 1} of {repeats}")
        mine = ours()
        if not same(mine, base):
            raise RuntimeError(
                f"{label}: relstate's output {mine.rows} does not match the baseline's "
                f"{base.rows}; the comparison would not be of the same work"
            )
        ours_runs.append(mine.seconds)
        theirs_runs.append(base.seconds)
    return ours_runs, theirs_runs, mine, base
