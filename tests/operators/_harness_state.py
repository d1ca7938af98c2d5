"""A query's state location built without Spark: each partition run in an
:class:`~operators.testing.OperatorHarness` on a real store, with the
runner's records of each batch, so that the state readers can be tested on
state of any operator for the cost of the harness alone."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from encoding import TableSchema
from operators import Operator, OperatorContext, RowKind
from operators._checkpoint.journal import RUNNER
from operators._engine.spark_hash import spark_partition
from operators.dedup import DropDuplicates
from operators.join import AppendJoin, JoinType, StreamingJoin, TimeRange
from operators.testing import OperatorHarness
from statestore import PartitionCheckpoint

__all__ = [
    "TYPED",
    "Feed",
    "LatestRow",
    "append_feed",
    "append_join",
    "dedup_feed",
    "drop_duplicates",
    "evicting_dedup",
    "evicting_feed",
    "harness_state",
    "join_feed",
    "streaming_join",
    "typed_feed",
    "typed_row",
]

#: Feeds batch ``batch`` of partition ``partition`` into the harness.
Feed = Callable[[OperatorHarness, int, int], object]


def harness_state(
    root: Path,
    make: Callable[[], Operator],
    feed: Feed,
    partitions: int = 2,
    batches: int = 3,
    key_types: list[list[str]] | None = None,
) -> Path:
    """Run ``make()`` on ``partitions`` partitions for ``batches`` batches,
    ``feed`` giving each its input, and record every batch as the runner
    does (its query, and each batch's winning commits); the state location."""
    name = make().name
    state = root / "checkpoint"
    for partition in range(partitions):
        with OperatorHarness(make(), "rocksdb", root, partition_id=partition) as harness:
            for batch in range(batches):
                feed(harness, partition, batch)
                harness.commit()
    runner = state / RUNNER
    (runner / "batches").mkdir(parents=True)
    query = {"operator": name, "partitions": partitions, "key_types": key_types or [["string"]]}
    (runner / "query.json").write_text(json.dumps(query))
    for batch in range(batches):
        winners = {
            str(p): PartitionCheckpoint(str(state), name, p).commits(batch)[0]
            for p in range(partitions)
        }
        record = {"batch_id": batch, "winners": winners, "watermark": None, "metrics": {}}
        (runner / "batches" / f"{batch:020d}.json").write_text(json.dumps(record))
    return state


# -- operators and feeds for the readers' tests --------------------------------------

SIDE = pa.schema([("k", pa.int64()), ("v", pa.int64())])
EVENTS = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("us")), ("v", pa.int64())])


def _mine(keys: Iterable[int], partition: int, partitions: int = 2) -> list[int]:
    """The keys Spark hashes to ``partition``."""
    return [k for k in keys if spark_partition([k], [pa.int64()], partitions) == partition]


def streaming_join() -> StreamingJoin:
    return StreamingJoin(JoinType.INNER, SIDE, SIDE, ["k"], ["k"], right_prefix="r_")


def join_feed(harness: OperatorHarness, partition: int, batch: int) -> None:
    """Left rows for keys 0..19, right rows for keys 10..29, a few of each
    batch's earlier left rows deleted."""
    left = [(k, batch) for k in _mine(range(20), partition)]
    harness.process_rows(left, side=0)
    harness.process_rows([(k, batch) for k in _mine(range(10, 30), partition)], side=1)
    if batch:
        gone = [(k, batch - 1) for k in _mine(range(0, 20, 3), partition)]
        harness.process_rows(gone, ["-D"] * len(gone), side=0)


def append_join() -> AppendJoin:
    return AppendJoin(
        EVENTS, EVENTS, ["k"], ["k"], "ts", "ts", TimeRange(10**9, 10**9), right_prefix="r_"
    )


def append_feed(harness: OperatorHarness, partition: int, batch: int) -> None:
    """Each side's events, one per key and batch, a second apart."""
    at = dt.datetime(2024, 1, 1) + dt.timedelta(seconds=batch)
    for side, keys in ((0, range(12)), (1, range(6, 18))):
        harness.process_rows([(k, at, batch) for k in _mine(keys, partition)], side=side)


def drop_duplicates() -> DropDuplicates:
    return DropDuplicates(SIDE, ["k"])


def dedup_feed(harness: OperatorHarness, partition: int, batch: int) -> None:
    """Keys 0..(10 + 5 * batch), each batch repeating the earlier ones."""
    harness.process_rows([(k, batch) for k in _mine(range(10 + 5 * batch), partition)])


#: A row of every column type the readers must keep.
TYPED = pa.schema(
    [
        ("k", pa.int64()),
        ("name", pa.string()),
        ("at", pa.timestamp("us")),
        ("day", pa.date32()),
        ("amount", pa.decimal128(12, 3)),
        ("blob", pa.binary()),
        ("flag", pa.bool_()),
        ("ratio", pa.float64()),
        ("small", pa.int32()),
    ]
)


class LatestRow(Operator):
    """Keeps the latest row of each key ``k`` in table ``rows``, every column
    type of :data:`TYPED`; emits nothing."""

    def __init__(self, schema: pa.Schema = TYPED, name: str = "latest", layout: str = "row"):
        self.name = name
        self.inputs = [schema]
        self.output = pa.schema([("k", pa.int64())])
        self.tables = [TableSchema(1, schema, ["k"], layout=layout, name="rows")]

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        ctx.table("rows").upsert(row)


def typed_row(k: int, batch: int) -> tuple[Any, ...]:
    """A row of :data:`TYPED` with a value of each type (nulls in some)."""
    return (
        k,
        f"name-{k}-{batch}",
        dt.datetime(2024, 2, 29, 12, 30) + dt.timedelta(microseconds=k * 1001 + batch),
        dt.date(1970, 1, 1) + dt.timedelta(days=k * 400 - 3000),
        decimal.Decimal(f"{k * 1000 + batch}.{k % 1000:03d}") * (-1 if k % 2 else 1),
        None if k % 5 == 0 else bytes([k % 256, 0, 255, batch % 256]),
        None if k % 7 == 0 else k % 2 == 0,
        k / 7 + batch,
        -(2**31) + k if k % 3 == 0 else k,
    )


def typed_feed(harness: OperatorHarness, partition: int, batch: int) -> None:
    """Keys 0..15 in batch 0; each later batch b updates every other key,
    inserts key 15 + b and deletes key b - 1."""
    keys = range(16) if batch == 0 else [*range(batch % 2, 16, 2), 15 + batch]
    harness.process_rows([typed_row(k, batch) for k in _mine(keys, partition)])
    for k in _mine(range(batch - 1, batch) if batch else [], partition):
        harness.table("rows").delete_key([k])


def evicting_dedup() -> DropDuplicates:
    return DropDuplicates(EVENTS, ["k", "ts"], event_time="ts")


def evicting_feed(harness: OperatorHarness, partition: int, batch: int) -> None:
    """Events a second apart per batch, repeated once; the watermark a second
    behind, so that every batch evicts (a range delete) the one before last."""
    at = dt.datetime(2024, 1, 1) + dt.timedelta(seconds=batch)
    rows = [(k, at, batch) for k in _mine(range(8), partition)]
    harness.process_rows(rows + rows)
    epoch_ms = int((at - dt.datetime(1970, 1, 1)).total_seconds() * 1000)
    harness.advance_watermark(epoch_ms - 1000)
