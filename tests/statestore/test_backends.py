"""The KV backend protocol, run against every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from encoding import prefix_successor
from statestore import (
    BackendClosedError,
    KVBackend,
    LockHeldError,
    MemoryBackend,
    RocksDBBackend,
    RocksDBConfig,
    StateStoreError,
)
from statestore._rocksdb import INGEST_AT
from statestore._writes import Writes


def _fill(backend: KVBackend, n: int = 10) -> None:
    backend.write([(bytes([1, i]), b"v%d" % i) for i in range(n)])


class TestKVBackend:
    def test_protocol(self, backend: KVBackend) -> None:
        """Every backend satisfies the KVBackend protocol."""
        assert isinstance(backend, KVBackend)

    def test_get_and_multi_get(self, backend: KVBackend) -> None:
        """get returns the value or None; multi_get answers in order."""
        _fill(backend)
        assert backend.get(bytes([1, 3])) == b"v3"
        assert backend.get(b"missing") is None
        assert backend.multi_get([bytes([1, 2]), b"x", bytes([1, 9])]) == [b"v2", None, b"v9"]
        assert backend.multi_get([]) == []

    def test_write_is_puts_and_deletes(self, backend: KVBackend) -> None:
        """A batch applies puts and deletes (value None) together."""
        _fill(backend)
        backend.write([(bytes([1, 0]), None), (bytes([1, 1]), b"new"), (b"\x02", b"z")])
        assert backend.get(bytes([1, 0])) is None
        assert backend.get(bytes([1, 1])) == b"new"
        assert backend.get(b"\x02") == b"z"

    def test_range_delete_before_puts(self, backend: KVBackend) -> None:
        """A range delete removes [start, end) and applies before the batch's puts."""
        _fill(backend)
        backend.write([(bytes([1, 4]), b"again")], [(bytes([1, 3]), bytes([1, 6]))])
        keys = [k[1] for k in backend.keys(b"", None)]
        assert keys == [0, 1, 2, 4, 6, 7, 8, 9]
        assert backend.get(bytes([1, 4])) == b"again"

    def test_forward_iteration_bounds(self, backend: KVBackend) -> None:
        """items() includes the lower bound and excludes the upper one."""
        _fill(backend)
        got = [k[1] for k, _ in backend.items(bytes([1, 2]), bytes([1, 5]))]
        assert got == [2, 3, 4]
        assert [k[1] for k, _ in backend.items(bytes([1, 8]))] == [8, 9]

    def test_reverse_iteration_bounds(self, backend: KVBackend) -> None:
        """Reverse items() walks down from below the upper bound to the lower one."""
        _fill(backend)
        got = [k[1] for k, _ in backend.items(bytes([1, 2]), bytes([1, 5]), reverse=True)]
        assert got == [4, 3, 2]
        everything = [k[1] for k, _ in backend.items(reverse=True)]
        assert everything == list(range(9, -1, -1))

    def test_read_range_and_values_equal_items(self, backend: KVBackend) -> None:
        """read_range() is items() read into a list, both directions, with the
        same bounds; read_values() its values, ascending."""
        _fill(backend)
        for lower, upper in ((b"", None), (bytes([1, 2]), bytes([1, 5])), (bytes([1, 8]), None)):
            for reverse in (False, True):
                expected = list(backend.items(lower, upper, reverse))
                assert backend.read_range(lower, upper, reverse) == expected
            assert backend.read_values(lower, upper) == [v for _, v in backend.items(lower, upper)]

    def test_keys_bounds(self, backend: KVBackend) -> None:
        """keys() iterates keys only, within the same half-open bounds."""
        _fill(backend)
        assert [k[1] for k in backend.keys(bytes([1, 7]), bytes([1, 9]))] == [7, 8]

    def test_closed_backend_raises(self, backend: KVBackend) -> None:
        """Using a closed backend raises BackendClosedError."""
        backend.close()
        with pytest.raises(BackendClosedError):
            backend.get(b"a")
        with pytest.raises(StateStoreError):
            backend.write([(b"a", b"b")])


