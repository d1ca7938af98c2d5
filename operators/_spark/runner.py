"""The Spark runner: one driver for every relstate query, exactly once.

A query is a :class:`~operators.Pipeline` of keyed stages (one stage for
:func:`run_operator`). Each micro-batch (``foreachBatch``) runs the stages in
order: a stage's input (rows of the batch's sources, or an earlier stage's
output of this batch) is repartitioned by the stage's key, ordered, and run in
``mapInArrow`` (:mod:`operators._spark.task`): each task loads its partition's
previous winning commit, processes, commits this batch under a fresh commit
id, and returns its output plus one metadata row. One Spark job per stage,
except that a stage whose rows only one side of the stage right after it
reads (and no sink) runs in that stage's job, its metadata rows handed on
with its rows.
The driver hands each output stage's rows to its sink, and only then records
the batch in the journal (:mod:`operators._checkpoint.journal`): every stage's winners,
the watermarks and the metrics, in one record. A batch that runs again (a
retried task, a restarted driver, a crash between two stages' commits) loads
the same previous winners for every stage, so it ends in the same state and
output as one that ran once.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial, reduce
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import pyarrow as pa

from operators._api.changelog import ROW_KIND, RowKind
from operators._api.operator import Operator
from operators._api.watermark import Watermark
from operators._checkpoint.journal import BatchRecord, Journal, QueryShape, StageShape
from operators._engine.graph import PipelineGraph, Stream
from operators._engine.task import output_schema
from operators._engine.watermark import query_watermark, stage_watermarks
from operators._spark.plan import (
    SOURCE,
    InputPlan,
    QueryPlan,
    quoted,
    source_column,
)
from operators._spark.session import without_adaptive_execution
from operators._spark.task import (
    META,
    ORDER,
    StagePlan,
    TaskBatch,
    run_task,
    task_schema,
)
from operators.errors import InputError, RunnerError
from operators.typing import BatchSink, BatchSummary, Progress, StagedSink
from statestore import (
    StoreConfig,
    current_log_config,
    fault,
    filesystem_for,
    get_logger,
    redact,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "QueryOptions",
    "RelstateQuery",
    "Watermark",
    "job_group",
    "run_operator",
    "stage_progress",
    "start",
]

#: Spark's names for a stateful operator's metrics, as its progress reports them.
SPARK_METRICS = (
    "numOutputRows",
    "numTotalStateRows",
    "numUpdatedStateRows",
    "numRemovedStateRows",
    "allUpdatesTimeMs",
    "allRemovalsTimeMs",
    "commitTimeMs",
    "memoryUsedBytes",
)
_TRIGGERS = ("processingTime", "once", "availableNow")


class QueryOptions(TypedDict, total=False):
    """The options of starting a query, the same keywords for
    :meth:`Pipeline.start <operators.Pipeline.start>`, :func:`run_operator`
    and :func:`~operators.run_fk_join`; all are optional.

    ``store_config`` configures each stage's state store (its
    ``retain_versions`` must be at least 2). ``trigger`` is Spark's
    (``{"processingTime": "5 seconds"}``, ``{"availableNow": True}``,
    ``{"once": True}``); ``query_name`` names the query (and its jobs in the
    Spark UI). ``state_location`` puts the state (and the batch journal)
    anywhere ``pyarrow.fs`` reaches, S3 say, while Spark's checkpoint stays
    where Spark can write it (default: ``checkpoint/state``). ``progress`` is
    called with each finished batch's summary (default: one line on stderr
    when it is a terminal).
    """

    store_config: StoreConfig | None
    trigger: Mapping[str, Any] | None
    query_name: str | None
    state_location: str | None
    progress: Progress | None


# -- the driver -------------------------------------------------------------------------


@dataclass
class _BatchStages:
    """One micro-batch's stages on the driver: what planning any of them
    reads, and what the planned ones leave for the later ones."""

    batch: DataFrame
    batch_id: int
    previous: BatchRecord | None
    #: Each stage's input watermark.
    marks: list[int | None]
    processing_time: int
    #: The output streams whose stage's tasks write into their sink.
    direct: Mapping[int, StagedSink]
    #: Each planned stage's rows (output and metadata), cached, by stage index.
    results: dict[int, DataFrame] = field(default_factory=dict)
    #: The frames cached for this batch, in the order they were cached.
    cached: list[DataFrame] = field(default_factory=list)
    #: What each planned stage's tasks run, by stage index: the job that
    #: runs them carries it (a Spark local property).
    batches: dict[int, TaskBatch] = field(default_factory=dict)


class _Driver:
    """The ``foreachBatch`` function of a pipeline."""

    def __init__(
        self,
        pipeline: PipelineGraph,
        outputs: Sequence[tuple[Stream, BatchSink]],
        plans: list[StagePlan],
        journal: Journal,
        retain: int,
        progress: Progress | None,
    ) -> None:
        self.pipeline = pipeline
        #: Each output stream and its sink, the ``output`` given to start first.
        self.outputs = list(outputs)
        self.plans = list(plans)  # a stage that passes rows on gets its own below
        self.journal = journal
        self.retain = retain
        self.progress = progress
        self.query_name = "relstate"
        self.history: list[BatchSummary] = []
        #: The error that stopped the query, raised again by RelstateQuery.
        self.error: InputError | None = None
        self.delays = pipeline.watermark_delays()
        self.stage_inputs = pipeline.watermark_inputs()
        self.log = get_logger(__name__, stages=[p.operator.name for p in plans])
        #: Which stages run in which job, and the plan of each stage's input.
        self.layout = QueryPlan(pipeline, {stream.index for stream, _ in self.outputs})
        self.fused = self.layout.fused
        self.passing = self.layout.passing
        for index, (side, _) in self.passing.items():
            schema = pipeline.stages[index].inputs[side].stream.schema
            self.plans[index] = replace(self.plans[index], passes_on=(side, schema))
        #: Each planned stage's task, as the UDF column ``mapInArrow`` applies.
        self.udfs: dict[int, Column] = {}
        #: How each stage's input frame is made from its sides' frames.
        self.inputs: list[_StageInput] = []
        for index in range(len(plans)):
            selected, order = self.layout.stage_input(index)
            self.inputs.append(_StageInput(selected, self.plans[index].partitions))
            self.plans[index] = replace(self.plans[index], order=order)
        #: The winner records of the last batch this driver recorded, written
        #: in a thread of their own while Spark ends that batch and starts the
        #: next (:meth:`settle`).
        self.winner_records: Future[None] | None = None
        self.winner_writer = ThreadPoolExecutor(1, thread_name_prefix="relstate-winners")
        #: The thread that plans a batch's later stages (:meth:`_run_stages`),
        #: the driver's own: Py4J gives each Python thread a connection to
        #: the JVM, and a thread of each batch's own would cost a new
        #: connection (and a new JVM thread) every batch.
        self.planner = ThreadPoolExecutor(1, thread_name_prefix="relstate-plan")
        self.winner_lock = threading.Lock()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._batch(batch, batch_id)
        except InputError as exc:
            self.error = exc
            raise

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        done = self.journal.record(batch_id)
        previous = self.journal.previous(batch_id)
        self._winners_before(previous)
        if done is not None:
            # Recorded, so its output is in the sink and its winners are
            # decided; Spark runs it again only because the driver died before
            # Spark committed it. Running it again would commit new attempts
            # of a version that already has winners.
            self.journal.record_winners(done)
            self._commit_sink(batch_id)
            self.log.info("relstate.batch_already_recorded", batch_id=batch_id)
            return
        watermark = query_watermark(
            self.delays,
            {} if previous is None else previous.max_event_time,
            None if previous is None else previous.watermark,
        )
        marks = stage_watermarks(self.stage_inputs, watermark)
        processing_time = self.journal.processing_time(batch_id)
        with without_adaptive_execution(batch.sparkSession):
            metas, jobs_ms = self._run_stages(batch, batch_id, previous, marks, processing_time)
        fault("runner.driver_after_sink")
        record = self._record(batch_id, previous, watermark, marks, metas)
        # The batch record decides; the stores' winner records, written after
        # it, are for readers that load a version without naming a commit.
        self.journal.write(record)
        self._commit_sink(batch_id)
        with self.winner_lock:
            self.winner_records = self.winner_writer.submit(self.journal.record_winners, record)
        self.journal.prune(self.retain)
        summary = _summary(
            record,
            {o.name for o, _ in self.outputs},
            int((time.perf_counter() - started) * 1000),
            jobs_ms,
            {p.operator.name: p.partitions for p in self.plans},
        )
        self.history.append(summary)
        self.log.info("relstate.batch", **{k: v for k, v in summary.items() if k != "stages"})
        if self.progress is not None:
            self.progress(summary)

    def settle(self) -> None:
        """Wait until the winner records of the last batch this driver
        recorded are written; raise the error that stopped them."""
        with self.winner_lock:
            pending, self.winner_records = self.winner_records, None
        if pending is not None:
            pending.result()

    def _winners_before(self, previous: BatchRecord | None) -> None:
        """Have the winner records of the batch before this one written
        before this one runs. Nothing but a reader of the checkpoint reads
        them (the tasks load the winners the driver hands them), so they
        are written in a thread while Spark ends a batch and starts the
        next, off the batch's path. A write that failed there is tried
        once more here, and its error then stops this batch. In this run's
        first batch they are written again (a write of the same winner is a
        no-op): a driver that died after recording its last batch may have
        left them unwritten."""
        if self.winner_records is None:
            if previous is not None:
                self.journal.record_winners(previous)
            return
        try:
            self.settle()
        except Exception as exc:
            assert previous is not None  # records were being written
            self.log.warning(
                "relstate.winner_records_failed", batch_id=previous.batch_id, error=str(exc)
            )
            self.journal.record_winners(previous)

    def operator_progress(self, batch_id: int) -> list[dict[str, Any]]:
        """Each stage's metrics of batch ``batch_id`` as Spark reports a
        stateful operator's (empty if this driver did not run it)."""
        for summary in reversed(self.history):
            if summary["batch_id"] == batch_id:
                counts = summary["stage_partitions"]
                return [_operator_progress(s, m, counts[s]) for s, m in summary["stages"].items()]
        return []

    def _commit_sink(self, batch_id: int) -> None:
        for _, sink in self.outputs:
            commit = getattr(sink, "commit", None)
            if commit is not None:
                commit(batch_id)

    # -- the stages ---------------------------------------------------------------------

    def _run_stages(
        self,
        batch: DataFrame,
        batch_id: int,
        previous: BatchRecord | None,
        marks: list[int | None],
        processing_time: int,
    ) -> tuple[dict[str, list[dict[str, Any]]], int]:
        """Run every stage of the batch in order and hand each output
        stage's rows to its sink; each stage's task metadata rows, and the
        milliseconds its stages' jobs ran (from the driver's call to their
        end: Spark's planning of each job's plan included)."""
        from pyspark import StorageLevel

        stages = self.pipeline.stages
        # An output no later stage reads, to a sink its tasks write into,
        # is written by the stage's own job; the others are handed over after.
        direct = {
            stream.index: sink
            for stream, sink in self.outputs
            if isinstance(sink, StagedSink) and not self.pipeline.consumers(stream)
        }
        metas: dict[str, list[dict[str, Any]]] = {}
        in_jobs = 0.0
        staged = _BatchStages(batch, batch_id, previous, marks, processing_time, direct)
        jobs: dict[int, set[int]] = defaultdict(set)
        for index, stage in enumerate(stages):
            for source in (i.stream.index for i in stage.inputs if not i.stream.is_stage):
                jobs[source].add(self.layout.job_of(index))
        if any(len(j) > 1 for j in jobs.values()):
            # A source is read by several jobs: read the batch once. Sides in
            # one job read it twice, as Spark's own plans read a source they
            # name twice, which costs that job less than caching it does
            # (docs/runner.md).
            staged.batch = batch.persist(StorageLevel.MEMORY_AND_DISK)
            staged.cached.append(staged.batch)
        context = batch.sparkSession.sparkContext
        plan_stage = partial(self._plan_stage, staged)
        upcoming: Future[tuple[DataFrame, tuple[StagedSink, str] | None]] | None = None
        try:
            # Each later stage is planned (its input frame, the batch its
            # tasks run, its cache) in a thread while the job before it runs:
            # planning is driver work that does not need the earlier stage's
            # rows, only its frame. A stage that runs in the next stage's job
            # is planned before that job, with nothing running.
            planned = plan_stage(0)
            in_job: list[int] = []
            for index, stage in enumerate(stages):
                committing, output = planned
                upcoming = (
                    self.planner.submit(plan_stage, index + 1) if index + 1 < len(stages) else None
                )
                in_job.append(index)
                if index not in self.fused:
                    if in_job[0]:
                        # An earlier job of this batch ran: its stages committed.
                        fault("runner.driver_between_stages")
                    names = ", ".join(repr(stages[i].name) for i in in_job)
                    context.setJobGroup(
                        job_group(self.query_name, stage.name),
                        f"{self.query_name}: batch {batch_id}, stage {index} ({names})",
                    )
                    for i in in_job:
                        context.setLocalProperty(TaskBatch.key(i), staged.batches[i].to_json())
                    job_started = time.perf_counter()
                    metas.update(self._committed(committing, batch_id, in_job))
                    in_jobs += time.perf_counter() - job_started
                    if output is not None:
                        sink, staging = output
                        parts = [m["part"] for m in metas[stage.name]]
                        sink.publish(staging, parts, batch_id)
                    in_job = []
                if upcoming is not None:
                    planned = upcoming.result()
            for stream, handed in self.outputs:
                if stream.index in direct:
                    continue
                context.setJobGroup(
                    job_group(self.query_name, "sink"), f"{self.query_name}: batch {batch_id}, sink"
                )
                rows = staged.results[stream.index].where(f"{META} IS NULL").drop(META, ORDER)
                handed(rows, batch_id)
        finally:
            if upcoming is not None:
                # A stage still being planned when a job failed: its frame's
                # cache, if it makes one, is in staged.cached once it is done.
                wait([upcoming])
            keys = [TaskBatch.key(i) for i in range(len(stages))]
            for key in ("spark.jobGroup.id", "spark.job.description", *keys):
                context.setLocalProperty(key, None)  # type: ignore[arg-type]
            # Later frames first: a frame uncached before a cached frame built
            # on it makes Spark look at (and, unless loaded, plan again) the
            # dependent one.
            for frame in reversed(staged.cached):
                frame.unpersist()
        return metas, int(in_jobs * 1000)

    def _committed(
        self, result: DataFrame, batch_id: int, stages: list[int]
    ) -> dict[str, list[dict[str, Any]]]:
        """Run a job: the metadata rows of the tasks of ``stages`` (its last
        stage's, and those the earlier ones' rows carried into it), by stage
        name; the first task's error as an :class:`InputError`; a
        :class:`RunnerError` unless every partition of each stage committed."""
        # No select(META) first: each frame is another analysis of the whole
        # plan, and these rows hold nulls in every other column.
        metas = [json.loads(r[META]) for r in result.collect()]
        # An earlier stage's error first: its reader ran on part of its rows.
        errors = sorted((m["stage"], m["partition"], m["error"]) for m in metas if "error" in m)
        if errors:
            stage, partition, error = errors[0]
            raise InputError(
                f"batch {batch_id}, stage {self.pipeline.stages[stage].name!r}, partition "
                f"{partition}: {error}; nothing of this batch was recorded"
            )
        committed: dict[str, list[dict[str, Any]]] = {}
        for index in stages:
            name, partitions = self.pipeline.stages[index].name, self.plans[index].partitions
            committed[name] = [m for m in metas if m["stage"] == index]
            got = sorted(m["partition"] for m in committed[name])
            if got != list(range(partitions)):
                raise RunnerError(
                    f"batch {batch_id}, stage {name!r}: tasks committed partitions {got}, "
                    f"expected 0..{partitions - 1}; the batch is not recorded and runs again"
                )
        return committed

    def _plan_stage(
        self, staged: _BatchStages, index: int
    ) -> tuple[DataFrame, tuple[StagedSink, str] | None]:
        """Stage ``index`` of the batch, planned but not run: the frame whose
        rows are its tasks' metadata rows (collecting it runs the stage), and
        the sink and staging area its tasks write their output into
        (``None``: into its rows, cached in ``staged.results`` for later
        stages and sinks). What its tasks run goes into ``staged.batches``,
        for the job that runs them to carry."""
        from pyspark import StorageLevel
        from pyspark.sql import DataFrame

        stage = self.pipeline.stages[index]
        previous, batch_id = staged.previous, staged.batch_id
        before = (
            None
            if previous is None
            else previous.stage_watermarks.get(stage.name, previous.watermark)
        )
        sink = staged.direct.get(index)
        output = None if sink is None else (sink, sink.stage(batch_id))
        staged.batches[index] = TaskBatch(
            batch_id=batch_id,
            previous_batch=None if previous is None else previous.batch_id,
            previous_winners={} if previous is None else previous.winners_of(stage.name),
            watermark=staged.marks[index],
            previous_watermark=before,
            processing_time=staged.processing_time,
            staging=None if output is None else output[1],
        )
        frame = self._stage_input(index, staged.batch, staged.results)
        # DataFrame.mapInArrow, with the task made once (see _task).
        task = self._task(index, frame, sink)
        result = DataFrame(frame._jdf.mapInArrow(task._jc, False, None), frame.sparkSession)
        if index in self.fused:
            # Its rows, metadata rows too, are read once, in its reader's job.
            staged.results[index] = result
            return result, None
        if output is not None:
            # Its tasks wrote their output to the sink and return only their
            # metadata rows: nothing to filter out.
            return result, output
        result = result.persist(StorageLevel.MEMORY_AND_DISK)
        staged.results[index] = result
        staged.cached.append(result)
        return result.where(f"{META} IS NOT NULL"), None

    def _task(self, index: int, frame: DataFrame, sink: StagedSink | None) -> Column:
        """Stage ``index``'s task over the columns of ``frame`` (its input,
        the same columns in every batch) as ``mapInArrow`` applies it: a
        Python UDF, made in the query's first batch and the same in every
        later one, as its function is (:func:`run_task`; the batch it runs
        comes with the job). PySpark's ``DataFrame.mapInArrow`` makes the UDF
        again for every call (the function pickled, its environment
        converted) and resolves each column of the frame, a round trip to
        the JVM each, tens of them a stage, all before the batch's job
        starts: made once, they are not paid again each batch.

        What PySpark reads when it makes a UDF (the Python includes added
        with ``addPyFile``, the profiler settings) is therefore read in the
        query's first batch and kept until the query restarts."""
        task = self.udfs.get(index)
        if task is None:
            from pyspark.rdd import PythonEvalType
            from pyspark.sql import functions as F
            from pyspark.sql.pandas.functions import pandas_udf
            from pyspark.sql.pandas.types import from_arrow_schema

            stage, plan = self.pipeline.stages[index], self.plans[index]
            output = None if sink is None else (sink, _sink_schema(stage.operator))
            udf = pandas_udf(
                run_task(plan, output),
                returnType=from_arrow_schema(task_schema(plan)),
                functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF,
            )
            task = self.udfs[index] = udf(*[F.col(quoted(c)) for c in frame.columns])
        return task

    def _stage_input(
        self, index: int, batch: DataFrame, results: dict[int, DataFrame]
    ) -> DataFrame:
        """The rows of every input of stage ``index`` in this batch, as its
        tasks take them (:meth:`QueryPlan.stage_input`)."""
        inputs = self.pipeline.stages[index].inputs
        frames = [results[i.stream.index] if i.stream.is_stage else batch for i in inputs]
        return self.inputs[index].frame(frames)

    def _record(
        self,
        batch_id: int,
        previous: BatchRecord | None,
        watermark: int | None,
        marks: list[int | None],
        metas: dict[str, list[dict[str, Any]]],
    ) -> BatchRecord:
        seen = dict(previous.max_event_time) if previous else {}
        metrics: dict[str, dict[str, int]] = {}
        for stage, rows in metas.items():
            totals = dict.fromkeys(SPARK_METRICS, 0)
            for m in rows:
                for k, v in m["metrics"].items():
                    totals[k] = totals.get(k, 0) + int(v)
                for source, t in m["max_event_time"].items():
                    seen[source] = max(seen.get(source, t), t)
            metrics[stage] = totals
        return BatchRecord(
            batch_id=batch_id,
            winners={
                s: {m["partition"]: m["commit_id"] for m in rows} for s, rows in metas.items()
            },
            watermark=watermark,
            stage_watermarks={
                s.name: mark for s, mark in zip(self.pipeline.stages, marks, strict=True)
            },
            max_event_time=seen,
            metrics=metrics,
        )


