"""Operator benchmark suites: relstate against a baseline, end to end.

A suite (``relstate bench --suite NAME``) runs one operator's workloads through
relstate and through a baseline (Spark's own operator, or the naive alternative
a Spark user has) on the same data in the same run, and reports each as a
:class:`Comparison`: the baseline's time over relstate's, so a ratio above 1 is
a speed-up. Absolute figures that have no baseline are readings.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import numpy as np
import pyarrow as pa

from bench.measure import ratio_text
from bench.runner import Machine
from encoding import TableSchema
from operators._api.changelog import ROW_KIND, RowKind
from operators._api.operator import Operator, OperatorContext
from operators._engine.row_order import SEQ, SIDE, RowOrder
from operators._spark.session import without_adaptive_execution
from statestore import StateStore, StoreConfig

__all__ = [
    "Comparison",
    "Discard",
    "FloorRun",
    "SuiteResult",
    "Work",
    "ceiling",
    "markdown",
    "page_name",
    "runs",
    "spark_floor",
    "spark_two_stage_floor",
    "terminal",
    "work_of",
]


def spark_order(order: RowOrder) -> list[str]:
    """``order`` as Spark SQL sort expressions over a stage's input frame,
    for the ceiling to have Spark sort by (``sortWithinPartitions``): by
    side, by sequence number, retractions first, nulls first as Spark sorts."""
    keys = [SIDE] if order.sides else []
    keys.append(SEQ)
    if order.kinds:
        retractions = ", ".join(f"'{k}'" for k in RowKind if k.is_retract)
        keys.append(f"CASE WHEN {ROW_KIND} IN ({retractions}) THEN 0 ELSE 1 END")
    return keys


@dataclass(frozen=True)
class Comparison:
    """The same work done by relstate and by a baseline, timed in one run."""

    name: str
    #: Input rows the work processed (each side counted).
    rows: int
    relstate_seconds: float
    baseline_seconds: float
    #: What the baseline is, e.g. "Spark stream-stream join".
    baseline: str
    #: The least speed-up that meets the goal (``None``: no goal).
    goal: float | None = None
    #: The baseline was stopped at a time limit: its time, and so the
    #: speed-up, is a lower bound.
    stopped: bool = False

    @classmethod
    def of_runs(
        cls,
        name: str,
        rows: int,
        relstate_runs: Sequence[float],
        baseline_runs: Sequence[float],
        baseline: str,
        goal: float | None = None,
        stopped: bool = False,
    ) -> Comparison:
        """The comparison of the medians of several runs of each side
        (``stopped``: a baseline run was stopped at a time limit)."""
        return cls(
            name, rows, median(relstate_runs), median(baseline_runs), baseline, goal, stopped
        )

    def __post_init__(self) -> None:
        if self.relstate_seconds <= 0 or self.baseline_seconds <= 0:
            raise ValueError(
                f"comparison {self.name!r}: times must be positive, got "
                f"{self.relstate_seconds} and {self.baseline_seconds}"
            )

    @property
    def ratio(self) -> float:
        """The baseline's time over relstate's: relstate's speed-up."""
        return self.baseline_seconds / self.relstate_seconds

    @property
    def goal_met(self) -> bool | None:
        """Whether the speed-up reaches the goal (``None`` without one, or
        when a stopped baseline's lower bound falls short of it: not known)."""
        if self.goal is None:
            return None
        if self.ratio >= self.goal:
            return True
        return None if self.stopped else False


@dataclass(frozen=True)
class Work:
    """Where relstate's time went in one comparison, against the baseline:
    microseconds per input row of relstate's own work (task time summed
    over partitions, from the batches' metrics), and of each side's wall
    time."""

    name: str
    rows: int
    #: The operator's work on its input (the runner's ``allUpdatesTimeMs``,
    #: plus rows an operator stores at the batch's close).
    update_us: float
    #: Eviction and timers (``allRemovalsTimeMs``, or the join's own
    #: ``evictionTimeMs``).
    eviction_us: float
    #: The state store's commit (``commitTimeMs``).
    commit_us: float
    relstate_us: float
    baseline_us: float
    baseline: str


def work_of(comparison: Comparison, history: Sequence[Mapping[str, Any]]) -> Work:
    """The :class:`Work` of ``comparison`` from a relstate run's batch
    ``history`` (one run: its batches' metrics, summed over partitions)."""

    def total(*names: str) -> float:
        return float(sum(int(h["metrics"].get(n, 0)) for h in history for n in names))

    per_row = 1000.0 / comparison.rows  # ms summed -> µs per row
    return Work(
        comparison.name,
        comparison.rows,
        total("allUpdatesTimeMs", "storeTimeMs") * per_row,
        total("allRemovalsTimeMs", "evictionTimeMs") * per_row,
        total("commitTimeMs") * per_row,
        comparison.relstate_seconds * 1e6 / comparison.rows,
        comparison.baseline_seconds * 1e6 / comparison.rows,
        comparison.baseline,
    )


