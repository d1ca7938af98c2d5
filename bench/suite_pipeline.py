"""``relstate bench --suite pipeline``: a two-stage pipeline in one query
against the same two stages as two chained queries, on the same input, in
one run.

The workload is the revenue pipeline of docs/pipelines.md: orders and
customers arrive as changelogs; a changelog ``StreamingJoin`` on the
customer, then a ``GroupAggregate`` of the joined orders per customer
segment (count and sum of the amounts). **One query** runs both stages in
one ``Pipeline``. **Two chained queries** run the join alone, writing its
output to a ``ParquetSink``; then a second query reads that committed
output as a stream (``format("relstate-output")``, one batch per trigger,
each row numbered in the order the join's partitions emitted it, as the one
query orders it) and runs the aggregate. Both variants end with the
aggregate's output in a ``ParquetSink``; its changelog, materialised, is
checked against the revenue per segment computed in plain Python from the
generated changes (the suite fails if either variant differs).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import median
from typing import Any

import pyarrow as pa

from bench.revenue_pipeline import (
    CUSTOMERS,
    ORDERS,
    build,
    revenue_query,
    segment_revenue,
    sources,
    write_changes,
)
from bench.versus import Comparison, SuiteResult, runs
from operators._api.changelog import ROW_KIND
from operators._spark.pipeline import Pipeline
from operators._spark.runner import RelstateQuery, job_group
from operators._spark.sinks import ParquetSink
from operators._tools.demo import join_orders, materialised

__all__ = [
    "JobCounter",
    "Plan",
    "Workload",
    "committed_result",
    "one_query",
    "run",
    "two_queries",
    "workload",
]

#: The aggregate's output columns, as its sink holds them.
REVENUE = ["c_segment", "orders", "revenue"]
BASELINE = "the same two stages as two chained queries"
SEGMENTS = 8
#: On a machine loaded far past its cores a Python worker can start too
#: slowly for Spark (it waits 10 s for it to connect back) and the query
#: fails before its first batch: such a run is started again, once.
_LATE_WORKER = "Python worker failed to connect back"
_ATTEMPTS = 2


@dataclass(frozen=True)
class Plan:
    """The size of the workload and of the run."""

    customers: int
    #: Orders inserted by the first batch (with every customer).
    orders: int
    #: Order changes per later batch: new orders, updates (a ``-U``/``+U``
    #: pair, a new amount or another customer) and deletes, 2 : 2 : 1.
    order_changes: int
    #: Customers moved to another segment per later batch (a ``-U``/``+U`` pair).
    moves: int
    #: Micro-batches, the first one included.
    batches: int
    #: Runs of each variant, alternating; the medians are compared.
    repeats: int
    #: Partitions of every stage, and Spark's shuffle partitions: one per core.
    partitions: int = 2


FULL = Plan(customers=6_000, orders=60_000, order_changes=20_000, moves=500, batches=6, repeats=3)
QUICK = Plan(customers=40, orders=300, order_changes=100, moves=5, batches=3, repeats=1)
#: The warm-up run (classes loaded, Python workers started).
WARM = Plan(customers=20, orders=100, order_changes=40, moves=2, batches=2, repeats=1)


@dataclass
class Workload:
    """Each batch's changes of both tables, and the revenue per segment they
    leave: ``(segment, orders, revenue)`` rows."""

    orders: list[pa.Table] = field(default_factory=list)
    customers: list[pa.Table] = field(default_factory=list)
    result: Counter[tuple[Any, ...]] = field(default_factory=Counter)

    @property
    def changes(self) -> int:
        """Changelog rows over both tables and every batch."""
        return sum(t.num_rows for t in (*self.orders, *self.customers))


def workload(plan: Plan, seed: int = 20261125) -> Workload:
    """The changes of ``plan``, one sequence counter over both tables (a
    ``-U``/``+U`` pair shares its number: retractions come first)."""
    rng = random.Random(seed)
    kinds = pa.field(ROW_KIND, pa.string())
    segment = {c: f"segment{c % SEGMENTS}" for c in range(plan.customers)}
    orders: dict[int, tuple[int, int]] = {}
    seq = 0
    next_order = plan.orders
    out = Workload()
    for b in range(plan.batches):
        o_rows: list[tuple[Any, ...]] = []
        c_rows: list[tuple[Any, ...]] = []
        if b == 0:
            c_rows += [(c, s, 0, "+I") for c, s in segment.items()]
            for oid in range(plan.orders):
                seq += 1
                orders[oid] = (rng.randrange(plan.customers), rng.randrange(1, 1_000))
                o_rows.append((oid, *orders[oid], seq, "+I"))
        else:
            for c in rng.sample(range(plan.customers), plan.moves):
                seq += 1
                new = f"segment{rng.randrange(SEGMENTS)}"
                c_rows += [(c, segment[c], seq, "-U"), (c, new, seq, "+U")]
                segment[c] = new
            live = list(orders)
            for oid in rng.sample(live, min(len(live), plan.order_changes * 3 // 5)):
                seq += 1
                if rng.random() < 1 / 3:
                    o_rows.append((oid, *orders.pop(oid), seq, "-D"))
                    continue
                new_order = (
                    rng.randrange(plan.customers) if rng.random() < 0.5 else orders[oid][0],
                    rng.randrange(1, 1_000),
                )
                o_rows += [(oid, *orders[oid], seq, "-U"), (oid, *new_order, seq, "+U")]
                orders[oid] = new_order
            for oid in range(next_order, next_order + plan.order_changes * 2 // 5):
                seq += 1
                orders[oid] = (rng.randrange(plan.customers), rng.randrange(1, 1_000))
                o_rows.append((oid, *orders[oid], seq, "+I"))
            next_order += plan.order_changes * 2 // 5
        out.orders.append(_table(ORDERS.append(kinds), o_rows))
        out.customers.append(_table(CUSTOMERS.append(kinds), c_rows))
    totals: dict[str, list[int]] = {}
    for customer, amount in orders.values():
        entry = totals.setdefault(segment[customer], [0, 0])
        entry[0] += 1
        entry[1] += amount
    out.result = Counter((s, n, total) for s, (n, total) in totals.items())
    return out


def _table(schema: pa.Schema, rows: list[tuple[Any, ...]]) -> pa.Table:
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    return pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def committed_result(sink: ParquetSink) -> Counter[tuple[Any, ...]]:
    """The rows the sink's committed changelog leaves, read without Spark."""
    rows = [
        row
        for batch in sink.committed()
        for file in sink.committed_files(batch)
        for row in sink.read_part(file).to_pylist()
    ]
    return materialised(rows, REVENUE)


