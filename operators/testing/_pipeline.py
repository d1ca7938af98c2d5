"""``PipelineHarness``: run a :class:`~operators.Pipeline` batch by batch
without Spark, over several partitions per stage, as the Spark runner does.

Per micro-batch, for each stage in order: every row of each input (a source's
rows of the batch, or an earlier stage's output of this batch) goes to the
partition Spark's own hash gives its key (:func:`spark_partition`, so a key
lands in the same partition here as on Spark); each partition's rows are
ordered as the runner orders them (by sequence, at one number retractions
first; a stage's output without a sequence column in the order its
partitions emitted it; the runner's tasks' rule, :class:`RowOrder`); the
partition's :class:`~operators.testing.OperatorHarness` runs them as one
batch with the stage's watermark (the one rule of :mod:`operators._engine.watermark`)
and commits. The runner's tasks sort stably, but Spark's shuffle hands a
task its rows in no fixed order: rows that tie (one number, one kind) may
come in either order, so ``tie_break`` shuffles each partition's rows before
they are ordered.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from operators._api.changelog import ROW_KIND, RowKind, row_kinds
from operators._engine.graph import PipelineGraph, Stage
from operators._engine.row_order import SEQ, SIDE, RowOrder, RowSorter
from operators._engine.spark_hash import spark_partition
from operators._engine.task import output_schema
from operators._engine.watermark import max_event_time, query_watermark, stage_watermarks
from operators.errors import InputError
from operators.testing._operator import Emitted, OperatorHarness

__all__ = ["PipelineHarness"]

_ORDER_BITS = 40


class PipelineHarness:
    """Runs ``pipeline`` on ``partitions`` partitions per stage (the Spark
    runner's one count; a list gives each stage its own, to test a protocol
    between stages harder), state in ``backend`` (``"memory"`` or
    ``"rocksdb"``). A keyless stage runs on one partition, as on Spark."""

    def __init__(
        self,
        pipeline: PipelineGraph,
        partitions: int | Sequence[int],
        backend: str = "memory",
        tie_break: random.Random | None = None,
    ) -> None:
        if not pipeline.stages:
            raise InputError("a pipeline needs at least one stage")
        counts = (
            [partitions] * len(pipeline.stages) if isinstance(partitions, int) else list(partitions)
        )
        if len(counts) != len(pipeline.stages) or not all(
            isinstance(n, int) and n >= 1 for n in counts
        ):
            raise InputError(
                f"give a positive partition count, or one per stage; got {partitions!r}"
            )
        if not isinstance(partitions, int):
            many = [
                s.name for s, n in zip(pipeline.stages, counts, strict=True) if s.keyless and n > 1
            ]
            if many:
                raise InputError(
                    f"keyless stage(s) {many} run on one partition; give them 1, got {partitions!r}"
                )
        counts = [s.partitions(n) for s, n in zip(pipeline.stages, counts, strict=True)]
        self.pipeline = pipeline
        self.tie_break = tie_break
        self.harnesses: list[list[OperatorHarness]] = [
            [OperatorHarness(s.operator, backend, partition_id=p) for p in range(n)]
            for s, n in zip(pipeline.stages, counts, strict=True)
        ]
        self._delays = pipeline.watermark_delays()
        self._stage_inputs = pipeline.watermark_inputs()
        #: The greatest event time seen per source, and the query's watermark.
        self.max_event_time: dict[str, int] = {}
        self.watermark: int | None = None
        #: The last batch's metrics per stage, summed over partitions.
        self.last_metrics: dict[str, dict[str, int]] = {}
        #: The last batch's input watermark per stage.
        self.stage_watermarks: dict[str, int | None] = {}
        self.batch_id = 0

    def run_batch(
        self,
        inputs: Mapping[str, pa.Table | None] | Sequence[pa.Table | None],
        processing_time: int | None = None,
    ) -> dict[str, pa.Table]:
        """Run one micro-batch: each source's rows (by source name, or a list
        in the order the sources were added; a missing source has none); every
        stage's output (with ``row_kind``), by stage name."""
        tables = self._source_tables(inputs)
        self.watermark = query_watermark(self._delays, self.max_event_time, self.watermark)
        marks = stage_watermarks(self._stage_inputs, self.watermark)
        outputs: list[pa.Table] = []
        for index, stage in enumerate(self.pipeline.stages):
            outputs.append(
                self._run_stage(index, stage, tables, outputs, marks[index], processing_time)
            )
            self.stage_watermarks[stage.name] = marks[index]
        self._see_event_times(tables)
        self.batch_id += 1
        return {s.name: _plain(t) for s, t in zip(self.pipeline.stages, outputs, strict=True)}

    def close(self) -> None:
        """Release every partition's state (and temporary directories)."""
        for harnesses in self.harnesses:
            for harness in harnesses:
                harness.close()

    def __enter__(self) -> PipelineHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one batch ----------------------------------------------------------------------

    def _source_tables(
        self, inputs: Mapping[str, pa.Table | None] | Sequence[pa.Table | None]
    ) -> list[pa.Table]:
        sources = self.pipeline.sources
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - {s.name for s in sources})
            if unknown:
                raise InputError(
                    f"the pipeline has no source(s) {unknown}; its sources are "
                    f"{[s.name for s in sources]}"
                )
            given = [inputs.get(s.name) for s in sources]
        else:
            given = list(inputs)
            if len(given) != len(sources):
                raise InputError(f"expected {len(sources)} input tables, got {len(given)}")
        tables = []
        for source, table in zip(sources, given, strict=True):
            if table is None:
                table = source.schema.empty_table()
            if ROW_KIND not in table.column_names:
                kinds = pa.array([RowKind.INSERT.value] * table.num_rows, type=pa.string())
                table = table.append_column(ROW_KIND, kinds)
            tables.append(table)
        return tables

    def _see_event_times(self, tables: list[pa.Table]) -> None:
        for source, table in zip(self.pipeline.sources, tables, strict=True):
            if source.watermark is None or not table.num_rows:
                continue
            latest = max_event_time(table.column(source.watermark.column))
            if latest is not None:
                seen = self.max_event_time.get(source.name, latest)
                self.max_event_time[source.name] = max(seen, latest)

    def _run_stage(
        self,
        index: int,
        stage: Stage,
        sources: list[pa.Table],
        outputs: list[pa.Table],
        watermark: int | None,
        processing_time: int | None,
    ) -> pa.Table:
        n = len(self.harnesses[index])
        orders = self.pipeline.sequenced(stage)
        # Per partition: (side, sequence, row kind, row index) of every row it gets.
        routed: list[list[tuple[int, Any, str, int]]] = [[] for _ in range(n)]
        tables: list[pa.Table] = []
        for side, (inp, order) in enumerate(zip(stage.inputs, orders, strict=True)):
            stream = inp.stream
            table = outputs[stream.index] if stream.is_stage else sources[stream.index]
            tables.append(table)
            if not table.num_rows:
                continue
            types = [table.schema.field(k).type for k in inp.keys]
            keys = (
                list(zip(*[table.column(k).to_pylist() for k in inp.keys], strict=True))
                if inp.keys
                else [()] * table.num_rows  # keyless: every row to partition 0
            )
            if order is not None:
                seqs = table.column(order).to_pylist()
            elif stream.is_stage:
                seqs = table.column("__ord").to_pylist()
            else:
                seqs = [None] * table.num_rows
            kinds = [k.value for k in row_kinds(table)]
            for row, (key, seq, kind) in enumerate(zip(keys, seqs, kinds, strict=True)):
                if inp.drop_null_keys and any(v is None for v in key):
                    continue
                routed[spark_partition(key, types, n)].append((side, seq, kind, row))
        metrics: dict[str, int] = {}
        emitted: list[pa.Table] = []
        for partition, (harness, rows) in enumerate(
            zip(self.harnesses[index], routed, strict=True)
        ):
            if self.tie_break is not None:
                self.tie_break.shuffle(rows)
            # Stable: rows with one sequence number and kind keep side order,
            # or the shuffled order.
            rows = _in_order(rows, RowOrder(stage.sides_in_turn, kinds=True))
            runs = []
            start = 0
            for i in range(1, len(rows) + 1):
                if i == len(rows) or rows[i][0] != rows[start][0]:
                    side = rows[start][0]
                    picked = pa.array([r[3] for r in rows[start:i]], type=pa.int64())
                    part = tables[side].take(picked).combine_chunks()
                    runs.append((side, part.to_batches()[0]))
                    start = i
            out = harness.run_batch(runs, watermark, processing_time)
            for name, value in harness.last_metrics.items():
                metrics[name] = metrics.get(name, 0) + value
            emitted.append(_as_table(stage, out, partition << _ORDER_BITS))
        self.last_metrics[stage.name] = metrics
        return pa.concat_tables(emitted)


