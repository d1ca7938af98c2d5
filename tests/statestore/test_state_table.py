"""StateTable behaviour, run against every backend."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from encoding import Direction, EncodingError, KeyColumn, TableSchema
from statestore import (
    EpochError,
    InconsistencyError,
    KVBackend,
    StateTable,
    capture_events,
)
from tests.conftest import BackendFactory, reopen

THREE = pa.schema([("pk", pa.int64()), ("b", pa.int64()), ("c", pa.int64())])


def _table(
    backend: KVBackend,
    layout: str = "row",
    consistency: str = "strict",
    table_id: int = 1,
    columns: pa.Schema = THREE,
    key: tuple[Any, ...] = ("pk",),
) -> StateTable:
    schema = TableSchema(table_id, columns, key, layout=layout)
    return StateTable(schema, backend, consistency=consistency)


@pytest.fixture(params=["row", "cell"])
def layout(request: pytest.FixtureRequest) -> str:
    """Each value layout."""
    return str(request.param)


class TestSeedCases:
    def test_get_and_scan_merge_memtable_over_storage(
        self, backend: KVBackend, layout: str
    ) -> None:
        """Seed 001's read path: committed rows, MemTable overrides, deletes hidden."""
        t = _table(backend, layout)
        t.insert((1, 11, 111))
        t.insert((2, 22, 222))
        t.delete((2, 22, 222))
        t.insert((3, 33, 333))
        t.commit(1)
        t.update((3, 33, 333), (3, 3333, 3333))
        for _ in range(2):
            assert t.get_row((1,)) == (1, 11, 111)
            assert t.get_row((2,)) is None
            assert t.get_row((3,)) == (3, 3333, 3333)
            assert list(t.scan()) == [(1, 11, 111), (3, 3333, 3333)]
            t.commit(2) if t.last_epoch == 1 else None

    def test_relaxed_delete_then_insert_is_update(self, backend: KVBackend, layout: str) -> None:
        """Relaxed mode: delete + insert of one key in an epoch becomes its new row."""
        cols = pa.schema([(n, pa.int64()) for n in ("a", "b", "c", "d")])
        t = _table(backend, layout, "relaxed", columns=cols, key=("a",))
        t.insert((6, 66, 666, 6666))
        t.insert((7, None, 777, None))
        t.commit(1)
        t.delete((6, 66, 666, 6666))
        t.insert((6, None, None, 6666))
        t.delete((7, None, 777, None))
        t.insert((7, 77, 7777, None))
        for epoch in (None, 2):
            if epoch is not None:
                t.commit(epoch)
            assert t.get_row((6,)) == (6, None, None, 6666)
            assert t.get_row((7,)) == (7, 77, 7777, None)
        assert t.row_count == 2 and t.metrics.inconsistencies == 0

    def test_strict_double_insert_raises(self, backend: KVBackend, layout: str) -> None:
        """Strict mode: a second insert of a key in one epoch is an inconsistency."""
        t = _table(backend, layout)
        t.insert((1, 1, 1))
        with pytest.raises(InconsistencyError) as info:
            t.insert((1, 2, 2))
        assert info.value.key == (1,)
        assert t.get_row((1,)) == (1, 1, 1)