# -- the two variants --------------------------------------------------------------------


@dataclass(frozen=True)
class _Query:
    """One streaming query of a run: its time, batches and Spark jobs."""

    name: str
    seconds: float
    batches: int
    #: Jobs per relstate job group (``relstate:<query>:<stage>``).
    grouped: dict[str, int]
    #: Every Spark job the query ran (file listing, planning, stages, sink).
    jobs: int


@dataclass(frozen=True)
class _Run:
    """One run of a variant: its queries in order, and its final result."""

    queries: tuple[_Query, ...]
    result: Counter[tuple[Any, ...]]

    @property
    def seconds(self) -> float:
        return sum(q.seconds for q in self.queries)


class JobCounter:
    """Spark's jobs counted by id: ids are given in order, one per job."""

    def __init__(self, spark: Any) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.next = self._after(0)

    def _after(self, start: int) -> int:
        # A job of no partitions takes an id but never starts (no info), so
        # a gap of a few ids does not end the count.
        last, probe = start - 1, start
        while probe - last <= 32:
            if self.tracker.getJobInfo(probe) is not None:
                last = probe
            probe += 1
        return last + 1

    def since(self) -> int:
        """The jobs started since the last call (or since this was made)."""
        first, self.next = self.next, self._after(self.next)
        return sum(self.tracker.getJobInfo(i) is not None for i in range(first, self.next))


def _timed(
    spark: Any, jobs: JobCounter, name: str, stages: list[str], start: Callable[[], RelstateQuery]
) -> _Query:
    jobs.since()
    began = time.perf_counter()
    query = start()
    query.awaitTermination()
    seconds = time.perf_counter() - began
    grouped = {s: len(jobs.tracker.getJobIdsForGroup(job_group(name, s))) for s in stages}
    return _Query(name, seconds, len(query.history), grouped, jobs.since())