def _in_order(
    rows: list[tuple[int, Any, str, int]], order: RowOrder
) -> list[tuple[int, Any, str, int]]:
    """A partition's ``rows`` (side, sequence number, row kind, row index)
    in ``order``, sorted as the runner's tasks sort (:class:`RowSorter`)."""
    if not rows:
        return rows
    sides, seqs, kinds, _ = zip(*rows, strict=True)
    batch = pa.record_batch(
        {
            SIDE: pa.array(sides, pa.int32()),
            SEQ: pa.array(seqs, pa.int64()),
            ROW_KIND: pa.array(kinds, pa.string()),
            "at": pa.array(range(len(rows)), pa.int64()),
        }
    )
    with RowSorter(order) as sorter:
        sorter.add(batch)
        places = [p for b in sorter.rows() for p in b.column("at").to_pylist()]
    return [rows[p] for p in places]


def _as_table(stage: Stage, rows: list[Emitted], first: int) -> pa.Table:
    """A partition's emitted rows as a table of the stage's output schema,
    ``row_kind`` and their emit order."""
    schema = output_schema(stage.operator)
    fields = stage.operator.output
    columns = list(zip(*[r for _, r in rows], strict=True)) if rows else [()] * len(fields)
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, fields, strict=True)]
    arrays.append(pa.array([k.value for k, _ in rows], type=pa.string()))
    arrays.append(pa.array(range(first, first + len(rows)), type=pa.int64()))
    return pa.Table.from_arrays(arrays, schema=schema.append(pa.field("__ord", pa.int64())))


def _plain(table: pa.Table) -> pa.Table:
    """A stage's output as the pipeline's user sees it: without emit order."""
    return table.drop_columns(["__ord"]) if "__ord" in table.column_names else table
