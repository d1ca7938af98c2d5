"""The operations the benchmark times, on a StateTable and on raw rocksdict.

``relstate bench`` and the pytest-benchmark files in ``bench/`` call these same
functions, so both measure the same work. The raw side gets keys and values
already encoded: it is the floor that StateTable's own work is measured against.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import rocksdict

from encoding import prefix_successor
from statestore import RocksDBConfig, StateTable

__all__ = [
    "RawStore",
    "get_each",
    "get_many",
    "insert_batch",
    "insert_rows",
    "scan_each",
]

Key = Sequence[Any]


def insert_batch(table: StateTable, batch: pa.RecordBatch, epoch: int) -> None:
    """Insert a record batch and commit it as ``epoch``."""
    table.insert_batch(batch)
    table.commit(epoch)


def insert_rows(table: StateTable, rows: Sequence[tuple[Any, ...]], epoch: int) -> None:
    """Insert row tuples one by one and commit them as ``epoch``."""
    insert = table.insert
    for row in rows:
        insert(row)
    table.commit(epoch)


def get_each(table: StateTable, keys: Sequence[Key]) -> list[Any]:
    """``get_row`` of every key."""
    get_row = table.get_row
    return [get_row(key) for key in keys]


def get_many(table: StateTable, keys: Sequence[Key], size: int) -> list[Any]:
    """``get_rows`` of the keys, ``size`` keys a call."""
    return [table.get_rows(keys[i : i + size]) for i in range(0, len(keys), size)]


def scan_each(table: StateTable, prefixes: Sequence[Key]) -> list[Any]:
    """Every row under each prefix, one scan a prefix."""
    scan = table.scan
    return [list(scan(prefix)) for prefix in prefixes]


class RawStore:
    """rocksdict with the options a :class:`~statestore.RocksDBBackend` of the
    same config gets, driven with pre-encoded keys and values."""

    def __init__(self, path: Path, config: RocksDBConfig) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.db = rocksdict.Rdict(str(path), config.to_options())
        self._write_opts = rocksdict.WriteOptions()
        # A property at run time; rocksdict's stub calls it a method.
        self._write_opts.disable_wal = config.disable_wal  # type: ignore[method-assign, assignment]
        self._open = True

    def write(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Put every pair in one atomic write batch."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        put = batch.put
        for key, value in zip(keys, values, strict=True):
            put(key, value)
        self.db.write(batch, self._write_opts)

    def write_read_once(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """One multi-get of every key (what is stored there), then :meth:`write`:
        the reads a relaxed commit, or a strict ``insert_batch``, makes."""
        self.db.get(list(keys))
        self.write(keys, values)

    def put_each_read(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """A get before each put (refusing a key that is stored), then one
        write: the reads a strict per-row ``insert`` makes."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        put, get = batch.put, self.db.get
        for key, value in zip(keys, values, strict=True):
            if get(key) is not None:
                raise KeyError(key)
            put(key, value)
        self.db.write(batch, self._write_opts)

    def get_each(self, keys: Sequence[bytes]) -> list[Any]:
        """One get a key."""
        get = self.db.get
        return [get(key) for key in keys]

    def get_many(self, keys: Sequence[bytes], size: int) -> list[Any]:
        """One multi-get of ``size`` keys at a time."""
        get = self.db.get
        return [get(list(keys[i : i + size])) for i in range(0, len(keys), size)]

    def scan_each(self, prefixes: Sequence[bytes]) -> list[list[tuple[Any, Any]]]:
        """The raw pairs under each key prefix, through ONE iterator that seeks
        to each prefix and steps until a key leaves it: no iterator or read
        options built per scan (the fastest raw scan of a short range)."""
        it = self.db.iter(rocksdict.ReadOptions())
        seek, valid, key, value, step = it.seek, it.valid, it.key, it.value, it.next
        out = []
        for prefix in prefixes:
            upper = prefix_successor(prefix)
            rows = []
            seek(prefix)
            while valid():
                k = key()
                if upper is not None and k >= upper:
                    break
                rows.append((k, value()))
                step()
            out.append(rows)
        del it
        return out

    def close(self) -> None:
        """Close the database and delete its directory (once; later calls do nothing)."""
        if self._open:
            self._open = False
            self.db.close()
            shutil.rmtree(self.path, ignore_errors=True)
