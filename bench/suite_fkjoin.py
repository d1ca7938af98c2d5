"""``relstate bench --suite fkjoin``: the foreign-key join through the Spark
runner against the naive alternative a Spark user has, a batch join of the
full tables recomputed every micro-batch, as the tables grow.

At each size a left table of N rows (K, FK, payload) and a right table of
N/10 rows are loaded in a first micro-batch; then a fixed number of changes per
batch follow (left rows moving to another FK, as ``-U``/``+U`` pairs, and
right rows updated). relstate's cost per change batch should follow the
changes; the baseline's follows the tables. A second sweep holds one table
size and varies the changes per batch (right updates a fifth of the left
moves): there relstate's cost should grow with the changes and the
baseline's stay flat. relstate's output after the last batch, applied as an
upsert changelog, is checked once against the baseline's join (the suite
fails if they differ).

All points run in one Spark session. Before the first counted point, one
whole point at a small table (10,000 rows, two change batches) runs every
side once and is not counted: relstate, the baseline, the Spark-alone
floors and the two stages doing nothing. The JVM's and the Python workers'
warm-up is paid there, so every counted point compares warm sides (without
it, the baseline's early points were slower than the same table size later
in the run). Which side runs first alternates from point to point. Each
side's first run over a point's files is not counted either: relstate's
initial load, and the baseline's join of the initial tables (a first job
over new files takes longer than the next ones). Each comparison is of the
medians over the change batches; every batch's time is listed.

The fixed cost: at the sweep's fewest changes, relstate's time per change
batch (two stages, each a shuffle into Python, a store opened and committed
per task) against one Spark-alone floor on the same files: Spark's
micro-batch with ``foreachBatch``, the batch shuffled by key into
``mapInArrow``, which only counts the rows. The goal is at most 1.5 floors,
so that comparison's baseline is 1.5 times the floor. Both sides, and the
four readings below that bound the fixed cost, run in ``FIXED_ROUNDS``
rounds over the same files, each round in the reverse order of the one
before, each run on a new checkpoint; each reading is of its side's
median over every round's change batches. One run of each, one after the
other, moved between runs of the suite on one machine by more than the
goal's margin. Each round's readings are listed, in floors of that round's
floor, and where a change batch's time goes on
each side, relstate's and the Spark-alone floor's over every round, and
Spark alone in the two stages' shape with a store per task (below): its
time in the ``foreachBatch`` function, and there in its Spark jobs (from the
call that runs each, Spark's planning of the job's plan included) and
before and after them (for relstate: planning its stages, and recording the
batch), and its time outside that function (Spark's own micro-batch: the
offsets, the source's files, the commit). Four readings bound
it from below. The two stages doing nothing: the same two stages through the
runner with operators that keep and emit nothing, the least the join's fixed
cost could be. Spark alone, two stages: Spark with no relstate in the join's
shape, in the cheapest shape Spark runs it, one job per micro-batch over the
same files: a ``foreachBatch`` that reads the batch once, shuffles both sides
by the FK into ``mapInArrow`` tasks that emit one row per left row (a
stand-in for a response) and pass each left row on, and those rows, in the
same job, by K into ``mapInArrow`` tasks that only count: the least any
two-stage design's fixed cost could be on Spark. Spark alone, two stages, a
store per task: the same shape, each task of both stages opening its
partition's state store, loading the previous batch's version and committing
this batch's with nothing written (what every task of an operator whose
state lives in relstate's stores does, since Spark's Python workers keep no
partition from one batch to the next): the least any two-stage design on
relstate's stores could cost. The same, ordered by Spark: that shape again,
Spark ordering each stage's partition before its tasks read it, in the
order the runner's tasks give a changelog's rows (the first stage's by
sequence number, retractions first; the second's by side, then the order
the first stage emitted them in): the least such a design could cost that
leaves the ordering to Spark. (The runner's tasks order their rows
themselves, in Arrow.) The two stages doing nothing and Spark alone,
two stages also run at the table size the sweep holds, with the sizes'
changes per batch, against the baseline there: the most the join's speed-up
could be at that point on this runner, and on Spark with two stages, were
the join's own work free.
"""

