"""What a manifest's metadata allows a later store to do, and the local
RocksDB cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from encoding import Direction, KeyColumn, PartitionLocal, SchemaError, TableSchema
from statestore import IncompatibleStateError, StateStoreError, _transfer
from statestore._metadata import TableMeta, check_compatible
from tests.statestore._store_util import KV, Stores, put, rows


def _committed(stores: Stores, **config: Any) -> None:
    s = stores.open(**config)
    s.load(None)
    put(s, {"a": 1})
    s.commit(1)
    s.close()


def _kv(columns: list[tuple[str, pa.DataType, bool]], key: object = ("k",)) -> TableSchema:
    fields = [pa.field(n, t, nullable=nullable) for n, t, nullable in columns]
    return TableSchema(1, pa.schema(fields), key, name="kv")  # type: ignore[arg-type]


class TestMetadataChecks:
    def test_changed_partition_count_is_refused(self, stores: Stores) -> None:
        """Another partition count is an IncompatibleStateError (a ValueError)."""
        _committed(stores, partition_count=4)
        s = stores.open(partition_count=8)
        with pytest.raises(IncompatibleStateError, match="4 partitions") as info:
            s.load(1)
        assert isinstance(info.value, ValueError) and isinstance(info.value, StateStoreError)

    def test_unset_partition_count_keeps_the_recorded_one(self, stores: Stores) -> None:
        """A store without a partition count loads and records the old count."""
        _committed(stores, partition_count=4)
        s = stores.open()
        s.load(1)
        info = s.commit(2)
        assert s.checkpoint.manifest(2, info.commit_id).partition_count == 4

    def test_changed_key_type_is_refused(self, stores: Stores) -> None:
        """A key column whose type changed is an IncompatibleStateError."""
        _committed(stores)
        other = _kv([("k", pa.large_string(), True), ("v", pa.int64(), True)])
        with pytest.raises(IncompatibleStateError, match="primary key"):
            stores.open(tables=[other]).load(1)

    def test_changed_key_order_is_refused(self, stores: Stores) -> None:
        """A key column whose direction changed is an IncompatibleStateError."""
        _committed(stores)
        other = _kv(
            [("k", pa.string(), True), ("v", pa.int64(), True)],
            key=[KeyColumn("k", Direction.DESC)],
        )
        with pytest.raises(IncompatibleStateError):
            stores.open(tables=[other]).load(1)

    def test_added_nullable_column_loads_old_rows(self, stores: Stores) -> None:
        """A nullable column added at the end: old rows read it as null."""
        _committed(stores)
        wider = _kv([("k", pa.string(), True), ("v", pa.int64(), True), ("w", pa.string(), True)])
        s = stores.open(tables=[wider])
        s.load(1)
        assert list(s.table("kv").scan()) == [("a", 1, None)]
        s.table("kv").insert(("b", 2, "two"))
        s.commit(2)
        again = stores.open(tables=[wider])
        again.load(2)
        assert list(again.table("kv").scan()) == [("a", 1, None), ("b", 2, "two")]

    @pytest.mark.parametrize(
        "columns",
        [
            [("k", pa.string(), True), ("v", pa.int64(), True), ("w", pa.string(), False)],
            [("k", pa.string(), True)],
            [("k", pa.string(), True), ("v", pa.int32(), True)],
            [("k", pa.string(), True), ("x", pa.int64(), True)],
        ],
        ids=["non-nullable-added", "removed", "retyped", "renamed"],
    )
    def test_other_value_changes_are_refused(
        self, stores: Stores, columns: list[tuple[str, pa.DataType, bool]]
    ) -> None:
        """Removing, retyping or renaming a column, or adding a non-nullable one, is refused."""
        _committed(stores)
        with pytest.raises(IncompatibleStateError):
            stores.open(tables=[_kv(columns)]).load(1)

    def test_layout_and_missing_table_are_refused(self, stores: Stores) -> None:
        """Another value layout, or a stored table not configured, is refused."""
        _committed(stores)
        cell = TableSchema(1, KV.columns, ["k"], layout="cell", name="kv")
        with pytest.raises(IncompatibleStateError, match="layout"):
            stores.open(tables=[cell]).load(1)
        other = TableSchema(2, KV.columns, ["k"], name="other")
        with pytest.raises(IncompatibleStateError, match="does not configure"):
            stores.open(tables=[other]).load(1)

    def test_new_table_starts_empty(self, stores: Stores) -> None:
        """A table added to the store is empty after loading older state."""
        _committed(stores)
        extra = TableSchema(2, KV.columns, ["k"], name="extra")
        s = stores.open(tables=[KV, extra])
        s.load(1)
        assert rows(s) == {"a": 1} and rows(s, "extra") == {}

    def test_newer_value_format_is_refused(self) -> None:
        """State written with a newer value format is refused with advice."""
        meta = TableMeta.of(KV)
        with pytest.raises(IncompatibleStateError, match="upgrade"):
            check_compatible([meta], None, 99, [KV], None, 1, "here")


class TestPartitionBy:
    @pytest.mark.parametrize(
        "by", [None, ("v",), PartitionLocal(), PartitionLocal(least="v")], ids=repr
    )
    def test_manifest_json_round_trips_it(self, by: object) -> None:
        """Each kind of partition_by survives the manifest's JSON."""
        schema = TableSchema(1, KV.columns, ["k"], name="kv", partition_by=by)  # type: ignore[arg-type]
        meta = TableMeta.from_json(TableMeta.of(schema).to_json())
        assert meta.partition_by == schema.partition_by and meta.partition_recorded

    def test_old_manifest_without_it_loads_as_unrecorded(self) -> None:
        """A manifest from before partition_by loads; it says nothing is recorded."""
        obj = TableMeta.of(KV).to_json()
        del obj["partition_by"]
        meta = TableMeta.from_json(obj)
        assert meta.partition_by is None and not meta.partition_recorded
        check_compatible([meta], None, 1, [KV], None, 1, "here")

    def test_a_changed_declaration_reopens_and_is_recorded(self, stores: Stores) -> None:
        """State committed without a declaration loads into a store that makes
        one, and the next manifest records it (it moves rows, not reads them)."""
        _committed(stores)
        declared = TableSchema(1, KV.columns, ["k"], name="kv", partition_by=PartitionLocal())
        s = stores.open(tables=[declared])
        s.load(1)
        info = s.commit(2)
        (meta,) = s.checkpoint.manifest(2, info.commit_id).tables
        assert meta.partition_by == PartitionLocal()

    @pytest.mark.parametrize("by", [("nope",), (), "k", PartitionLocal(least="nope")], ids=repr)
    def test_bad_declarations_are_schema_errors(self, by: object) -> None:
        """partition_by must name columns of the table, as a sequence."""
        with pytest.raises(SchemaError, match="partition_by"):
            TableSchema(1, KV.columns, ["k"], name="kv", partition_by=by)  # type: ignore[arg-type]


