"""Row layout against cell layout at 4, 8 and 16 columns: the workloads of
``relstate bench`` at 100,000 rows. Compare within a group."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from bench._support import EPOCH_ROWS, Opener, cycling, pedantic
from bench.data import table_schema
from bench.workloads import get_each, insert_batch, scan_each
from encoding import ValueLayout
from statestore import StateTable

WIDTHS = (4, 8, 16)
LAYOUTS = (ValueLayout.ROW, ValueLayout.CELL)

parametrize = pytest.mark.parametrize(
    ("columns", "layout"),
    [(w, layout) for w in WIDTHS for layout in LAYOUTS],
    ids=[f"{w}cols-{layout.value}" for w in WIDTHS for layout in LAYOUTS],
)


def _group(benchmark: BenchmarkFixture, workload: str, columns: int) -> None:
    benchmark.group = f"{workload}, {columns} columns"


@parametrize
def test_write_commit(
    benchmark: BenchmarkFixture,
    opener: Opener,
    batches: Callable[[int], pa.RecordBatch],
    columns: int,
    layout: ValueLayout,
) -> None:
    """insert_batch of 10,000 rows into an empty table, then commit (relaxed)."""
    _group(benchmark, "write + commit", columns)
    part = batches(columns).slice(0, EPOCH_ROWS)
    schema = table_schema(columns, layout)
    pedantic(benchmark, insert_batch, setup=lambda: ((opener.table(schema), part, 1), {}), rounds=5)


@parametrize
def test_get_row(
    benchmark: BenchmarkFixture,
    loaded: Callable[[int, ValueLayout], StateTable],
    key_chunks: list[list[tuple[int, int]]],
    columns: int,
    layout: ValueLayout,
) -> None:
    """get_row of 1,000 random keys of a 100,000-row table."""
    _group(benchmark, "get_row", columns)
    table = loaded(columns, layout)
    chunk = cycling(key_chunks)
    benchmark(lambda: get_each(table, chunk()))


@parametrize
def test_prefix_scan(
    benchmark: BenchmarkFixture,
    loaded: Callable[[int, ValueLayout], StateTable],
    prefix_chunks: list[list[tuple[int]]],
    columns: int,
    layout: ValueLayout,
) -> None:
    """scan((group,)) of 100 random groups of ten rows."""
    _group(benchmark, "prefix scan", columns)
    table = loaded(columns, layout)
    chunk = cycling(prefix_chunks)
    benchmark(lambda: scan_each(table, chunk()))