@dataclass(frozen=True)
class SuiteResult:
    """Everything one suite measured."""

    suite: str
    title: str
    #: What was run, on what data, and how it was timed (markdown).
    description: str
    comparisons: Sequence[Comparison]
    #: Absolute figures: (what, value as text).
    readings: Sequence[tuple[str, str]] = ()
    #: Per comparison where it has one, relstate's own work per row.
    work: Sequence[Work] = ()
    #: How many times the suite's default size the run was (``--scale``).
    scale: int = 1
    #: The other options the run was given, as on the command line
    #: (``--only aggregate,topn``, say), for the page's header.
    options: str = ""
    machine: Machine = field(default_factory=Machine.current)
    finished: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))


class Discard(Operator):
    """Takes its inputs, keeps no state, emits nothing: run through the runner
    on a suite's data, it times what the runner costs around any operator
    (reading the files, the shuffle, Arrow to Python, opening and committing
    the store, Spark's micro-batch)."""

    def __init__(
        self, inputs: Sequence[pa.Schema], output: pa.Schema, name: str = "discard"
    ) -> None:
        self.inputs = list(inputs)
        self.output = output
        self.name = name

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Nothing: the rows only pass through the runner."""


@dataclass(frozen=True)
class FloorRun:
    """One run of :func:`spark_floor` or :func:`spark_two_stage_floor`."""

    #: From the query's start to its end.
    seconds: float
    #: Each batch's time: the first from the query's start, each later one
    #: from the end of the one before.
    batches: list[float]
    #: The rows the tasks counted, over all batches.
    rows: int
    #: Each batch's time in the ``foreachBatch`` function, and of that in
    #: its job: from the call that runs it (``collect``, Spark's planning of
    #: the job's plan included) to its end.
    inside: list[float]
    jobs: list[float]


def _count_rows(batches: Any) -> Any:
    """A ``mapInArrow`` function that only counts its task's rows."""
    yield pa.record_batch([pa.array([sum(b.num_rows for b in batches)])], names=["rows"])


def spark_floor(stream: Any, key: str, partitions: int, checkpoint: str) -> FloorRun:
    """What any operator run by Spark's ``foreachBatch`` pays before it does
    anything: Spark's micro-batch over ``stream`` (an ``availableNow``
    trigger), each batch shuffled by ``key`` into ``partitions`` tasks and
    handed to Python by ``mapInArrow``, which only counts the rows (adaptive
    execution off, as in relstate's runner)."""

    def each(batch: Any, batch_id: int) -> Any:
        return batch.repartition(partitions, key).mapInArrow(_count_rows, "rows long")

    return _floor_run(stream, checkpoint, each)


def spark_two_stage_floor(
    stream: Any,
    foreign_key: str,
    key: str,
    partitions: int,
    checkpoint: str,
    stores: str | None = None,
    ordered: bool = False,
) -> FloorRun:
    """What any two-stage operator of the foreign-key join's shape pays on
    Spark alone before it does anything, as :func:`spark_floor` for one
    stage, in the cheapest shape Spark runs it: one job, reading each batch
    of ``stream`` once. The first stage shuffles it by ``foreign_key`` into
    ``mapInArrow`` tasks that emit each row's ``key`` (a stand-in for a
    response; rows without one, the right side's, are only read) and pass
    each such row on (its ``key`` again); those rows go straight, in the
    same job, into the second stage's shuffle by ``key`` into ``mapInArrow``
    tasks that only count, whose counts are collected. (Two jobs, the first
    stage's rows persisted and collected in between, cost about 0.1 s a
    batch more at the FK suite's 100k point; the first stage's rows unioned
    with the batch's rows read a second time, about 0.05 to 0.09 s more;
    both measured.) ``rows``: what the second stage's tasks counted.

    With ``stores`` (a state location), each task of both stages also does
    what every task of an operator that keeps its state in relstate must,
    as Spark's Python workers keep no partition from one batch to the next:
    it opens its partition's :class:`~statestore.StateStore` (one per stage,
    under ``stores``), loads the previous batch's version, and commits this
    batch's, with no rows written.

    With ``ordered`` (``stream`` has a sequence number, ``__seq``, and a
    ``row_kind``), Spark orders each stage's partition before its tasks
    read it, in the order the runner's tasks give their rows
    (:class:`~operators._engine.row_order.RowOrder`): the first stage's by sequence
    number, retractions before accumulations at one number; the second's by
    side (the rows passed on, then the responses) and the order the first
    stage's tasks emitted them in."""

    def each(batch: Any, batch_id: int) -> Any:
        from pyspark.sql import functions as F

        key_type = batch.schema[key].dataType

        def respond(batches: Any) -> Any:
            emitted = 0
            for b in batches:
                keys = b.column(key).drop_null()
                # A response for each row with a key, and the row passed on.
                columns = [pa.concat_arrays([keys, keys])]
                if ordered:  # responses are side 1, the rows passed on side 0
                    n = len(keys)
                    columns.append(pa.array(np.repeat(np.array([1, 0], np.int32), n)))
                    columns.append(pa.array(np.arange(emitted, emitted + 2 * n, dtype=np.int64)))
                    emitted += 2 * n
                yield pa.record_batch(columns, [key, SIDE, SEQ][: len(columns)])

        first: Callable[[Any], Any] = respond
        second: Callable[[Any], Any] = _count_rows
        if stores is not None:
            first = _in_a_store(respond, stores, "first", batch_id, partitions)
            second = _in_a_store(_count_rows, stores, "second", batch_id, partitions)
        responses = f"`{key}` {key_type.simpleString()}"
        rows = batch.repartition(partitions, foreign_key)
        if ordered:
            order = [F.expr(e) for e in spark_order(RowOrder(sides=False, kinds=True))]
            rows = rows.sortWithinPartitions(*order).drop(SEQ)
            responses += f", {SIDE} int, {SEQ} long"
        rows = rows.mapInArrow(first, responses).repartition(partitions, key)
        if ordered:
            order = [F.expr(e) for e in spark_order(RowOrder(sides=True, kinds=False))]
            rows = rows.sortWithinPartitions(*order).drop(SIDE, SEQ)
        return rows.mapInArrow(second, "rows long")

    return _floor_run(stream, checkpoint, each)


