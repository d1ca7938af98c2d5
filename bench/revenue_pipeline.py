"""The two-stage workload that the pipeline bench and the pipeline tests run:
orders and customers as changelogs, joined on the customer (the demo's join,
:func:`operators._tools.demo.join_orders`), then revenue per customer segment.

Here too: the changelogs as streams of files (one file per table per batch),
and the chained variant's second query, which reads the join's committed
output as a stream in the order the join's partitions emitted it, as the one
query orders it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Unpack

import pyarrow as pa

from operators._api.changelog import ROW_KIND
from operators._api.operator import Operator
from operators._engine.graph import Stream
from operators._spark.pipeline import Pipeline
from operators._spark.runner import QueryOptions, RelstateQuery, run_operator
from operators._tools.demo import join_orders, read_batches, revenue_by, write_batches
from operators.aggregate import GroupAggregate
from operators.typing import BatchSink

__all__ = [
    "CUSTOMERS",
    "EMIT_ORDER",
    "ORDERS",
    "build",
    "revenue_query",
    "segment_revenue",
    "sources",
    "write_changes",
]

ORDERS = pa.schema(
    [
        ("order_id", pa.int64()),
        ("customer", pa.int64()),
        ("amount", pa.int64()),
        ("seq", pa.int64()),
    ]
)
CUSTOMERS = pa.schema([("customer", pa.int64()), ("segment", pa.string()), ("seq", pa.int64())])
#: The column that numbers the join's output rows in the order they were emitted.
EMIT_ORDER = "emit_order"
_TABLES = (("orders", ORDERS), ("customers", CUSTOMERS))


def build(
    pipeline: Pipeline, orders: Stream, customers: Stream, revenue: Operator | None = None
) -> tuple[Stream, Stream]:
    """The join stage and the revenue stage on ``pipeline``, keyed by
    ``c_segment``: ``revenue`` (default: :func:`segment_revenue`)."""
    joined = join_orders(pipeline, orders, customers)
    operator = revenue or segment_revenue(joined.schema)
    return joined, pipeline.stage(operator, joined, keys=["c_segment"])


def segment_revenue(joined: pa.Schema) -> GroupAggregate:
    """The bench's revenue stage: a ``GroupAggregate`` named ``revenue``,
    the orders and the sum of their amounts per ``c_segment``."""
    return revenue_by(joined, ["c_segment"], "revenue")


def write_changes(root: Path, changes: Sequence[tuple[pa.Table, pa.Table]]) -> None:
    """Each batch's ``(orders, customers)`` changes as one file per table
    under ``root/orders`` and ``root/customers``, in batch order."""
    write_batches(root / "orders", [o for o, _ in changes], prefix="part")
    write_batches(root / "customers", [c for _, c in changes], prefix="part")


def sources(spark: Any, root: Path, pipeline: Pipeline) -> tuple[Stream, Stream]:
    """The changelogs :func:`write_changes` wrote as ``pipeline``'s sources
    ``orders`` and ``customers``, one file per micro-batch, ordered by ``seq``."""
    orders, customers = (
        pipeline.source(
            read_batches(spark, root / name, schema.append(pa.field(ROW_KIND, pa.string()))),
            name,
            sequence="seq",
        )
        for name, schema in _TABLES
    )
    return orders, customers


def revenue_query(
    spark: Any,
    joined: str,
    revenue: Operator,
    partitions: int,
    checkpoint: str,
    sink: BatchSink,
    **options: Unpack[QueryOptions],
) -> RelstateQuery:
    """The second of two chained queries: ``revenue`` over the join's
    committed output at ``joined`` (a :class:`ParquetSink`'s path), read as a
    stream one batch per trigger, each row numbered :data:`EMIT_ORDER` in the
    order the join's partitions emitted it (one input partition per part,
    rows in file order), as the one query orders it."""
    from pyspark.sql.types import LongType, StructField, StructType

    read = (
        spark.readStream.format("relstate-output")
        .option("maxBatchesPerTrigger", 1)
        .load(joined)
        .drop("batch")
    )
    ordered = StructType([*read.schema.fields, StructField(EMIT_ORDER, LongType())])
    return run_operator(
        read.mapInArrow(_with_emit_order, ordered),
        revenue,
        keys=["c_segment"],
        partitions=partitions,
        checkpoint=checkpoint,
        sink=sink,
        sequence_column=EMIT_ORDER,
        **options,
    )


def _with_emit_order(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each row with its input partition and position, as one number: the
    order the join's partitions emitted it (one input partition per part)."""
    import numpy as np
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    position = context.partitionId() << 40
    for batch in batches:
        order = pa.array(np.arange(position, position + batch.num_rows, dtype=np.int64))
        position += batch.num_rows
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, order], names=[*batch.schema.names, EMIT_ORDER]
        )
