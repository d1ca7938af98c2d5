"""Spilling a large epoch into the local database before its commit."""

from __future__ import annotations

from pathlib import Path

import pytest

from statestore import StateStore
from tests.statestore._store_util import Stores, rows


def _big_epoch(store: StateStore, version: int, n: int = 100) -> dict[str, int]:
    """Insert n rows, update some of them and delete others, in one epoch."""
    t = store.table("kv")
    model = dict(rows(store))
    for i in range(n):
        key = f"{version}-{i:04d}"
        t.insert((key, i))
        model[key] = i
    for i in range(0, n, 3):
        key = f"{version}-{i:04d}"
        t.update((key, i), (key, -i))
        model[key] = -i
    for i in range(1, n, 5):
        key = f"{version}-{i:04d}"
        t.delete((key, model.pop(key)))
    return model


class TestSpill:
    def test_spilled_epoch_commits_and_loads(self, stores: Stores) -> None:
        """An epoch far larger than the spill threshold commits exactly, reads
        during the epoch see the spilled rows, and every version loads right."""
        store = stores.loaded(None, spill_rows=7, snapshot_interval=100)
        models = {}
        for version in (1, 2, 3):
            models[version] = _big_epoch(store, version)
            assert store._spills, "the workload must spill"
            assert rows(store) == models[version]
            assert store.table("kv").row_count == len(models[version])
            store.commit(version)
            assert not store._spills
        for version, model in models.items():
            fresh = stores.loaded(version)
            assert rows(fresh) == model
            assert fresh.table("kv").row_count == len(model)

    def test_abort_undoes_spilled_writes(self, stores: Stores) -> None:
        """abort() after a spill returns to the last committed version."""
        store = stores.loaded(None, spill_rows=5)
        model = _big_epoch(store, 1, 20)
        store.commit(1)
        _big_epoch(store, 2, 50)
        store.abort()
        assert rows(store) == model
        assert store.table("kv").row_count == len(model)
        _big_epoch(store, 2, 10)
        store.commit(2)
        assert stores.loaded(1).table("kv").row_count == len(model)

    def test_load_discards_spilled_writes(self, stores: Stores) -> None:
        """load() of the committed version after a spill gives that version."""
        store = stores.loaded(None, spill_rows=5)
        model = _big_epoch(store, 1, 20)
        store.commit(1)
        _big_epoch(store, 2, 50)
        store.load(1)
        assert rows(store) == model

    def test_range_delete_after_spill_keeps_order(self, stores: Stores) -> None:
        """A clean_below after spilled inserts removes them on replay too: each
        changelog part replays as its own batch, in order."""
        store = stores.loaded(None, spill_rows=3, snapshot_interval=100)
        t = store.table("kv")
        for i in range(10):
            t.insert((f"a{i}", i))
        t.clean_below("a5")
        t.insert(("a0", 100))
        store.commit(1)
        expected = {"a0": 100, **{f"a{i}": i for i in range(5, 10)}}
        assert rows(store) == expected
        assert rows(stores.loaded(1)) == expected

    def test_closed_store_with_spill_is_not_reused(self, stores: Stores, tmp_path: Path) -> None:
        """A store closed with spilled, uncommitted writes leaves no marker: the
        next store rebuilds the committed version from the checkpoint."""
        local = str(tmp_path / "shared-local")
        store = stores.open(local_dir=local, spill_rows=4)
        store.load(None)
        model = _big_epoch(store, 1, 12)
        store.commit(1)
        _big_epoch(store, 2, 30)
        store.close()
        again = stores.open(local_dir=local, spill_rows=4)
        info = again.load(1)
        assert rows(again) == model
        assert info.rebuilt

    @pytest.mark.parametrize("spill_rows", [1, 2, 1000])
    def test_same_result_whatever_the_threshold(self, stores: Stores, spill_rows: int) -> None:
        """The committed state does not depend on when or whether spills happen."""
        store = stores.loaded(None, spill_rows=spill_rows)
        model = _big_epoch(store, 1, 30)
        store.commit(1)
        assert rows(stores.loaded(1)) == model


class TestFailedSpill:
    def test_commit_refused_after_a_failed_spill(self, stores: Stores) -> None:
        """A spill that fails half-way (its segment written, the local write
        not) leaves the store refusing to commit until abort() reloads the last
        version: nothing of that epoch can be committed."""
        from statestore import StoreStateError
        from statestore._faults import InjectedFault, inject

        store = stores.loaded(None, spill_rows=2)
        store.table("kv").insert(("a", 1))
        store.commit(0)
        with inject("spill.after_segment"), pytest.raises(InjectedFault):
            for i in range(3):
                store.table("kv").insert((f"k{i}", i))
        with pytest.raises(StoreStateError, match="abort"):
            store.commit(1)
        store.abort()
        assert rows(store) == {"a": 1}
        store.table("kv").insert(("b", 2))
        store.commit(1)
        assert rows(stores.loaded(1)) == {"a": 1, "b": 2}
