"""Pipelines started in Spark: :class:`Pipeline` is the graph
(:class:`~operators._engine.graph.PipelineGraph`) with :meth:`Pipeline.start`;
:func:`run_fk_join` runs the foreign-key join as a pipeline of its own."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Unpack

import pyarrow as pa

from operators._engine.graph import PipelineGraph, Stream
from operators._fk_join.join import FkJoin
from operators._fk_join.spec import FK, FkJoinSpec
from operators._spark.runner import QueryOptions, RelstateQuery, start
from operators.typing import BatchSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Pipeline", "prepared", "run_fk_join"]


class Pipeline(PipelineGraph):
    """Sources and keyed stages that run in one streaming query."""

    def start(
        self,
        output: Stream,
        sink: BatchSink,
        checkpoint: str,
        partitions: int,
        more_outputs: Sequence[tuple[Stream, BatchSink]] = (),
        **options: Unpack[QueryOptions],
    ) -> RelstateQuery:
        """Start the streaming query that runs the pipeline; ``output``'s rows
        (with ``row_kind``) go to ``sink`` each batch, and each further
        ``(stream, sink)`` of ``more_outputs`` likewise, all written before the
        batch is recorded and committed after. ``options`` are
        :class:`~operators.QueryOptions`; see :func:`operators.run_operator`
        for the other arguments."""
        return start(self, output, sink, checkpoint, partitions, more_outputs, **options)


def prepared(left: DataFrame, join: FkJoinSpec) -> DataFrame:
    """The left changelog with each row's FK (:meth:`FkJoin.keyed_left`): a
    column FK is a projection of Spark's; a function FK runs in Spark's
    Python workers, once per row, before the shuffle."""
    if isinstance(join.foreign_key, str):
        column = join.foreign_key.replace("`", "``")
        return left.selectExpr("*", f"`{column}` AS `{FK}`")
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    schema = join.keyed_schema(to_arrow_schema(left.schema))

    def keyed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield join.keyed_left(batch)

    return left.mapInArrow(keyed, from_arrow_schema(schema))


def run_fk_join(
    left: DataFrame,
    right: DataFrame,
    join: FkJoin,
    partitions: int,
    checkpoint: str,
    sink: BatchSink,
    **options: Unpack[QueryOptions],
) -> RelstateQuery:
    """Run the foreign-key ``join`` of two streaming changelogs in Spark: a
    two-stage :class:`~operators.Pipeline` (:meth:`FkJoin.add_to`).

    ``left`` has ``join.left``'s columns, ``right`` ``join.right``'s, both
    the sequence column and a ``row_kind`` column (docs/operators/fk-join.md:
    the left changelog must carry before-images). ``sink`` gets the upsert
    changelog keyed by the left key. ``options`` are
    :class:`~operators.QueryOptions`; the other arguments are
    :func:`operators.run_operator`'s.
    """
    pipeline = Pipeline()
    left_stream = pipeline.source(prepared(left, join), "left", sequence=join.sequence_column)
    right_stream = pipeline.source(right, "right", sequence=join.sequence_column)
    output = join.add_to(pipeline, left_stream, right_stream)
    return pipeline.start(output, sink, checkpoint, partitions, **options)