class TestConsistency:
    def test_strict_checks_committed_storage(self, backend: KVBackend, layout: str) -> None:
        """Strict checks see committed rows: insert over one, delete/update of a
        missing one, and a wrong old row all raise and change nothing."""
        t = _table(backend, layout)
        t.insert((1, 1, 1))
        t.commit(1)
        with pytest.raises(InconsistencyError, match="existing"):
            t.insert((1, 9, 9))
        with pytest.raises(InconsistencyError, match="missing"):
            t.delete((2, 2, 2))
        with pytest.raises(InconsistencyError, match="missing"):
            t.update((2, 2, 2), (2, 3, 3))
        with pytest.raises(InconsistencyError, match="holds"):
            t.delete((1, 5, 5))
        with pytest.raises(InconsistencyError, match="holds"):
            t.update((1, 5, 5), (1, 6, 6))
        assert t.pending == 0
        assert t.get_row((1,)) == (1, 1, 1)

    def test_strict_batch_is_all_or_nothing(self, backend: KVBackend, layout: str) -> None:
        """A strict batch insert with one existing key writes none of its rows."""
        t = _table(backend, layout)
        t.insert((2, 2, 2))
        t.commit(1)
        batch = pa.RecordBatch.from_pylist(
            [{"pk": 1, "b": 1, "c": 1}, {"pk": 2, "b": 2, "c": 2}], schema=THREE
        )
        with pytest.raises(InconsistencyError):
            t.insert_batch(batch)
        assert t.get_row((1,)) is None and t.pending == 0

    def test_relaxed_newest_wins_and_logs(self, backend: KVBackend, layout: str) -> None:
        """Relaxed mode: an insert over a committed row replaces it, is logged,
        and the row count stays exact."""
        t = _table(backend, layout, "relaxed")
        t.insert((1, 1, 1))
        t.commit(1)
        with capture_events() as logs:
            t.insert((1, 2, 2))
            t.delete((5, 5, 5))
            t.commit(2)
        assert t.get_row((1,)) == (1, 2, 2)
        assert t.row_count == 1
        events = [e for e in logs if e["event"] == "state_table.inconsistency"]
        assert len(events) == 2

    @pytest.mark.parametrize("mode", ["relaxed", "unchecked"])
    def test_blind_insert_then_delete_removes_committed_row(
        self, backend: KVBackend, layout: str, mode: str
    ) -> None:
        """Without checks, insert over a committed row then delete, in one
        epoch, leaves the key deleted (a tombstone), not the committed row."""
        t = _table(backend, layout, mode)
        t.insert((1, 1, 1))
        t.commit(1)
        t.insert((1, 2, 2))
        t.delete((1, 2, 2))
        assert t.get_row((1,)) is None
        assert list(t.scan()) == []
        t.commit(2)
        assert t.get_row((1,)) is None
        if mode == "relaxed":
            assert t.row_count == 0


class TestBatchForms:
    @pytest.mark.parametrize("mode", ["relaxed", "unchecked"])
    def test_delete_keys_named_twice_deletes_once(self, backend: KVBackend, mode: str) -> None:
        """Outside strict mode a key named twice in one delete_keys is deleted
        once and counted once; strict mode refuses it."""
        t = _table(backend, consistency=mode)
        t.insert_batch(pa.table({"pk": [1, 2], "b": [10, 20], "c": [100, 200]}))
        t.commit(1)
        assert t.delete_keys(pa.table({"pk": [1, 1]})) == 1
        t.commit(2)
        assert list(t.scan()) == [(2, 20, 200)] and t.row_count == 1
        strict = _table(backend, table_id=2)
        with pytest.raises(InconsistencyError, match="named twice"):
            strict.delete_keys(pa.table({"pk": [1, 1]}))

    @pytest.mark.parametrize("mode", ["relaxed", "unchecked"])
    def test_delete_batch_merges_as_deletes_one_by_one(
        self, backend: KVBackend, layout: str, mode: str
    ) -> None:
        """Outside strict mode delete_batch leaves what a delete per row
        leaves: committed rows go, a row inserted in the epoch goes without a
        trace, and a key named twice is deleted once and logged once."""
        t = _table(backend, layout, mode)
        t.insert_batch(pa.table({"pk": [1, 2, 3], "b": [10, 20, 30], "c": [100, 200, 300]}))
        t.commit(1)
        t.insert((4, 40, 400))
        t.delete_batch(pa.table({"pk": [1, 4], "b": [10, 40], "c": [100, 400]}))
        with capture_events() as logs:
            t.delete_batch(pa.table({"pk": [2, 2], "b": [20, 20], "c": [200, 200]}))
        assert [e["event"] for e in logs] == ["state_table.inconsistency"]
        assert list(t.scan()) == [(3, 30, 300)] and t.metrics.deleted == 4
        t.commit(2)
        assert list(t.scan()) == [(3, 30, 300)]
        if mode == "relaxed":
            assert t.row_count == 1

    def test_scan_batch_buffers_are_aligned(self, backend: KVBackend) -> None:
        """Fixed-width columns that scan_batch decodes sit on aligned buffers
        (Arrow's compute, a join say, warns on and may mishandle others)."""
        cols = pa.schema([("t", pa.int64()), ("k", pa.int32()), ("s", pa.string())])
        t = _table(backend, columns=cols, key=("t",))
        t.insert((1, 2, "x"))
        t.commit(1)
        batch = t.scan_batch()
        for column in (batch.column("t"), batch.column("k")):
            width = column.type.bit_width // 8
            assert column.buffers()[1].address % width == 0


