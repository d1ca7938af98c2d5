"""A state store in memory: the tables of one operator partition on a
:class:`MemoryBackend`, each committed version kept as a copy.

It has :class:`StateStore`'s interface (``load``, ``commit``, ``abort``,
``tables``) and its commit (:func:`prepare_tables`, one ordered batch), without
checkpoints: nothing outlives the process. Tests and the record-at-a-time
harness run on it; :meth:`StateStore.in_memory` makes one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from encoding import TableSchema
from statestore._checkpoint import check_version
from statestore._config import CommitInfo, LoadInfo
from statestore._memory import MemoryBackend
from statestore._store_tables import StoreTables
from statestore._table import ConsistencyMode, StateTable, check_tables, prepare_tables
from statestore.errors import EpochError, VersionNotFoundError

__all__ = ["MemoryStateStore"]


class MemoryStateStore(StoreTables):
    """The versioned state of one operator partition, in memory.

    Every committed version stays loadable (a copy of the backend each), so a
    test can go back to any of them. Call :meth:`load` before using the
    tables; a load replaces the table objects, so fetch them after each load.
    """

    def __init__(
        self,
        operator_id: str,
        partition_id: int,
        tables: Sequence[TableSchema],
        consistency: ConsistencyMode | str = ConsistencyMode.STRICT,
    ) -> None:
        self.operator_id = operator_id
        self.partition_id = partition_id
        self.consistency = ConsistencyMode(consistency)
        self._schemas = check_tables(tables)
        #: Committed versions: the backend after the commit, and its commit id.
        self._versions: dict[int, tuple[MemoryBackend, str]] = {}
        self._backend = MemoryBackend()
        self._tables: dict[str, StateTable] = {}
        self._head: int | None = None
        self._loaded = False
        self._closed = False

    # -- accessors ----------------------------------------------------------------------

    def _head_commit(self) -> tuple[int, str] | None:
        return None if self._head is None else (self._head, self._versions[self._head][1])

    def versions(self) -> list[int]:
        """The versions that can be loaded, ascending."""
        return sorted(self._versions)

    # -- load and commit ------------------------------------------------------------------

    def load(self, version: int | None = None, commit_id: str | None = None) -> LoadInfo:
        """Make the tables hold exactly the state after ``version`` committed
        (``None``: the empty state), dropping any uncommitted writes; a
        version never committed raises :class:`VersionNotFoundError`."""
        self._require_open()
        started = time.perf_counter()
        if version is None:
            if commit_id is not None:
                raise ValueError("commit_id names an attempt of a version; pass the version too")
            backend = MemoryBackend()
        else:
            version = check_version(version)
            committed = self._versions.get(version)
            if committed is None or commit_id not in (None, committed[1]):
                raise VersionNotFoundError(
                    f"version {version}"
                    + ("" if commit_id is None else f" (commit {commit_id})")
                    + f" was never committed in this memory store; committed: {self.versions()}",
                    version,
                )
            backend = committed[0].copy()
        self._open(backend)
        self._head = version
        self._loaded = True
        return LoadInfo(
            version=version,
            commit_id=self.commit_id,
            rebuilt=True,
            num_total_rows=self._total_rows(),
            load_ms=(time.perf_counter() - started) * 1000,
            files_copied=0,
            files_reused=0,
            bytes_copied=0,
            changelogs_replayed=0,
            memory_used_bytes=0,
        )

    def _open(self, backend: MemoryBackend) -> None:
        self._backend.close()
        self._backend = backend
        self._tables = {
            name: StateTable(schema, backend, self.consistency)
            for name, schema in self._schemas.items()
        }

    def commit(self, version: int) -> CommitInfo:
        """Make the tables' writes the state of ``version`` (above the loaded one)."""
        self._require_loaded()
        check_version(version)
        if self._head is not None and version <= self._head:
            raise EpochError(
                f"commit of version {version} after version {self._head}: versions "
                "must increase; load an older version first to redo a batch"
            )
        started = time.perf_counter()
        ops, ranges, updated, removed = prepare_tables(self._tables.values(), version)
        self._backend.write(ops, ranges)
        for table in self._tables.values():
            table.finish_commit(version)
        parent = self.commit_id
        commit_id = uuid.uuid4().hex
        self._versions[version] = (self._backend.copy(), commit_id)
        self._head = version
        elapsed = (time.perf_counter() - started) * 1000
        return CommitInfo(
            version=version,
            commit_id=commit_id,
            parent_commit_id=parent,
            snapshot=False,
            num_total_rows=self._total_rows(),
            num_updated_rows=updated,
            num_removed_rows=removed,
            local_write_ms=elapsed,
            changelog_ms=0.0,
            snapshot_ms=0.0,
            upload_ms=0.0,
            manifest_ms=0.0,
            cleanup_ms=0.0,
            commit_ms=elapsed,
            files_copied=0,
            files_reused=0,
            bytes_copied=0,
            memory_used_bytes=0,
        )

    # -- abort and close ----------------------------------------------------------------

    def abort(self) -> None:
        """Drop the uncommitted writes: the tables hold the loaded (or last
        committed) version again."""
        for table in self._tables.values():
            table.abort()

    def close(self) -> None:
        """Drop uncommitted writes and every version."""
        if self._closed:
            return
        self.abort()
        self._backend.close()
        self._tables = {}
        self._versions = {}
        self._loaded = False
        self._closed = True

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        else:
            state = "empty" if self._head is None else f"version {self._head}"
        return f"MemoryStateStore({self.operator_id!r}, {self.partition_id}, {state})"
