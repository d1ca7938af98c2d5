"""Local caches closed for good: a cache whose local checkpoint is gone is
removed, by hand or when a store opens a new cache; a cache a store holds, or
whose checkpoint is still there or not local, stays."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from statestore import StateStore, StoreConfig, remove_orphaned_caches
from statestore import _caches as caches
from tests.statestore._store_util import KV, put, rows


class Caches:
    """Stores on checkpoints ``{tmp}/ck-<name>``, all caching under one root."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "local"
        self.opened: list[StateStore] = []

    def open(self, name: str) -> StateStore:
        """A store on checkpoint ``name``, not loaded."""
        config = StoreConfig(local_dir=str(self.root))
        store = StateStore(str(self.tmp / f"ck-{name}"), "op", 0, [KV], config)
        self.opened.append(store)
        return store

    def store(self, name: str) -> StateStore:
        """A store on checkpoint ``name`` with version 1 committed."""
        store = self.open(name)
        store.load(None)
        put(store, {name: 1})
        store.commit(1)
        return store

    def cache(self, store: StateStore) -> Path:
        """The store's cache directory under the root (``{root}/{key}``)."""
        return store.local_dir.parents[1]


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Caches]:
    """A fresh root; this process counts as not having swept it yet."""
    monkeypatch.setattr(caches, "_swept", set())
    made = Caches(tmp_path)
    yield made
    for store in made.opened:
        store.close()


class TestOrphanedCaches:
    def test_only_caches_of_gone_checkpoints_nobody_holds_are_removed(self, setup: Caches) -> None:
        """The cache of a deleted checkpoint goes; one whose checkpoint is
        there stays (the next batch reopens it); one a store holds stays
        until that store is closed."""
        gone, kept, held = setup.store("gone"), setup.store("kept"), setup.store("held")
        gone.close()
        kept.close()
        shutil.rmtree(setup.tmp / "ck-gone")
        shutil.rmtree(setup.tmp / "ck-held")
        assert remove_orphaned_caches(setup.root) == [setup.cache(gone)]
        assert not setup.cache(gone).exists()
        assert setup.cache(kept).is_dir() and setup.cache(held).is_dir()
        assert rows(held) == {"held": 1}
        held.close()
        assert remove_orphaned_caches(setup.root) == [setup.cache(held)]
        reopened = setup.open("kept")
        assert not reopened.load(1).rebuilt  # the kept cache is reused
        assert rows(reopened) == {"kept": 1}

    def test_a_new_cache_sweeps_its_root_once_per_process(self, setup: Caches) -> None:
        """Opening a store on a checkpoint this root has no cache of removes
        the orphaned caches there, once per process: the next process (the
        next test run, a new Spark worker) removes those left since."""
        first = setup.store("first")
        first.close()
        shutil.rmtree(setup.tmp / "ck-first")
        caches._swept.clear()  # a new process
        setup.store("second").close()
        assert not setup.cache(first).exists()
        third = setup.store("third")
        third.close()
        shutil.rmtree(setup.tmp / "ck-third")
        setup.store("fourth").close()
        assert setup.cache(third).is_dir()

    def test_caches_it_cannot_judge_are_left(self, setup: Caches) -> None:
        """A cache without a record (from before relstate kept one), or of a
        checkpoint that is not on the local filesystem, is never removed; the
        leftover of a removal cut short is."""
        plain = setup.store("plain")
        remote = setup.store("remote")
        plain.close()
        remote.close()
        (setup.cache(plain) / caches.ORIGIN).unlink()
        record = {"filesystem": "s3", "checkpoint": "bucket/nowhere/op/0"}
        (setup.cache(remote) / caches.ORIGIN).write_text(json.dumps(record))
        leftover = setup.root / ".removing-0123456789abcdef-00000000"
        (leftover / "op" / "0").mkdir(parents=True)
        shutil.rmtree(setup.tmp / "ck-plain")
        assert remove_orphaned_caches(setup.root) == []
        assert setup.cache(plain).is_dir() and setup.cache(remote).is_dir()
        assert not leftover.exists()

    def test_the_record_names_the_checkpoint_absolutely(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A checkpoint given as a relative path is recorded as an absolute
        one, so that a sweep from another directory judges it right."""
        monkeypatch.chdir(tmp_path)
        store = StateStore("ck", "op", 0, [KV], StoreConfig(local_dir=str(tmp_path / "local")))
        store.close()
        record = json.loads((store.local_dir.parents[1] / caches.ORIGIN).read_text())
        assert record == {"filesystem": "local", "checkpoint": str(tmp_path / "ck" / "op" / "0")}