def job_group(query: str, stage: str) -> str:
    """The Spark job group of a stage's jobs (the sink's: ``stage="sink"``):
    the Spark UI lists a batch's jobs under it, with a description naming
    the batch and the stage."""
    return f"relstate:{query}:{stage}"


#: The running queries' drivers by Spark query id, for listeners.
_DRIVERS: weakref.WeakValueDictionary[str, _Driver] = weakref.WeakValueDictionary()


def stage_progress(progress: Any) -> list[dict[str, Any]]:
    """Each stage's state metrics of the batch a Spark progress reports, in
    the shape of Spark's ``StateOperatorProgress``: what a
    ``StreamingQueryListener`` calls with ``event.progress``. Empty for a
    query that is not relstate's, or a batch this driver did not run."""
    driver = _DRIVERS.get(str(progress.id))
    if driver is None:
        return []
    return driver.operator_progress(int(progress.batchId))


class _StageInput:
    """How a stage's input frame is made from its sides' frames, the same in
    every batch: its parts (:func:`selections`) unioned by name and
    repartitioned into ``partitions`` by ``by`` (SQL expressions all). Spark
    does not order the rows: a stage's tasks do, where it is ordered
    (:mod:`operators._engine.row_order`).

    The frame is built with the JVM's ``Dataset`` calls, from lists of
    expressions made in the query's first batch: PySpark's ``selectExpr``
    and ``repartition`` convert their lists into the JVM again at every
    call, a round trip per element; made once, what is left of a batch's
    planning is Spark analysing the plan at each call."""

    def __init__(self, plan: InputPlan, partitions: int) -> None:
        self.parts = plan.parts
        self.by = plan.by
        self.partitions = partitions
        #: The JVM's lists of the expressions above, made in the first batch.
        self._java: tuple[list[Any], Any] | None = None

    def rows(self, frames: list[DataFrame]) -> DataFrame:
        """The parts of ``frames`` (each side's frame), unioned by name,
        before they are partitioned."""
        from pyspark.sql import DataFrame

        session = frames[0].sparkSession
        selected = []
        for part, columns in zip(self.parts, self._lists(session)[0], strict=True):
            rows = frames[part.side]._jdf
            if part.condition is not None:
                rows = rows.where(part.condition)
            selected.append(rows.selectExpr(columns))
        return DataFrame(reduce(lambda a, b: a.unionByName(b, True), selected), session)

    def frame(self, frames: list[DataFrame]) -> DataFrame:
        """The stage's input frame in a batch whose sides' frames are ``frames``."""
        from pyspark.sql import DataFrame

        session = frames[0].sparkSession
        _, by = self._lists(session)
        rows = self.rows(frames)._jdf
        rows = (
            rows.repartition(self.partitions, by) if self.by else rows.repartition(self.partitions)
        )
        return DataFrame(rows, session)

    def _lists(self, session: SparkSession) -> tuple[list[Any], Any]:
        """Each part's columns and ``by`` as the JVM's lists."""
        if self._java is None:
            from pyspark.sql import functions as F

            to_seq = session.sparkContext._jvm.PythonUtils.toSeq  # type: ignore[union-attr]
            self._java = (
                [to_seq(p.columns) for p in self.parts],
                to_seq([F.expr(e)._jc for e in self.by]),
            )
        return self._java