#: The one table of the stores a floor's tasks open and commit: it never
#: holds a row.
_NO_STATE = TableSchema(1, pa.schema([("k", pa.int64())]), ["k"], name="nothing")


def _in_a_store(
    work: Callable[[Any], Any], location: str, stage: str, batch_id: int, partitions: int
) -> Callable[[Any], Any]:
    """``work`` (a ``mapInArrow`` function) run in a task that opens its
    partition's store of ``stage``, loads the version of the batch before
    ``batch_id`` (none before the first; by version, so it lists the
    version's one commit where the runner's tasks name theirs) and, after
    ``work``, commits ``batch_id``'s."""

    def task(batches: Any) -> Any:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        config = StoreConfig(partition_count=partitions)
        store = StateStore(location, stage, context.partitionId(), [_NO_STATE], config)
        try:
            store.load(batch_id - 1 if batch_id else None)
            yield from work(batches)
            store.commit(batch_id)
        finally:
            store.close()

    return task


def _floor_run(stream: Any, checkpoint: str, each: Callable[[Any, int], Any]) -> FloorRun:
    """Run every batch of ``stream`` through ``foreachBatch`` (an
    ``availableNow`` trigger; adaptive execution off, as in relstate's
    runner), timing each batch: ``each`` plans, from the batch and its id,
    the job whose rows (one column) are the counts its tasks made, which is
    then run."""
    counted: list[int] = []
    finished: list[float] = []
    inside: list[float] = []
    jobs: list[float] = []

    def batch_done(batch: Any, batch_id: int) -> None:
        called = time.perf_counter()
        with without_adaptive_execution(batch.sparkSession):
            job = each(batch, batch_id)
            job_started = time.perf_counter()
            counted.append(int(sum(r[0] for r in job.collect())))
        finished.append(time.perf_counter())
        jobs.append(finished[-1] - job_started)
        inside.append(finished[-1] - called)

    started = time.perf_counter()
    query = (
        stream.writeStream.foreachBatch(batch_done)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    ends = [started, *finished]
    return FloorRun(
        seconds, [b - a for a, b in itertools.pairwise(ends)], sum(counted), inside, jobs
    )


def runs(seconds: Sequence[float]) -> str:
    """Several runs' times as a reading: each, in order."""
    return ", ".join(f"{s:.2f} s" for s in seconds)


def ceiling(baseline_seconds: float, floor_seconds: float, bound: str = "any operator") -> str:
    """A reading: the most that ``bound`` could reach against the baseline,
    since the part of the work it cannot avoid already takes
    ``floor_seconds`` (for any operator, the runner alone: :class:`Discard`)."""
    return (
        f"{floor_seconds:.2f} s; the baseline's {baseline_seconds:.2f} s over it: at most "
        f"{baseline_seconds / floor_seconds:.2f}x for {bound}"
    )


def _rate(rows: int, seconds: float) -> str:
    rate = rows / seconds
    return f"{rate / 1e6:.2f} M rows/s" if rate >= 1e6 else f"{rate / 1e3:.1f} k rows/s"


def _cells(c: Comparison) -> list[str]:
    # One decimal unless the goal has two (0.25).
    goal = (
        ""
        if c.goal is None
        else f"≥ {c.goal:.1f}"
        if round(c.goal, 1) == c.goal
        else f"≥ {c.goal:.2f}"
    )
    verdict = {None: "", True: "met", False: "not met"}[c.goal_met]
    at_least, stopped = ("≥ ", ", stopped") if c.stopped else ("", "")
    if c.stopped and c.goal is not None and c.goal_met is None:
        verdict = "not known"
    return [
        c.name,
        f"{c.rows:,}",
        f"{c.relstate_seconds:.2f} s",
        f"{at_least}{c.baseline_seconds:.2f} s ({c.baseline}{stopped})",
        _rate(c.rows, c.relstate_seconds),
        f"{at_least}{ratio_text(c.ratio, c.goal, c.goal_met)}x",
        goal,
        verdict,
    ]


_HEADER = ["workload", "rows", "relstate", "baseline", "relstate rate", "speed-up", "goal", ""]


def _machine(m: Machine) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in m.versions)
    load = "" if m.load is None else f", load {m.load:.1f} at start"
    code = "" if m.commit is None else f"; code at commit {m.commit}"
    return f"{m.cores} cores ({m.cpu}), Python {m.python}, {versions}{load}{code}"