class TestRocksDBBackend:
    def test_second_handle_is_lock_held(self, tmp_path: Path) -> None:
        """Opening a directory another handle holds raises LockHeldError."""
        first = RocksDBBackend(tmp_path / "db")
        try:
            with pytest.raises(LockHeldError, match="lock"):
                RocksDBBackend(tmp_path / "db")
        finally:
            first.close()

    def test_data_survives_reopen(self, tmp_path: Path) -> None:
        """Written data is there after close and reopen, with the WAL off."""
        with RocksDBBackend(tmp_path / "db") as db:
            _fill(db)
        with RocksDBBackend(tmp_path / "db") as db:
            assert db.get(bytes([1, 5])) == b"v5"

    def test_reopening_keeps_the_info_logs_bounded(self, tmp_path: Path) -> None:
        """RocksDB starts an info log at every open: a directory opened again
        and again (as a task opens its partition's every batch) keeps
        ``info_log_files`` of them, not one per open."""
        config = RocksDBConfig(info_log_files=2)
        for _ in range(6):
            RocksDBBackend(tmp_path / "db", config).close()
        logs = sorted(p.name for p in (tmp_path / "db").iterdir() if p.name.startswith("LOG"))
        assert len(logs) == 2, logs
        assert "LOG" in logs

    def test_a_config_without_info_logs_is_refused(self) -> None:
        """RocksDB needs one info log at least: zero is refused when the
        config is made, before any database is opened with it."""
        with pytest.raises(ValueError, match="info_log_files"):
            RocksDBConfig(info_log_files=0)

    def test_iterator_outlives_garbage_collection(self, tmp_path: Path) -> None:
        """An iterator keeps its upper bound alive (rocksdict does not copy it)."""
        import gc

        with RocksDBBackend(tmp_path / "db") as db:
            _fill(db)
            it = db.items(bytes([1, 2]), bytes([1, 8]))
            gc.collect()
            assert [k[1] for k, _ in it] == [2, 3, 4, 5, 6, 7]

    def test_count_is_the_keys_in_range(self, tmp_path: Path) -> None:
        """count() gives how many keys keys() yields for the same bounds, deletes left out."""
        with RocksDBBackend(tmp_path / "db") as db:
            _fill(db)
            db.write([(bytes([1, 4]), None)], [(bytes([1, 7]), bytes([1, 9]))])
            for lower, upper in [(b"", None), (bytes([1, 2]), bytes([1, 8])), (b"\x02", None)]:
                assert db.count(lower, upper) == len(list(db.keys(lower, upper)))
            assert db.count(bytes([1, 2]), bytes([1, 8])) == 4

    def test_a_large_ordered_write_is_taken_as_a_file(self, tmp_path: Path) -> None:
        """An ordered write of INGEST_AT keys or more (ingested as a sorted file)
        leaves what the same writes leave in memory: range deletes first, then
        the puts and deletes, which win inside a deleted range; no file is
        left beside the database, and the state survives a reopen."""
        n = INGEST_AT + 5
        keys = [b"\x01" + i.to_bytes(4, "big") for i in range(n)]
        before = [(k, b"old") for k in keys[::2]]
        ops = Writes.in_key_order(keys, [None if i % 3 == 0 else b"v%d" % i for i in range(n)])
        ranges = [(keys[10], keys[100]), (b"\x02", b"\x03")]
        memory = MemoryBackend()
        with RocksDBBackend(tmp_path / "db") as db:
            for backend in (memory, db):
                backend.write([*before, (b"\x02\x00", b"gone"), (b"\x04", b"kept")])
                backend.write(ops, ranges)
            assert ops.ordered and len(ops) >= INGEST_AT
            assert db.read_range() == memory.read_range()
            assert db.get(keys[13]) == b"v13" and db.get(keys[14]) == b"v14"
            assert db.get(keys[3]) is None and db.get(b"\x02\x00") is None
            assert sorted(p.name for p in tmp_path.iterdir()) == ["db"]
            assert not (tmp_path / "db" / "relstate-ingest.sst").exists()
        with RocksDBBackend(tmp_path / "db") as db:
            assert db.read_range() == memory.read_range()

    def test_each_large_run_of_an_ordered_write_is_a_file_of_its_own(self, tmp_path: Path) -> None:
        """An ordered write made of runs (tables), large and small, leaves
        what the same writes leave in memory, whether a range delete falls
        in a run's file (whose writes win) or only among stored rows and the
        small runs (whose writes win too); a large run's file spans its own
        table only, so a later commit's files overlap no earlier one and all
        go to the last level; no file is left beside the database."""
        n = INGEST_AT

        def key(table: int, i: int) -> bytes:
            return bytes([table]) + i.to_bytes(4, "big")

        def commit(at: int, values: bytes) -> Writes:
            parts = [
                Writes.in_key_order([key(t, i) for i in range(at, at + n)], [values] * n)
                for t in (1, 3)
            ]
            parts.append(Writes.in_key_order([key(5, at), key(5, at + 1)], [values, None]))
            return Writes.concat(parts, distinct=True)

        memory = MemoryBackend()
        with RocksDBBackend(tmp_path / "db") as db:
            stored = [(key(5, 0), b"old"), (key(5, 1), b"old"), (key(5, n), b"old")]
            steps = [
                (commit(0, b"a"), []),
                (commit(n, b"b"), [(key(3, 0), key(3, 50)), (key(5, 0), key(5, n + 1))]),
            ]
            for backend in (memory, db):
                backend.write(stored)
                for ops, ranges in steps:
                    backend.write(ops, ranges)
            assert db.read_range() == memory.read_range()
            assert db.get(key(5, n)) == b"b" and db.get(key(5, 0)) is None
            files = [
                db._live().property_int_value(f"rocksdb.num-files-at-level{level}")
                for level in range(7)
            ]
            assert files == [0, 0, 0, 0, 0, 0, 4]  # two commits, two tables
            inside = commit(2 * n, b"c")
            for backend in (memory, db):
                backend.write(inside, [(key(1, 2 * n + 10), key(1, 2 * n + 100))])
            assert db.read_range() == memory.read_range()
            assert db.get(key(1, 2 * n + 20)) == b"c"
            assert not list((tmp_path / "db").glob("relstate-ingest*"))
        with RocksDBBackend(tmp_path / "db") as db:
            assert db.read_range() == memory.read_range()

    def test_checkpoint_copies_state(self, tmp_path: Path) -> None:
        """checkpoint() writes a directory that opens as the same database."""
        with RocksDBBackend(tmp_path / "db") as db:
            _fill(db)
            db.checkpoint(tmp_path / "cp")
        with RocksDBBackend(tmp_path / "cp") as cp:
            assert cp.get(bytes([1, 9])) == b"v9"