def _sink_schema(operator: Operator) -> pa.Schema:
    """The Arrow schema of an operator's output rows as a staged sink takes
    them: Spark's types, every column nullable."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    fields = [f.with_nullable(True) for f in output_schema(operator)]
    return to_arrow_schema(from_arrow_schema(pa.schema(fields)), timezone="UTC")


def _summary(
    record: BatchRecord,
    outputs: set[str],
    duration_ms: int,
    jobs_ms: int,
    partitions: dict[str, int],
) -> BatchSummary:
    """A batch as the query's history and progress callback see it: its
    time in the driver and, of that, in its stages' jobs; the stages'
    metrics under ``stage.metric``, and summed over stages under their own
    names (``numOutputRows``: the output stages'), and each stage's
    partition count."""
    flat: dict[str, int] = {}
    for stage, metrics in record.metrics.items():
        for k, v in metrics.items():
            flat[f"{stage}.{k}"] = v
            if k != "numOutputRows" or stage in outputs:
                flat[k] = flat.get(k, 0) + v
    return {
        "batch_id": record.batch_id,
        "watermark": record.watermark,
        "duration_ms": duration_ms,
        "jobs_ms": jobs_ms,
        "metrics": flat,
        "stages": {s: dict(m) for s, m in record.metrics.items()},
        "stage_watermarks": dict(record.stage_watermarks),
        "stage_partitions": dict(partitions),
    }


# -- the query ---------------------------------------------------------------------------


class RelstateQuery:
    """The running query: a Spark ``StreamingQuery`` (every attribute of which
    it passes through) plus relstate's per-batch, per-stage metrics."""

    def __init__(self, query: StreamingQuery, driver: _Driver) -> None:
        self._query = query
        self._driver = driver

    @property
    def last_metrics(self) -> dict[str, int]:
        """The last finished batch's metrics, summed over partitions (Spark's
        names: numOutputRows, numTotalStateRows, ...; each stage's also under
        ``stage.name``)."""
        return dict(self._driver.history[-1]["metrics"]) if self._driver.history else {}

    @property
    def history(self) -> list[BatchSummary]:
        """Every batch this run finished: id, watermark, duration, metrics,
        and each stage's metrics and watermark."""
        return list(self._driver.history)

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        """Spark's last progress, its ``stateOperators`` the stages' state
        metrics under Spark's names (see :meth:`stage_progress`)."""
        progress = self._query.lastProgress
        return None if progress is None else self._with_stages(progress)

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        """Spark's recent progress, each with the stages' state metrics."""
        return [self._with_stages(p) for p in self._query.recentProgress]

    def stage_progress(self, batch_id: int) -> list[dict[str, Any]]:
        """Each stage's state metrics of batch ``batch_id`` (if this run
        finished it) in the shape of Spark's ``StateOperatorProgress``."""
        return self._driver.operator_progress(batch_id)

    def _with_stages(self, progress: Any) -> dict[str, Any]:
        data = dict(progress) if isinstance(progress, Mapping) else json.loads(progress.json)
        data["stateOperators"] = self.stage_progress(int(data.get("batchId", -1)))
        return data

    def awaitTermination(self, timeout: int | None = None) -> bool | None:
        """Spark's ``awaitTermination``; a batch stopped by bad input raises
        its :class:`InputError` rather than Spark's wrapper. Once the query
        has ended, the last batch's winner records are written too."""
        try:
            ended = self._query.awaitTermination(timeout)
        except Exception:
            self._raise_input_error()
            raise
        if ended is not False:
            self._settle()
        return ended

    def processAllAvailable(self) -> None:
        """Spark's ``processAllAvailable``; bad input raises its InputError.
        The last batch's winner records are written when it returns."""
        try:
            self._query.processAllAvailable()
        except Exception:
            self._raise_input_error()
            raise
        self._settle()

    def stop(self) -> None:
        """Spark's ``stop``, and the last batch's winner records written."""
        self._query.stop()
        self._settle()

    def _settle(self) -> None:
        """The last batch's winner records written (:meth:`_Driver.settle`).
        When the query failed, a failure to write them is logged, not
        raised, so that it does not stand in for the query's own error."""
        try:
            self._driver.settle()
        except Exception as exc:
            if self._query.exception() is None:
                raise
            self._driver.log.warning("relstate.winner_records_failed", error=str(exc))

    def _raise_input_error(self) -> None:
        if self._driver.error is not None:
            raise self._driver.error from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._query, name)


