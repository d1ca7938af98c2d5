"""StateTable against raw rocksdict given pre-encoded keys and values: the
workloads of ``relstate bench`` at 100,000 rows. Compare within a group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from bench._support import COLUMNS, EPOCH_ROWS, Opener, cycling, pedantic
from bench.data import rows_of, table_schema
from bench.workloads import (
    RawStore,
    get_each,
    get_many,
    insert_batch,
    insert_rows,
    scan_each,
)
from encoding import KeyCodec, RowCodec, ValueLayout
from statestore import ConsistencyMode, StateTable

SCHEMA = table_schema(COLUMNS)
MULTI_GET = 1_000
MODES = list(ConsistencyMode)


@pytest.fixture(scope="module")
def epoch_batch(batches: Callable[[int], pa.RecordBatch]) -> pa.RecordBatch:
    """The first EPOCH_ROWS benchmark rows."""
    return batches(COLUMNS).slice(0, EPOCH_ROWS)


@pytest.fixture(scope="module")
def reader(loaded: Callable[[int, ValueLayout], StateTable]) -> StateTable:
    """The row-layout table holding every benchmark row."""
    return loaded(COLUMNS, ValueLayout.ROW)


def _raw_keys(chunks: list[list[Any]]) -> list[list[bytes]]:
    codec = KeyCodec(SCHEMA)
    return [[codec.encode(key) for key in chunk] for chunk in chunks]


@pytest.mark.benchmark(group="insert + commit")
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_insert_batch_commit(
    benchmark: BenchmarkFixture, opener: Opener, epoch_batch: pa.RecordBatch, mode: ConsistencyMode
) -> None:
    """insert_batch of 10,000 rows into an empty table, then commit."""
    pedantic(
        benchmark,
        insert_batch,
        setup=lambda: ((opener.table(SCHEMA, mode), epoch_batch, 1), {}),
        rounds=5,
    )


@pytest.mark.benchmark(group="insert + commit")
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_insert_rows_commit(
    benchmark: BenchmarkFixture, opener: Opener, epoch_batch: pa.RecordBatch, mode: ConsistencyMode
) -> None:
    """insert of 10,000 row tuples one by one into an empty table, then commit."""
    rows = rows_of(epoch_batch)
    pedantic(
        benchmark, insert_rows, setup=lambda: ((opener.table(SCHEMA, mode), rows, 1), {}), rounds=5
    )


@pytest.mark.benchmark(group="insert + commit")
def test_raw_write_batch(
    benchmark: BenchmarkFixture, opener: Opener, epoch_batch: pa.RecordBatch
) -> None:
    """Raw: one WriteBatch of 10,000 pre-encoded pairs into an empty database."""
    keys = KeyCodec(SCHEMA).encode_batch(epoch_batch)
    values = RowCodec(SCHEMA).encode_batch(epoch_batch)
    pedantic(benchmark, RawStore.write, setup=lambda: ((opener.raw(), keys, values), {}), rounds=5)


@pytest.mark.benchmark(group="insert + commit")
def test_raw_write_read_once(
    benchmark: BenchmarkFixture, opener: Opener, epoch_batch: pa.RecordBatch
) -> None:
    """Raw: one multi-get of the 10,000 keys, then one WriteBatch of the pairs
    (the reads of relaxed mode's commit and of a strict insert_batch)."""
    keys = KeyCodec(SCHEMA).encode_batch(epoch_batch)
    values = RowCodec(SCHEMA).encode_batch(epoch_batch)
    pedantic(
        benchmark,
        RawStore.write_read_once,
        setup=lambda: ((opener.raw(), keys, values), {}),
        rounds=5,
    )


@pytest.mark.benchmark(group="insert + commit")
def test_raw_put_each_read(
    benchmark: BenchmarkFixture, opener: Opener, epoch_batch: pa.RecordBatch
) -> None:
    """Raw: a get before each of 10,000 puts, then one write (a strict insert's reads)."""
    keys = KeyCodec(SCHEMA).encode_batch(epoch_batch)
    values = RowCodec(SCHEMA).encode_batch(epoch_batch)
    pedantic(
        benchmark,
        RawStore.put_each_read,
        setup=lambda: ((opener.raw(), keys, values), {}),
        rounds=5,
    )


@pytest.mark.benchmark(group="get_row")
def test_get_row(
    benchmark: BenchmarkFixture, reader: StateTable, key_chunks: list[list[tuple[int, int]]]
) -> None:
    """get_row of 1,000 random keys of a 100,000-row table."""
    chunk = cycling(key_chunks)
    benchmark(lambda: get_each(reader, chunk()))


@pytest.mark.benchmark(group="get_row")
def test_raw_get(
    benchmark: BenchmarkFixture, raw_loaded: RawStore, key_chunks: list[list[tuple[int, int]]]
) -> None:
    """Raw: db.get of the same 1,000 keys, pre-encoded."""
    chunk = cycling(_raw_keys(key_chunks))
    benchmark(lambda: raw_loaded.get_each(chunk()))


@pytest.mark.benchmark(group="get_rows")
def test_get_rows(
    benchmark: BenchmarkFixture, reader: StateTable, key_chunks: list[list[tuple[int, int]]]
) -> None:
    """get_rows of 1,000 random keys in one call."""
    chunk = cycling(key_chunks)
    benchmark(lambda: get_many(reader, chunk(), MULTI_GET))


@pytest.mark.benchmark(group="get_rows")
def test_raw_multi_get(
    benchmark: BenchmarkFixture, raw_loaded: RawStore, key_chunks: list[list[tuple[int, int]]]
) -> None:
    """Raw: one multi-get db.get([keys]) of the same 1,000 keys, pre-encoded."""
    chunk = cycling(_raw_keys(key_chunks))
    benchmark(lambda: raw_loaded.get_many(chunk(), MULTI_GET))


@pytest.mark.benchmark(group="prefix scan")
def test_scan(
    benchmark: BenchmarkFixture, reader: StateTable, prefix_chunks: list[list[tuple[int]]]
) -> None:
    """scan((group,)) of 100 random groups of ten rows."""
    chunk = cycling(prefix_chunks)
    benchmark(lambda: scan_each(reader, chunk()))


@pytest.mark.benchmark(group="prefix scan")
def test_raw_scan(
    benchmark: BenchmarkFixture, raw_loaded: RawStore, prefix_chunks: list[list[tuple[int]]]
) -> None:
    """Raw: one iterator seeking to each of the same 100 prefixes in turn."""
    chunk = cycling(_raw_keys(prefix_chunks))
    benchmark(lambda: raw_loaded.scan_each(chunk()))
