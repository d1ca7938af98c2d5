"""The Spark runner: stateful operators inside Spark executors, exactly once.

Each micro-batch (``foreachBatch``): check the input, tag each input's rows with
their side, repartition by key, sort by the sequence column if any, and run the
operator per partition in ``mapInArrow``. Each task opens its partition's
:class:`~statestore.StateStore`, loads the previous batch's winning commit,
processes, commits this batch under a fresh commit id, and returns its output
plus one metadata row. The driver collects the metadata, writes the output
through the sink, and only then records the batch: its winning commit ids,
watermark and metrics. A batch that runs again (a retried task, a restarted
driver) loads the same previous winners, so it ends in the same state and
output as one that ran once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import structlog

from operators._changelog import ROW_KIND, RowKind
from operators._operator import Operator
from operators._sinks import BatchSink, StagedSink, filesystem_of, write_atomically
from operators._task import BatchRun, output_schema, state_metrics, state_tables
from operators.errors import InputError, RunnerError
from statestore import LockHeldError, PartitionCheckpoint, StateStore, StoreConfig
from statestore._faults import fault
from statestore._filesystems import redact

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["RelstateQuery", "Watermark", "run_operator"]

_SIDE = "__side"
#: A task joins consecutive runs of one side into one batch for its operator
#: and cuts the batch once it reaches this many rows (the run that reaches it
#: may take it past).
_CHUNK_ROWS = 65_536
_META = "__meta"
_SEQ = "__seq"
_SPARK_METRICS = (
    "numOutputRows",
    "numTotalStateRows",
    "numUpdatedStateRows",
    "numRemovedStateRows",
    "allUpdatesTimeMs",
    "allRemovalsTimeMs",
    "commitTimeMs",
    "memoryUsedBytes",
)


@dataclass(frozen=True)
class Watermark:
    """An input's event-time column and how late its rows may be (ms)."""

    column: str
    delay_ms: int


@dataclass
class _Plan:
    """What every task of the query needs, pickled to the executors."""

    operator: Operator
    location: str
    partitions: int
    side_columns: list[list[str]]
    watermarks: dict[int, Watermark]
    store: StoreConfig
    #: The least level of relstate's log events in the Python workers, which
    #: do not share the driver's structlog configuration (``None``: leave it).
    log_level: int | None = None


#: Where a task writes its output: a staged sink, the batch run's staging
#: area in it, and the Arrow schema of the rows (Spark's types).
_StagedOutput = tuple[StagedSink, str, pa.Schema]


@dataclass
class _BatchRecord:
    """What the driver records once a batch's output is written."""

    batch_id: int
    winners: dict[int, str]
    watermark: int | None
    max_event_time: dict[int, int]
    metrics: dict[str, int] = field(default_factory=dict)
    #: A multi-stage batch's winners, per stage operator (``winners`` is then
    #: empty); see operators/_stage_runner.py.
    stage_winners: dict[str, dict[int, str]] = field(default_factory=dict)


# -- the task, in the executors -------------------------------------------------------


