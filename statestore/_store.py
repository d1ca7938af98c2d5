"""The state store: all state tables of one operator partition, versioned and
checkpointed at every micro-batch commit.

The tables share one local RocksDB (their table ids keep them apart), which is
only a cache of the checkpoint. The protocol (docs/checkpoints.md):

* ``commit(v)``: the tables' net operations become one batch; it is written as
  the changelog of ``v`` (or, every ``snapshot_interval`` versions, the batch is
  applied and the database uploaded as a snapshot), applied to the local
  database, and the manifest of ``v`` is published last, atomically. The commit
  returns only then.
* ``load(v)``: the manifest of ``v`` names a snapshot and the changelogs after
  it; the local database is reused when it holds ``v`` or an ancestor of ``v``
  on that chain, else rebuilt from the snapshot. Every file is verified.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.fs as pafs

from encoding import FORMAT_VERSION as VALUE_FORMAT_VERSION
from encoding import TableSchema
from statestore import _changelog
from statestore._caches import note_origin, sweep_once
from statestore._checkpoint import PartitionCheckpoint, check_version
from statestore._config import CommitInfo, LoadInfo, StoreConfig
from statestore._faults import fault
from statestore._local import LocalDir
from statestore._log import get_logger
from statestore._manifest import ChangelogRef, CommitRef, Manifest, SnapshotRef
from statestore._memory_store import MemoryStateStore
from statestore._metadata import TableMeta, check_compatible
from statestore._rocksdb import RocksDBBackend
from statestore._store_tables import StoreTables
from statestore._table import ConsistencyMode, StateTable, check_tables, prepare_tables
from statestore._transfer import (
    ChecksumCache,
    Transfers,
    download_snapshot,
    read_changelogs,
    upload_snapshot,
)
from statestore._writes import Writes
from statestore.errors import BackendError, EpochError, IncompatibleStateError, StoreStateError

__all__ = ["StateStore"]


def _now_ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


class StateStore(StoreTables):
    """The versioned state of one operator partition.

    ``location`` is any path or URI ``pyarrow.fs`` understands (or a path on
    ``filesystem`` when one is given); the partition's files go under
    ``{location}/{operator_id}/{partition_id}/``. Call
    :meth:`load` before using the tables; a load that rebuilds the local
    database replaces the table objects, so fetch them with :meth:`table` after
    each load.
    """

    def __init__(
        self,
        location: str,
        operator_id: str,
        partition_id: int,
        tables: Sequence[TableSchema],
        config: StoreConfig | None = None,
        consistency: ConsistencyMode | str = ConsistencyMode.STRICT,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        self.config = config or StoreConfig()
        self.checkpoint = PartitionCheckpoint(location, operator_id, partition_id, filesystem)
        self.consistency = ConsistencyMode(consistency)
        self._schemas = check_tables(tables)
        self._metas = tuple(TableMeta.of(s) for s in self._schemas.values())
        self._log = get_logger(__name__, operator=operator_id, partition=partition_id)
        self._local = LocalDir(
            self.config.local_path(
                f"{self.checkpoint.fs.fs.type_name}:{self.checkpoint.root}",
                operator_id,
                partition_id,
            )
        )
        self._local.lock()
        if note_origin(self._local.path, self.checkpoint.fs.fs.type_name, self.checkpoint.root):
            sweep_once(self._local.path.parents[2])  # a new cache: drop orphaned ones
        self._backend: RocksDBBackend | None = None
        self._db_dir: Path | None = None
        self._checksums: ChecksumCache = {}
        self._tables: dict[str, StateTable] = {}
        #: The committed version the local database holds (``None``: empty state).
        self._head: Manifest | None = None
        self._partition_count = self.config.partition_count
        self._loaded = False  # a load succeeded and the tables are usable
        self._dirty = False  # the local database holds writes no manifest has
        #: Segment files of the epoch's spilled writes, in order; while there are
        #: any, the local database is ahead of the checkpoint too.
        self._spills: list[Path] = []
        self._closed = False

    @staticmethod
    def in_memory(
        operator_id: str,
        partition_id: int,
        tables: Sequence[TableSchema],
        consistency: ConsistencyMode | str = ConsistencyMode.STRICT,
    ) -> MemoryStateStore:
        """A store with this interface whose tables live in a memory backend,
        every committed version kept in memory, no checkpoint written: for
        tests and the record-at-a-time harness."""
        return MemoryStateStore(operator_id, partition_id, tables, consistency)

    # -- accessors ----------------------------------------------------------------------

    @property
    def local_dir(self) -> Path:
        """This store's local directory (the RocksDB cache)."""
        return self._local.path

    def _head_commit(self) -> tuple[int, str] | None:
        return None if self._head is None else (self._head.version, self._head.commit_id)

    def versions(self) -> list[int]:
        """The versions that can be loaded (that have a manifest), ascending."""
        return self.checkpoint.versions()

    def record_winner(self, version: int, commit_id: str) -> None:
        """Name the attempt of ``version`` that counts (see
        :meth:`PartitionCheckpoint.record_winner`)."""
        self.checkpoint.record_winner(version, commit_id)

    # -- load -------------------------------------------------------------------------------

    def load(self, version: int | None = None, commit_id: str | None = None) -> LoadInfo:
        """Make the tables hold exactly the state after ``version`` committed
        (``None``: the empty state), dropping any uncommitted writes.
        A version that cannot be one (negative, not an integer) raises
        :class:`InvalidVersionError` before anything changes; one never
        committed (or dropped by retention), :class:`VersionNotFoundError`.

        ``commit_id`` names one attempt of the version; without it the recorded
        winner is used, else the only attempt (:class:`AmbiguousVersionError` if
        there are several). Every checkpoint file read is verified.
        """
        self._require_open()
        started = time.perf_counter()
        if version is None and commit_id is not None:
            raise ValueError("commit_id names an attempt of a version; pass the version too")
        if version is not None:
            version = check_version(version)  # before anything changes
        for t in self._tables.values():
            t.abort()
        if self._spills:
            self._drop_spills()
            self._dirty = True  # the local database holds the spilled writes
        self._loaded = False
        target = None
        if version is not None:
            target = self.checkpoint.resolve(version, commit_id)
            self._check_metadata(target)
        moved = Transfers()
        try:
            replayed, rebuilt = self._bring_local_to(target, moved)
        except BaseException:
            self._dirty = True
            raise
        self._head = target
        self._dirty = False
        if target is not None and self.config.partition_count is None:
            self._partition_count = target.partition_count
        self._open_tables()
        self._loaded = True
        info = LoadInfo(
            version=version,
            commit_id=None if target is None else target.commit_id,
            rebuilt=rebuilt,
            num_total_rows=self._total_rows(),
            load_ms=_now_ms(started),
            files_copied=moved.files_copied,
            files_reused=moved.files_reused,
            bytes_copied=moved.bytes_copied,
            changelogs_replayed=replayed,
            memory_used_bytes=self._memory(),
        )
        self._log.info("state_store.load", **info.event())
        return info

    def _check_metadata(self, target: Manifest) -> None:
        check_compatible(
            target.tables,
            target.partition_count,
            target.value_format_version,
            list(self._schemas.values()),
            self.config.partition_count,
            VALUE_FORMAT_VERSION,
            where=f"version {target.version} (manifest {self.checkpoint.fs.full(target.path)})",
        )
        if target.changelog_format_version > _changelog.FORMAT_VERSION:
            raise IncompatibleStateError(
                f"version {target.version} uses changelog format "
                f"{target.changelog_format_version}; this relstate reads up to "
                f"{_changelog.FORMAT_VERSION}: upgrade relstate"
            )

    def _local_commit(self) -> tuple[bool, CommitRef | None]:
        """Whether a usable local database is open or was opened from the
        marker, and which commit it holds (``None``: the empty state)."""
        if self._backend is not None:
            if self._ahead:
                return False, None
            return True, None if self._head is None else self._head.ref
        marker = self._local.read_marker()
        if marker is None:
            return False, None
        self._local.clear_marker()  # the directory is about to change
        self._checksums = {}
        try:
            self._open_backend(self._local.path / marker.db)
        except BackendError as exc:
            self._log.warning("state_store.local_cache_unusable", error=repr(exc))
            return False, None
        self._local.remove_stale(keep=self._db_dir)
        return True, marker.commit

    def _bring_local_to(self, target: Manifest | None, moved: Transfers) -> tuple[int, bool]:
        """Make the local database hold ``target``; returns (changelogs
        replayed, whether it was rebuilt)."""
        usable, local = self._local_commit()
        applied: int | None = None
        if usable and target is None:
            applied = 0 if local is None else None
        elif usable and target is not None:
            applied = _applied(target, local)
        rebuilt = applied is None
        if applied is None:
            self._rebuild(target, moved)
            applied = 0
        elif target is not None and target.snapshot is not None:
            moved.files_reused += len(target.snapshot.files)
        if target is None:
            return 0, rebuilt
        chain = target.changelogs[applied:]
        if chain:
            self._dirty = True
        backend = self._live_backend()
        for ref, log in zip(
            chain,
            read_changelogs(self.checkpoint.fs, chain, target.version, self.config.io_threads),
            strict=True,
        ):
            backend.write(log.writes, log.range_deletes)
            moved.files_copied += 1
            moved.bytes_copied += ref.file.size
        fault("load.after_replay")
        return len(chain), rebuilt

    def _rebuild(self, target: Manifest | None, moved: Transfers) -> None:
        """Open a fresh local database holding ``target``'s snapshot."""
        self._dirty = True
        self._close_backend()
        self._local.clear_marker()
        db_dir = self._local.new_db_dir()
        self._checksums = {}
        if target is not None and target.snapshot is not None:
            download_snapshot(
                self.checkpoint.fs,
                target.snapshot,
                db_dir,
                target.version,
                self._checksums,
                moved,
                self.config.io_threads,
            )
        self._open_backend(db_dir)
        self._local.remove_stale(keep=db_dir)

    def _open_backend(self, db_dir: Path) -> None:
        self._close_backend()
        self._backend = RocksDBBackend(db_dir, self.config.rocksdb)
        self._db_dir = db_dir

    def _close_backend(self) -> None:
        if self._backend is not None:
            backend, self._backend = self._backend, None
            backend.close()

    @property
    def _ahead(self) -> bool:
        """Whether the local database holds writes that no manifest names."""
        return self._dirty or bool(self._spills)

    def _live_backend(self) -> RocksDBBackend:
        if self._backend is None:
            raise StoreStateError("the state store has no open database; call load() first")
        return self._backend

    def _open_tables(self) -> None:
        """State tables on the open database: the same objects re-read when the
        database is the same (building codecs is not free), else new ones."""
        backend = self._live_backend()
        if self._tables and all(t.backend is backend for t in self._tables.values()):
            for t in self._tables.values():
                t.reload()
            return
        self._tables = {
            name: StateTable(
                schema,
                backend,
                self.consistency,
                spill_at=self.config.spill_rows,
                on_spill=self._spill,
            )
            for name, schema in self._schemas.items()
        }

    # -- commit -----------------------------------------------------------------------------

    def commit(self, version: int) -> CommitInfo:
        """Make the tables' writes durable as ``version`` (a micro-batch id above
        the loaded one) and return once its manifest is published.

        If it raises, the version may or may not exist in the checkpoint (the
        manifest is the last step), and the tables keep their writes: call
        :meth:`abort` (or :meth:`load`) before going on.
        """
        self._require_loaded()
        if self._dirty:
            raise StoreStateError(
                "a failed commit left the local database ahead of the checkpoint; call "
                "abort() or load() before committing again"
            )
        check_version(version)
        head = self._head
        if head is not None and version <= head.version:
            raise EpochError(
                f"commit of version {version} after version {head.version}: versions "
                "must increase; load an older version first to redo a batch"
            )
        fault("commit.start")
        started = time.perf_counter()
        ops, ranges, updated, removed = self._prepare(version)
        commit = CommitRef(version, uuid.uuid4().hex)
        chain = () if head is None else head.changelogs
        cfg = self.config
        snapshot_now = not cfg.changelog or len(chain) + 1 >= cfg.snapshot_interval
        moved = Transfers()
        new_chain: tuple[ChangelogRef, ...] = ()
        changelog_ms = 0.0
        backend = self._live_backend()
        # The changelog goes to the checkpoint while the local database takes
        # the same writes: neither reads the other, and each mostly waits for
        # its disk (fsync), so the commit waits for the longer, not for both.
        # Leaving the block waits for the changelog whatever happened.
        with ThreadPoolExecutor(1) as pool:
            upload = (
                None if snapshot_now else pool.submit(self._timed_changelogs, commit, ops, ranges)
            )
            t = time.perf_counter()
            self._dirty = True
            backend.write(ops, ranges)
            fault("commit.after_local_write")
            local_write_ms = _now_ms(t)
            if upload is not None:
                refs, changelog_ms = upload.result()
                new_chain = (*chain, *refs)
                moved.files_copied += len(refs)
                moved.bytes_copied += sum(ref.file.size for ref in refs)

        t = time.perf_counter()
        snapshot: SnapshotRef | None = None if head is None else head.snapshot
        if snapshot_now:
            snapshot = upload_snapshot(
                self.checkpoint.fs,
                backend,
                self._local.new_checkpoint_dir(),
                commit,
                snapshot,
                self._checksums,
                moved,
            )
        snapshot_total_ms = _now_ms(t)

        t = time.perf_counter()
        total_rows = self._total_rows()
        manifest = self._manifest(commit, head, snapshot, new_chain, total_rows)
        self.checkpoint.publish(manifest)
        manifest_ms = _now_ms(t)

        self._head = manifest
        self._dirty = False
        self._drop_spills()
        for table in self._tables.values():
            table.finish_commit(version)
        fault("commit.after_finish")
        t = time.perf_counter()
        self._cleanup()
        cleanup_ms = _now_ms(t)

        info = CommitInfo(
            version=version,
            commit_id=commit.commit_id,
            parent_commit_id=None if head is None else head.commit_id,
            snapshot=snapshot_now,
            num_total_rows=total_rows,
            num_updated_rows=updated,
            num_removed_rows=removed,
            local_write_ms=local_write_ms,
            changelog_ms=changelog_ms,
            snapshot_ms=moved.checkpoint_ms,
            upload_ms=snapshot_total_ms - moved.checkpoint_ms,
            manifest_ms=manifest_ms,
            cleanup_ms=cleanup_ms,
            commit_ms=_now_ms(started),
            files_copied=moved.files_copied,
            files_reused=moved.files_reused,
            bytes_copied=moved.bytes_copied,
            memory_used_bytes=self._memory(),
        )
        self._log.info("state_store.commit", **info.event())
        return info

    def _timed_changelogs(
        self, commit: CommitRef, ops: Writes, ranges: list[tuple[bytes, bytes]]
    ) -> tuple[list[ChangelogRef], float]:
        """:meth:`_write_changelogs` and its milliseconds."""
        t = time.perf_counter()
        return self._write_changelogs(commit, ops, ranges), _now_ms(t)

    def _write_changelogs(
        self, commit: CommitRef, ops: Writes, ranges: list[tuple[bytes, bytes]]
    ) -> list[ChangelogRef]:
        """The commit's changelog: one file, or with spills one part per spilled
        segment and a last part for the rest. Each part is one batch on replay,
        in order, as it was written locally (a later range delete must not apply
        before earlier spilled writes)."""
        if not self._spills:
            return [self.checkpoint.write_changelog(commit, ops, ranges)]
        refs = []
        for part, path in enumerate(self._spills):
            segment = _changelog.decode(path.read_bytes())
            refs.append(
                self.checkpoint.write_changelog(
                    commit, segment.writes, segment.range_deletes, part=part
                )
            )
        refs.append(self.checkpoint.write_changelog(commit, ops, ranges, part=len(refs)))
        return refs

    # -- spill ------------------------------------------------------------------------------

    def _spill(self, table: StateTable) -> None:
        """Move a full MemTable into the local database before the commit: its
        writes go to a local segment file (for the commit's changelog) and to
        RocksDB. Until the commit, the local database is ahead of the
        checkpoint, so an abort or a crash reloads the last version."""
        try:
            spilled = table.spill()
            if not spilled.keys and not spilled.range_deletes:
                return
            ops, ranges = spilled.in_key_order(), spilled.range_deletes  # as in _prepare
            backend = self._live_backend()
            path = self._local.spill_dir() / f"{len(self._spills):08d}.seg"
            path.write_bytes(_changelog.encode(0, _SEGMENT_ID, ops, ranges))
            self._spills.append(path)
            fault("spill.after_segment")
            backend.write(ops, ranges)
        except BaseException:
            # The table's MemTable is gone and the segment and the local
            # database may disagree: nothing of this epoch may be committed.
            self._dirty = True
            raise
        self._log.debug("state_store.spill", table=table.schema.name, writes=len(ops))

    def _drop_spills(self) -> None:
        self._spills = []
        self._local.clear_spills()

    def _prepare(self, version: int) -> tuple[Writes, list[tuple[bytes, bytes]], int, int]:
        return prepare_tables(self._tables.values(), version)

    def _manifest(
        self,
        commit: CommitRef,
        head: Manifest | None,
        snapshot: SnapshotRef | None,
        chain: tuple[ChangelogRef, ...],
        total_rows: int,
    ) -> Manifest:
        ancestors: tuple[CommitRef, ...] = ()
        if head is not None:
            keep = self.config.retain_versions
            ancestors = (head.ref, *head.ancestors)[:keep]
        return Manifest(
            version=commit.version,
            commit_id=commit.commit_id,
            parent=None if head is None else head.ref,
            ancestors=ancestors,
            operator_id=self.checkpoint.operator_id,
            partition_id=self.checkpoint.partition_id,
            partition_count=self._partition_count,
            value_format_version=VALUE_FORMAT_VERSION,
            changelog_format_version=_changelog.FORMAT_VERSION,
            tables=self._metas,
            snapshot=snapshot,
            changelogs=chain,
            created_at=datetime.now(UTC).isoformat(),
            metrics={"numTotalStateRows": total_rows},
            table_rows={name: t.row_count for name, t in self._tables.items()},
        )

    def _cleanup(self) -> None:
        """Retention after a commit. The commit is durable already, so a failure
        here is logged and left to the next commit's cleanup."""
        try:
            self.checkpoint.cleanup(self.config.retain_versions)
        except Exception as exc:  # the version is committed; never fail the commit
            self._log.warning("state_store.cleanup_failed", error=repr(exc))

    def _memory(self) -> int:
        return 0 if self._backend is None else self._backend.memory_usage()

    # -- abort and close ----------------------------------------------------------------

    def abort(self) -> None:
        """Drop the uncommitted writes: the tables hold the loaded (or last
        committed) version again. After a failed commit that reached the local
        database, that version is loaded again (from the local cache when it can)."""
        self._require_open()
        for table in self._tables.values():
            table.abort()
        if self._loaded and self._ahead:
            self._drop_spills()
            self._dirty = True
            head = self._head
            if head is None:
                self.load(None)
            else:
                self.load(head.version, head.commit_id)

    def close(self) -> None:
        """Drop uncommitted writes and release the local database; a clean store
        leaves it marked as holding its version, for the next store to reuse."""
        if self._closed:
            return
        try:
            for table in self._tables.values():
                table.abort()
            backend, db_dir = self._backend, self._db_dir
            if backend is not None and db_dir is not None:
                if self._loaded and not self._ahead and self._head is not None:
                    backend.flush()
                    fault("close.before_marker")
                    self._local.write_marker(db_dir, self._head.ref)
                    fault("close.after_marker")
                self._close_backend()
        finally:
            self._tables = {}
            self._loaded = False
            self._closed = True
            self._local.unlock()

    def __repr__(self) -> str:
        state = (
            "closed"
            if self._closed
            else (f"version {self._head.version}" if self._head is not None else "empty")
        )
        return f"StateStore({self.checkpoint.root!r}, {state})"


#: The commit id in the header of a spill segment, a local file that is
#: rewritten under the real commit id when the commit writes its changelog.
_SEGMENT_ID = "0" * 32


def _applied(target: Manifest, local: CommitRef | None) -> int | None:
    """How many of ``target``'s changelogs a local database holding ``local``
    has applied, or ``None`` if it is not on ``target``'s chain."""
    if local is None:
        return 0 if target.snapshot is None else None
    if target.snapshot is not None and local == target.snapshot.commit:
        return 0
    # A commit that spilled has several changelog parts: all of them are applied.
    applied = None
    for i, ref in enumerate(target.changelogs):
        if ref.commit == local:
            applied = i + 1
    return applied
