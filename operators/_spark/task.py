"""A stage's task, in Spark's Python workers: one partition of one batch.

The task opens the partition's :class:`~statestore.StateStore`, loads the
previous batch's winning commit, feeds the operator its rows (split into runs
of one side, each under the side's own column names), fires timers, advances
the watermark, commits the batch under a fresh commit id and returns its
output plus one metadata row (its partition, commit id, metrics, the latest
event time per source). Bad input raises nothing here: the task commits
nothing and returns one metadata row naming the error, which the driver raises
as :class:`~operators.errors.InputError`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from operators._api.changelog import ROW_KIND, RowKind
from operators._api.operator import Operator
from operators._engine.graph import same_type
from operators._engine.row_order import SEQ, SIDE, RowOrder, RowSorter
from operators._engine.task import BatchRun, output_schema, state_metrics, state_tables
from operators._engine.watermark import max_event_time
from operators.errors import InputError, RunnerError
from operators.typing import StagedSink
from statestore import LockHeldError, LogConfig, StateStore, StoreConfig, apply_log_config, fault

__all__ = [
    "META",
    "ORDER",
    "PASS",
    "SEQ",
    "SIDE",
    "StagePlan",
    "TaskBatch",
    "open_store",
    "passed_column",
    "run_task",
    "tagged",
    "task_schema",
]

#: The row kind of a stage's input row when the stage's input carries none.
INSERT = pa.scalar(RowKind.INSERT.value, pa.string())
META = "__meta"
#: The order a stage's output rows were emitted in: partition, then position.
ORDER = "__ord"
#: In a stage's input, true on the rows its task passes on (see
#: :attr:`StagePlan.passes_on`); in its output, true on those rows.
PASS = "__pass"
_ORDER_BITS = 40
#: A task joins consecutive runs of one side into one batch for its operator
#: and cuts the batch once it reaches this many rows or bytes (the run that
#: reaches it may take it past). An operator that reads state for a batch at
#: once pays per batch: each read of many keys scans their span in storage,
#: so a 100k-row task of the dedup cost half again in two batches as in one.
CHUNK_ROWS = 262_144
CHUNK_BYTES = 64 << 20


def tagged(side: int, position: int) -> str:
    """A side's column (at ``position`` among its columns) as the stage's
    input frame holds it: named by position, a plain identifier, so that
    the runner's expressions over the frame (its keys, its ordering, the
    task's columns) can name it unquoted whatever the side's own names hold
    (a dot, a backtick)."""
    return f"s{side}__{position}"


def passed_column(position: int) -> str:
    """A passed-on row's column (at ``position`` among its side's columns)
    as a task's output holds it (see :attr:`StagePlan.passes_on`)."""
    return f"{PASS}_{position}"


@dataclass(frozen=True)
class StagePlan:
    """What every task of a stage needs, pickled to the executors."""

    operator: Operator
    location: str
    partitions: int
    #: Each side's columns (without ``row_kind``), as the operator sees them.
    side_columns: list[list[str]]
    #: Per side with an event-time watermark: its source's name and column.
    event_times: dict[int, tuple[str, str]]
    store: StoreConfig
    #: The stage's place in the pipeline (0: the first), which its tasks'
    #: metadata rows name.
    index: int
    #: The driver's log configuration, which the Python workers (processes
    #: of their own) take on.
    log: LogConfig | None = None
    #: A side whose rows the task passes on, and their schema: the rows of
    #: it that its input marks ``__pass`` come back out of the task as they
    #: went in (their row kinds included), beside its output, for the next
    #: stage, which runs in the same job and reads the same source. That
    #: stage takes them from this stage's rows instead of reading the batch
    #: again (see the runner). A row only passed on (``__side`` null) is not
    #: the operator's.
    passes_on: tuple[int, pa.Schema] | None = None
    #: How the task orders its input rows before the operator sees them
    #: (``None``: as they come); the input then carries the columns it sorts by.
    order: RowOrder | None = None


