"""The RocksDB backend, through rocksdict in raw (bytes) mode.

rocksdict raises bare ``Exception`` with text; :func:`_wrapped` is the one place
that turns it into relstate's typed errors.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
import rocksdict

from statestore._typing import WriteOp
from statestore._writes import Writes
from statestore.errors import (
    BackendClosedError,
    BackendError,
    CorruptionError,
    LockHeldError,
)

__all__ = ["RocksDBBackend", "RocksDBConfig"]


@dataclass(frozen=True)
class RocksDBConfig:
    """RocksDB settings; :meth:`to_options` is the only place they become
    ``rocksdict.Options``.

    The block cache is shared by every backend in the process that asks for the
    same size, as Spark's RocksDB state store shares one per executor.
    """

    block_cache_bytes: int = 64 * 1024 * 1024
    block_size: int = 16 * 1024
    bloom_bits_per_key: int = 10
    write_buffer_bytes: int = 64 * 1024 * 1024
    max_write_buffers: int = 3
    compression: str = "lz4"
    background_jobs: int = 2
    #: The write-ahead log is off by default: durability comes from the
    #: checkpoint, and the local database is only a cache of it.
    disable_wal: bool = True
    #: Info logs (``LOG``, ``LOG.old.*``) kept in the database's directory.
    #: RocksDB starts a new one at every open, about 30 KB of its options, and
    #: by default keeps 1,000: a task opens its partition's database every
    #: batch, so a local cache would grow by that much a batch to about 30 MB.
    info_log_files: int = 2

    def __post_init__(self) -> None:
        if self.info_log_files < 1:
            raise ValueError(f"info_log_files must be at least 1, got {self.info_log_files}")

    def to_options(self) -> rocksdict.Options:
        """Build the rocksdict options for this configuration."""
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_max_background_jobs(self.background_jobs)
        opts.set_write_buffer_size(self.write_buffer_bytes)
        opts.set_max_write_buffer_number(self.max_write_buffers)
        opts.set_compression_type(_compression(self.compression))
        opts.set_keep_log_file_num(self.info_log_files)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(_shared_cache(self.block_cache_bytes))
        table.set_block_size(self.block_size)
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        # Index and filter blocks live in the block cache, so memory stays
        # bounded by it; partitioned, so that no single block outgrows a cache
        # shard. Unpartitioned, a table of ~1M keys has a filter larger than a
        # shard of the default cache, which then re-reads it from the file on
        # every get (83 us a get at 3M keys, against 7 us partitioned).
        table.set_cache_index_and_filter_blocks(True)
        table.set_partition_filters(True)
        table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
        table.set_pin_top_level_index_and_filter(True)
        opts.set_block_based_table_factory(table)
        return opts


def _compression(name: str) -> rocksdict.DBCompressionType:
    makers = {
        "none": rocksdict.DBCompressionType.none,
        "snappy": rocksdict.DBCompressionType.snappy,
        "lz4": rocksdict.DBCompressionType.lz4,
        "zstd": rocksdict.DBCompressionType.zstd,
    }
    if name not in makers:
        raise ValueError(f"compression must be one of {sorted(makers)}, got {name!r}")
    return makers[name]()


_caches: dict[int, rocksdict.Cache] = {}
_caches_lock = threading.Lock()


def _shared_cache(size: int) -> rocksdict.Cache:
    with _caches_lock:
        cache = _caches.get(size)
        if cache is None:
            cache = _caches[size] = rocksdict.Cache(size)
        return cache


def _raise_typed(exc: Exception, action: str, path: str) -> NoReturn:
    """Translate one rocksdict exception into a typed relstate error."""
    text = str(exc)
    where = f"RocksDB at {path}: {action} failed: {text}"
    if isinstance(exc, rocksdict.DbClosedError):
        raise BackendClosedError(f"{where}; the backend was closed") from exc
    if "lock" in text.lower() and ("hold" in text.lower() or "LOCK" in text):
        raise LockHeldError(
            f"{where}; another open handle holds the lock: close it (and every "
            "iterator on it) first"
        ) from exc
    if "Corruption" in text or "checksum" in text.lower():
        raise CorruptionError(f"{where}; the local files are damaged") from exc
    raise BackendError(where) from exc


@contextlib.contextmanager
def _wrapped(action: str, path: str) -> Iterator[None]:
    try:
        yield
    except (BackendError, KeyboardInterrupt):
        raise
    except Exception as exc:  # rocksdict raises bare Exception
        _raise_typed(exc, action, path)


def _below(upper: bytes | None) -> rocksdict.ReadOptions:
    """Read options that stop an iterator before ``upper`` (``None``: never).
    The options must outlive the iterator: its bound is not copied."""
    read_opts = rocksdict.ReadOptions()
    if upper is not None:
        read_opts.set_iterate_upper_bound(upper)
    return read_opts


def _bounded(method: Any, lower: bytes, upper: bytes | None, path: str) -> Iterator[Any]:
    """Iterate ``method(from_key=lower)`` below ``upper``; this generator
    holds the read options until iteration ends."""
    read_opts = _below(upper)
    try:
        yield from method(from_key=lower, read_opt=read_opts)
    except BackendError:
        raise
    except Exception as exc:  # rocksdict raises bare Exception
        _raise_typed(exc, "iterate", path)


def _read_all(method: Any, lower: bytes, upper: bytes | None, path: str) -> list[Any]:
    """``list(method(from_key=lower))`` below ``upper``: rocksdict fills the
    list in one call, where a generator would take a Python step per item."""
    read_opts = _below(upper)
    with _wrapped("iterate", path):
        return list(method(from_key=lower, read_opt=read_opts))


#: A write of at least this many keys in order goes to RocksDB as a sorted
#: file it takes in whole (``ingest_external_file``), rather than one put
#: after another into its MemTable, which the flush at close writes to a
#: file again. Below it, the file's fixed cost (its own fsync and the
#: manifest's) outweighs that; at about this size the two are even.
INGEST_AT = 16_384


def _write_file(path: str, options: rocksdict.Options, ops: Writes) -> None:
    """Write ``ops`` (keys ascending) to a new SST file at ``path``: the
    deletes as tombstones, the puts as values."""
    writer = rocksdict.SstFileWriter(options)
    writer.open(path)
    keys, values = ops.keys.to_pylist(), ops.values.to_pylist()
    put, delete = writer.__setitem__, writer.__delitem__
    if ops.values.null_count:
        for key, value in zip(keys, values, strict=True):
            if value is None:
                delete(key)
            else:
                put(key, value)
    else:
        deque(map(put, keys, values), maxlen=0)
    writer.finish()


def _any_within(keys: pa.Array, ranges: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether a key of ``keys`` (ascending) lies in one of ``ranges``
    (``[start, end)``): a binary search per range."""
    for start, end in ranges:
        first = bisect.bisect_left(keys, start, key=methodcaller("as_py"))  # first key ≥ start
        if first < len(keys) and keys[first].as_py() < end:
            return True
    return False


