"""`relstate repartition` end to end through the runner, for the project's
own operators: two batches on 2 partitions, repartition to 3, the rest on 3
partitions; every batch's output equals an undisturbed run on 2 partitions.

The undisturbed run takes every file at once; the repartitioned one gets its
later files after the repartition, each newer than the last, so both run the
same batches with the same watermarks (the runner's records keep them)."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators import ParquetSink, Watermark, run_operator
from operators._api.operator import Operator
from operators._tools.demo import write_batches
from operators._tools.repartition import repartition
from operators.dedup import DropDuplicates, DropDuplicatesWithinWatermark
from operators.join import AppendJoin, StreamingJoin, TimeRange
from tests.operators.dedup.test_drop_duplicates_spark import events_schema, random_batches
from tests.operators.join.test_append_join_spark import _data, _schema

pytestmark = pytest.mark.spark

BEFORE = 2
#: Output rows per batch, as multisets.
Batches = list[Counter[tuple[Any, ...]]]


def _append(directory: Path, batches: list[pa.Table], first: int, prefix: str) -> None:
    """Write batches ``first``.. as files newer than any already there."""
    now = time.time()
    for i, table in enumerate(batches[first:], start=first):
        path = directory / f"{prefix}-{i:04d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (now + i, now + i))


def _run(
    spark: Any,
    work: Path,
    operator: Operator,
    read_schema: pa.Schema,
    keys: list[str],
    partitions: int,
    watermarks: dict[int, Watermark],
    batches: int,
) -> Batches:
    """Run ``operator`` over ``work/input<i>`` and return the sink's rows of
    batches ``0..batches-1``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    streams = [
        spark.readStream.schema(from_arrow_schema(read_schema))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / f"input{i}"))
        for i in range(len(operator.inputs))
    ]
    sink = ParquetSink(str(work / "output"))
    query = run_operator(
        streams if len(streams) > 1 else streams[0],
        operator,
        keys=keys,
        partitions=partitions,
        checkpoint=str(work / "checkpoint"),
        sink=sink,
        watermarks=watermarks,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    out: dict[int, Counter[tuple[Any, ...]]] = {}
    names = ["row_kind", *operator.output.names]
    for r in sink.read(spark).collect():
        out.setdefault(r["batch"], Counter())[tuple(r[n] for n in names)] += 1
    assert query.history and query.history[-1]["batch_id"] == batches - 1
    return [out.get(i, Counter()) for i in range(batches)]


def _undisturbed_and_repartitioned(
    spark: Any,
    root: Path,
    make: Callable[[str], Operator],
    inputs: list[list[pa.Table]],
    read_schema: pa.Schema,
    keys: list[str],
    watermarks: dict[int, Watermark],
) -> tuple[Batches, Batches]:
    """Each batch's rows of an undisturbed run on 2 partitions, and of a run
    repartitioned from 2 to 3 after batch ``BEFORE - 1``."""
    tz = spark.conf.get("spark.sql.session.timeZone")
    whole, split = root / "whole", root / "split"
    for i, batches in enumerate(inputs):
        write_batches(whole / f"input{i}", batches, prefix="part")
        write_batches(split / f"input{i}", batches[:BEFORE], prefix="part")
    n = len(inputs[0])
    expected = _run(spark, whole, make(tz), read_schema, keys, 2, watermarks, n)
    first = _run(spark, split, make(tz), read_schema, keys, 2, watermarks, BEFORE)
    result = repartition(str(split / "checkpoint"), 3)
    assert (result.old_partitions, result.new_partitions) == (2, 3)
    for i, batches in enumerate(inputs):
        _append(split / f"input{i}", batches, BEFORE, prefix="part")
    got = _run(spark, split, make(tz), read_schema, keys, 3, watermarks, n)
    assert got[:BEFORE] == first
    return expected, got


class TestResumeAfterRepartition:
    @pytest.mark.parametrize("within", [True, False], ids=["withinWatermark", "dropDuplicates"])
    def test_deduplication(self, spark: Any, tmp_path: Path, within: bool) -> None:
        """DropDuplicatesWithinWatermark (its expiry index keyed by expiry
        time first) and DropDuplicates with eviction (its rows keyed by event
        time first) output the same rows per batch after a repartition: keys
        stored before it still expire, and duplicates of them are dropped."""

        def make(tz: str) -> Operator:
            schema = events_schema(tz)
            if within:
                return DropDuplicatesWithinWatermark(schema, ["k"], event_time="ts", delay_ms=150)
            return DropDuplicates(schema, ["k", "ts"], event_time="ts")

        batches = random_batches(seed=11 if within else 7)
        expected, got = _undisturbed_and_repartitioned(
            spark,
            tmp_path,
            make,
            [batches],
            events_schema("UTC"),
            ["k"],
            {0: Watermark("ts", 150)},
        )
        assert len(expected) == len(batches) and sum(map(len, expected[BEFORE:])) > 0
        assert got == expected

    @pytest.mark.parametrize("kind", ["append", "streaming_ttl"])
    def test_joins(self, spark: Any, tmp_path: Path, kind: str) -> None:
        """AppendJoin (rows keyed by time first, per-side floors) and StreamingJoin with a
        TTL (per-side sweep times) output the same rows per batch after a
        repartition: rows stored before it still match, and AppendJoin still
        evicts and pads them."""

        def make(tz: str) -> Operator:
            schema = _schema(tz)
            if kind == "append":
                return AppendJoin(
                    schema,
                    schema,
                    ["k"],
                    ["k"],
                    "ts",
                    "ts",
                    TimeRange(2_000, 3_000),
                    "full",
                    left_prefix="l_",
                    right_prefix="r_",
                )
            return StreamingJoin(
                "inner",
                schema,
                schema,
                ["k"],
                ["k"],
                left_ttl_ms=3_600_000,
                right_ttl_ms=3_600_000,
                left_prefix="l_",
                right_prefix="r_",
            )

        left, right = _data(seed=5)
        watermarks = (
            {0: Watermark("ts", 1_000), 1: Watermark("ts", 2_000)} if kind == "append" else {}
        )
        expected, got = _undisturbed_and_repartitioned(
            spark, tmp_path, make, [left, right], _schema("UTC"), ["k"], watermarks
        )
        assert len(expected) == len(left) and sum(map(len, expected[BEFORE:])) > 0
        assert got == expected