@dataclass(frozen=True)
class TaskBatch:
    """What one run of a batch tells a stage's tasks. It comes with the
    batch's Spark job, as a local property (:meth:`key`), so that a
    stage's task function is the same in every batch (:func:`run_task`)."""

    batch_id: int
    #: The previous recorded batch and this stage's winners in it.
    previous_batch: int | None
    previous_winners: dict[int, str]
    watermark: int | None
    previous_watermark: int | None
    processing_time: int
    #: Where this run's tasks write their output, when they write it into
    #: the stage's sink (:meth:`StagedSink.stage`).
    staging: str | None = None

    @staticmethod
    def key(stage: int) -> str:
        """The Spark local property that holds stage ``stage``'s batch."""
        return f"relstate.batch.{stage}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TaskBatch:
        fields = json.loads(text)
        # JSON keys are strings; partitions are numbers.
        fields["previous_winners"] = {int(p): c for p, c in fields["previous_winners"].items()}
        return cls(**fields)


#: Where a task writes its output: a staged sink, the batch run's staging
#: area in it, and the Arrow schema of the rows (Spark's types).
StagedOutput = tuple[StagedSink, str, pa.Schema]


def task_schema(plan: StagePlan) -> pa.Schema:
    """What a stage's task returns: the output rows with their emit order,
    the rows it passes on (:attr:`StagePlan.passes_on`), and one metadata
    row (nulls in every other column), so every column is nullable here."""
    fields = [f.with_nullable(True) for f in output_schema(plan.operator)]
    if plan.passes_on is not None:
        passed = plan.passes_on[1]
        fields.extend(pa.field(passed_column(i), f.type) for i, f in enumerate(passed))
        fields.append(pa.field(PASS, pa.bool_()))
    return pa.schema([*fields, pa.field(ORDER, pa.int64()), pa.field(META, pa.string())])