class TestScan:
    COLS = pa.schema([("jk", pa.int32()), ("pk", pa.string()), ("v", pa.float64())])

    def _fill(self, backend: KVBackend, layout: str) -> StateTable:
        t = _table(backend, layout, columns=self.COLS, key=("jk", "pk"))
        for jk in range(4):
            for pk in "abcd":
                t.insert((jk, pk, float(jk)))
        t.commit(1)
        t.insert((1, "bb", 9.0))
        t.delete((1, "c", 1.0))
        t.update((2, "a", 2.0), (2, "a", 7.0))
        return t

    def test_prefix_scan(self, backend: KVBackend, layout: str) -> None:
        """A prefix scan yields exactly that join key's rows, merged, in order."""
        t = self._fill(backend, layout)
        assert [r[1] for r in t.scan((1,))] == ["a", "b", "bb", "d"]
        assert next(t.scan((2,))) == (2, "a", 7.0)

    def test_reverse_prefix_scan(self, backend: KVBackend, layout: str) -> None:
        """reverse=True yields the same rows from the end."""
        t = self._fill(backend, layout)
        assert [r[1] for r in t.scan((1,), reverse=True)] == ["d", "bb", "b", "a"]

    def test_sub_range(self, backend: KVBackend, layout: str) -> None:
        """start (included) and end (excluded) bound the next key column."""
        t = self._fill(backend, layout)
        assert [r[1] for r in t.scan((1,), start=("b",), end=("d",))] == ["b", "bb"]
        assert [r[0] for r in t.scan(start=(2,))][:1] == [2]
        assert {r[0] for r in t.scan(start=(1,), end=(3,))} == {1, 2}

    def test_scan_batch_matches_scan(self, backend: KVBackend, layout: str) -> None:
        """scan_batch gives scan's rows as an Arrow batch with the table's types."""
        t = self._fill(backend, layout)
        batch = t.scan_batch((1,))
        assert batch.schema == self.COLS
        assert [tuple(r.values()) for r in batch.to_pylist()] == list(t.scan((1,)))

    @pytest.mark.parametrize("pending", [False, True])
    def test_scan_ranges_of_prefixes_is_each_scan(
        self, backend: KVBackend, layout: str, pending: bool
    ) -> None:
        """``scan_ranges`` of plain prefixes (read through one iterator when
        the epoch wrote nothing, ``pending=False``; merged over the MemTable
        otherwise) gives each prefix's scan, one after another: ascending
        prefixes with gaps and prefixes without rows, a prefix twice, one
        extending another, descending ones, a whole key and the empty prefix."""
        t = self._fill(backend, layout)
        t.commit(2)
        if pending:
            t.insert((5, "z", 5.0))
        cases: list[list[tuple[Any, ...]]] = [
            [(0,), (1,), (2,), (3,)],
            [(0,), (2,), (9,), (-1,)],
            [(1,), (1,), (1, "bb"), (1, "b")],
            [(3,), (1,), (0, "d"), (0, "a")],
            [(), (2,)],
            [],
        ]
        for prefixes in cases:
            got = t.scan_ranges([(p, None, None) for p in prefixes])
            expected = [row for p in prefixes for row in t.scan(p)]
            assert [tuple(r.values()) for r in got.to_pylist()] == expected, prefixes
            assert got.schema == self.COLS

    @pytest.mark.parametrize("pending", [False, True])
    def test_scan_prefixes_is_the_rows_under_any_in_key_order(
        self, backend: KVBackend, layout: str, pending: bool
    ) -> None:
        """``scan_prefixes`` gives every row under any of the prefixes once,
        in key order, whatever their order, repeats and nesting, merged over
        the epoch's writes (``pending``: inserts, deletes and updates under
        the prefixes) and after a clean (range deletes)."""
        t = self._fill(backend, layout)
        t.commit(2)
        if pending:
            t.insert((0, "aa", 5.0))
            t.delete((3, "b", 3.0))
            t.update((1, "a", 1.0), (1, "a", 8.0))
        cases: list[list[tuple[Any, ...]]] = [
            [(3,), (0,), (1,)],
            [(2,), (2,), (2, "a"), (9,)],
            [(1, "d"), (1, "a"), (0, "b")],
            [(), (2,)],
            [],
        ]
        for prefixes in cases:
            wanted = [r for r in t.scan() if any(r[: len(p)] == p for p in prefixes)]
            got = t.scan_prefixes(prefixes)
            assert [tuple(r.values()) for r in got.to_pylist()] == wanted, prefixes
            assert got.schema == self.COLS
        t.clean_below(1)
        cleaned = t.scan_prefixes([(0,), (1,), (2,)]).to_pylist()
        assert [tuple(r.values()) for r in cleaned] == [r for r in t.scan() if r[0] in (1, 2)]

    def test_scan_ranges_prefix_longer_than_the_key(self, backend: KVBackend) -> None:
        """A prefix longer than the key is refused as a scan refuses it."""
        t = self._fill(backend, "row")
        t.commit(2)
        with pytest.raises(EncodingError, match="longer than the primary key"):
            t.scan_ranges([((1,), None, None), ((1, "a", 2.0), None, None)])

    def test_descending_key(self, backend: KVBackend, layout: str) -> None:
        """A descending key column scans from the largest value."""
        cols = pa.schema([("k", pa.int64()), ("v", pa.int64())])
        t = _table(backend, layout, columns=cols, key=(KeyColumn("k", Direction.DESC),))
        for k in (3, 1, 2):
            t.insert((k, k))
        assert [r[0] for r in t.scan()] == [3, 2, 1]


