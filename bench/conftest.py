"""Shared data and tables for the pytest-benchmark files: the workloads of
``relstate bench`` at 100,000 rows. Not part of the test suite; run with
``python -m pytest bench/ --benchmark-only``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pytest

from bench._support import COLUMNS, CONFIG, READS, ROWS, SCANS, Opener
from bench.data import epochs, key_samples, make_batch, prefix_samples, table_schema
from bench.workloads import RawStore, insert_batch
from encoding import KeyCodec, RowCodec, ValueLayout
from statestore import StateTable


@pytest.fixture(scope="session")
def opener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Opener]:
    """The session's table opener."""
    opened = Opener(tmp_path_factory.mktemp("bench"))
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def batches() -> Callable[[int], pa.RecordBatch]:
    """The benchmark's rows at a given width, made once per width."""
    made: dict[int, pa.RecordBatch] = {}

    def get(columns: int) -> pa.RecordBatch:
        if columns not in made:
            made[columns] = make_batch(ROWS, columns, CONFIG.seed + columns)
        return made[columns]

    return get


@pytest.fixture(scope="session")
def loaded(
    opener: Opener, batches: Callable[[int], pa.RecordBatch]
) -> Callable[[int, ValueLayout], StateTable]:
    """A table of every benchmark row at a width and layout, written once."""
    made: dict[tuple[int, ValueLayout], StateTable] = {}

    def get(columns: int, layout: ValueLayout) -> StateTable:
        if (columns, layout) not in made:
            table = opener.table(table_schema(columns, layout))
            for epoch, part in enumerate(epochs(batches(columns), 10), 1):
                insert_batch(table, part, epoch)
            made[columns, layout] = table
        return made[columns, layout]

    return get


@pytest.fixture(scope="session")
def raw_loaded(opener: Opener, batches: Callable[[int], pa.RecordBatch]) -> RawStore:
    """A raw rocksdict database holding the encoded rows of the COLUMNS-wide table."""
    schema = table_schema(COLUMNS)
    store = opener.raw()
    for part in epochs(batches(COLUMNS), 10):
        store.write(KeyCodec(schema).encode_batch(part), RowCodec(schema).encode_batch(part))
    return store


@pytest.fixture(scope="session")
def key_chunks() -> list[list[tuple[int, int]]]:
    """Random primary keys, READS to a chunk."""
    rng = np.random.default_rng(1)
    return [key_samples(ROWS, READS, rng) for _ in range(20)]


@pytest.fixture(scope="session")
def prefix_chunks() -> list[list[tuple[int]]]:
    """Random one-column prefixes (groups of ten rows), SCANS to a chunk."""
    rng = np.random.default_rng(2)
    return [prefix_samples(ROWS, SCANS, rng) for _ in range(20)]
