"""StateStore: the cases of issue 3, versions, aborts, and the zombie attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statestore import (
    AmbiguousVersionError,
    EpochError,
    InvalidVersionError,
    LockHeldError,
    StateStore,
    StateStoreError,
    StoreConfig,
    StoreStateError,
    VersionNotFoundError,
    WinnerConflictError,
    capture_events,
)
from statestore import _faults as faults
from statestore._rocksdb import INGEST_AT
from tests.statestore._store_util import KV, Stores, checkpoint_files, put, rows


class TestIssueCases:
    def test_case_1_versions_are_exact(self, stores: Stores) -> None:
        """Case (1): empty, {a:1}, an uncommitted write dropped, {a:1, b:2}."""
        s = stores.open()
        s.load(None)
        put(s, {"a": 1})
        s.commit(1)
        s.load(None)
        assert rows(s) == {}
        s.load(1)
        assert rows(s) == {"a": 1}
        put(s, {"x": 9})
        s.load(1)
        assert rows(s) == {"a": 1}
        put(s, {"b": 2})
        s.commit(2)
        assert rows(s) == {"a": 1, "b": 2}
        s.load(1)
        assert rows(s) == {"a": 1}
        s.load(2)
        assert rows(s) == {"a": 1, "b": 2}

    def test_case_2_retention_keeps_exactly_the_last_ten(self, stores: Stores) -> None:
        """Case (2): keep 10; v = 1..50 each replaces v-1 by v; exactly 41..50 load."""
        s = stores.open(retain_versions=10)
        s.load(None)
        for v in range(1, 51):
            if v > 1:
                assert s.table("kv").delete_key((str(v - 1),)) == (str(v - 1), v - 1)
            put(s, {str(v): v})
            s.commit(v)
        assert s.versions() == list(range(41, 51))
        reader = stores.open(retain_versions=10)
        for v in range(1, 51):
            if v <= 40:
                with pytest.raises(VersionNotFoundError):
                    reader.load(v)
            else:
                reader.load(v)
                assert rows(reader) == {str(v): v}

    def test_case_2_no_file_outlives_the_versions_that_need_it(self, stores: Stores) -> None:
        """Retention deletes every file that no kept manifest names."""
        s = stores.open(retain_versions=10, snapshot_interval=4)
        s.load(None)
        for v in range(1, 51):
            put(s, {str(v): v})
            s.commit(v)
        root = Path(s.checkpoint.root)
        needed = set()
        for v in s.versions():
            (cid,) = s.checkpoint.commits(v)
            m = s.checkpoint.manifest(v, cid)
            needed |= {m.path} | {f.path for f in m.files()}
        on_disk = {f for f in checkpoint_files(root) if not f.startswith("winners/")}
        assert on_disk == needed

    @pytest.mark.parametrize(
        "point",
        [
            "commit.start",
            "changelog.after_temp",
            "changelog.after_write",
            "commit.after_local_write",
            "manifest.before_write",
            "manifest.after_temp",
        ],
    )
    def test_case_3_failed_commit_leaves_last_version(self, stores: Stores, point: str) -> None:
        """Case (3): commit 11 fails at a fault point; load(10) is rows 1..10;
        11 written and aborted leaves load(10) unchanged."""
        s = stores.open()
        s.load(None)
        for v in range(1, 11):
            put(s, {str(v): v})
            s.commit(v)
        expected = {str(v): v for v in range(1, 11)}
        put(s, {"11": 11})
        with faults.inject(point), pytest.raises(faults.InjectedFault):
            s.commit(11)
        assert s.versions() == list(range(1, 11))
        s.load(10)
        assert rows(s) == expected
        put(s, {"11": 11})
        s.abort()
        assert rows(s) == expected
        s.load(10)
        assert rows(s) == expected
        assert rows(stores.loaded(10)) == expected

    @pytest.mark.parametrize("point", ["snapshot.after_write", "manifest.after_temp"])
    def test_case_3_abort_after_failed_commit_restores_version(
        self, stores: Stores, point: str
    ) -> None:
        """abort() after a commit failed past the local write restores the last
        version; commit refuses until then."""
        s = stores.open(snapshot_interval=11)
        s.load(None)
        for v in range(1, 11):
            put(s, {str(v): v})
            s.commit(v)
        put(s, {"11": 11})
        with faults.inject(point), pytest.raises(faults.InjectedFault):
            s.commit(11)
        with pytest.raises(StoreStateError):
            s.commit(11)
        s.abort()
        assert rows(s) == {str(v): v for v in range(1, 11)}
        put(s, {"11": 11})
        s.commit(11)
        assert rows(stores.loaded(11)) == {str(v): v for v in range(1, 12)}

    def test_case_4_every_version_loads_across_config_changes(self, stores: Stores) -> None:
        """Case (4): snapshots every 5 versions for 50 versions, then runs that
        change the snapshot interval and changelog mode: all versions load."""
        runs: list[tuple[range, dict[str, Any]]] = [
            (range(1, 51), {"snapshot_interval": 5}),
            (range(51, 61), {"snapshot_interval": 3}),
            (range(61, 71), {"changelog": False}),
            (range(71, 81), {"snapshot_interval": 7}),
        ]
        expected: dict[int, dict[str, int]] = {}
        state: dict[str, int] = {}
        for versions, cfg in runs:
            s = stores.open(retain_versions=100, **cfg)
            s.load(versions[0] - 1 if versions[0] > 1 else None)
            for v in versions:
                if v % 3 == 0:
                    s.table("kv").delete_key((str(v - 2),))
                    state.pop(str(v - 2), None)
                put(s, {str(v): v, "total": v})
                state.update({str(v): v, "total": v})
                s.commit(v)
                expected[v] = dict(state)
            s.close()
        reader = stores.open(retain_versions=100)
        for v in range(1, 81):
            reader.load(v)
            assert rows(reader) == expected[v], v


class TestVersions:
    def test_large_commits_load_anywhere(self, stores: Stores) -> None:
        """Commits of more writes than INGEST_AT (taken by RocksDB as files,
        and replayed from their changelogs as files) load the same rows in
        the store that wrote them, after a reopen, and in a fresh directory:
        inserts, updates, deletes and a range delete, version by version."""
        n = 2 * INGEST_AT
        s = stores.open()
        s.load(None)
        expected: dict[str, int] = {}
        for version in range(1, 4):
            table = s.table("kv")
            for i in range(n):
                key = f"k{(i * version) % (n + 50):06d}"
                if i % 7 == version:
                    if table.get_row((key,)) is not None:
                        table.delete((key, table.get_row((key,))[1]))  # type: ignore[index]
                        expected.pop(key)
                else:
                    table.upsert((key, i + version))
                    expected[key] = i + version
            if version == 3:
                table.clean_below("k000500")
                expected = {k: v for k, v in expected.items() if k >= "k000500"}
            s.commit(version)
            assert rows(s) == expected
            assert rows(stores.loaded(version)) == expected
        s.close()
        reopened = stores.open(local_dir=s.config.local_dir)
        reopened.load(3)
        assert rows(reopened) == expected

    def test_commit_needs_a_load(self, stores: Stores) -> None:
        """Tables and commit before load() are a typed error."""
        s = stores.open()
        with pytest.raises(StoreStateError):
            s.table("kv")
        with pytest.raises(StoreStateError):
            s.commit(1)

    def test_versions_must_increase(self, stores: Stores) -> None:
        """A commit at or below the loaded version is an EpochError."""
        s = stores.open()
        s.load(None)
        s.commit(5)
        with pytest.raises(EpochError):
            s.commit(5)
        with pytest.raises(InvalidVersionError):
            s.commit(-1)

    @pytest.mark.parametrize("version", [-1, 1.5, "3", True])
    def test_bad_version_is_the_stores_typed_error(self, stores: Stores, version: object) -> None:
        """A version that cannot be one (negative, not an int) is an
        InvalidVersionError, also a ValueError, naming it, raised before the
        loaded state changes; a well-formed missing version is still
        VersionNotFoundError."""
        s = stores.open()
        s.load(None)
        put(s, {"a": 1})
        s.commit(1)
        with pytest.raises(ValueError) as info:
            s.load(version)  # type: ignore[arg-type]
        assert isinstance(info.value, InvalidVersionError) and info.value.version == version
        assert isinstance(info.value, StateStoreError)
        assert f"version {version!r} is not a version" in str(info.value)
        assert s.version == 1 and rows(s) == {"a": 1}
        with pytest.raises(VersionNotFoundError):
            s.load(2)

    def test_unknown_version_is_not_found(self, stores: Stores) -> None:
        """Loading a version never committed raises VersionNotFoundError (a KeyError)."""
        s = stores.open()
        s.load(None)
        s.commit(1)
        with pytest.raises(KeyError) as info:
            s.load(7)
        assert isinstance(info.value, VersionNotFoundError)
        assert "version 7" in str(info.value)

    def test_failed_load_keeps_cache(self, stores: Stores) -> None:
        """A load that fails before touching the local database leaves it usable."""
        s = stores.open()
        s.load(None)
        put(s, {"a": 1})
        s.commit(1)
        with pytest.raises(VersionNotFoundError):
            s.load(3)
        info = s.load(1)
        assert not info.rebuilt and info.files_copied == 0
        assert rows(s) == {"a": 1}

    def test_gaps_between_versions(self, stores: Stores) -> None:
        """Versions need only increase: 3 then 8 both load."""
        s = stores.open()
        s.load(None)
        put(s, {"a": 3})
        s.commit(3)
        put(s, {"a": 8})
        s.commit(8)
        assert s.versions() == [3, 8]
        assert rows(stores.loaded(3)) == {"a": 3}

    def test_context_manager_closes(self, stores: Stores, tmp_path: Path) -> None:
        """Leaving the with block closes the store and frees its local directory."""
        local = str(tmp_path / "ctx")
        with StateStore(stores.location, "op", 0, [KV], StoreConfig(local_dir=local)) as s:
            s.load(None)
            s.commit(1)
        with pytest.raises(StoreStateError):
            s.load(1)
        with StateStore(stores.location, "op", 0, [KV], StoreConfig(local_dir=local)) as s2:
            assert s2.load(1).files_copied == 0

    def test_one_store_per_local_directory(self, stores: Stores) -> None:
        """A second store on a local directory in use gets LockHeldError."""
        local = stores.local()
        stores.open(local_dir=local)
        with pytest.raises(LockHeldError):
            stores.open(local_dir=local)

    def test_bad_ids_are_rejected(self, stores: Stores) -> None:
        """Operator ids with a slash and negative partitions are ValueErrors."""
        with pytest.raises(ValueError):
            StateStore(stores.location, "a/b", 0, [KV])
        with pytest.raises(ValueError):
            StateStore(stores.location, "op", -1, [KV])


class TestZombieAttempts:
    @pytest.mark.parametrize("a_first", [True, False])
    @pytest.mark.parametrize("interval", [1, 10])
    def test_named_winner_decides_whatever_the_order(
        self, stores: Stores, a_first: bool, interval: int
    ) -> None:
        """Attempts A and B both commit 2 on 1; B is named; load(2) is B's state
        in either order, and 3 committed on B loads right."""
        base = stores.open(snapshot_interval=interval)
        base.load(None)
        put(base, {"x": 1})
        base.commit(1)
        base.close()
        a = stores.open(snapshot_interval=interval)
        b = stores.open(snapshot_interval=interval)
        a.load(1)
        b.load(1)
        put(a, {"x": 100, "a": 2})
        put(b, {"x": 200, "b": 2})
        if a_first:
            a_info, b_info = a.commit(2), b.commit(2)
        else:
            b_info, a_info = b.commit(2), a.commit(2)
        reader = stores.open(snapshot_interval=interval)
        with pytest.raises(AmbiguousVersionError) as info:
            reader.load(2)
        assert set(info.value.commit_ids) == {a_info.commit_id, b_info.commit_id}
        reader.record_winner(2, b_info.commit_id)
        reader.load(2)
        assert rows(reader) == {"x": 200, "b": 2}
        put(b, {"b": 3})
        b3 = b.commit(3)
        # The zombie wakes up late and goes on from its own version 2.
        put(a, {"a": 3})
        a.commit(3)
        reader.record_winner(3, b3.commit_id)
        for store in (reader, stores.open(snapshot_interval=interval)):
            store.load(3)
            assert rows(store) == {"x": 200, "b": 3}
            store.load(2)
            assert rows(store) == {"x": 200, "b": 2}

    def test_late_files_of_a_zombie_after_the_winner_moved_on(self, stores: Stores) -> None:
        """A's version 2 lands after B committed 2 and 3: loading 3 follows B."""
        base = stores.open()
        base.load(None)
        put(base, {"x": 1})
        base.commit(1)
        a, b = stores.open(), stores.open()
        a.load(1)
        b.load(1)
        put(a, {"a": 2})
        put(b, {"b": 2})
        b.commit(2)
        put(b, {"b": 3})
        b.commit(3)
        a_info = a.commit(2)
        reader = stores.open()
        reader.load(3)
        assert rows(reader) == {"x": 1, "b": 3}
        reader.load(2, commit_id=a_info.commit_id)
        assert rows(reader) == {"x": 1, "a": 2}

    def test_winner_is_recorded_once(self, stores: Stores) -> None:
        """Recording another winner for a version is a WinnerConflictError."""
        s1, s2 = stores.open(), stores.open()
        s1.load(None)
        s2.load(None)
        c1 = s1.commit(1).commit_id
        c2 = s2.commit(1).commit_id
        s1.record_winner(1, c1)
        s1.record_winner(1, c1)
        with pytest.raises(WinnerConflictError):
            s1.record_winner(1, c2)
        with pytest.raises(VersionNotFoundError):
            s1.record_winner(1, "0" * 32)