def _side_batches(
    batches: Iterator[pa.RecordBatch], columns: list[list[str]]
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Split tagged batches into runs of one side, in order, each with that
    side's own column names. Consecutive runs of one side are joined until
    they reach :data:`_CHUNK_ROWS` rows (a chunk may pass it by the last
    input batch's run), so that an operator sees few large batches rather
    than the many small ones Arrow hands a task."""
    side, rows = -1, 0
    pending: list[pa.RecordBatch] = []
    for batch in batches:
        if not batch.num_rows:
            continue
        sides = np.asarray(batch.column(_SIDE))
        starts = [0, *(np.flatnonzero(sides[1:] != sides[:-1]) + 1).tolist()]
        for start, end in zip(starts, [*starts[1:], batch.num_rows], strict=True):
            run_side = int(sides[start])
            if pending and (run_side != side or rows >= _CHUNK_ROWS):
                yield side, _untagged(side, pending, columns[side])
                pending, rows = [], 0
            side = run_side
            pending.append(batch.slice(start, end - start))
            rows += end - start
    if pending:
        yield side, _untagged(side, pending, columns[side])


def _untagged(side: int, parts: list[pa.RecordBatch], names: list[str]) -> pa.RecordBatch:
    """One batch of a side's rows, its columns under the side's own names."""
    table = (
        pa.Table.from_batches(parts)
        .select([_tagged(side, n) for n in names])
        .rename_columns(names)
        .combine_chunks()
    )
    if not table.num_rows:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return table.to_batches()[0]


def _in_sequence(sequence: str) -> list[Column]:
    """How a partition's rows are ordered: by ``sequence``, and at one sequence
    number retractions (``-U``, ``-D``) before accumulations (``+I``, ``+U``),
    so that an update's ``-U``/``+U`` pair sharing its number applies in order.
    Spark's sort is not stable: without the second key such ties would come in
    any order, and differently when a task runs again."""
    from pyspark.sql import functions as F

    retract = F.col(ROW_KIND).isin(RowKind.UPDATE_BEFORE.value, RowKind.DELETE.value)
    return [F.col(sequence), F.when(retract, 0).otherwise(1)]


def _tagged(side: int, name: str) -> str:
    return name if name in (_SIDE, ROW_KIND) else f"s{side}__{name}"


def _run_task(
    plan: _Plan,
    batch_id: int,
    previous: _BatchRecord | None,
    watermark: int | None,
    processing_time: int,
    output: _StagedOutput | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The task of one batch. With ``output``, it writes its output rows into
    the sink's staging area and returns only its metadata row (which names its
    part); without, it returns its output rows too."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        if plan.log_level is not None:
            structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(plan.log_level))
        partition = context.partitionId()
        operator = plan.operator
        out_schema = _task_schema(operator)
        store = _open_store(plan, partition, context.attemptNumber())
        try:
            prev_version = None if previous is None else previous.batch_id
            commit_id = None if previous is None else previous.winners.get(partition)
            store.load(prev_version, commit_id)
            run = BatchRun(
                operator,
                store.tables,
                batch_id,
                partition,
                watermark,
                None if previous is None else previous.watermark,
                processing_time,
            )
            max_time: dict[int, int] = {}
            outputs = _outputs(run, batches, plan, max_time)
            part = None
            if output is None:
                for out in outputs:
                    if out.num_rows:
                        yield _with_meta(out, out_schema, None)
            else:
                sink, staging, schema = output
                part = sink.write_part(staging, partition, schema, outputs)
            metrics = {**run.metrics, **state_metrics(store.tables)}
            started = time.perf_counter()
            info = store.commit(batch_id)
            fault("runner.task_after_commit")
            metrics["commitTimeMs"] = int((time.perf_counter() - started) * 1000)
            metrics["memoryUsedBytes"] = info.memory_used_bytes
            meta = {
                "partition": partition,
                "commit_id": info.commit_id,
                "metrics": metrics,
                "max_event_time": {str(k): v for k, v in max_time.items()},
            }
            if part is not None:
                meta["part"] = part
            yield _with_meta(None, out_schema, json.dumps(meta))
        finally:
            store.close()

    return task


def _outputs(
    run: BatchRun,
    batches: Iterator[pa.RecordBatch],
    plan: _Plan,
    max_time: dict[int, int],
) -> Iterator[pa.RecordBatch]:
    """Run the operator over a task's input batches; its output batches (some
    empty). Notes each watermarked side's latest event time in ``max_time``."""
    for side, part in _side_batches(batches, plan.side_columns):
        mark = plan.watermarks.get(side)
        if mark is not None and part.num_rows:
            times = part.column(mark.column)
            counted = plan.operator.watermark_rows(part, side)
            latest = _max_millis(times if counted is None else times.filter(counted))
            if latest is not None:
                max_time[side] = max(max_time.get(side, latest), latest)
        run.process(side, part)
        yield run.drain()
    run.fire_timers()
    run.advance_watermark()
    yield run.finish()


def _open_store(plan: _Plan, partition: int, attempt: int) -> StateStore:
    tables = state_tables(plan.operator)
    try:
        return StateStore(
            plan.location,
            plan.operator.name,
            partition,
            tables,
            plan.store,
            plan.operator.consistency,
        )
    except LockHeldError:
        # Another attempt of this partition runs on this host (a speculative
        # copy, or a zombie): give this one a local cache of its own.
        base = plan.store.local_path(plan.location, plan.operator.name, partition)
        config = replace(
            plan.store, local_dir=str(base / f"attempt-{attempt}-{uuid.uuid4().hex[:8]}")
        )
        return StateStore(
            plan.location, plan.operator.name, partition, tables, config, plan.operator.consistency
        )


def _max_millis(column: pa.Array) -> int | None:
    import pyarrow.compute as pc

    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ms", tz=column.type.tz))
        latest = pc.max(column.cast(pa.int64())).as_py()
    else:
        latest = pc.max(column).as_py()
    return None if latest is None else int(latest)


def _task_schema(operator: Operator) -> pa.Schema:
    """What a task returns: the output rows, and one metadata row (nulls in
    every output column), so every column is nullable here."""
    fields = [f.with_nullable(True) for f in output_schema(operator)]
    return pa.schema([*fields, pa.field(_META, pa.string())])


def _with_meta(batch: pa.RecordBatch | None, schema: pa.Schema, meta: str | None) -> pa.RecordBatch:
    if batch is None:
        arrays = [pa.nulls(1, type=f.type) for f in schema]
        arrays[-1] = pa.array([meta], type=pa.string())
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    arrays = [*batch.columns, pa.nulls(batch.num_rows, type=pa.string())]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@contextmanager
def _without_adaptive_execution(session: SparkSession) -> Iterator[None]:
    """Adaptive query execution off for the job that runs the tasks, and as it
    was after. The job is one shuffle into ``mapInArrow`` with a fixed
    partition count, which adaptive execution cannot improve; it would only
    run the shuffle as a job of its own and plan the rest again, about 40 ms
    of every micro-batch here. The streaming query's session is the query's
    own, and ``foreachBatch`` calls run one at a time, so nothing else sees
    the change."""
    key = "spark.sql.adaptive.enabled"
    # Unset, Spark gives its default, "true"; the "or" is for the Optional type.
    before = session.conf.get(key) or "true"
    session.conf.set(key, "false")
    try:
        yield
    finally:
        session.conf.set(key, before)


def _committed(result: DataFrame, batch_id: int, partitions: int) -> list[dict[str, Any]]:
    """The metadata rows of a task result; a :class:`RunnerError` unless
    every partition committed."""
    from pyspark.sql import functions as F

    with _without_adaptive_execution(result.sparkSession):
        rows = result.where(F.col(_META).isNotNull()).select(_META).collect()
    metas = [json.loads(r[0]) for r in rows]
    got = sorted(m["partition"] for m in metas)
    if got != list(range(partitions)):
        raise RunnerError(
            f"batch {batch_id}: tasks committed partitions {got}, expected "
            f"0..{partitions - 1}; the batch is not recorded and runs again"
        )
    return metas


# -- the driver -------------------------------------------------------------------------


class RelstateQuery:
    """The running query: a Spark ``StreamingQuery`` (every attribute of which
    it passes through) plus relstate's per-batch metrics."""

    def __init__(self, query: StreamingQuery, driver: _Driver) -> None:
        self._query = query
        self._driver = driver

    @property
    def last_metrics(self) -> dict[str, int]:
        """The last finished batch's metrics, summed over partitions (Spark's
        names: numOutputRows, numTotalStateRows, ...)."""
        return dict(self._driver.history[-1].metrics) if self._driver.history else {}

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every batch this run finished: id, watermark, metrics."""
        return [asdict(r) for r in self._driver.history]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._query, name)


class _Driver:
    """The ``foreachBatch`` function, and the batch records in the checkpoint."""

    def __init__(
        self, plan: _Plan, keys: list[list[str]], sink: BatchSink, sequence: str | None
    ) -> None:
        self.plan = plan
        self.keys = keys
        self.sink = sink
        self.sequence = sequence
        self.history: list[_BatchRecord] = []
        #: What query.json records as the operator (a pipeline names its stages).
        self.name = plan.operator.name
        #: Whether an input carries its own row-kind column (else every row is
        #: an insert and checking the kinds would only cost a Spark job).
        self.changelog_input = True
        self.fs, root = filesystem_of(plan.location)
        journal = f"{root}.repartition.json"
        if self.fs.get_file_info(journal).type != pafs.FileType.NotFound:
            # Before anything is written: the state may be half moved.
            raise InputError(
                f"the state at {redact(plan.location)} is being repartitioned ({journal} exists); "
                "run `relstate repartition` on it again to finish, then start the query"
            )
        self.root = f"{root}/_runner"
        self.fs.create_dir(f"{self.root}/batches", recursive=True)
        self.log = structlog.get_logger("relstate").bind(operator=self.name)

    # -- records ----------------------------------------------------------------------

    def _record_path(self, batch_id: int) -> str:
        return f"{self.root}/batches/{batch_id:020d}.json"

    def previous(self, batch_id: int) -> _BatchRecord | None:
        """The record of the newest batch before ``batch_id``."""
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/batches"))
        ids = sorted(
            int(i.base_name[:-5])
            for i in infos
            if i.base_name.endswith(".json") and i.base_name[:-5].isdigit()
        )
        earlier = [i for i in ids if i < batch_id]
        return self._read_record(earlier[-1]) if earlier else None

    def _recorded(self, batch_id: int) -> _BatchRecord | None:
        """The record of ``batch_id`` itself, if it was recorded."""
        path = self._record_path(batch_id)
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        return self._read_record(batch_id)

    def _record_winners(self, record: _BatchRecord) -> None:
        by_operator = {self.plan.operator.name: record.winners, **record.stage_winners}
        for name, winners in by_operator.items():
            for partition, commit_id in winners.items():
                checkpoint = PartitionCheckpoint(self.plan.location, name, partition)
                if checkpoint.winner(record.batch_id) != commit_id:
                    checkpoint.record_winner(record.batch_id, commit_id)

    def _read_record(self, batch_id: int) -> _BatchRecord:
        with self.fs.open_input_stream(self._record_path(batch_id)) as src:
            obj = json.loads(src.read())
        return _BatchRecord(
            batch_id=obj["batch_id"],
            winners={int(k): v for k, v in obj["winners"].items()},
            watermark=obj["watermark"],
            max_event_time={int(k): v for k, v in obj["max_event_time"].items()},
            metrics=obj["metrics"],
            stage_winners={
                name: {int(k): v for k, v in winners.items()}
                for name, winners in obj.get("stage_winners", {}).items()
            },
        )

    def _processing_time(self, batch_id: int) -> int:
        """The batch's processing time: recorded before its first run, so that
        a batch that runs again (after a driver restart) sees the same one."""
        path = f"{self.root}/batches/{batch_id:020d}.start"
        if self.fs.get_file_info(path).type != pafs.FileType.NotFound:
            with self.fs.open_input_stream(path) as src:
                return int(src.read())
        now = int(time.time() * 1000)
        write_atomically(self.fs, path, str(now).encode())
        return now

    def _write_record(self, record: _BatchRecord) -> None:
        data = json.dumps(asdict(record), sort_keys=True).encode()
        write_atomically(self.fs, self._record_path(record.batch_id), data)

    def check_query(self, key_types: list[list[str]]) -> None:
        """Record the query's shape on its first batch; refuse a later run with
        another partition count or key types."""
        path = f"{self.root}/query.json"
        shape = {
            "operator": self.name,
            "partitions": self.plan.partitions,
            "key_types": key_types,
        }
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            write_atomically(self.fs, path, json.dumps(shape, sort_keys=True).encode())
            return
        with self.fs.open_input_stream(path) as src:
            recorded = json.loads(src.read())
        for what in ("operator", "partitions", "key_types"):
            if recorded[what] != shape[what]:
                raise InputError(
                    f"the checkpoint at {redact(self.plan.location)} was written with {what} "
                    f"{recorded[what]!r}; this query has {shape[what]!r}. Keep it, or start "
                    "from a new checkpoint; to change the partition count of a stopped "
                    "query, run `relstate repartition`"
                )

    # -- one batch ---------------------------------------------------------------------

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        done = self._recorded(batch_id)
        if done is not None:
            # Recorded, so its output is in the sink and its winners are
            # decided; Spark runs it again only because the driver died before
            # Spark committed it. Running it again would commit new attempts
            # of a version that already has winners.
            self._record_winners(done)
            commit = getattr(self.sink, "commit", None)  # the driver died before the sink's commit
            if commit is not None:
                commit(batch_id)
            self.log.info("relstate.batch_already_recorded", batch_id=batch_id)
            return
        previous = self.previous(batch_id)
        watermark = self._watermark(previous)
        self._check_input(batch)
        processing_time = self._processing_time(batch_id)
        metas = self._run_batch(batch, batch_id, previous, watermark, processing_time)
        fault("runner.driver_after_sink")
        record = self._record(batch_id, previous, watermark, metas)
        # The batch record decides; the stores' winner records, written after
        # it, are for readers that load a version without naming a commit.
        self._write_record(record)
        self._record_winners(record)
        commit = getattr(self.sink, "commit", None)
        if commit is not None:
            commit(batch_id)
        self.history.append(record)
        self.log.info(
            "relstate.batch",
            batch_id=batch_id,
            watermark=watermark,
            durationMs=int((time.perf_counter() - started) * 1000),
            **record.metrics,
        )

    def _run_batch(
        self,
        batch: DataFrame,
        batch_id: int,
        previous: _BatchRecord | None,
        watermark: int | None,
        processing_time: int,
    ) -> list[dict[str, Any]]:
        """Run the operator over the batch and hand its output to the sink;
        the tasks' metadata rows (one per partition)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        keyed = batch.repartition(
            self.plan.partitions, *[F.col(f"__k{i}") for i in range(len(self.keys[0]))]
        )
        if self.sequence is not None:
            keyed = keyed.sortWithinPartitions(*_in_sequence(self.sequence))
        output = self._staged_output(self.plan.operator, batch_id)
        task = _run_task(self.plan, batch_id, previous, watermark, processing_time, output)
        schema = from_arrow_schema(_task_schema(self.plan.operator))
        if output is not None:
            # One Spark job: the tasks wrote their parts; publish the winners'.
            metas = _committed(keyed.mapInArrow(task, schema), batch_id, self.plan.partitions)
            self._publish(output, metas, batch_id)
            return metas
        result = keyed.mapInArrow(task, schema).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            metas = _committed(result, batch_id, self.plan.partitions)
            self.sink(result.where(F.col(_META).isNull()).drop(_META), batch_id)
        finally:
            result.unpersist()
        return metas

    def _staged_output(self, operator: Operator, batch_id: int) -> _StagedOutput | None:
        """Where this run of the batch's tasks write their output, if the
        sink takes parts from the tasks (``None``: the driver hands it the
        output as a DataFrame)."""
        from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

        if not isinstance(self.sink, StagedSink):
            return None
        fields = [f.with_nullable(True) for f in output_schema(operator)]
        schema = to_arrow_schema(from_arrow_schema(pa.schema(fields)), timezone="UTC")
        return self.sink, self.sink.stage(batch_id), schema

    def _publish(self, output: _StagedOutput, metas: list[dict[str, Any]], batch_id: int) -> None:
        """Publish the parts the winning attempts wrote (named in their
        metadata rows) as the batch's output."""
        sink, staging, _ = output
        sink.publish(staging, [m["part"] for m in metas], batch_id)

    def _watermark(self, previous: _BatchRecord | None) -> int | None:
        """Spark's rule: the minimum over inputs of (max event time seen
        before this batch - delay); it never goes back."""
        if previous is None or not self.plan.watermarks:
            return None
        candidates = []
        for side, mark in self.plan.watermarks.items():
            seen = previous.max_event_time.get(side)
            if seen is None:
                return previous.watermark
            candidates.append(seen - mark.delay_ms)
        current = min(candidates)
        if previous.watermark is not None:
            current = max(current, previous.watermark)
        return current

    def _record(
        self,
        batch_id: int,
        previous: _BatchRecord | None,
        watermark: int | None,
        metas: list[dict[str, Any]],
    ) -> _BatchRecord:
        seen = dict(previous.max_event_time) if previous else {}
        totals = dict.fromkeys(_SPARK_METRICS, 0)
        for m in metas:
            for k, v in m["metrics"].items():
                totals[k] = totals.get(k, 0) + int(v)
            for side, t in m["max_event_time"].items():
                seen[int(side)] = max(seen.get(int(side), t), t)
        stage_winners: dict[str, dict[int, str]] = {}
        for m in metas:
            if "stage" in m:
                stage_winners.setdefault(m["stage"], {})[m["partition"]] = m["commit_id"]
        return _BatchRecord(
            batch_id=batch_id,
            winners={m["partition"]: m["commit_id"] for m in metas if "stage" not in m},
            watermark=watermark,
            max_event_time=seen,
            metrics=totals,
            stage_winners=stage_winners,
        )

    def _check_input(self, batch: DataFrame) -> None:
        """Unknown row kinds fail the batch before any task runs."""
        from pyspark.sql import functions as F

        if not self.changelog_input or ROW_KIND not in batch.columns:
            return
        valid = [k.value for k in RowKind]
        bad = (
            batch.where(F.col(ROW_KIND).isNull() | ~F.col(ROW_KIND).isin(valid))
            .select(ROW_KIND)
            .limit(3)
            .collect()
        )
        if bad:
            raise InputError(
                f"unknown row kind(s) {[r[0] for r in bad]!r} in column {ROW_KIND!r}; a "
                "changelog row is '+I', '-U', '+U' or '-D'. Nothing of this batch was committed"
            )


