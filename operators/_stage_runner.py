"""The Spark runner for a pipeline of keyed stages (``operators._stages``).

Per micro-batch the driver runs the stages in order. For each it selects the
rows of its sources (query inputs of this batch, or the persisted output of
an earlier stage), repartitions them by the stage's keys, sorts each
partition by the sequence column and runs the stage's operator in
``mapInArrow`` exactly as :func:`operators.run_operator` runs its one
operator: each task loads its partition's previous winning commit, processes,
commits under a fresh commit id. Only the last stage's output reaches the
sink; then one batch record holds every stage's winners. A batch that runs
again loads the same previous winners for every stage, so stages that
committed before a crash are simply committed again as new attempts that
nothing will load unless recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial, reduce
from typing import TYPE_CHECKING, Any

from operators._changelog import ROW_KIND, RowKind
from operators._runner import (
    _META,
    _SEQ,
    _SIDE,
    RelstateQuery,
    _BatchRecord,
    _committed,
    _Driver,
    _in_sequence,
    _Plan,
    _run_task,
    _start,
    _tagged,
    _task_schema,
)
from operators._sinks import BatchSink
from operators._stages import Source, Stage, check_stages
from operators.errors import InputError
from statestore import StoreConfig
from statestore._faults import fault

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["run_stages"]

#: Metrics that only the last stage reports under their own name.
_OUTPUT_ONLY = ("numOutputRows",)


class _StagesDriver(_Driver):
    """The ``foreachBatch`` function of a pipeline; records as the runner's."""

    def __init__(
        self,
        stages: Sequence[Stage],
        plans: list[_Plan],
        input_columns: list[list[str]],
        sink: BatchSink,
    ) -> None:
        super().__init__(plans[-1], [], sink, _SEQ)
        self.stages = list(stages)
        self.plans = plans
        self.input_columns = input_columns
        self.name = "+".join(p.operator.name for p in plans)
        self.log = self.log.bind(operator=self.name)

    def _run_batch(
        self,
        batch: DataFrame,
        batch_id: int,
        previous: _BatchRecord | None,
        watermark: int | None,
        processing_time: int,
    ) -> list[dict[str, Any]]:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        results: list[DataFrame] = []  # each stage's result, by stage index
        cached: list[DataFrame] = []
        metas: list[dict[str, Any]] = []
        readers = sum(any(not s.from_stage for s in stage.sources) for stage in self.stages)
        if readers > 1:
            # Several stages read the query's inputs: read them once.
            batch = batch.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(batch)
        try:
            for index, (stage, plan) in enumerate(zip(self.stages, self.plans, strict=True)):
                if index:
                    fault("runner.driver_between_stages")
                keys = [F.col(f"__k{i}") for i in range(len(stage.sources[0].keys))]
                order = _in_sequence(_SEQ)
                if stage.sides_in_turn:
                    order.insert(0, F.col(_SIDE))
                keyed = (
                    self._stage_input(stage, batch, results)
                    .repartition(plan.partitions, *keys)
                    .sortWithinPartitions(*order)
                )
                name = plan.operator.name
                before = (
                    None
                    if previous is None
                    else replace(previous, winners=previous.stage_winners.get(name, {}))
                )
                last = index == len(self.stages) - 1
                output = self._staged_output(plan.operator, batch_id) if last else None
                task = _run_task(plan, batch_id, before, watermark, processing_time, output)
                schema = from_arrow_schema(_task_schema(plan.operator))
                result = keyed.mapInArrow(task, schema)
                if output is None:
                    result = result.persist(StorageLevel.MEMORY_AND_DISK)
                    results.append(result)
                    cached.append(result)
                committed = _committed(result, batch_id, plan.partitions)
                metas += [_stage_meta(m, name, last) for m in committed]
            if output is None:
                self.sink(results[-1].where(F.col(_META).isNull()).drop(_META), batch_id)
            else:
                self._publish(output, committed, batch_id)
        finally:
            for frame in cached:
                frame.unpersist()
        return metas

    def _stage_input(self, stage: Stage, batch: DataFrame, results: list[DataFrame]) -> DataFrame:
        """The rows of every source of ``stage``, tagged with the stage's side
        numbers, keys ``__k{i}`` and sequence."""
        from pyspark.sql import functions as F

        parts = []
        for side, source in enumerate(stage.sources):
            origin = source.origin
            renamed: Callable[[str], str]
            if source.from_stage:
                rows = results[origin].where(F.col(_META).isNull())
                names = list(self.plans[origin].operator.output.names)
                renamed = str
            else:
                rows = batch.where(F.col(_SIDE) == origin)
                names = [n for n in self.input_columns[origin] if n != ROW_KIND]
                renamed = partial(_tagged, origin)
            sequence = _SEQ if source.sequence is None else f"`{renamed(source.sequence)}`"
            keys = [F.col(f"`{renamed(k)}`").alias(f"__k{i}") for i, k in enumerate(source.keys)]
            part = rows.select(
                *[F.col(f"`{renamed(n)}`").alias(_tagged(side, n)) for n in names],
                F.col(ROW_KIND),
                F.lit(side).alias(_SIDE),
                *keys,
                F.col(sequence).alias(_SEQ),
            )
            if source.drop_null_keys:
                for i in range(len(keys)):
                    part = part.where(F.col(f"__k{i}").isNotNull())
            parts.append(part)
        return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)