def one_query(spark: Any, jobs: JobCounter, inputs: Path, work: Path, name: str) -> _Run:
    """Both stages in one pipeline query, to the end of the input."""
    pipeline = Pipeline()
    _, revenue = build(pipeline, *sources(spark, inputs, pipeline))
    sink = ParquetSink(str(work / "revenue"))
    query = _timed(
        spark,
        jobs,
        name,
        ["join", "revenue"],
        lambda: pipeline.start(
            revenue,
            sink,
            checkpoint=str(work / "checkpoint"),
            partitions=FULL.partitions,
            trigger={"availableNow": True},
            query_name=name,
        ),
    )
    return _Run((query,), committed_result(sink))


def two_queries(spark: Any, jobs: JobCounter, inputs: Path, work: Path, name: str) -> _Run:
    """The join in one query, then the aggregate in a second that starts
    when the first has ended and reads its committed output as a stream."""
    pipeline = Pipeline()
    joined = join_orders(pipeline, *sources(spark, inputs, pipeline))
    join_sink = ParquetSink(str(work / "joined"))
    first = _timed(
        spark,
        jobs,
        f"{name}_join",
        ["join"],
        lambda: pipeline.start(
            joined,
            join_sink,
            checkpoint=str(work / "checkpoint1"),
            partitions=FULL.partitions,
            trigger={"availableNow": True},
            query_name=f"{name}_join",
        ),
    )
    sink = ParquetSink(str(work / "revenue"))

    def second_query() -> RelstateQuery:
        return revenue_query(
            spark,
            join_sink.path,
            segment_revenue(joined.schema),
            partitions=FULL.partitions,
            checkpoint=str(work / "checkpoint2"),
            sink=sink,
            trigger={"availableNow": True},
            query_name=f"{name}_revenue",
        )

    second = _timed(spark, jobs, f"{name}_revenue", ["revenue"], second_query)
    return _Run((first, second), committed_result(sink))


# -- the suite ---------------------------------------------------------------------------


def _checked(run: _Run, expected: Counter[tuple[Any, ...]], what: str, work: Path) -> _Run:
    if run.result != expected:
        missing, extra = expected - run.result, run.result - expected
        raise RuntimeError(
            f"{what}: the revenue per segment differs from the one computed from the "
            f"changes ({sum(missing.values())} rows missing, {sum(extra.values())} extra, "
            f"in {work}); the comparison would not be of the same work"
        )
    return run


_Variant = Callable[[Any, JobCounter, Path, Path, str], _Run]


def _again_if_late(start: Callable[[int], _Run], what: str, again: list[str]) -> _Run:
    """``start(attempt)``, once more if Spark's Python worker came too late
    (noted in ``again``)."""
    for attempt in range(_ATTEMPTS):
        try:
            return start(attempt)
        except Exception as exc:
            if _LATE_WORKER not in str(exc) or attempt == _ATTEMPTS - 1:
                raise
            again.append(what)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _per_batch(count: float, batches: int) -> str:
    return f"{count / batches:.1f}"


def _jobs_reading(run: _Run) -> str:
    parts = []
    for q in run.queries:
        stages = ", ".join(f"{s} {_per_batch(n, q.batches)}" for s, n in q.grouped.items())
        parts.append(
            f"{q.name.rsplit('_', 1)[-1] if len(run.queries) > 1 else 'query'}: "
            f"{q.batches} batches; per batch {stages}, all jobs {_per_batch(q.jobs, q.batches)}"
        )
    return "; ".join(parts)