def _operator_progress(stage: str, metrics: Mapping[str, int], partitions: int) -> dict[str, Any]:
    """A stage's metrics in the shape of Spark's ``StateOperatorProgress``;
    its partitions as Spark's shuffle partitions and state store instances
    (one of each for a keyless stage)."""
    known = {
        "numRowsTotal": "numTotalStateRows",
        "numRowsUpdated": "numUpdatedStateRows",
        "numRowsRemoved": "numRemovedStateRows",
        "allUpdatesTimeMs": "allUpdatesTimeMs",
        "allRemovalsTimeMs": "allRemovalsTimeMs",
        "commitTimeMs": "commitTimeMs",
        "memoryUsedBytes": "memoryUsedBytes",
        "numRowsDroppedByWatermark": "numRowsDroppedByWatermark",
    }
    progress: dict[str, Any] = {"operatorName": f"relstate:{stage}"}
    progress.update({spark: int(metrics.get(ours, 0)) for spark, ours in known.items()})
    progress["customMetrics"] = {
        k: v for k, v in metrics.items() if k not in known.values() and k != "numOutputRows"
    }
    progress["numOutputRows"] = int(metrics.get("numOutputRows", 0))
    progress["numShufflePartitions"] = partitions
    progress["numStateStoreInstances"] = partitions
    return progress