def run_task(
    plan: StagePlan, output: tuple[StagedSink, pa.Schema] | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The task of one stage, the same function in every batch: it runs the
    batch its job's local property :meth:`TaskBatch.key` names. With
    ``output`` (a sink and the Arrow schema of its rows), it writes its
    output rows into the batch's staging area in the sink and returns only
    its metadata row (which names its part); without, it returns its output
    rows too."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        apply_log_config(plan.log)
        partition = context.partitionId()
        if partition >= plan.partitions:
            # A stage run in a later stage's job takes the first partitions
            # of the union that job's input is (the runner puts its side
            # first, one_per_side); past them, this task would be no partition of
            # the stage. A side put later would give tasks of other partitions'
            # numbers, which no check here can tell.
            raise RunnerError(
                f"stage {plan.operator.name!r}: task of partition {partition}, but the stage "
                f"has {plan.partitions}; its input was not partitioned by the runner"
            )
        given = context.getLocalProperty(TaskBatch.key(plan.index))
        if given is None:
            raise RunnerError(
                f"stage {plan.operator.name!r}: its job names no batch "
                f"({TaskBatch.key(plan.index)}); it was not run by the runner"
            )
        batch = TaskBatch.from_json(given)
        staged = None
        if output is not None:
            assert batch.staging is not None
            staged = (output[0], batch.staging, output[1])
        schema = task_schema(plan)
        store = open_store(plan, partition, context.attemptNumber())
        try:
            yield from _run(plan, batch, staged, store, partition, schema, batches)
        finally:
            store.close()

    return task


def _run(
    plan: StagePlan,
    batch: TaskBatch,
    output: StagedOutput | None,
    store: StateStore,
    partition: int,
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    store.load(batch.previous_batch, batch.previous_winners.get(partition))
    run = BatchRun(
        plan.operator,
        store.tables,
        batch.batch_id,
        partition,
        batch.watermark,
        batch.previous_watermark,
        batch.processing_time,
    )
    max_time: dict[str, int] = {}
    part = None
    handed_on: list[str] = []
    passing: list[pa.RecordBatch] = []
    sorter = None if plan.order is None else RowSorter(plan.order)
    try:
        own = _passing_on(batches, plan, schema, passing)
        given = _handing_on(own, handed_on)
        if sorter is not None:
            # The operator sees no row before the last is read and ordered;
            # the rows to pass on (a stage with no sink of its own) go as
            # they are read.
            for read in given:
                sorter.add(read)
                yield from passing
                passing.clear()
            given = sorter.rows()
        rows = side_batches(given, plan.side_columns)
        outputs = _outputs(run, rows, plan, max_time)
        if output is None:
            position = partition << _ORDER_BITS
            for out in outputs:
                if out.num_rows:
                    yield _with_order(out, schema, position)
                    position += out.num_rows
                # The rows read so far to pass on go now, not held to the
                # end: the next stage orders its rows, whatever their place.
                yield from passing
                passing.clear()
        else:
            sink, staging, arrow = output
            part = sink.write_part(staging, partition, arrow, outputs)
    except InputError as exc:
        # Nothing is committed; the driver raises it, once.
        error = {"stage": plan.index, "partition": partition, "error": str(exc)}
        yield _meta_rows(schema, [*handed_on, json.dumps(error)])
        return
    finally:
        if sorter is not None:
            sorter.close()
    metrics = {**run.metrics, **state_metrics(store.tables)}
    started = time.perf_counter()
    info = store.commit(batch.batch_id)
    fault("runner.task_after_commit")
    if plan.index:
        fault("runner.later_stage_after_commit")
    metrics["commitTimeMs"] = int((time.perf_counter() - started) * 1000)
    metrics["memoryUsedBytes"] = info.memory_used_bytes
    meta: dict[str, Any] = {
        "stage": plan.index,
        "partition": partition,
        "commit_id": info.commit_id,
        "metrics": metrics,
        "max_event_time": max_time,
    }
    if part is not None:
        meta["part"] = part
    yield _meta_rows(schema, [*handed_on, json.dumps(meta)])


def _handing_on(batches: Iterator[pa.RecordBatch], into: list[str]) -> Iterator[pa.RecordBatch]:
    """A task's input without the metadata rows of an earlier stage that ran
    in this job (``__meta`` set), which go to ``into``: the task returns them
    with its own, for the driver."""
    for batch in batches:
        index = batch.schema.get_field_index(META)
        if index < 0:
            yield batch
            continue
        meta = batch.column(index)
        if meta.null_count < batch.num_rows:
            into.extend(meta.drop_null().to_pylist())
            batch = batch.filter(meta.is_null())
        yield batch.remove_column(index)


def _passing_on(
    batches: Iterator[pa.RecordBatch],
    plan: StagePlan,
    schema: pa.Schema,
    into: list[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """A task's input rows that are its operator's (``__side`` set), without
    ``__pass``; the rows it marks go to ``into`` too, as output rows (the
    task's ``schema``) that carry them on (:attr:`StagePlan.passes_on`)."""
    if plan.passes_on is None:
        yield from batches
        return
    side, passed = plan.passes_on
    for batch in batches:
        marked = batch.filter(batch.column(PASS))
        if marked.num_rows:
            into.append(_passed_rows(marked, side, passed, schema))
        sides = batch.column(SIDE)
        if sides.null_count:
            batch = batch.filter(sides.is_valid())
        yield batch.remove_column(batch.schema.get_field_index(PASS))


def _passed_rows(
    rows: pa.RecordBatch, side: int, passed: pa.Schema, schema: pa.Schema
) -> pa.RecordBatch:
    """Input rows of ``side`` as the output rows that pass them on: their
    columns and row kinds, in a task's output ``schema``, nulls elsewhere."""
    n = rows.num_rows
    values = {
        passed_column(i): rows.column(tagged(side, i)).cast(f.type) for i, f in enumerate(passed)
    }
    kinds = rows.schema.get_field_index(ROW_KIND)
    values[ROW_KIND] = rows.column(kinds) if kinds >= 0 else pa.repeat(INSERT, n)
    values[PASS] = pa.repeat(pa.scalar(True), n)
    arrays = [values[f.name] if f.name in values else pa.nulls(n, type=f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _meta_rows(schema: pa.Schema, metas: list[str]) -> pa.RecordBatch:
    """Metadata rows (JSON): this task's own, last, after those handed on
    from an earlier stage that ran in this job; nulls in every other column."""
    arrays = [pa.nulls(len(metas), type=f.type) for f in schema]
    arrays[-1] = pa.array(metas, type=pa.string())
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _outputs(
    run: BatchRun,
    runs: Iterator[tuple[int, pa.RecordBatch]],
    plan: StagePlan,
    max_time: dict[str, int],
) -> Iterator[pa.RecordBatch]:
    """Run the operator over a task's runs of input; its output batches
    (some empty). Notes the latest event time per watermarked source."""
    for side, part in runs:
        part = conform(part, plan.operator.inputs[side])
        source = plan.event_times.get(side)
        if source is not None and part.num_rows:
            times = part.column(source[1])
            counted = plan.operator.watermark_rows(part, side)
            latest = max_event_time(times if counted is None else times.filter(counted))
            if latest is not None:
                max_time[source[0]] = max(max_time.get(source[0], latest), latest)
        run.process(side, part)
        yield run.drain()
    run.fire_timers()
    run.advance_watermark()
    yield run.finish()


def conform(batch: pa.RecordBatch, declared: pa.Schema) -> pa.RecordBatch:
    """``batch`` with its timestamps in the declared time zone: Spark hands a
    task timestamps in the session's zone, the operator declared (from the
    stream) UTC; the instant is the same."""
    arrays = list(batch.columns)
    changed = False
    for fld in declared:
        index = batch.schema.get_field_index(fld.name)
        if index < 0:
            continue
        given = batch.schema.field(index).type
        if given != fld.type and same_type(fld.type, given):
            arrays[index] = arrays[index].cast(fld.type)
            changed = True
    if not changed:
        return batch
    fields = [batch.schema.field(i).with_type(a.type) for i, a in enumerate(arrays)]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def side_batches(
    batches: Iterator[pa.RecordBatch], columns: list[list[str]]
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Split a task's input into runs of one side, in order, each with that
    side's own column names and ``row_kind``. A stage of one input gets no
    ``__side`` column (every row is side 0), and a stage whose inputs are
    all append-only no ``row_kind`` (every row an insert). Consecutive runs of one side
    are joined until they reach :data:`CHUNK_ROWS` rows or :data:`CHUNK_BYTES`
    bytes (a chunk may pass it by the last input batch's run), so that an operator sees few large
    batches rather than the many small ones Arrow hands a task."""
    side, rows, size = -1, 0, 0
    pending: list[pa.RecordBatch] = []
    for batch in batches:
        if not batch.num_rows:
            continue
        if SIDE in batch.schema.names:
            sides = np.asarray(batch.column(SIDE))
            starts = [0, *(np.flatnonzero(sides[1:] != sides[:-1]) + 1).tolist()]
        else:
            sides, starts = np.zeros(1, dtype=np.int64), [0]
        for start, end in zip(starts, [*starts[1:], batch.num_rows], strict=True):
            run_side = int(sides[start])
            if pending and (run_side != side or rows >= CHUNK_ROWS or size >= CHUNK_BYTES):
                yield side, _untagged(side, pending, columns[side])
                pending, rows, size = [], 0, 0
            side = run_side
            run = batch.slice(start, end - start)
            pending.append(run)
            rows += run.num_rows
            size += run.nbytes
    if pending:
        yield side, _untagged(side, pending, columns[side])


def _untagged(side: int, parts: list[pa.RecordBatch], names: list[str]) -> pa.RecordBatch:
    """One batch of a side's rows, its columns under the side's own names,
    and its row kinds (inserts where the stage's input carries none)."""
    table = pa.Table.from_batches(parts)
    if ROW_KIND not in table.schema.names:
        table = table.append_column(ROW_KIND, pa.repeat(INSERT, table.num_rows))
    table = (
        table.select([*(tagged(side, i) for i in range(len(names))), ROW_KIND])
        .rename_columns([*names, ROW_KIND])
        .combine_chunks()
    )
    if not table.num_rows:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return table.to_batches()[0]


def open_store(plan: StagePlan, partition: int, attempt: int) -> StateStore:
    """The partition's store; a local cache of its own when another attempt
    of the partition (a speculative copy, or a zombie) holds the usual one
    on this host."""
    tables = state_tables(plan.operator)
    name, consistency = plan.operator.name, plan.operator.consistency
    try:
        return StateStore(plan.location, name, partition, tables, plan.store, consistency)
    except LockHeldError:
        base = plan.store.local_path(plan.location, name, partition)
        config = replace(
            plan.store, local_dir=str(base / f"attempt-{attempt}-{uuid.uuid4().hex[:8]}")
        )
        return StateStore(plan.location, name, partition, tables, config, consistency)


def _with_order(batch: pa.RecordBatch, schema: pa.Schema, first: int) -> pa.RecordBatch:
    n = batch.num_rows
    order = pa.array(np.arange(first, first + n, dtype=np.int64))
    # Nulls in the columns of rows passed on, when the task passes any.
    between = [pa.nulls(n, type=f.type) for f in list(schema)[batch.num_columns : -2]]
    arrays = [*batch.columns, *between, order, pa.nulls(n, type=pa.string())]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