def run(quick: bool, workdir: Path, progress: Callable[[str], None], scale: int = 1) -> SuiteResult:
    """Time both variants on the same files, alternating, in one session;
    check every run's result; count the Spark jobs of each batch. ``scale``
    multiplies the tables and the changes per batch (not the batches)."""
    from operators._spark.session import local_spark

    plan = QUICK if quick else FULL
    if scale != 1:
        plan = replace(
            plan,
            customers=plan.customers * scale,
            orders=plan.orders * scale,
            order_changes=plan.order_changes * scale,
            moves=plan.moves * scale,
        )
    progress("writing the changes")
    data = workload(plan)
    inputs = workdir / "input"
    write_changes(inputs, list(zip(data.orders, data.customers, strict=True)))
    warm_data = workload(WARM, seed=1)
    warm = workdir / "warm-input"
    write_changes(warm, list(zip(warm_data.orders, warm_data.customers, strict=True)))
    progress("starting Spark")
    spark = local_spark(
        "relstate-bench-pipeline", {"spark.sql.shuffle.partitions": str(plan.partitions)}
    )
    variants: dict[str, _Variant] = {"one": one_query, "two": two_queries}
    results: dict[str, list[_Run]] = {"one": [], "two": []}
    #: Runs started again (a Python worker too late for Spark).
    again: list[str] = []
    try:
        jobs = JobCounter(spark)
        # The chained variant runs every piece the one query runs (both
        # operators, the sink) and the relstate-output source besides.
        progress("warming up")
        work = workdir / "warm"
        done = _again_if_late(
            lambda a: two_queries(spark, jobs, warm, work / str(a), f"warm_{a}"), "warm-up", again
        )
        _checked(done, warm_data.result, "warm-up", work)
        for i in range(plan.repeats):
            # Alternate which variant goes first, so a busy spell falls on both.
            order = ["one", "two"] if i % 2 == 0 else ["two", "one"]
            for key in order:
                progress(f"{key} query(s), run {i + 1} of {plan.repeats}")
                name = f"{key}_r{i}"
                variant = variants[key]

                def attempt(a: int, variant: _Variant = variant, name: str = name) -> _Run:
                    return variant(spark, jobs, inputs, workdir / f"{name}_{a}", f"{name}_{a}")

                done = _again_if_late(attempt, f"{key} query(s), run {i + 1}", again)
                results[key].append(_checked(done, data.result, key, workdir / name))
    finally:
        spark.stop()
    one, two = results["one"], results["two"]
    comparison = Comparison.of_runs(
        "join → aggregate: one query vs two chained",
        data.changes,
        [r.seconds for r in one],
        [r.seconds for r in two],
        BASELINE,
    )
    readings = [
        ("runs, one query", runs([r.seconds for r in one])),
        ("runs, two chained queries (both)", runs([r.seconds for r in two])),
        ("runs, chained: the join query", runs([r.queries[0].seconds for r in two])),
        ("runs, chained: the aggregate query", runs([r.queries[1].seconds for r in two])),
        (
            "median per batch, one query / two chained",
            f"{median(r.seconds for r in one) / plan.batches:.2f} s / "
            f"{median(r.seconds for r in two) / plan.batches:.2f} s",
        ),
        (
            "runs done again: Spark's Python worker failed to connect back in time",
            ", ".join(again) or "none",
        ),
        ("Spark jobs, one query (last run)", _jobs_reading(one[-1])),
        ("Spark jobs, two chained queries (last run)", _jobs_reading(two[-1])),
        (
            "final result (both variants = computed from the changes)",
            f"{len(data.result)} segments, {sum(n for _, n, _ in data.result):,} joined orders",
        ),
    ]
    description = (
        f"{__doc__ or ''}\n"
        f"The input: {plan.customers:,} customers in {SEGMENTS} segments and "
        f"{plan.orders:,} orders in the first batch, then {plan.batches - 1} batches of "
        f"{plan.order_changes:,} order changes and {plan.moves:,} customers moving segment "
        f"each; {data.changes:,} changelog rows in all, one Parquet file per table per batch "
        f"(`maxFilesPerTrigger=1`), {plan.batches} micro-batches. {plan.partitions} partitions "
        "per stage, Spark `local[2,3]` (two cores), `availableNow` triggers. The chained "
        "queries run one after the other (the second starts when the first has ended), so "
        "their time is the sum of both, from the first's start to the second's end; the one "
        "query's is from its start to its end. After a warm-up run of the chained variant "
        "(it runs every piece the one query runs, and the `relstate-output` source) on a "
        f"small input, each variant runs {plan.repeats} times, alternating which goes first, "
        "and the table compares the medians (a speed-up above 1: the one query is faster). "
        "**Spark jobs per batch** come from Spark's status tracker: each stage's jobs by the "
        "job group the runner sets (`relstate:<query>:<stage>`; a job is grouped under its "
        "last stage, so in the one query the join, which runs in the revenue stage's job, "
        "has none of its own), and every job the query ran (by job id: file listing, "
        "planning, the stages, the sink), over its batches."
    )
    return SuiteResult(
        suite="pipeline",
        title="Pipelines: one query against two chained queries",
        description=description,
        comparisons=[comparison],
        readings=readings,
    )