def _console_line(summary: BatchSummary) -> None:
    """The default progress when interactive: one line per batch."""
    m = summary["metrics"]
    print(
        f"relstate: batch {summary['batch_id']} done in {summary['duration_ms']} ms: "
        f"{m.get('numOutputRows', 0)} output rows, {m.get('numTotalStateRows', 0)} state rows",
        file=sys.stderr,
    )


def start(
    pipeline: PipelineGraph,
    output: Stream,
    sink: BatchSink,
    checkpoint: str,
    partitions: int,
    more_outputs: Sequence[tuple[Stream, BatchSink]] = (),
    **options: Unpack[QueryOptions],
) -> RelstateQuery:
    """Start the streaming query of ``pipeline`` (see :meth:`Pipeline.start`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    # The one place that reads the options: a misspelt keyword is refused as
    # Python refuses one, not silently dropped.
    unknown_options = sorted(set(options) - QueryOptions.__optional_keys__)
    if unknown_options:
        raise TypeError(
            f"unknown query option(s) {unknown_options}; the options are "
            f"{sorted(QueryOptions.__optional_keys__)}"
        )
    store_config = options.get("store_config")
    trigger = options.get("trigger")
    query_name = options.get("query_name")
    state_location = options.get("state_location")
    progress = options.get("progress")
    outputs = [(output, sink), *more_outputs]
    pipeline.check_complete([o for o, _ in outputs])
    harness_only = [s.name for s in pipeline.sources if s.frame is None]
    if harness_only:
        raise InputError(
            f"source(s) {harness_only} were given as Arrow schemas, which only the harness "
            "runs; give Spark streaming DataFrames to start a query"
        )
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise InputError(f"partitions must be a positive integer, got {partitions!r}")
    store = store_config or StoreConfig()
    if store.retain_versions < 2:
        raise InputError(
            "the runner needs StoreConfig.retain_versions >= 2: a task retried after "
            "its commit loads the version before it"
        )
    unknown = sorted(set(trigger or {}) - set(_TRIGGERS))
    if unknown or len(trigger or {}) > 1:
        raise InputError(
            f"trigger takes one of {list(_TRIGGERS)} (a micro-batch trigger); got "
            f"{dict(trigger or {})}"
        )
    for _, each in outputs:
        if not callable(each):
            raise InputError(f"a sink must be callable with (DataFrame, batch id); got {each!r}")
    location = (state_location or checkpoint.rstrip("/") + "/state").rstrip("/")
    fs, root = filesystem_for(location)
    if fs.get_file_info(f"{root}.repartition.json").type.name != "NotFound":
        # Before anything is written: the state may be half moved.
        raise InputError(
            f"the state at {redact(location)} is being repartitioned; run `relstate "
            "repartition` on it again to finish, then start the query"
        )
    journal = Journal(fs, root, redact(location))
    shapes: list[StageShape] = []
    plans: list[StagePlan] = []
    for stage in pipeline.stages:
        first = stage.inputs[0]
        types = tuple(
            from_arrow_type(first.stream.schema.field(k).type).simpleString() for k in first.keys
        )
        count = stage.partitions(partitions)
        shapes.append(StageShape(stage.name, types, count))
        watermarks: dict[int, Watermark] = {}
        event_times: dict[int, tuple[str, str]] = {}
        for side, inp in enumerate(stage.inputs):
            if not inp.stream.is_stage:
                mark = pipeline.sources[inp.stream.index].watermark
                if mark is not None:
                    watermarks[side] = mark
                    event_times[side] = (inp.stream.name, mark.column)
        stage.operator.check_watermarks(watermarks)
        plans.append(
            StagePlan(
                operator=stage.operator,
                location=location,
                partitions=count,
                side_columns=[list(i.stream.schema.names) for i in stage.inputs],
                event_times=event_times,
                store=replace(store, partition_count=count),
                index=len(plans),
                log=current_log_config(),
            )
        )
    journal.bind_shape(QueryShape(tuple(shapes), partitions))
    frames = []
    for index, source in enumerate(pipeline.sources):
        frame = source.frame
        kind = F.col(ROW_KIND) if source.changelog else F.lit(RowKind.INSERT.value)
        frames.append(
            frame.select(
                *[F.col(quoted(n)).alias(source_column(index, n)) for n in source.schema.names],
                kind.alias(ROW_KIND),
                F.lit(index).alias(SOURCE),
            )
        )
    stream = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    if progress is None and sys.stderr.isatty():
        progress = _console_line
    driver = _Driver(pipeline, outputs, plans, journal, max(store.retain_versions, 2), progress)
    if query_name:
        driver.query_name = query_name
    writer = stream.writeStream.foreachBatch(driver).option(
        "checkpointLocation", checkpoint.rstrip("/") + "/spark"
    )
    if query_name:
        writer = writer.queryName(query_name)
    if trigger:
        writer = writer.trigger(**trigger)
    query = writer.start()
    _DRIVERS[str(query.id)] = driver
    return RelstateQuery(query, driver)


def run_operator(
    inputs: DataFrame | Sequence[DataFrame],
    operator: Operator,
    keys: Sequence[str] | Sequence[Sequence[str]],
    partitions: int,
    checkpoint: str,
    sink: BatchSink,
    watermarks: Mapping[int, Watermark] | None = None,
    sequence_column: str | None = None,
    **options: Unpack[QueryOptions],
) -> RelstateQuery:
    """Run ``operator`` over one or two streaming DataFrames: a one-stage
    :class:`~operators.Pipeline`. Returns the running query.

    ``keys`` are the key columns (one list per input for two inputs; the
    inputs' keys must have one type, in order); rows with equal keys meet in
    one task. ``partitions`` is fixed for the life of the checkpoint.
    ``checkpoint`` holds Spark's own stream checkpoint (``checkpoint/spark``)
    and, unless the ``state_location`` option is given, the operator's state
    (``checkpoint/state``). ``sink`` receives each batch's output (with the
    ``row_kind`` column) and its id, and must be idempotent
    (:class:`ParquetSink` is). ``watermarks`` maps an input index to its
    event-time column and delay (default: what ``withWatermark`` set).
    ``sequence_column`` (default: the operator's) orders each partition's
    rows. ``options`` are :class:`QueryOptions` (``trigger``, ``query_name``,
    ``store_config``, ``state_location``, ``progress``). relstate's log events
    follow :func:`statestore.configure_logging` (or ``RELSTATE_LOG``) on the
    driver, in the Python workers too.
    """
    frames: list[DataFrame] = [inputs] if not isinstance(inputs, Sequence) else list(inputs)
    if len(frames) != len(operator.inputs):
        raise InputError(
            f"operator {operator.name!r} takes {len(operator.inputs)} input(s); got {len(frames)}"
        )
    marks = dict(watermarks or {})
    unknown = sorted(set(marks) - set(range(len(frames))))
    if unknown:
        raise InputError(f"watermarks name input(s) {unknown}; the inputs are 0..{len(frames) - 1}")
    # Before the inputs are read: the watermarks given may not fit the operator.
    operator.check_watermarks(marks)
    pipeline = PipelineGraph()
    streams = [
        pipeline.source(f, f"input{i}", sequence=sequence_column, watermark=marks.get(i))
        for i, f in enumerate(frames)
    ]
    result = pipeline.stage(operator, *streams, keys=keys)
    return start(pipeline, result, sink, checkpoint, partitions, **options)