class TestLocalCache:
    def test_load_of_the_held_version_copies_nothing(self, stores: Stores) -> None:
        """After a commit, loading that version reads no checkpoint file."""
        s = stores.open(snapshot_interval=2)
        s.load(None)
        for v in range(1, 4):
            put(s, {str(v): v})
            s.commit(v)
        info = s.load(3)
        assert (info.rebuilt, info.files_copied, info.changelogs_replayed) == (False, 0, 0)

    def test_closed_store_is_reused_by_the_next(self, stores: Stores) -> None:
        """A cleanly closed local directory serves the next store without copying."""
        local = stores.local()
        s = stores.open(local_dir=local)
        s.load(None)
        put(s, {"a": 1})
        s.commit(1)
        s.close()
        again = stores.open(local_dir=local)
        info = again.load(1)
        assert (info.rebuilt, info.files_copied) == (False, 0)
        assert rows(again) == {"a": 1}

    def test_local_ancestor_replays_only_newer_changelogs(self, stores: Stores) -> None:
        """A local directory at version 2 loads version 5 by replaying 3 changelogs."""
        local = stores.local()
        s = stores.open(local_dir=local)
        s.load(None)
        for v in (1, 2):
            put(s, {str(v): v})
            s.commit(v)
        s.close()
        other = stores.open()
        other.load(2)
        for v in (3, 4, 5):
            put(other, {str(v): v})
            other.commit(v)
        other.close()
        again = stores.open(local_dir=local)
        info = again.load(5)
        assert (info.rebuilt, info.changelogs_replayed, info.files_copied) == (False, 3, 3)
        assert rows(again) == {str(v): v for v in range(1, 6)}

    def test_local_state_off_the_lineage_is_rebuilt(self, stores: Stores) -> None:
        """A local directory holding a losing attempt is rebuilt, not replayed on."""
        base = stores.open()
        base.load(None)
        base.commit(1)
        loser_dir = stores.local()
        loser = stores.open(local_dir=loser_dir)
        loser.load(1)
        put(loser, {"loser": 2})
        loser.commit(2)
        loser.close()
        winner = stores.open()
        winner.load(1)
        put(winner, {"winner": 2})
        w2 = winner.commit(2)
        winner.record_winner(2, w2.commit_id)
        put(winner, {"winner": 3})
        winner.commit(3)
        again = stores.open(local_dir=loser_dir)
        info = again.load(3)
        assert info.rebuilt and rows(again) == {"winner": 3}

    def test_unclean_local_directory_is_rebuilt(self, stores: Stores) -> None:
        """Without the close marker the local database is not trusted."""
        local = stores.local()
        s = stores.open(local_dir=local)
        s.load(None)
        put(s, {"a": 1})
        s.commit(1)
        s.close()
        marker = next(p for p in stores.root.rglob("LOCAL_COMMIT.json"))
        marker.unlink()
        again = stores.open(local_dir=local)
        assert again.load(1).rebuilt and rows(again) == {"a": 1}

    def test_snapshot_after_rebuild_reuses_downloaded_files_unread(
        self, stores: Stores, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """SST files downloaded by a load are reused by the next snapshot
        without being read again to checksum them."""
        s = stores.open(snapshot_interval=2)
        s.load(None)
        for v in (1, 2):
            put(s, {str(v): v})
            s.commit(v)
        again = stores.open(snapshot_interval=1)
        assert again.load(2).rebuilt
        reads: list[Path] = []

        def counting_crc32(path: Path) -> int:
            reads.append(path)
            return 0

        monkeypatch.setattr(_transfer, "file_crc32", counting_crc32)
        put(again, {"3": 3})
        info = again.commit(3)
        assert info.snapshot and info.files_reused >= 1 and reads == []
        assert rows(stores.loaded(3)) == {"1": 1, "2": 2, "3": 3}
