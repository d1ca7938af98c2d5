"""transform_with_state / transform_with_state_in_pandas on Spark: a query moved
from ``grouped.transformWithState(...)`` in one line gives Spark's answer."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _processors import PandasRunningCount, RunningCount, Timeout
from pyarrow.fs import LocalFileSystem

from operators import ParquetSink
from operators._checkpoint.journal import Journal
from operators.stateful import transform_with_state, transform_with_state_in_pandas
from statestore import PartitionCheckpoint
from statestore._faults import inject

pytestmark = pytest.mark.spark

BATCHES = [
    [("a", "x"), ("b", "y"), ("a", "z")],
    [("a", "q")],
    [("c", "r"), ("b", "s")],
]


def _source(root: Path) -> Path:
    source = root / "source"
    source.mkdir(parents=True)
    for i, rows in enumerate(BATCHES):
        table = pa.table({"key": [r[0] for r in rows], "value": [r[1] for r in rows]})
        path = source / f"part-{i:03d}.parquet"
        pq.write_table(table, path)
        # Spark reads files in modification time order: make it the batch order.
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    return source


def _per_batch(spark: Any, sink: ParquetSink, columns: list[str]) -> list[Counter[tuple[Any, ...]]]:
    out: dict[int, Counter[tuple[Any, ...]]] = {}
    for r in sink.read(spark).collect():
        out.setdefault(r["batch"], Counter())[tuple(r[c] for c in columns)] += 1
    return [out.get(i, Counter()) for i in range(max(out) + 1)] if out else []


@pytest.mark.parametrize("flavour", ["rows", "pandas"])
def test_running_count_with_initial_state(spark: Any, tmp_path: Path, flavour: str) -> None:
    """A running count with initial state: Spark's counts, batch by batch."""
    source = _source(tmp_path)
    stream = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )
    initial = spark.createDataFrame([("a", 100)], "key string, start long").groupBy("key")
    sink = ParquetSink(str(tmp_path / "out"))
    call = transform_with_state if flavour == "rows" else transform_with_state_in_pandas
    processor = RunningCount() if flavour == "rows" else PandasRunningCount()
    query = call(
        stream.groupBy("key"),
        processor,
        "key string, count long",
        "Update",
        "None",
        initialState=initial,
        sink=sink,
        checkpoint=str(tmp_path / "checkpoint"),
        partitions=2,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    assert _per_batch(spark, sink, ["key", "count"]) == [
        Counter({("a", 102): 1, ("b", 1): 1}),
        Counter({("a", 103): 1}),
        Counter({("c", 1): 1, ("b", 2): 1}),
    ]


def _timeouts(
    spark: Any,
    root: Path,
    source: Path,
    clock: Any,
    trigger: dict[str, Any] | None = None,
) -> tuple[Any, ParquetSink]:
    """A Timeout(1000) query on ``source``: one file a batch, batch times from
    ``clock``; started, with its sink."""
    stream = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )
    sink = ParquetSink(str(root / "out"))
    query = transform_with_state(
        stream.groupBy("key"),
        Timeout(1000),
        "key string, count long, seen string, fired long",
        "Update",
        "ProcessingTime",
        sink=sink,
        checkpoint=str(root / "checkpoint"),
        partitions=2,
        trigger=trigger or {"availableNow": True},
        clock=clock,
    )
    return query, sink


def _all_timeouts(spark: Any, root: Path, source: Path, times: dict[int, int]) -> ParquetSink:
    query, sink = _timeouts(spark, root, source, times.__getitem__)
    query.awaitTermination()
    return sink


def test_processing_time_timers_with_clock(spark: Any, tmp_path: Path) -> None:
    """Processing-time timers fire at the batch times the clock option gives."""
    source = _source(tmp_path)
    sink = _all_timeouts(spark, tmp_path, source, {0: 10_000, 1: 10_600, 2: 11_700})
    # a's timer moved to 11_600 in batch 1 and fires in batch 2; b's (11_000)
    # would too, but batch 2's row of b moves it first: rows come before timers.
    assert _per_batch(spark, sink, ["key", "count", "seen", "fired"]) == [
        Counter(),
        Counter(),
        Counter({("a", 3, "q", 11_600): 1}),
    ]


def test_crash_between_commit_and_record_resumes_exactly(spark: Any, tmp_path: Path) -> None:
    """Killed after batch 1's state commit and output, before its record: run
    again, a processor with timers and TTL gives the uninterrupted run's output."""
    source = _source(tmp_path)
    # a's timer (10_600 + 1000) fires in batch 2, after its TTL'd value
    # (written at 10_600, 5000 ms) expired: the output shows both.
    times = {0: 10_000, 1: 10_600, 2: 16_000}
    columns = ["key", "count", "seen", "fired"]
    whole = _per_batch(spark, _all_timeouts(spark, tmp_path / "whole", source, times), columns)
    assert whole == [Counter(), Counter(), Counter({("a", 3, None, 11_600): 1})]
    crashed = tmp_path / "crashed"
    with (
        inject("runner.driver_after_sink", nth=2),
        pytest.raises(Exception, match="driver_after_sink"),
    ):
        _all_timeouts(spark, crashed, source, times)
    location = str(crashed / "checkpoint" / "state")
    assert Journal(LocalFileSystem(), location).latest() == 0
    assert any(
        PartitionCheckpoint(location, "transform_with_state", p).commits(1) for p in range(2)
    )
    sink = _all_timeouts(spark, crashed, source, times)
    assert _per_batch(spark, sink, columns) == whole


def test_timers_fire_without_input(spark: Any, tmp_path: Path) -> None:
    """ProcessingTime mode: once input stops, batches still run (Spark's no-data
    batches), so a key's idle timer fires with no new row."""
    import time

    source = tmp_path / "source"
    source.mkdir()
    pq.write_table(pa.table({"key": ["a"], "value": ["x"]}), source / "part-0.parquet")
    query, sink = _timeouts(
        spark,
        tmp_path,
        source,
        lambda batch_id: 10_000 + 600 * batch_id,
        {"processingTime": "200 milliseconds"},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not sink.committed()[1:]:
            time.sleep(0.2)
        while time.monotonic() < deadline and not any(
            r["fired"] for r in sink.read(spark).collect()
        ):
            time.sleep(0.5)
    finally:
        query.stop()
    rows = [(r["batch"], r["key"], r["count"], r["fired"]) for r in sink.read(spark).collect()]
    # Batch 0 (10_000) registers 11_000; batch 1 (10_600) has no input and
    # nothing due; batch 2 (11_200) fires it.
    assert rows == [(2, "a", 1, 11_000)]