class TestMemoryBackend:
    def test_iteration_is_a_snapshot(self) -> None:
        """Writes during an iteration do not change what it yields."""
        db = MemoryBackend()
        _fill(db, 3)
        it = db.items()
        db.write([(bytes([1, 0]), None), (bytes([1, 5]), b"x")])
        assert [k[1] for k, _ in it] == [0, 1, 2]


class TestShortRead:
    def test_short_read_is_the_range_up_to_a_limit(
        self, backend: MemoryBackend | RocksDBBackend
    ) -> None:
        """read_short gives the values of [lower, upper) in order, or None past the limit."""
        _fill(backend)
        assert backend.read_short(bytes([1, 2]), bytes([1, 5]), 3) == [b"v2", b"v3", b"v4"]
        assert backend.read_short(bytes([1, 2]), bytes([1, 6]), 3) is None
        assert backend.read_short(bytes([1, 8]), None, 5) == [b"v8", b"v9"]
        assert backend.read_short(b"\x05", None, 5) == []

    def test_short_read_sees_every_write(self, backend: MemoryBackend | RocksDBBackend) -> None:
        """A short read after a write (RocksDB's reused iterator is renewed) sees it."""
        _fill(backend, 3)
        assert backend.read_short(bytes([1]), bytes([2]), 10) == [b"v0", b"v1", b"v2"]
        backend.write(
            [(bytes([1, 1]), None), (bytes([1, 5]), b"five")], [(bytes([1, 2]), bytes([1, 3]))]
        )
        assert backend.read_short(bytes([1]), bytes([2]), 10) == [b"v0", b"five"]

    def test_short_read_of_a_closed_backend_raises(
        self, backend: MemoryBackend | RocksDBBackend
    ) -> None:
        """read_short on a closed backend raises BackendClosedError."""
        _fill(backend, 2)
        backend.read_short(b"", None, 10)
        backend.close()
        with pytest.raises(BackendClosedError):
            backend.read_short(b"", None, 10)