def _stage_meta(meta: dict[str, Any], stage: str, last: bool) -> dict[str, Any]:
    """A task's metadata, tagged with its stage: its metrics under
    ``stage.name`` and, summed over stages, under their own names (output
    rows only from the last stage, whose output is the query's)."""
    metrics = {f"{stage}.{k}": v for k, v in meta["metrics"].items()}
    metrics.update({k: v for k, v in meta["metrics"].items() if last or k not in _OUTPUT_ONLY})
    return {**meta, "stage": stage, "metrics": metrics}


def run_stages(
    inputs: Sequence[DataFrame],
    stages: Sequence[Stage],
    partitions: int,
    checkpoint: str,
    sink: BatchSink,
    sequence_column: str,
    store_config: StoreConfig | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    log_level: int | None = None,
) -> RelstateQuery:
    """Run a pipeline of keyed ``stages`` over streaming ``inputs`` and
    return the running query.

    Each micro-batch runs every stage in order on ``partitions`` partitions
    (fixed for the life of the checkpoint), each partitioned by its own keys,
    and hands the last stage's output (with ``row_kind``) to ``sink``.
    ``sequence_column`` (in every input) orders each partition's rows. Every
    stage keeps its state under its operator's name in ``checkpoint``; one
    batch record holds all their winners. No event-time watermarks.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    frames = list(inputs)
    check_stages(stages, len(frames))
    if not isinstance(partitions, int) or partitions < 1:
        raise InputError(f"partitions must be a positive integer, got {partitions!r}")
    if store_config is not None and store_config.retain_versions < 2:
        raise InputError(
            "the runner needs StoreConfig.retain_versions >= 2: a task retried after "
            "its commit loads the version before it"
        )
    tagged = []
    input_columns: list[list[str]] = []
    for index, frame in enumerate(frames):
        if sequence_column not in frame.columns:
            raise InputError(
                f"input {index} has no sequence column {sequence_column!r}; its columns "
                f"are {frame.columns}"
            )
        names = [n for n in frame.columns if n != ROW_KIND]
        input_columns.append([*names, ROW_KIND])
        kind = F.col(ROW_KIND) if ROW_KIND in frame.columns else F.lit(RowKind.INSERT.value)
        tagged.append(
            frame.select(
                *[F.col(f"`{n}`").alias(_tagged(index, n)) for n in names],
                kind.alias(ROW_KIND),
                F.lit(index).alias(_SIDE),
                F.col(f"`{sequence_column}`").alias(_SEQ),
            )
        )

    def key_types(stage: Stage, source: Source) -> list[str]:
        if source.from_stage:
            out = stages[source.origin].operator.output
            return [from_arrow_type(out.field(k).type).simpleString() for k in source.keys]
        frame = frames[source.origin]
        missing = [k for k in source.keys if k not in frame.columns]
        if missing:
            raise InputError(
                f"stage {stage.operator.name!r}: input {source.origin} has no key column(s) "
                f"{missing}; its columns are {frame.columns}"
            )
        return [frame.schema[k].dataType.simpleString() for k in source.keys]

    shape: list[list[str]] = []
    plans = []
    store = replace(store_config or StoreConfig(), partition_count=partitions)
    location = checkpoint.rstrip("/") + "/state"
    for stage in stages:
        types = [key_types(stage, s) for s in stage.sources]
        if any(t != types[0] for t in types):
            raise InputError(
                f"stage {stage.operator.name!r}: its sources' keys have types {types}; rows "
                "with equal keys must hash alike, so cast them to one type"
            )
        shape.append(types[0])
        columns = [
            input_columns[s.origin]
            if not s.from_stage
            else [*stages[s.origin].operator.output.names, ROW_KIND]
            for s in stage.sources
        ]
        plans.append(_Plan(stage.operator, location, partitions, columns, {}, store, log_level))
    stream = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)
    driver = _StagesDriver(stages, plans, input_columns, sink)
    driver.changelog_input = any(ROW_KIND in f.columns for f in frames)
    driver.check_query(shape)
    return _start(stream, driver, checkpoint, trigger, query_name)