class TestMetrics:
    def test_commit_and_load_events(self, stores: Stores) -> None:
        """Commits and loads log events with Spark's row metric names."""
        s = stores.open(snapshot_interval=2)
        with capture_events() as logs:
            s.load(None)
            put(s, {"a": 1, "b": 2})
            first = s.commit(1)
            s.table("kv").delete_key(("a",))
            put(s, {"c": 3})
            second = s.commit(2)
        commits = [e for e in logs if e["event"] == "state_store.commit"]
        assert [e["numTotalStateRows"] for e in commits] == [2, 2]
        assert [e["numUpdatedStateRows"] for e in commits] == [2, 1]
        assert [e["numRemovedStateRows"] for e in commits] == [0, 1]
        assert not first.snapshot and second.snapshot
        assert second.files_copied >= 3 and second.bytes_copied > 0
        for key in (
            "changelog_ms",
            "snapshot_ms",
            "upload_ms",
            "manifest_ms",
            "files_copied",
            "files_reused",
            "bytes_copied",
            "memory_used_bytes",
        ):
            assert key in commits[0]
        assert any(e["event"] == "state_store.load" for e in logs)

    def test_load_from_checkpoint_counts_files(self, stores: Stores) -> None:
        """A rebuilding load reports files copied and changelogs replayed."""
        s = stores.open(snapshot_interval=3)
        s.load(None)
        for v in range(1, 6):
            put(s, {str(v): v})
            s.commit(v)
        info = stores.open(snapshot_interval=3).load(5)
        assert info.rebuilt and info.changelogs_replayed == 2
        assert info.files_copied > 2 and info.bytes_copied > 0
        assert info.num_total_rows == 5