from __future__ import annotations

import itertools
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bench.versus import (
    Comparison,
    Discard,
    FloorRun,
    SuiteResult,
    ceiling,
    runs,
    spark_floor,
    spark_two_stage_floor,
)
from operators._fk_join.join import FkJoin, add_stages
from operators._fk_join.stages import ResultStage, SubscriptionStage
from operators._spark.pipeline import Pipeline, prepared, run_fk_join
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run"]

LEFT = pa.schema([("id", pa.int64()), ("fk", pa.int64()), ("payload", pa.string())])
RIGHT = pa.schema([("rid", pa.int64()), ("rval", pa.string())])
BASELINE = "Spark batch join of the full tables"
#: The fixed cost's goal: at most this many Spark-alone floors per batch.
FLOORS = 1.5
#: Rounds of relstate, the Spark-alone floor and the ceilings at the fixed
#: cost's point, each round in the reverse order of the one before.
FIXED_ROUNDS = 3
FLOOR = f"{FLOORS} x Spark alone: foreachBatch, shuffle into mapInArrow"
#: Spark with no relstate in the shape of the join's two stages.
TWO_STAGES = "Spark alone, two stages"
#: The same, each task opening and committing an empty state store.
STORED = "Spark alone, two stages, a store per task"
#: The same again, Spark ordering each stage's input as the runner's tasks do.
ORDERED = "the same, ordered by Spark"


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
    #: The changes sweep: one left table size, several left moves per batch.
    sweep_size: int = 0
    sweep_changes: tuple[int, ...] = ()
    #: The left rows of the warm-up point, run whole before the first
    #: counted one and not counted.
    warmup: int = 10_000

    def warmup_point(self) -> _Plan:
        """The uncounted warm-up point: a small table, at most two change
        batches, the sizes' changes per batch."""
        return replace(self, sizes=(self.warmup,), batches=min(self.batches, 2))

    def points(self) -> list[tuple[bool, _Plan]]:
        """One plan per comparison: each size, then (marked ``True``) each
        changes count of the sweep, right updates a fifth of the left moves."""
        runs = [(False, replace(self, sizes=(n,))) for n in self.sizes]
        for moves in self.sweep_changes:
            point = replace(self, sizes=(self.sweep_size,), left_changes=moves)
            runs.append((True, replace(point, right_changes=max(moves // 5, 1))))
        return runs


@dataclass(frozen=True)
class _Batches:
    """One run's change batches (its first batch, the initial load, left
    out): each one's time from the end of the one before, and of that its
    time in the ``foreachBatch`` function and, there, in its Spark jobs
    (from the call that runs each to its end)."""

    times: list[float]
    inside: list[float]
    jobs: list[float]


@dataclass(frozen=True)
class _Round:
    """One round at the fixed cost's point: each side's change batches."""

    relstate: _Batches
    floor: _Batches
    #: The two stages doing nothing; Spark alone in their shape, and in it
    #: with a store per task.
    alone: list[float]
    two_stages: list[float]
    stored: _Batches
    #: Spark alone with a store per task, each stage's input ordered.
    ordered: _Batches


@dataclass(frozen=True)
class _Times:
    """One run's initial load, and each change batch, on each side."""

    load: float
    relstate: list[float]
    baseline: list[float]
    #: Where measured once (the size the sweep holds): each change batch
    #: through the two stages doing nothing, and through Spark alone in the
    #: two stages' shape.
    once: tuple[list[float], list[float]] | None = None
    #: Where the fixed cost is read: every side's change batches, round by
    #: round, the first round's relstate batches being ``relstate``.
    rounds: list[_Round] | None = None

    @property
    def alone(self) -> list[float] | None:
        """Each change batch through the two stages doing nothing, over
        every round where there are rounds."""
        if self.rounds is not None:
            return [b for r in self.rounds for b in r.alone]
        return None if self.once is None else self.once[0]

    @property
    def two_stages(self) -> list[float] | None:
        """Each change batch through Spark alone in the two stages' shape,
        over every round where there are rounds."""
        if self.rounds is not None:
            return [b for r in self.rounds for b in r.two_stages]
        return None if self.once is None else self.once[1]

    @property
    def stored(self) -> _Batches | None:
        """The same with a store per task, over every round (measured only
        in the rounds)."""
        return None if self.rounds is None else _pooled([r.stored for r in self.rounds])

    @property
    def ordered(self) -> _Batches | None:
        """The same, each stage's input ordered by Spark, over every round
        (measured only in the rounds)."""
        return None if self.rounds is None else _pooled([r.ordered for r in self.rounds])

    @property
    def floor(self) -> list[float] | None:
        """The first round's Spark-alone floor, where it was measured."""
        return None if self.rounds is None else self.rounds[0].floor.times


_FULL = _Plan(
    (10_000, 100_000, 300_000, 1_000_000),
    1_000,
    200,
    5,
    sweep_size=100_000,
    sweep_changes=(100, 1_000, 10_000),
)
_QUICK = _Plan((2_000,), 200, 40, 1, sweep_size=2_000, sweep_changes=(20, 200), warmup=1_000)


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


class _TimingSink(ParquetSink):
    """relstate's Parquet sink (the output stage's tasks write their own
    rows, as the other suites' relstate side does), noting when each batch
    was committed: its end."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.finished: list[float] = []

    def commit(self, batch_id: int) -> None:
        super().commit(batch_id)
        self.finished.append(time.perf_counter())


def _streams(spark: SparkSession, root: Path) -> list[DataFrame]:
    """Each side's changelog files as a stream, one file per batch."""
    from pyspark.sql.pandas.types import from_arrow_schema

    streams = []
    for side, schema in ((0, LEFT), (1, RIGHT)):
        full = pa.schema([*schema, ("seq", pa.int64()), ("row_kind", pa.string())])
        streams.append(
            spark.readStream.schema(from_arrow_schema(full))
            .option("maxFilesPerTrigger", 1)
            .parquet(str(root / f"in{side}"))
        )
    return streams


def _batch_times(started: float, finished: list[float]) -> tuple[float, list[float]]:
    """The first batch's time (the initial load) and each later one's."""
    ends = [started, *finished]
    times = [b - a for a, b in itertools.pairwise(ends)]
    return times[0], times[1:]


def _spark_floor(spark: SparkSession, root: Path, partitions: int) -> _Batches:
    """Each change batch's Spark-alone floor
    (:func:`~bench.versus.spark_floor`) over the same files, both
    sides shuffled by the FK."""
    from pyspark.sql import functions as F

    left, right = _streams(spark, root)
    stream = left.select("fk").unionByName(right.select(F.col("rid").alias("fk")))
    return _changes(spark_floor(stream, "fk", partitions, str(root / "floor-checkpoint")))


def _spark_two_stages(
    spark: SparkSession, root: Path, partitions: int, stores: bool = False, ordered: bool = False
) -> _Batches:
    """Each change batch's time through Spark alone in the shape of the
    join's two stages (:func:`~bench.versus.spark_two_stage_floor`)
    over the same files: both sides by the FK, one response per left row,
    then the left rows and the responses by K. With ``stores``, each task
    opens, loads and commits a state store that holds nothing; with
    ``ordered``, Spark orders each stage's input by the changelogs'
    sequence numbers and row kinds, as the runner's tasks do."""
    from pyspark.sql import functions as F

    left, right = _streams(spark, root)
    kept = ["seq AS __seq", "row_kind"] if ordered else []
    stream = left.selectExpr("id", "fk", *kept).unionByName(
        right.select(
            F.lit(None).cast("long").alias("id"),
            F.col("rid").alias("fk"),
            *[F.expr(k) for k in kept],
        )
    )
    name = "ordered" if ordered else "stored" if stores else "two-stage"
    checkpoint = str(root / f"{name}-checkpoint")
    state = str(root / f"{name}-state") if stores else None
    return _changes(
        spark_two_stage_floor(stream, "fk", "id", partitions, checkpoint, state, ordered)
    )


def _changes(run: FloorRun) -> _Batches:
    """A floor's change batches (its first batch, the initial tables, left out)."""
    return _Batches(run.batches[1:], run.inside[1:], run.jobs[1:])


def _relstate(
    spark: SparkSession, root: Path, join: FkJoin, partitions: int
) -> tuple[float, _Batches]:
    """The initial load's time and the change batches', through the runner
    (their times in the driver and in its jobs from the query's history)."""
    streams = _streams(spark, root)
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
    )
    query.awaitTermination()
    load, times = _batch_times(started, sink.finished)
    changes = query.history[1:]
    inside = [b["duration_ms"] / 1000 for b in changes]
    return load, _Batches(times, inside, [b["jobs_ms"] / 1000 for b in changes])


def _stages_alone(spark: SparkSession, root: Path, join: FkJoin, partitions: int) -> list[float]:
    """Each change batch's time through the runner with the join's two
    stages in place, partitioned and ordered as the join's, but operators
    that keep and emit nothing (:class:`Discard`): what the two stages cost
    before any work, the most the join's fixed cost can come down to."""
    left, right = _streams(spark, root)
    pipeline = Pipeline()
    sides = (
        pipeline.source(prepared(left, join), "left", sequence=join.sequence_column),
        pipeline.source(right, "right", sequence=join.sequence_column),
    )
    nothing = [
        Discard(s.inputs, s.output, f"{s.name}-alone")
        for s in (SubscriptionStage(join), ResultStage(join))
    ]
    output = add_stages(join, pipeline, *sides, *nothing)
    sink = _TimingSink(root / "alone")
    started = time.perf_counter()
    query = pipeline.start(
        output, sink, str(root / "alone-ck"), partitions, trigger={"availableNow": True}
    )
    query.awaitTermination()
    return _batch_times(started, sink.finished)[1]


def _as_it_stands(changes: DataFrame, order: str) -> DataFrame:
    """A table as an upsert changelog keyed by its first column leaves it:
    the newest row per key by ``order``, deletes dropped."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key = changes.columns[0]
    newest = Window.partitionBy(key).orderBy(F.col(order).desc())
    return (
        changes.withColumn("__n", F.row_number().over(newest))
        .where((F.col("__n") == 1) & (F.col("row_kind") != "-D"))
        .drop("__n", order, "row_kind")
    )


def _current(spark: SparkSession, paths: list[str]) -> DataFrame:
    """A table as it stands after the changelog files ``paths``."""
    return _as_it_stands(spark.read.parquet(*paths), "seq")


def _check_output(spark: SparkSession, root: Path) -> None:
    """Raise unless relstate's output, applied batch by batch, equals the
    baseline's join of the tables after the last batch."""
    ours = _as_it_stands(spark.read.parquet(str(root / "out")), "batch")
    theirs = spark.read.parquet(str(root / "baseline")).select(*ours.columns)
    missing, extra = theirs.exceptAll(ours).count(), ours.exceptAll(theirs).count()
    if missing or extra:
        raise RuntimeError(
            f"the FK join's output after the last batch differs from the baseline's join "
            f"({missing} rows missing, {extra} extra, in {root}); the comparison would not "
            "be of the same work"
        )


def _baseline(spark: SparkSession, root: Path, batches: int) -> list[float]:
    """Each change batch's time for the naive alternative: rebuild both
    tables from their changelogs and write their full left join. The join of
    the initial tables runs first, not counted, as relstate's initial load."""
    times = []
    for b in range(batches + 1):
        started = time.perf_counter()
        left, right = (
            _current(spark, sorted(str(p) for p in (root / f"in{s}").glob("*.parquet"))[: b + 1])
            for s in (0, 1)
        )
        joined = left.join(right, left["fk"] == right["rid"], "left")
        joined.write.mode("overwrite").parquet(str(root / "baseline"))
        times.append(time.perf_counter() - started)
    return times[1:]


def _measure(
    spark: SparkSession,
    root: Path,
    join: FkJoin,
    point: _Plan,
    progress: Callable[[str], None],
    floor: bool = False,
    stages: bool = False,
    relstate_first: bool = True,
) -> _Times:
    """Run ``point``'s changelogs through relstate and the baseline, in that
    order or (not ``relstate_first``) the other; then, with ``floor``, the
    Spark-alone floor and the three ceilings, in :data:`FIXED_ROUNDS` rounds
    (:func:`_round`; the first takes relstate's run above); with ``stages``
    alone, the two stages doing nothing and Spark alone in the two stages'
    shape, once. ``progress`` hears which one starts."""
    n = point.sizes[0]
    shutil.rmtree(root, ignore_errors=True)
    lefts, rights = _changelogs(n, point, seed=n)
    write_batches(root / "in0", lefts, prefix="part")
    write_batches(root / "in1", rights, prefix="part")
    if not relstate_first:
        progress(BASELINE)
        theirs = _baseline(spark, root, point.batches)
    progress("relstate")
    load, first_round = _relstate(spark, root, join, point.partitions)
    if relstate_first:
        progress(BASELINE)
        theirs = _baseline(spark, root, point.batches)
    ours = first_round.times
    if not (floor or stages):
        return _Times(load, ours, theirs)
    if not floor:
        progress("the two stages alone")
        nothing = _stages_alone(spark, root, join, point.partitions)
        progress(TWO_STAGES)
        two = _spark_two_stages(spark, root, point.partitions).times
        return _Times(load, ours, theirs, (nothing, two))
    rounds = [
        _round(spark, root, join, point.partitions, progress, 0, first_round),
        *(_round(spark, root, join, point.partitions, progress, r) for r in range(1, FIXED_ROUNDS)),
    ]
    return _Times(load, ours, theirs, rounds=rounds)


def _round(
    spark: SparkSession,
    root: Path,
    join: FkJoin,
    partitions: int,
    progress: Callable[[str], None],
    number: int,
    relstate: _Batches | None = None,
) -> _Round:
    """Round ``number`` at the fixed cost's point: relstate (unless its
    batches are given, the first round's), the Spark-alone floor and the
    three ceilings, each on a new checkpoint. Every other round runs them in
    the reverse order, so no side always runs after the same one."""
    sides: dict[str, Callable[[], Any]] = {
        "relstate": lambda: _relstate(spark, root, join, partitions)[1],
        "Spark alone": lambda: _spark_floor(spark, root, partitions),
        "the two stages alone": lambda: _stages_alone(spark, root, join, partitions),
        TWO_STAGES: lambda: _spark_two_stages(spark, root, partitions).times,
        STORED: lambda: _spark_two_stages(spark, root, partitions, stores=True),
        ORDERED: lambda: _spark_two_stages(spark, root, partitions, stores=True, ordered=True),
    }
    order = list(sides) if number % 2 == 0 else list(reversed(sides))
    got: dict[str, Any] = {}
    if relstate is not None:
        got["relstate"] = relstate
        order.remove("relstate")
    for name in order:
        progress(
            name if number == 0 else f"fixed cost, round {number + 1} of {FIXED_ROUNDS}: {name}"
        )
        for path in _CHECKPOINTS[name]:
            shutil.rmtree(root / path, ignore_errors=True)
        got[name] = sides[name]()
    return _Round(
        got["relstate"],
        got["Spark alone"],
        got["the two stages alone"],
        got[TWO_STAGES],
        got[STORED],
        got[ORDERED],
    )


#: What each side of a round writes under the point's directory.
_CHECKPOINTS = {
    "relstate": ("ck", "out"),
    "Spark alone": ("floor-checkpoint",),
    "the two stages alone": ("alone-ck", "alone"),
    TWO_STAGES: ("two-stage-checkpoint",),
    STORED: ("stored-checkpoint", "stored-state"),
    ORDERED: ("ordered-checkpoint", "ordered-state"),
}


def _scaled(scale: int) -> _Plan:
    """The plan at ``scale`` times the size: the 100,000-row point of the
    full plan, its tables and its changes per batch ``scale`` times larger
    (the initial load of the full plan's every size times ``scale`` would
    take an hour)."""
    return _Plan((100_000 * scale,), _FULL.left_changes * scale, _FULL.right_changes * scale, 5)


def run(quick: bool, workdir: Path, progress: Callable[[str], None], scale: int = 1) -> SuiteResult:
    """Time both at each size and each changes count of the sweep (a point
    in both is run once), after one uncounted warm-up point; one comparison
    per point. The first run's output is checked against the baseline's
    join. Above ``scale`` 1, one point: see :func:`_scaled`."""
    from operators._spark.session import local_spark

    plan = _QUICK if quick else _FULL if scale == 1 else _scaled(scale)
    shuffle = {"spark.sql.shuffle.partitions": str(plan.partitions)}
    spark = local_spark("relstate-bench-fkjoin", shuffle)
    join = FkJoin(LEFT, ["id"], RIGHT, "rid", "fk", how="left")
    times: dict[_Plan, _Times] = {}
    comparisons, readings = [], []
    # One whole point, every side of it, before the first counted one: the
    # JVM's and the Python workers' warm-up is paid here, not by whichever
    # side the first counted points run first.
    warmup = plan.warmup_point()
    what = f"warm-up, not counted: {warmup.sizes[0]:,} rows"
    started = time.perf_counter()
    _measure(spark, workdir / "warmup", join, warmup, partial(_step, progress, what), True, True)
    readings.append(
        (
            f"{what}, {warmup.batches} change batch{'es' * (warmup.batches > 1)}, every side",
            f"{time.perf_counter() - started:.1f} s",
        )
    )
    for sweep, point in plan.points():
        n = point.sizes[0]
        changes = 2 * point.left_changes + point.right_changes
        what = f"{n:,} rows, {changes:,} changes per batch"
        fewest = sweep and point.left_changes == min(plan.sweep_changes)
        # The size the sweep holds, at the sizes' changes: the two stages
        # doing nothing there bound the join's speed-up at that point.
        shared = not sweep and n == plan.sweep_size and point.left_changes == plan.left_changes
        if point not in times:
            root = workdir / f"n{n}-c{point.left_changes}"
            # Which side runs first alternates from point to point.
            first = len(times) % 2 == 0
            times[point] = t = _measure(
                spark, root, join, point, partial(_step, progress, what), fewest, shared, first
            )
            if len(times) == 1:
                _check_output(spark, root)
            readings.append((f"{what}: initial load through relstate", f"{t.load:.2f} s"))
            readings.append((f"{what}: relstate per batch", runs(t.relstate)))
            readings.append((f"{what}: baseline per batch", runs(t.baseline)))
            for label, measured in (
                ("Spark alone", t.floor),
                ("the two stages alone", t.alone),
                (TWO_STAGES, t.two_stages),
                (STORED, None if t.stored is None else t.stored.times),
                (ORDERED, None if t.ordered is None else t.ordered.times),
            ):
                if measured is not None:
                    readings.append((f"{what}: {label} per batch", runs(measured)))
        t = times[point]
        name = (
            f"{n:,} left rows, {changes:,} changes per batch"
            if sweep
            else f"{n:,} left + {n // 10:,} right rows, one change batch"
        )
        goal = 1.0 if n >= 100_000 and not sweep else None
        relstate, baseline = median(t.relstate), median(t.baseline)
        comparisons.append(Comparison(name, changes, relstate, baseline, BASELINE, goal))
        if shared and t.alone is not None and t.two_stages is not None:
            alone, two = median(t.alone), median(t.two_stages)
            readings.append(
                (
                    f"{what}: the two stages doing nothing, against the baseline",
                    ceiling(baseline, alone, "the FK join on this runner"),
                )
            )
            readings.append(
                (
                    f"{what}: {TWO_STAGES}, against the baseline",
                    ceiling(baseline, two, "any two-stage design"),
                )
            )
        # Every round's change batches, each side's (_Times pools them).
        stores, ordered, nothing, spark_two = t.stored, t.ordered, t.alone, t.two_stages
        if fewest and t.rounds and stores and ordered and nothing and spark_two:
            ours = _pooled([r.relstate for r in t.rounds])
            floors = _pooled([r.floor for r in t.rounds])
            floor = median(floors.times)
            alone, two = median(nothing), median(spark_two)
            for i, r in enumerate(t.rounds):
                one = median(r.floor.times)
                readings.append(
                    (
                        f"{what}: fixed cost, round {i + 1}: relstate, Spark alone per batch",
                        f"{runs(r.relstate.times)}; {runs(r.floor.times)}: "
                        f"{median(r.relstate.times) / one:.2f} floors; in the same round, the "
                        f"two stages doing nothing {median(r.alone) / one:.2f}, {TWO_STAGES} "
                        f"{median(r.two_stages) / one:.2f}, {STORED} "
                        f"{median(r.stored.times) / one:.2f}, {ORDERED} "
                        f"{median(r.ordered.times) / one:.2f}",
                    )
                )
            for label, batches in (
                ("relstate", ours),
                ("Spark alone", floors),
                (STORED, stores),
                (f"{STORED}, ordered by Spark", ordered),
            ):
                readings.append(
                    (f"{what}: where a change batch's time goes, {label}", _spent(batches))
                )
            readings.append(
                (
                    f"{what}: fixed cost, in Spark-alone floors (each side's median "
                    f"over {len(t.rounds)} rounds)",
                    f"the join {median(ours.times) / floor:.2f}; the two stages doing nothing "
                    f"{alone / floor:.2f} (the least the join's could be); {TWO_STAGES} "
                    f"{two / floor:.2f} (the least any two-stage design's could be); "
                    f"{STORED} {median(stores.times) / floor:.2f} (the least any two-stage design "
                    f"that keeps its state in relstate's stores could be); {ORDERED} "
                    f"{median(ordered.times) / floor:.2f} (the least such a design could be "
                    f"that has Spark order a changelog's rows); goal {FLOORS}",
                )
            )
            comparisons.append(
                Comparison(
                    f"fixed cost: {n:,} left rows, {changes:,} changes per batch",
                    changes,
                    median(ours.times),
                    FLOORS * floor,
                    FLOOR,
                    goal=1.0,
                )
            )
    spark.stop()
    return SuiteResult(
        suite="fkjoin",
        title="Foreign-key join: relstate vs recomputing the join",
        description=__doc__ or "",
        comparisons=comparisons,
        readings=readings,
    )


def _pooled(runs: list[_Batches]) -> _Batches:
    """Several runs' change batches as one run's."""
    return _Batches(
        [b for r in runs for b in r.times],
        [b for r in runs for b in r.inside],
        [b for r in runs for b in r.jobs],
    )


def _spent(batches: _Batches) -> str:
    """Where a change batch's time goes, medians over ``batches`` (each part
    its own median, so the parts need not add up to the whole)."""
    whole, inside, jobs = (median(x) * 1000 for x in (batches.times, batches.inside, batches.jobs))
    rest = median(i - j for i, j in zip(batches.inside, batches.jobs, strict=True)) * 1000
    outside = median(t - i for t, i in zip(batches.times, batches.inside, strict=True)) * 1000
    return (
        f"{whole:.0f} ms a batch: {inside:.0f} in foreachBatch ({jobs:.0f} in its Spark jobs, "
        f"their planning by Spark included; {rest:.0f} before and after them), "
        f"{outside:.0f} outside it (Spark's micro-batch)"
    )


def _step(progress: Callable[[str], None], what: str, step: str) -> None:
    progress(f"{what}: {step}")
