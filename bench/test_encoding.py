"""Keys and row values encoded and decoded a RecordBatch at a time against a
row at a time: the workloads of ``relstate bench`` at 100,000 rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from bench._support import COLUMNS, pedantic
from bench.data import rows_of, table_schema
from encoding import KeyCodec, RowCodec

SCHEMA = table_schema(COLUMNS)
KEYS = KeyCodec(SCHEMA)
VALUES = RowCodec(SCHEMA)


@pytest.fixture(scope="module")
def batch(batches: Callable[[int], pa.RecordBatch]) -> pa.RecordBatch:
    """The 100,000 benchmark rows as one RecordBatch."""
    return batches(COLUMNS)


@pytest.fixture(scope="module")
def rows(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """The same rows as tuples."""
    return rows_of(batch)


@pytest.mark.benchmark(group="key encode")
def test_key_encode_batch(benchmark: BenchmarkFixture, batch: pa.RecordBatch) -> None:
    """KeyCodec.encode_batch of 100,000 rows."""
    benchmark(KEYS.encode_batch, batch)


@pytest.mark.benchmark(group="key encode")
def test_key_encode_rows(benchmark: BenchmarkFixture, rows: list[tuple[Any, ...]]) -> None:
    """KeyCodec.encode of 100,000 key tuples, one call each."""
    pks = [SCHEMA.key_of(row) for row in rows]
    pedantic(benchmark, lambda: [KEYS.encode(pk) for pk in pks], rounds=3)


@pytest.mark.benchmark(group="value encode")
def test_value_encode_batch(benchmark: BenchmarkFixture, batch: pa.RecordBatch) -> None:
    """RowCodec.encode_batch of 100,000 rows."""
    benchmark(VALUES.encode_batch, batch)


@pytest.mark.benchmark(group="value encode")
def test_value_encode_rows(benchmark: BenchmarkFixture, rows: list[tuple[Any, ...]]) -> None:
    """RowCodec.encode of 100,000 row tuples, one call each."""
    pedantic(benchmark, lambda: [VALUES.encode(row) for row in rows], rounds=3)


@pytest.mark.benchmark(group="key decode")
def test_key_decode_batch(benchmark: BenchmarkFixture, batch: pa.RecordBatch) -> None:
    """KeyCodec.decode_batch of 100,000 keys into Arrow columns."""
    keys = KEYS.encode_batch(batch)
    benchmark(KEYS.decode_batch, keys)


@pytest.mark.benchmark(group="key decode")
def test_key_decode_rows(benchmark: BenchmarkFixture, batch: pa.RecordBatch) -> None:
    """KeyCodec.decode of 100,000 keys, one call each."""
    keys = KEYS.encode_batch(batch)
    pedantic(benchmark, lambda: [KEYS.decode(key) for key in keys], rounds=3)


@pytest.mark.benchmark(group="value decode")
def test_value_decode_batch(benchmark: BenchmarkFixture, batch: pa.RecordBatch) -> None:
    """RowCodec.decode_batch of 100,000 values into one RecordBatch."""
    values = VALUES.encode_batch(batch)
    benchmark(VALUES.decode_batch, values)


@pytest.mark.benchmark(group="value decode")
def test_value_decode_rows(benchmark: BenchmarkFixture, batch: pa.RecordBatch) -> None:
    """RowCodec.decode of 100,000 values, one call each."""
    values = VALUES.encode_batch(batch)
    pedantic(benchmark, lambda: [VALUES.decode(value) for value in values], rounds=3)
