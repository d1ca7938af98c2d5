"""What every state store is: versions loaded and committed, the loaded
tables and the ids of the head version, the same whether the store is
checkpointed (:class:`StateStore`) or in memory (:class:`MemoryStateStore`).
Code that takes either store takes a :class:`StoreTables`."""

from __future__ import annotations

import types
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Self

from statestore._config import CommitInfo, LoadInfo
from statestore._table import StateTable
from statestore.errors import StoreStateError

__all__ = ["StoreTables"]


class StoreTables(ABC):
    """A state store: it loads a version, commits the next, and reads its
    tables once a version is loaded, with that version's number and commit
    id. A store fills ``_tables`` and sets ``_loaded`` / ``_closed``; it says
    which commit it holds."""

    _tables: dict[str, StateTable]
    _loaded: bool
    _closed: bool

    @abstractmethod
    def _head_commit(self) -> tuple[int, str] | None:
        """The version the tables hold and its commit id (``None``: the empty state)."""

    @abstractmethod
    def load(self, version: int | None = None, commit_id: str | None = None) -> LoadInfo:
        """Load ``version`` (``None``: the empty state) into the tables; with
        ``commit_id``, that commit of it."""

    @abstractmethod
    def commit(self, version: int) -> CommitInfo:
        """Commit the tables' changes as ``version``."""

    @abstractmethod
    def close(self) -> None:
        """Release the store."""

    @property
    def version(self) -> int | None:
        """The version loaded or last committed (``None``: the empty state)."""
        self._require_loaded()
        head = self._head_commit()
        return None if head is None else head[0]

    @property
    def commit_id(self) -> str | None:
        """The commit id of :attr:`version`."""
        self._require_loaded()
        head = self._head_commit()
        return None if head is None else head[1]

    @property
    def tables(self) -> Mapping[str, StateTable]:
        """The state tables by name."""
        self._require_loaded()
        return types.MappingProxyType(self._tables)

    def table(self, name: str) -> StateTable:
        """The state table called ``name``."""
        self._require_loaded()
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError(
                f"no state table {name!r}; this store has {sorted(self._tables)}"
            ) from None

    def _require_open(self) -> None:
        if self._closed:
            raise StoreStateError("the state store is closed; create a new one")

    def _require_loaded(self) -> None:
        self._require_open()
        if not self._loaded:
            raise StoreStateError(
                "the state store has no loaded version: call load(version) first (a "
                "failed load or an abort that could not restore state also clears it)"
            )

    def _total_rows(self) -> int:
        return sum(t.row_count for t in self._tables.values())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
