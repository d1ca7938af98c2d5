"""The deduplication operators through the harness on RocksDB, without Spark:
the operator's own cost per batch. Compare within a group (mini-batch against
record at a time; the three keep-first operators). The Spark comparisons are
``relstate bench --suite dedup``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from bench.suite_dedup import events, schema
from operators.dedup import Deduplicate, DropDuplicates, DropDuplicatesWithinWatermark
from operators.testing import OperatorHarness

ROWS, KEYS, BATCHES = 20_000, 10_000, 5
DELAY_MS = (KEYS // BATCHES) * 15


@pytest.fixture(scope="module")
def batches() -> list[pa.RecordBatch]:
    """The suite's data at 20,000 rows over 10,000 keys, as 5 record batches."""
    return [t.combine_chunks().to_batches()[0] for t in events(ROWS, KEYS, BATCHES)]


def _watermarks(batches: list[pa.RecordBatch]) -> list[int | None]:
    """Spark's watermark per batch (ms): max event time before it - delay."""
    marks: list[int | None] = [None]
    for b in batches[:-1]:
        latest = max(b.column("ts").cast(pa.int64()).to_pylist()) // 1000
        marks.append(max(latest - DELAY_MS, marks[-1] or 0))
    return marks


def _run(make: Callable[[], Any], batches: list[pa.RecordBatch]) -> Callable[[], int]:
    """A round: a fresh harness on RocksDB, every batch with its watermark and
    a commit; returns the rows emitted."""

    def round_() -> int:
        with OperatorHarness(make(), backend="rocksdb") as h:
            for batch, mark in zip(batches, _watermarks(batches), strict=True):
                h.process_batch(batch)
                if mark is not None:
                    h.advance_watermark(mark)
                h.commit()
            return len(h.output)

    return round_


def _bench(benchmark: BenchmarkFixture, target: Callable[[], int]) -> None:
    benchmark.pedantic(target, rounds=3)  # type: ignore[no-untyped-call]


@pytest.mark.benchmark(group="keep-last on processing time")
@pytest.mark.parametrize("mini_batch", [True, False], ids=["mini-batch", "record"])
def test_keep_last(
    benchmark: BenchmarkFixture, batches: list[pa.RecordBatch], mini_batch: bool
) -> None:
    """Keep-last with update-before: one multi-get and write per key per
    batch against a read and a write per row."""
    s = schema()
    _bench(
        benchmark,
        _run(
            lambda: Deduplicate(s, ["k"], generate_update_before=True, mini_batch=mini_batch),
            batches,
        ),
    )


@pytest.mark.benchmark(group="keep-first")
@pytest.mark.parametrize("kind", ["flink", "drop", "within"])
def test_keep_first(benchmark: BenchmarkFixture, batches: list[pa.RecordBatch], kind: str) -> None:
    """Keep-first three ways: Flink's on processing time, Spark's
    dropDuplicates(k, ts) evicting by key order, and
    dropDuplicatesWithinWatermark(k) evicting through its index."""
    s = schema()
    makers: dict[str, Callable[[], Any]] = {
        "flink": lambda: Deduplicate(s, ["k"], keep="first"),
        "drop": lambda: DropDuplicates(s, ["k", "ts"], event_time="ts"),
        "within": lambda: DropDuplicatesWithinWatermark(
            s, ["k"], event_time="ts", delay_ms=DELAY_MS
        ),
    }
    _bench(benchmark, _run(makers[kind], batches))


@pytest.mark.benchmark(group="row time")
@pytest.mark.parametrize("keep", ["first", "last"])
def test_row_time(benchmark: BenchmarkFixture, batches: list[pa.RecordBatch], keep: str) -> None:
    """Keep-first and keep-last by the event-time column, mini-batch."""
    s = schema()
    _bench(benchmark, _run(lambda: Deduplicate(s, ["k"], keep=keep, order_by="ts"), batches))