def _key_lists(keys: Sequence[str] | Sequence[Sequence[str]]) -> list[list[str]]:
    """One list of key column names per input (a flat list serves every input)."""
    if keys and all(isinstance(k, str) for k in keys):
        return [[str(k) for k in keys]]
    return [[str(c) for c in k] for k in keys if not isinstance(k, str)]


def run_operator(
    inputs: DataFrame | Sequence[DataFrame],
    operator: Operator,
    keys: Sequence[str] | Sequence[Sequence[str]],
    partitions: int,
    checkpoint: str,
    sink: BatchSink,
    watermarks: Mapping[int, Watermark] | None = None,
    sequence_column: str | None = None,
    store_config: StoreConfig | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    log_level: int | None = None,
    state_location: str | None = None,
) -> RelstateQuery:
    """Run ``operator`` over one or two streaming DataFrames and return the
    running query.

    ``keys`` are the key columns (one list per input for two inputs; the
    inputs' keys must have the same types, in order); rows with equal keys meet
    in one task. ``partitions`` is fixed for the life of the checkpoint.
    ``checkpoint`` holds Spark's own stream checkpoint (``checkpoint/spark``)
    and, unless ``state_location`` is given, the operator's state
    (``checkpoint/state``); ``state_location`` puts the state (and the batch
    records) anywhere ``pyarrow.fs`` reaches, S3 say, while Spark's checkpoint
    stays where Spark can write it. ``sink`` receives each batch's output
    (with the ``row_kind`` column) and its id, and must be idempotent
    (:class:`ParquetSink` is). ``watermarks`` maps an input index to its
    event-time column and delay. ``sequence_column`` (default: the operator's)
    orders each partition's rows. ``log_level`` (a ``logging`` level) filters
    relstate's log events in the Python workers.
    """
    from pyspark.sql import functions as F

    frames: list[DataFrame] = [inputs] if not isinstance(inputs, Sequence) else list(inputs)
    if not 1 <= len(frames) <= 2 or len(frames) != len(operator.inputs):
        raise InputError(
            f"operator {operator.name!r} takes {len(operator.inputs)} input(s); got {len(frames)}"
        )
    operator.check_watermarks(dict(watermarks or {}))
    key_lists = _key_lists(keys)
    if len(key_lists) == 1 and len(frames) == 2:
        key_lists = key_lists * 2
    if len(key_lists) != len(frames) or len({len(k) for k in key_lists}) != 1:
        raise InputError(f"give one list of key columns per input, of equal length; got {keys!r}")
    if not isinstance(partitions, int) or partitions < 1:
        raise InputError(f"partitions must be a positive integer, got {partitions!r}")
    if store_config is not None and store_config.retain_versions < 2:
        raise InputError(
            "the runner needs StoreConfig.retain_versions >= 2: a task retried after "
            "its commit loads the version before it"
        )

    sequence = sequence_column or operator.sequence_column
    key_types: list[list[str]] = []
    tagged = []
    side_columns: list[list[str]] = []
    for side, (frame, key_cols) in enumerate(zip(frames, key_lists, strict=True)):
        missing = [c for c in key_cols if c not in frame.columns]
        if missing:
            raise InputError(
                f"input {side} has no key column(s) {missing}; its columns are {frame.columns}"
            )
        types = [frame.schema[c].dataType.simpleString() for c in key_cols]
        key_types.append(types)
        names = list(frame.columns)
        side_columns.append(
            [n for n in names if n != ROW_KIND] + ([ROW_KIND] if ROW_KIND in names else [])
        )
        cols = [F.col(f"`{n}`").alias(_tagged(side, n)) for n in names if n != ROW_KIND]
        kind = F.col(ROW_KIND) if ROW_KIND in names else F.lit(RowKind.INSERT.value)
        cols += [kind.alias(ROW_KIND), F.lit(side).alias(_SIDE)]
        cols += [F.col(f"`{c}`").alias(f"__k{i}") for i, c in enumerate(key_cols)]
        if sequence is not None:
            if sequence not in names:
                raise InputError(
                    f"input {side} has no sequence column {sequence!r}; its columns are {names}"
                )
            cols.append(F.col(f"`{sequence}`").alias(_SEQ))
        tagged.append(frame.select(*cols))
    if len(key_types) == 2 and key_types[0] != key_types[1]:
        raise InputError(
            f"the inputs' key columns have different types {key_types[0]} and {key_types[1]}; "
            "rows with equal keys must hash alike, so cast them to one type"
        )
    for names in side_columns:
        if ROW_KIND not in names:
            names.append(ROW_KIND)
    stream = (
        tagged[0]
        if len(tagged) == 1
        else tagged[0].unionByName(tagged[1], allowMissingColumns=True)
    )
    plan = _Plan(
        operator=operator,
        location=(state_location or checkpoint.rstrip("/") + "/state").rstrip("/"),
        partitions=partitions,
        side_columns=side_columns,
        watermarks=dict(watermarks or {}),
        store=replace(store_config or StoreConfig(), partition_count=partitions),
        log_level=log_level,
    )
    driver = _Driver(plan, key_lists, sink, None if sequence is None else _SEQ)
    driver.changelog_input = any(ROW_KIND in f.columns for f in frames)
    driver.check_query(key_types)
    return _start(stream, driver, checkpoint, trigger, query_name)


def _start(
    stream: DataFrame,
    driver: _Driver,
    checkpoint: str,
    trigger: Mapping[str, Any] | None,
    query_name: str | None,
) -> RelstateQuery:
    """Start the streaming query that calls ``driver`` for each batch."""
    writer = stream.writeStream.foreachBatch(driver).option(
        "checkpointLocation", checkpoint.rstrip("/") + "/spark"
    )
    if query_name:
        writer = writer.queryName(query_name)
    if trigger:
        writer = writer.trigger(**trigger)
    return RelstateQuery(writer.start(), driver)