_WORK_HEADER = [
    "workload",
    "rows",
    "update",
    "eviction",
    "commit",
    "relstate own work",
    "relstate wall",
    "baseline wall",
]


def _work_cells(w: Work) -> list[str]:
    own = w.update_us + w.eviction_us + w.commit_us
    return [
        w.name,
        f"{w.rows:,}",
        f"{w.update_us:.1f}",
        f"{w.eviction_us:.1f}",
        f"{w.commit_us:.1f}",
        f"{own:.1f}",
        f"{w.relstate_us:.1f}",
        f"{w.baseline_us:.1f} ({w.baseline})",
    ]


def page_name(suite: str, scale: int) -> str:
    """The file name of a suite's page at ``scale``: ``join.md``, ``join-x10.md``."""
    return f"{suite}.md" if scale == 1 else f"{suite}-x{scale}.md"


def _command(result: SuiteResult) -> str:
    scale = "" if result.scale == 1 else f" --scale {result.scale}"
    options = f" {result.options}" if result.options else ""
    return f"relstate bench --suite {result.suite}{scale}{options}"


def terminal(result: SuiteResult) -> str:
    """The comparisons and readings as aligned plain-text tables."""
    rows = [_HEADER, *(_cells(c) for c in result.comparisons)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    lines = [f"{_command(result)}: {result.title}", _machine(result.machine)]
    lines += [""] + [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]
    if result.work:
        work = [_WORK_HEADER, *(_work_cells(w) for w in result.work)]
        widths = [max(len(r[i]) for r in work) for i in range(len(_WORK_HEADER))]
        lines += ["", "  µs per input row:"] + [
            "  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in work
        ]
    if result.readings:
        lines += ["", *(f"  {what}: {value}" for what, value in result.readings)]
    return "\n".join(lines) + "\n"


def markdown(result: SuiteResult) -> str:
    """The page ``docs/bench/<suite>.md`` (``<suite>-x<scale>.md`` at a scale)."""
    title = result.title if result.scale == 1 else f"{result.title} ({result.scale}x size)"
    lines = [
        f"# {title}",
        "",
        f"*Generated by `{_command(result)}` on "
        f"{result.finished:%Y-%m-%d %H:%M} UTC; do not edit by hand.*",
        "",
        result.description.strip(),
        "",
        f"Machine: {_machine(result.machine)}.",
        "",
        "| " + " | ".join(_HEADER[:-1]) + " | |",
        "|" + "---|" * len(_HEADER),
    ]
    lines += ["| " + " | ".join(_cells(c)) + " |" for c in result.comparisons]
    if result.work:
        lines += [
            "",
            "Where the time goes, in microseconds per input row: relstate's own work "
            "(update: the operator on its input; eviction: watermark eviction and timers; "
            "commit: the state store's commit) is task time summed over partitions, "
            "from the batches' metrics of the last run; the wall columns are each "
            "side's median wall time over its input rows.",
            "",
            "| " + " | ".join(_WORK_HEADER) + " |",
            "|" + "---|" * len(_WORK_HEADER),
        ]
        lines += ["| " + " | ".join(_work_cells(w)) + " |" for w in result.work]
    if result.readings:
        lines += ["", "| measurement | value |", "|---|---|"]
        lines += [f"| {what} | {value} |" for what, value in result.readings]
    return "\n".join(lines) + "\n"
