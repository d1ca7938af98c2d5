"""``StageHarness``: run a pipeline of keyed stages batch by batch, without
Spark, over several partitions per stage.

What the Spark runner does per micro-batch, in one process: for each stage in
order, route every row of each source (a query input, or an earlier stage's
output of this batch) to its partition by the stage's keys, order each
partition's rows by the sequence column (at one number, retractions first),
feed them to that partition's :class:`~operators.testing.OperatorHarness`, and
commit. Partitions of different stages hash different keys, so a protocol
between stages (the foreign-key join's subscriptions and responses) really
crosses partitions. Spark's sort is not stable: rows that tie (one number,
one kind) may come in either order, so ``tie_break`` orders ties at random.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import pyarrow as pa

from operators._changelog import row_kinds
from operators._stages import Stage, check_stages, partition_of
from operators._task import output_schema
from operators.errors import InputError

__all__ = ["StageHarness"]


class StageHarness:
    """Runs ``stages`` over ``inputs`` query inputs, each stage on
    ``partitions`` partitions (one count, or one per stage), rows ordered by
    ``sequence_column`` (where a source names none of its own). Rows that
    tie keep their input order, side 0's first, unless ``tie_break`` is
    given: then ties come in an order it draws, as Spark's sort may give them."""

    def __init__(
        self,
        stages: Sequence[Stage],
        inputs: int,
        partitions: int | Sequence[int],
        sequence_column: str,
        backend: str = "memory",
        tie_break: random.Random | None = None,
    ) -> None:
        from operators.testing import OperatorHarness

        check_stages(stages, inputs)
        counts = [partitions] * len(stages) if isinstance(partitions, int) else list(partitions)
        if len(counts) != len(stages) or min(counts) < 1:
            raise InputError(f"give a positive partition count per stage; got {partitions!r}")
        self.stages = list(stages)
        self.inputs = inputs
        self.sequence_column = sequence_column
        self.tie_break = tie_break
        self.partitions = [
            [OperatorHarness(s.operator, backend, partition_id=p) for p in range(n)]
            for s, n in zip(stages, counts, strict=True)
        ]
        #: The last batch's counters per stage (by operator name), summed
        #: over partitions.
        self.last_metrics: dict[str, dict[str, int]] = {}

    def run_batch(self, inputs: Sequence[pa.Table | None]) -> pa.Table:
        """Run one micro-batch (one table per query input, ``None`` for no
        rows) through every stage; the last stage's output."""
        if len(inputs) != self.inputs:
            raise InputError(f"expected {self.inputs} input tables, got {len(inputs)}")
        outputs: list[pa.Table] = []
        for stage, harnesses in zip(self.stages, self.partitions, strict=True):
            outputs.append(self._run_stage(stage, harnesses, inputs, outputs))
        return outputs[-1]

    def close(self) -> None:
        """Release every partition's state (and temporary directories)."""
        for harnesses in self.partitions:
            for harness in harnesses:
                harness.close()

    def __enter__(self) -> StageHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run_stage(
        self,
        stage: Stage,
        harnesses: list[Any],
        inputs: Sequence[pa.Table | None],
        outputs: list[pa.Table],
    ) -> pa.Table:
        n = len(harnesses)
        # Per partition: (sequence, retraction last, side, row index) of every
        # row it gets: the order the Spark runner sorts in.
        routed: list[list[tuple[int, int, int, int]]] = [[] for _ in range(n)]
        tables: list[pa.Table] = []
        for side, source in enumerate(stage.sources):
            table = outputs[source.origin] if source.from_stage else inputs[source.origin]
            if table is None:
                table = pa.table({})
            tables.append(table)
            if not table.num_rows:
                continue
            keys = list(zip(*[table.column(k).to_pylist() for k in source.keys], strict=True))
            seqs = table.column(source.sequence or self.sequence_column).to_pylist()
            ranks = [int(k.is_accumulate) for k in row_kinds(table)]
            for index, (key, seq, rank) in enumerate(zip(keys, seqs, ranks, strict=True)):
                if source.drop_null_keys and any(v is None for v in key):
                    continue
                routed[partition_of(key, n)].append((seq, rank, side, index))
        metrics: dict[str, int] = {}
        emitted: list[pa.RecordBatch] = []
        for harness, rows in zip(harnesses, routed, strict=True):
            harness.output.clear()
            if self.tie_break is not None:
                self.tie_break.shuffle(rows)
            # Stable: rows with one sequence number and kind keep side order,
            # or the shuffled order.
            rows.sort(key=itemgetter(2, 0, 1) if stage.sides_in_turn else itemgetter(0, 1))
            start = 0
            for i in range(1, len(rows) + 1):
                if i == len(rows) or rows[i][2] != rows[start][2]:
                    side = rows[start][2]
                    picked = pa.array([r[3] for r in rows[start:i]], type=pa.int64())
                    part = tables[side].take(picked).combine_chunks()
                    harness.process_batch(part.to_batches()[0], side)
                    start = i
            harness.commit()
            for name, value in harness.last_metrics.items():
                metrics[name] = metrics.get(name, 0) + value
            emitted.append(_as_batch(stage, harness))
        self.last_metrics[stage.operator.name] = metrics
        return pa.Table.from_batches(emitted, schema=output_schema(stage.operator))


def _as_batch(stage: Stage, harness: Any) -> pa.RecordBatch:
    schema = output_schema(stage.operator)
    rows = harness.output
    columns = (
        list(zip(*[r for _, r in rows], strict=True)) if rows else [()] * len(stage.operator.output)
    )
    fields = stage.operator.output
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, fields, strict=True)]
    arrays.append(pa.array([k.value for k, _ in rows], type=pa.string()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
