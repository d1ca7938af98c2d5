"""StreamingJoin through the Spark runner: a full outer join of two changelog
streams, checked after every batch against Spark's own batch join."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import ParquetSink, RowKind, run_operator
from operators._tools.demo import write_batches
from operators.join import JoinType, StreamingJoin


def _pickle_by_value() -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# The condition below lives in this test module, which Spark's Python workers
# cannot import: ship it by value.
_pickle_by_value()

Row = tuple[Any, ...]
SIDE = pa.schema([("k", pa.int64()), ("v", pa.int64())])
FILES = pa.schema(
    [("k", pa.int64()), ("v", pa.int64()), ("seq", pa.int64()), ("row_kind", pa.string())]
)


def differs(left: Row, right: Row) -> bool:
    """The non-equi part of the join: l.v <> r.v."""
    return bool(left[1] != right[1])


def changelogs(batches: int, seed: int) -> tuple[list[list[list[Any]]], list[Counter[Row]]]:
    """Per side, per batch, changelog rows ``[k, v, seq, kind]`` (a sequence
    number shared by both sides), and the live rows of each side after each
    batch, as (left, right) pairs flattened: index ``2 * batch + side``."""
    rnd = random.Random(seed)
    live: list[list[Row]] = [[], []]
    files: list[list[list[Any]]] = [[], []]
    after: list[Counter[Row]] = []
    seq = 0
    for _ in range(batches):
        rows: list[list[Any]] = [[], []]
        for _ in range(60):
            side = rnd.randrange(2)
            seq += 1
            if live[side] and rnd.random() < 0.35:
                old = live[side].pop(rnd.randrange(len(live[side])))
                rows[side].append([*old, seq, RowKind.DELETE.value])
                continue
            new = (rnd.choice([1, 2, 3, 4, None]), rnd.randint(0, 3))
            live[side].append(new)
            rows[side].append([*new, seq, RowKind.INSERT.value])
        for side in (0, 1):
            files[side].append(rows[side])
            after.append(Counter(live[side]))
    return files, after


@pytest.mark.spark
class TestSparkFullOuterJoin:
    def test_each_batch_equals_sparks_batch_join(self, spark: Any, tmp_path: Path) -> None:
        """After each of 3 batches, the materialised output of a full outer
        join with a condition equals Spark SQL's join of the inputs so far."""
        batches = 3
        files, after = changelogs(batches, seed=7)
        tables = [
            [
                pa.Table.from_pylist([dict(zip(FILES.names, r, strict=True)) for r in rows], FILES)
                for rows in files[side]
            ]
            for side in (0, 1)
        ]
        join = StreamingJoin(
            JoinType.FULL, SIDE, SIDE, ["k"], ["k"], condition=differs, right_prefix="r_"
        )
        query, sink = run_join(spark, tmp_path, tables, join)
        assert len(query.history) == batches

        out = sink.read(spark).collect()
        held: Counter[Row] = Counter()
        for batch in range(batches):
            for r in out:
                if r["batch"] == batch:
                    row = (r["k"], r["v"], r["r_k"], r["r_v"])
                    held[row] += 1 if RowKind(r["row_kind"]).is_accumulate else -1
            assert all(n >= 0 for n in held.values())
            for side, name in ((0, "l"), (1, "r")):
                rows = list(after[2 * batch + side].elements())
                spark.createDataFrame(rows, "k long, v long").createOrReplaceTempView(name)
            expected = Counter(
                tuple(r)
                for r in spark.sql(
                    "SELECT l.k, l.v, r.k, r.v FROM l FULL OUTER JOIN r ON l.k = r.k AND l.v <> r.v"
                ).collect()
            )
            assert +held == expected, f"batch {batch}"
        assert query.last_metrics["numOutputRows"] > 0
        assert "left.numTotalStateRows" in query.last_metrics


def run_join(
    spark: Any, root: Path, tables: list[list[pa.Table]], join: StreamingJoin
) -> tuple[Any, ParquetSink]:
    """Write each side's ``tables`` (one file a batch, columns of the join's
    inputs plus ``seq`` and ``row_kind``) under ``root`` and run ``join`` over
    them to their end, keyed by ``k``, 2 partitions: the query and its sink."""
    from pyspark.sql.pandas.types import from_arrow_schema

    streams = []
    for side in (0, 1):
        write_batches(root / f"side{side}", tables[side], prefix="part")
        streams.append(
            spark.readStream.schema(from_arrow_schema(tables[side][0].schema))
            .option("maxFilesPerTrigger", 1)
            .parquet(str(root / f"side{side}"))
        )
    sink = ParquetSink(str(root / "out"))
    query = run_operator(
        streams,
        join,
        keys=[["k"], ["k"]],
        partitions=2,
        checkpoint=str(root / "ck"),
        sink=sink,
        sequence_column="seq",
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    return query, sink