class TestPrefixRead:
    """RocksDB's read of many prefixes through one reused iterator."""

    @staticmethod
    def _each(backend: RocksDBBackend, prefixes: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        pairs: list[tuple[bytes, bytes]] = []
        for prefix in prefixes:
            pairs += backend.read_range(prefix, prefix_successor(prefix))
        return [k for k, _ in pairs], [v for _, v in pairs]

    def test_prefixes_read_as_one_range_read_each(self, tmp_path: Path) -> None:
        """read_prefixes gives, prefix after prefix, the keys and values a
        range read of each gives: ascending with gaps (no seek where the iterator already
        stands past them), a prefix given twice, one that extends the one
        before, descending ones, prefixes with no keys, past the last key,
        and the empty prefix."""
        backend = RocksDBBackend(tmp_path / "db")
        try:
            backend.write(
                [(bytes([t, i]), b"%d-%d" % (t, i)) for t in (1, 2, 4) for i in range(3)]
                + [(bytes([2, 1, 7]), b"2-1-7"), (b"\xff\xff", b"top")]
            )
            cases = [
                [bytes([1]), bytes([2]), bytes([4])],
                [bytes([1, 1]), bytes([1, 2]), bytes([2, 0]), bytes([2, 1])],
                [bytes([2]), bytes([2]), bytes([2, 1]), bytes([2, 1, 7])],
                [bytes([4]), bytes([2, 1]), bytes([1])],
                [bytes([0]), bytes([3]), bytes([5]), bytes([1, 9]), bytes([2, 2])],
                [bytes([4, 2]), b"\xff", b"\xff\xff", b"\xff\xff\x00"],
                [b"", bytes([2])],
                [],
            ]
            for prefixes in cases:
                assert backend.read_prefixes(prefixes) == self._each(backend, prefixes), prefixes
        finally:
            backend.close()

    def test_prefix_read_sees_every_write(self, tmp_path: Path) -> None:
        """A prefix read after a write (the reused iterator renewed) sees it."""
        backend = RocksDBBackend(tmp_path / "db")
        try:
            _fill(backend, 3)
            assert backend.read_prefixes([bytes([1])])[1] == [b"v0", b"v1", b"v2"]
            backend.write([(bytes([1, 1]), None), (bytes([1, 5]), b"five")])
            keys, values = backend.read_prefixes([bytes([1])])
            assert keys == [bytes([1, 0]), bytes([1, 2]), bytes([1, 5])]
            assert values == [b"v0", b"v2", b"five"]
        finally:
            backend.close()

    def test_prefix_read_of_a_closed_backend_raises(self, tmp_path: Path) -> None:
        """read_prefixes on a closed backend raises BackendClosedError."""
        backend = RocksDBBackend(tmp_path / "db")
        backend.close()
        with pytest.raises(BackendClosedError):
            backend.read_prefixes([bytes([1])])
