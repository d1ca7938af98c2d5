"""Helpers shared by the state store tests: a one-table schema, a store
factory with its own local directory per store, and state read-back."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from encoding import TableSchema
from statestore import StateStore, StoreConfig

KV = TableSchema(1, pa.schema([("k", pa.string()), ("v", pa.int64())]), ["k"], name="kv")


def rows(store: StateStore, table: str = "kv") -> dict[Any, Any]:
    """The table's rows as ``{key: value}`` (first column to second)."""
    return {r[0]: r[1] for r in store.table(table).scan()}


def put(store: StateStore, values: dict[str, int], table: str = "kv") -> None:
    """Upsert ``{key: value}`` rows."""
    for k, v in values.items():
        store.table(table).upsert((k, v))


class Stores:
    """Opens stores on one checkpoint location, each with a fresh local
    directory unless one is named; closes them all at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root / "checkpoint")
        self._opened: list[StateStore] = []
        self._ids = itertools.count()

    def local(self) -> str:
        return str(self.root / f"local{next(self._ids)}")

    def open(
        self,
        tables: Sequence[TableSchema] = (KV,),
        local_dir: str | None = None,
        **config: Any,
    ) -> StateStore:
        cfg = StoreConfig(local_dir=local_dir or self.local(), **config)
        store = StateStore(self.location, "op", 0, tables, cfg)
        self._opened.append(store)
        return store

    def loaded(self, version: int | None, **config: Any) -> StateStore:
        """A new store (new local directory) loaded at ``version``."""
        store = self.open(**config)
        store.load(version)
        return store

    def close_all(self) -> None:
        for store in self._opened:
            store.close()


def checkpoint_files(root: Path) -> set[str]:
    """Every file under a partition directory, relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