def _add_distinct(batch: rocksdict.WriteBatch, ops: Writes) -> None:
    """Add ``ops`` (no key twice) to ``batch``: the deletes, then the puts,
    each in one call that loops in C (no key twice, so the order between a
    delete and a put does not matter; each part keeps the batch's order)."""
    keys, values = ops.keys, ops.values
    if values.null_count:
        deleted = values.is_null()
        deque(map(batch.delete, keys.filter(deleted).to_pylist()), maxlen=0)
        kept = pc.invert(deleted)
        keys, values = keys.filter(kept), values.filter(kept)
    deque(map(batch.put, keys.to_pylist(), values.to_pylist()), maxlen=0)


class RocksDBBackend:
    """A :class:`~statestore.KVBackend` on a local RocksDB directory."""

    def __init__(self, path: str | os.PathLike[str], config: RocksDBConfig | None = None):
        self.path = str(Path(path))
        self.config = config or RocksDBConfig()
        Path(self.path).mkdir(parents=True, exist_ok=True)
        self._options = self.config.to_options()
        with _wrapped("open", self.path):
            self._db: rocksdict.Rdict | None = rocksdict.Rdict(self.path, self._options)
        self._write_opts = rocksdict.WriteOptions()
        # A property at run time, though rocksdict's stubs call it a method.
        self._write_opts.disable_wal = self.config.disable_wal  # type: ignore[method-assign, assignment]
        # One iterator that short reads seek, rather than an iterator (and its
        # read options) built per read. It sees the database as it was when
        # made, so every write (and close) drops it.
        self._iter: rocksdict.RdictIter | None = None
        self._iter_opts = rocksdict.ReadOptions()

    def _live(self) -> rocksdict.Rdict:
        if self._db is None:
            raise BackendClosedError(f"RocksDB at {self.path} is closed; open it again")
        return self._db

    # The point reads are the hottest calls: they catch inline rather than
    # through the _wrapped context manager, which costs a microsecond a call.
    def get(self, key: bytes) -> bytes | None:
        try:
            return self._db.get(key)  # type: ignore[union-attr]
        except AttributeError:
            if self._db is None:
                self._live()
            raise
        except Exception as exc:  # rocksdict raises bare Exception
            _raise_typed(exc, "get", self.path)

    def multi_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            self._live()
            return []
        try:
            return self._db.get(list(keys))  # type: ignore[union-attr, return-value]
        except AttributeError:
            if self._db is None:
                self._live()
            raise
        except Exception as exc:
            _raise_typed(exc, "multi-get", self.path)

    def write(
        self,
        ops: Sequence[WriteOp],
        range_deletes: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        db = self._live()
        self._iter = None
        if isinstance(ops, Writes) and ops.ordered and len(ops) >= INGEST_AT:
            self._write_ordered(db, ops, range_deletes)
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        for start, end in range_deletes:
            batch.delete_range(start, end)
        if isinstance(ops, Writes) and ops.distinct:
            _add_distinct(batch, ops)
        else:
            for key, value in ops:
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
        with _wrapped("write", self.path):
            db.write(batch, self._write_opts)

    def _write_ordered(
        self, db: rocksdict.Rdict, ops: Writes, range_deletes: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """A large ordered batch: each of its runs (a table's writes) of at
        least ``INGEST_AT`` keys as a sorted file of its own, the rest and the
        range deletes through the MemTable.

        A file per run spans one table's new keys, not every table's and the
        metadata rows': in a store whose keys lead with event time (a join
        side's) it then overlaps no file RocksDB holds and goes to the
        deepest level, rather than to level 0, where each file brings the
        next compaction (a rewrite of every file it overlaps) nearer. The
        range deletes are written after the files when no key of a file falls
        in one, so that the MemTable overlaps no file (RocksDB would flush it
        first, into a level-0 file of its own); else before them. Either way a
        write of the batch wins over a range delete of the batch.
        """
        runs = ops.run_slices()
        files = [r for r in runs if len(r) >= INGEST_AT]
        small = [r for r in runs if len(r) < INGEST_AT]
        if not files:  # many small runs: one file still beats the MemTable
            files, small = [ops], []
        early = any(_any_within(f.keys, range_deletes) for f in files)
        first = rocksdict.WriteBatch(raw_mode=True)
        later = rocksdict.WriteBatch(raw_mode=True)
        for start, end in range_deletes:
            (first if early else later).delete_range(start, end)
        for run in small:
            _add_distinct(later, run)
        with _wrapped("write", self.path):
            if not first.is_empty():
                db.write(first, self._write_opts)
        self._ingest(db, files)
        with _wrapped("write", self.path):
            if not later.is_empty():
                db.write(later, self._write_opts)

    def _ingest(self, db: rocksdict.Rdict, files: list[Writes]) -> None:
        """Write each of ``files`` (keys ascending, apart from each other's)
        as one SST file, which the database takes in at once: written in its
        directory under names RocksDB does not own (so a crash can leave
        nothing outside the directory, which a rebuild removes whole), and
        moved, never copied."""
        paths = [os.path.join(self.path, f"relstate-ingest-{i}.sst") for i in range(len(files))]
        with _wrapped("ingest", self.path):
            try:
                for path, ops in zip(paths, files, strict=True):
                    _write_file(path, self._options, ops)
                options = rocksdict.IngestExternalFileOptions()
                options.set_move_files(True)
                db.ingest_external_file(paths, options)
            finally:
                for path in paths:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)

    def items(
        self,
        lower: bytes = b"",
        upper: bytes | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        db = self._live()
        if reverse:
            return self._items_reverse(db, lower, upper)
        return _bounded(db.items, lower, upper, self.path)

    def _items_reverse(
        self, db: rocksdict.Rdict, lower: bytes, upper: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        # rocksdict ignores a ReadOptions lower bound, so the lower end is checked
        # here; the upper end is exclusive, so a key equal to it is skipped.
        kwargs: dict[str, Any] = {"backwards": True}
        if upper is not None:
            kwargs["from_key"] = upper
        with _wrapped("iterate", self.path):
            it = db.items(**kwargs)
            for key, value in it:
                assert isinstance(key, bytes)
                if upper is not None and key >= upper:
                    continue
                if key < lower:
                    return
                yield key, value

    def read_range(
        self, lower: bytes = b"", upper: bytes | None = None, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        db = self._live()
        if reverse:
            return list(self._items_reverse(db, lower, upper))
        return _read_all(db.items, lower, upper, self.path)

    def read_values(self, lower: bytes = b"", upper: bytes | None = None) -> list[bytes]:
        return _read_all(self._live().values, lower, upper, self.path)

    def read_keys(self, lower: bytes = b"", upper: bytes | None = None) -> list[bytes]:
        return _read_all(self._live().keys, lower, upper, self.path)

    def read_short(self, lower: bytes, upper: bytes | None, limit: int) -> list[bytes] | None:
        """The values with ``lower <= key < upper``, ascending, if there are at
        most ``limit``; ``None`` if there are more. One seek of the backend's
        reused iterator: for the many short scans of an operator (one per
        join key), where building an iterator is a large part of the read."""
        it = self._reused_iterator()
        try:
            it.seek(lower)
            valid, key, value, step = it.valid, it.key, it.value, it.next
            out: list[bytes] = []
            while valid():
                if upper is not None and key() >= upper:
                    return out
                if len(out) == limit:
                    return None
                out.append(value())
                step()
            it.status()  # raises if the iterator stopped on an error
            return out
        except Exception as exc:  # rocksdict raises bare Exception
            self._iteration_failed(exc)

    def _reused_iterator(self) -> rocksdict.RdictIter:
        """The backend's reused iterator, made on first use (each write drops it)."""
        it = self._iter
        if it is None:
            db = self._live()
            with _wrapped("iterate", self.path):
                it = self._iter = db.iter(self._iter_opts)
        return it

    def _iteration_failed(self, exc: Exception) -> NoReturn:
        """Drop the reused iterator and raise ``exc`` as a typed error."""
        self._iter = None
        _raise_typed(exc, "iterate", self.path)

    def read_prefixes(self, prefixes: Iterable[bytes]) -> tuple[list[bytes], list[bytes]]:
        """The keys and values of every key that starts with one of
        ``prefixes``, one prefix's after another (each in key order; a
        prefix given twice is read twice). One reused iterator for all: for
        the many prefix scans of an input batch (a join key each), with no
        bounds to build per prefix. Where the prefixes ascend, a prefix the
        iterator has already passed into needs no seek (each key between
        them was read)."""
        it = self._reused_iterator()
        try:
            valid, key, value, step, seek = it.valid, it.key, it.value, it.next, it.seek
            # Keys and values alternate in one list, split at the end in C.
            out: list[bytes] = []
            append = out.append
            last: bytes | None = None
            for prefix in prefixes:
                # The iterator stands on the first key past ``last``'s keys:
                # it needs no seek when that key is at or past ``prefix``
                # (or there is none) and ``prefix`` comes after ``last``'s keys.
                after = last is not None and prefix > last and not prefix.startswith(last)
                if not after or (valid() and key() < prefix):
                    seek(prefix)
                last = prefix
                while valid():
                    k = key()
                    if not k.startswith(prefix):
                        break
                    append(k)
                    append(value())
                    step()
            it.status()  # raises if the iterator stopped on an error
            return out[0::2], out[1::2]
        except Exception as exc:  # rocksdict raises bare Exception
            self._iteration_failed(exc)

    def keys(self, lower: bytes = b"", upper: bytes | None = None) -> Iterator[bytes]:
        db = self._live()
        return _bounded(db.keys, lower, upper, self.path)

    def count(self, lower: bytes = b"", upper: bytes | None = None) -> int:
        """How many keys lie in ``[lower, upper)``: counted in C, not by a
        Python step per key, and not held in memory."""
        read_opts = _below(upper)
        with _wrapped("iterate", self.path):
            keys = self._live().keys(from_key=lower, read_opt=read_opts)
            last = deque(enumerate(keys, 1), maxlen=1)
        return last[0][0] if last else 0

    def checkpoint(self, directory: str | os.PathLike[str]) -> None:
        """Write a consistent RocksDB checkpoint (hard-linked SST files) to
        ``directory``, which must not exist yet."""
        db = self._live()
        self._iter = None
        with _wrapped("checkpoint", self.path):
            db.flush()
            rocksdict.Checkpoint(db).create_checkpoint(str(directory))

    def flush(self) -> None:
        """Write the memtables to SST files (the WAL is off: this is what makes
        the local directory hold every write after a close)."""
        db = self._live()
        self._iter = None
        with _wrapped("flush", self.path):
            db.flush()

    def memory_usage(self) -> int:
        """Bytes RocksDB holds in memory for this database (memtables and
        table readers; the shared block cache is counted once per process)."""
        db = self._live()
        total = 0
        with _wrapped("property", self.path):
            for prop in ("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem"):
                total += int(db.property_int_value(prop) or 0)
        return total

    def close(self) -> None:
        if self._db is None:
            return
        db, self._db = self._db, None
        self._iter = None  # an open iterator would keep the database open
        with _wrapped("close", self.path):
            db.close()

    def __enter__(self) -> RocksDBBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