class TestRetention:
    def test_files_of_failed_commits_are_removed_in_time(self, stores: Stores) -> None:
        """Temporary and unreferenced files that failed commits left behind are
        deleted once their version is older than every kept version."""
        s = stores.open(retain_versions=3, snapshot_interval=2)
        s.load(None)
        # Snapshot every second version: odd versions write changelogs.
        points = [
            "changelog.after_temp",
            "snapshot.after_temp",
            "changelog.after_write",
            "snapshot.after_write",
            "manifest.after_temp",
            "winner.after_temp",
        ]
        version = 0
        for point in points:
            version += 1
            put(s, {"v": version})
            if point.startswith("winner"):
                info = s.commit(version)
                with faults.inject(point), pytest.raises(faults.InjectedFault):
                    s.record_winner(version, info.commit_id)
                continue
            with faults.inject(point), pytest.raises(faults.InjectedFault):
                s.commit(version)
            s.abort()
            put(s, {"v": version})
            s.commit(version)
        root = Path(s.checkpoint.root)
        assert any(".tmp-" in f for f in checkpoint_files(root))
        for later in range(version + 1, version + 5):
            put(s, {"v": later})
            s.commit(later)
        needed = set()
        for v in s.versions():
            for cid in s.checkpoint.commits(v):
                m = s.checkpoint.manifest(v, cid)
                needed |= {m.path} | {f.path for f in m.files()}
        assert checkpoint_files(root) == needed
