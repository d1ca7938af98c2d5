"""The memory-backed state store: StateStore's interface and commit, the same
behaviour suite run on memory and on RocksDB with checkpoints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore import (
    EpochError,
    InconsistencyError,
    InvalidVersionError,
    MemoryStateStore,
    StateStore,
    StoreConfig,
    StoreStateError,
    VersionNotFoundError,
)
from tests.statestore._store_util import KV

Store = StateStore | MemoryStateStore


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty loaded store of the ``kv`` table, in memory or on RocksDB."""
    s: Store
    if request.param == "memory":
        s = StateStore.in_memory("op", 0, [KV])
    else:
        s = StateStore(str(tmp_path / "cp"), "op", 0, [KV], StoreConfig(local_dir=str(tmp_path)))
    s.load(None)
    yield s
    s.close()


def _rows(store: Store) -> dict[Any, Any]:
    return {r[0]: r[1] for r in store.table("kv").scan()}


def _put(store: Store, values: dict[str, int]) -> None:
    for k, v in values.items():
        store.table("kv").upsert((k, v))


class TestMemoryStateStore:
    def test_in_memory_makes_a_memory_store(self) -> None:
        """StateStore.in_memory returns a MemoryStateStore holding the named tables."""
        with StateStore.in_memory("op", 3, [KV], "relaxed") as s:
            assert isinstance(s, MemoryStateStore)
            s.load(None)
            assert list(s.tables) == ["kv"]
            assert s.table("kv").consistency.value == "relaxed"

    def test_versions_are_exact(self, store: Store) -> None:
        """Each version loads exactly as committed; uncommitted writes are dropped."""
        _put(store, {"a": 1})
        store.commit(1)
        _put(store, {"x": 9})
        store.load(1)
        assert _rows(store) == {"a": 1}
        _put(store, {"b": 2})
        store.commit(2)
        store.load(None)
        assert _rows(store) == {}
        store.load(1)
        assert _rows(store) == {"a": 1}
        store.load(2)
        assert _rows(store) == {"a": 1, "b": 2}
        assert store.versions() == [1, 2]

    def test_a_version_again_after_a_load_replaces_it(self, store: Store) -> None:
        """After loading version 1, committing 2 again makes the new attempt the one that loads."""
        _put(store, {"a": 1})
        store.commit(1)
        _put(store, {"b": 2})
        store.commit(2)
        store.load(1)
        _put(store, {"c": 3})
        info = store.commit(2)
        store.load(2, info.commit_id)
        assert _rows(store) == {"a": 1, "c": 3}

    def test_commit_reports_the_row_counts(self, store: Store) -> None:
        """CommitInfo counts the rows written, removed and held after the commit."""
        _put(store, {"a": 1, "b": 2})
        store.commit(1)
        store.table("kv").delete_key(("a",))
        info = store.commit(2)
        assert (info.version, info.num_updated_rows, info.num_removed_rows) == (2, 0, 1)
        assert info.num_total_rows == 1
        assert store.version == 2
        assert store.commit_id == info.commit_id

    def test_versions_must_increase(self, store: Store) -> None:
        """A commit at or below the loaded version raises EpochError."""
        store.commit(1)
        with pytest.raises(EpochError):
            store.commit(1)

    def test_a_version_never_committed_is_not_found(self, store: Store) -> None:
        """A version never committed is not found; a negative one is invalid."""
        with pytest.raises(VersionNotFoundError):
            store.load(7)
        with pytest.raises(InvalidVersionError):
            store.load(-1)

    def test_abort_drops_the_uncommitted_writes(self, store: Store) -> None:
        """abort() leaves the tables as the last commit left them."""
        _put(store, {"a": 1})
        store.commit(1)
        _put(store, {"b": 2})
        store.abort()
        assert _rows(store) == {"a": 1}

    def test_a_failed_strict_write_leaves_the_store_usable(self, store: Store) -> None:
        """A strict inconsistency raises and the store commits what was written before it."""
        _put(store, {"a": 1})
        with pytest.raises(InconsistencyError):
            store.table("kv").insert(("a", 2))
        store.commit(1)
        store.load(1)
        assert _rows(store) == {"a": 1}

    def test_a_closed_store_refuses_use(self, store: Store) -> None:
        """After close(), the tables are gone and a load raises StoreStateError."""
        store.close()
        with pytest.raises(StoreStateError):
            store.load(None)
