"""Sizes and helpers shared by the pytest-benchmark files."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_benchmark.fixture import BenchmarkFixture

from bench.config import BenchConfig
from bench.workloads import RawStore
from encoding import TableSchema
from statestore import ConsistencyMode, RocksDBBackend, StateTable

ROWS = 100_000
COLUMNS = 8
#: Rows written by one round of a write benchmark.
EPOCH_ROWS = 10_000
#: Point reads, and prefix scans, in one call of a read benchmark.
READS = 1_000
SCANS = 100
CONFIG = BenchConfig(rows=ROWS)


class Opener:
    """Opens StateTables and raw stores in fresh directories; closes them all at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.counter = itertools.count()
        self.tables: list[StateTable] = []
        self.raws: list[RawStore] = []

    def table(
        self, schema: TableSchema, mode: ConsistencyMode = ConsistencyMode.RELAXED
    ) -> StateTable:
        """A new, empty StateTable on RocksDB."""
        backend = RocksDBBackend(self.root / f"db{next(self.counter)}", CONFIG.rocksdb)
        table = StateTable(schema, backend, mode)
        self.tables.append(table)
        return table

    def raw(self) -> RawStore:
        """A new, empty raw rocksdict database."""
        store = RawStore(self.root / f"db{next(self.counter)}", CONFIG.rocksdb)
        self.raws.append(store)
        return store

    def close(self) -> None:
        """Close every table and store opened here."""
        for table in self.tables:
            table.backend.close()
        for store in self.raws:
            store.close()


def cycling(chunks: list[Any]) -> Callable[[], Any]:
    """A function that returns the next chunk each call, round and round."""
    return itertools.cycle(chunks).__next__


def pedantic(
    benchmark: BenchmarkFixture,
    target: Callable[..., object],
    setup: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
    rounds: int = 5,
) -> None:
    """``benchmark.pedantic``: ``rounds`` calls of ``target``, each after an
    untimed ``setup()`` that gives its arguments; a StateTable or raw store
    among them is closed after its round."""
    benchmark.pedantic(  # type: ignore[no-untyped-call]
        target, setup=setup, teardown=_close_stores, rounds=rounds
    )


def _close_stores(*args: Any) -> None:
    for arg in args:
        if isinstance(arg, StateTable):
            arg.backend.close()
        elif isinstance(arg, RawStore):
            arg.close()