class TestTables:
    def test_tables_share_a_backend(self, backend: KVBackend, layout: str) -> None:
        """Two tables on one backend see only their own rows."""
        a = _table(backend, layout, table_id=1)
        b = _table(backend, layout, table_id=2)
        a.insert((1, 1, 1))
        b.insert((1, 2, 2))
        a.commit(1)
        b.commit(1)
        assert list(a.scan()) == [(1, 1, 1)]
        assert list(b.scan()) == [(1, 2, 2)]
        assert a.row_count == b.row_count == 1

    def test_tables_of_equal_schemas_share_codecs(self, backend: KVBackend) -> None:
        """Tables of equal schemas (a pickled copy, as a Spark task gets) share their codecs."""
        import pickle

        schema = TableSchema(1, THREE, ("pk",))
        a = StateTable(schema, backend)
        b = StateTable(pickle.loads(pickle.dumps(schema)), backend)
        assert a.keys is b.keys and a.rows is b.rows
        assert _table(backend, table_id=2).keys is not a.keys

    def test_epochs_must_increase(self, backend: KVBackend) -> None:
        """A commit whose epoch is not above the last raises EpochError."""
        t = _table(backend)
        t.commit(5)
        with pytest.raises(EpochError, match="not above"):
            t.commit(5)
        with pytest.raises(EpochError):
            t.commit(4)

    def test_state_survives_reopen(self, backend_factory: BackendFactory, layout: str) -> None:
        """Rows, the last epoch and the row count survive reopening the backend."""
        backend = backend_factory()
        t = _table(backend, layout)
        for i in range(5):
            t.insert((i, i, i))
        t.commit(3)
        backend = reopen(backend)
        t = _table(backend, layout)
        assert t.last_epoch == 3 and t.row_count == 5
        assert t.get_rows([(0,), (4,), (9,)]) == [(0, 0, 0), (4, 4, 4), None]
        backend.close()

    @pytest.mark.parametrize("asked", [100, 1_000])
    def test_many_reads_match_single_reads(
        self, backend: KVBackend, layout: str, asked: int
    ) -> None:
        """get_rows and get_batch of many keys (unordered, repeated, absent,
        some the epoch changed, in a second table's key space too) give what
        get_row gives, whether they read by multi-get or by a scan of the keys'
        span; contains says which of them hold a row, read by multi-get or by
        a scan of keys alone."""
        t = _table(backend, layout)
        other = _table(backend, layout, table_id=2)
        for i in range(0, 2_000, 2):
            t.insert((i, i, -i))
            other.insert((i + 1, 0, 0))
        t.commit(1)
        other.commit(1)
        t.update((10, 10, -10), (10, 7, 7))
        t.delete((12, 12, -12))
        t.insert((13, 13, 13))
        step = 2_100 // asked
        pks = [((i * 7919) % 2_100 // step * step,) for i in range(asked)] + [(10,), (13,)]
        expected = [t.get_row(pk) for pk in pks]
        assert t.get_rows(pks) == expected
        rows, found = t.get_batch(pa.table({"pk": pa.array([p[0] for p in pks], pa.int64())}))
        assert found.to_pylist() == [e is not None for e in expected]
        assert rows.to_pylist() == [dict(zip(THREE.names, e, strict=True)) for e in expected if e]
        asked_keys = pa.table({"pk": pa.array([p[0] for p in pks], pa.int64())})
        assert t.contains(asked_keys) == [e is not None for e in expected]
        t.commit(2)
        assert t.get_rows(pks) == [t.get_row(pk) for pk in pks]
        assert t.contains(asked_keys) == [e is not None for e in expected]

    @pytest.mark.parametrize("kind", [pa.int32(), pa.string()])
    def test_batch_read_of_most_keys_matches_single_reads(
        self, backend: KVBackend, layout: str, kind: pa.DataType
    ) -> None:
        """get_batch of many of the stored keys in an untouched epoch (read by
        one scan matched in Arrow) gives what get_row gives: a null key, a
        key asked twice, absent keys, keys past the greatest stored."""
        columns = pa.schema([pa.field("pk", kind), ("b", pa.int64())])
        t = _table(backend, layout, columns=columns)
        value = (lambda i: i) if kind == pa.int32() else (lambda i: f"k{i:05d}")
        t.insert((None, -1))
        for i in range(0, 300, 3):
            t.insert((value(i), i))
        t.commit(1)
        asked = [None, *(value(i) for i in range(310, -1, -1)), value(6)]
        rows, found = t.get_batch(pa.table({"pk": pa.array(asked, kind)}))
        expected = [t.get_row((k,)) for k in asked]
        assert found.to_pylist() == [e is not None for e in expected]
        assert rows.to_pylist() == [{"pk": e[0], "b": e[1]} for e in expected if e is not None]

    def test_abort_drops_the_epoch(self, backend: KVBackend, layout: str) -> None:
        """abort() forgets uncommitted writes."""
        t = _table(backend, layout)
        t.insert((1, 1, 1))
        t.commit(1)
        t.delete((1, 1, 1))
        t.abort()
        assert t.get_row((1,)) == (1, 1, 1)


class TestCleanBelow:
    def test_removes_rows_below_watermark(self, backend: KVBackend, layout: str) -> None:
        """clean_below removes committed and pending rows whose first key column
        is below the watermark, keeps the rest, and keeps the count exact."""
        cols = pa.schema([("ts", pa.int64()), ("id", pa.int64()), ("v", pa.int64())])
        t = _table(backend, layout, columns=cols, key=("ts", "id"))
        for ts in range(10):
            t.insert((ts, 0, ts))
        t.commit(1)
        t.insert((2, 1, 0))  # pending, below the watermark
        t.delete((3, 0, 3))  # pending delete of a committed row below it
        t.insert((8, 1, 0))
        assert t.clean_below(5) == 5
        assert [r[0] for r in t.scan()] == [5, 6, 7, 8, 8, 9]
        assert t.row_count == 6
        t.insert((1, 5, 5))  # written after the clean: survives it
        t.commit(2)
        assert [r[0] for r in t.scan()] == [1, 5, 6, 7, 8, 8, 9]
        assert t.row_count == 7
        assert t.get_row((0, 0)) is None

    def test_contains_of_many_keys_sees_the_clean(self, backend: KVBackend, layout: str) -> None:
        """contains of many keys, read by one scan of keys alone, says no for
        committed rows a pending clean removed, and yes for rows the epoch
        wrote after it, as get_row does."""
        cols = pa.schema([("ts", pa.int64()), ("id", pa.int64()), ("v", pa.int64())])
        t = _table(backend, layout, columns=cols, key=("ts", "id"))
        for ts in range(100):
            t.insert((ts, 0, ts))
        t.commit(1)
        t.clean_below(40)
        t.insert((10, 0, 1))  # written after the clean
        asked = [(ts, i) for ts in range(0, 110) for i in (0, 1)]
        keys = pa.table(
            {
                "ts": pa.array([a[0] for a in asked], pa.int64()),
                "id": pa.array([a[1] for a in asked], pa.int64()),
            }
        )
        expected = [t.get_row(a) is not None for a in asked]
        assert expected.count(True) == 61
        assert t.contains(keys) == expected


class TestBadInput:
    def test_wrong_length_row(self, backend: KVBackend, layout: str) -> None:
        """A row of the wrong length raises EncodingError and writes nothing."""
        t = _table(backend, layout)
        with pytest.raises(EncodingError):
            t.insert((1, 2))
        assert t.pending == 0

    def test_wrong_type(self, backend: KVBackend, layout: str) -> None:
        """A value of the wrong type raises EncodingError and writes nothing."""
        t = _table(backend, layout)
        with pytest.raises(EncodingError):
            t.insert((1, "two", 3))
        assert t.pending == 0

    def test_null_in_non_nullable_column(self, backend: KVBackend, layout: str) -> None:
        """A null where the schema forbids it raises EncodingError."""
        cols = pa.schema(
            [pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64(), nullable=False)]
        )
        t = _table(backend, layout, columns=cols, key=("k",))
        with pytest.raises(EncodingError):
            t.insert((1, None))
        with pytest.raises(EncodingError):
            t.insert((None, 1))
        assert t.pending == 0

    def test_wrong_key_arity(self, backend: KVBackend, layout: str) -> None:
        """get_row with too few or too many key values raises EncodingError."""
        t = _table(backend, layout)
        with pytest.raises(EncodingError, match="primary key"):
            t.get_row(())
        with pytest.raises(EncodingError, match="primary key"):
            t.get_row((1, 2))

    def test_update_may_not_change_key(self, backend: KVBackend, layout: str) -> None:
        """An update whose rows have different keys raises EncodingError."""
        t = _table(backend, layout)
        t.insert((1, 1, 1))
        with pytest.raises(EncodingError, match="primary key"):
            t.update((1, 1, 1), (2, 1, 1))


class TestReadme:
    def test_snippet_runs_again_and_again(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The README's StateTable snippet prints its rows on a second run as
        on the first: it opens a fresh database each time."""
        readme = (Path(__file__).parents[2] / "README.md").read_text()
        code = re.search(r"```python\n(.*?)```", readme, re.S)
        assert code is not None and "StateTable(" in code.group(1)
        for _ in range(2):
            exec(compile(code.group(1), "README.md", "exec"), {})
        assert capsys.readouterr().out == "[(7, 'o-1', 11.0)]\n" * 2
