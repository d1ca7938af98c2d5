"""Moving state between the local RocksDB and the checkpoint, verified.

Uploads: a snapshot is a RocksDB checkpoint whose SST files are uploaded only if
the parent's snapshot does not already hold the same file (same RocksDB name,
size and CRC-32); the small files that describe the database (``MANIFEST-*``,
``OPTIONS-*``, ``CURRENT``...) are uploaded with every snapshot, since RocksDB
rewrites them under the same names.

Downloads: every file is checked against the size and CRC-32 its manifest
records; a missing, short or altered file raises
:class:`~statestore.errors.CheckpointCorruptError` naming the file and version.
"""

from __future__ import annotations

import os
import shutil
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from statestore import _changelog
from statestore._checkpoint_fs import CheckpointFS
from statestore._faults import fault
from statestore._manifest import ChangelogRef, CommitRef, FileEntry, SnapshotRef, snapshot_file_path
from statestore._rocksdb import RocksDBBackend
from statestore.errors import CheckpointCorruptError

__all__ = ["ChecksumCache", "Transfers", "download_snapshot", "read_changelogs", "upload_snapshot"]

#: CRC-32 of local SST files by ``(name, size, inode, mtime)``: a checkpoint
#: hard-links the live files, so a file checksummed once (when uploaded or
#: downloaded) is never read again to decide whether it can be reused. RocksDB
#: never reuses a file name within one database, and the cache is emptied when
#: the store opens another database directory.
ChecksumCache = dict[tuple[str, int, int, int], int]


@dataclass
class Transfers:
    """Files and bytes moved by one commit or load."""

    files_copied: int = 0
    files_reused: int = 0
    bytes_copied: int = 0
    #: Time spent making the local RocksDB checkpoint of a snapshot.
    checkpoint_ms: float = 0.0


def _key(name: str, st: os.stat_result) -> tuple[str, int, int, int]:
    return (name, st.st_size, st.st_ino, st.st_mtime_ns)


def file_crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            crc = zlib.crc32(chunk, crc)
    return crc


def upload_snapshot(
    fs: CheckpointFS,
    backend: RocksDBBackend,
    checkpoint_dir: Path,
    commit: CommitRef,
    parent: SnapshotRef | None,
    checksums: ChecksumCache,
    moved: Transfers,
) -> SnapshotRef:
    """Checkpoint ``backend`` into ``checkpoint_dir`` (which must not exist),
    upload what the parent snapshot lacks, and remove the directory."""
    fault("snapshot.before_checkpoint")
    started = time.perf_counter()
    backend.checkpoint(checkpoint_dir)
    moved.checkpoint_ms += (time.perf_counter() - started) * 1000
    reusable = (
        {}
        if parent is None
        else {(f.name, f.size, f.crc32): f for f in parent.files if f.name.endswith(".sst")}
    )
    candidates = {(name, size) for name, size, _ in reusable}
    entries: list[FileEntry] = []
    uploaded: list[str] = []
    try:
        for name in sorted(os.listdir(checkpoint_dir)):
            local = checkpoint_dir / name
            st = local.stat()
            sst = name.endswith(".sst")
            if sst and (name, st.st_size) in candidates:
                key = _key(name, st)
                crc = checksums.get(key)
                if crc is None:
                    crc = checksums[key] = file_crc32(local)
                hit = reusable.get((name, st.st_size, crc))
                if hit is not None:
                    entries.append(hit)
                    moved.files_reused += 1
                    continue
            rel = snapshot_file_path(commit.version, commit.commit_id, name)
            fault("snapshot.before_write")
            size, crc = fs.upload(
                str(local), rel, on_temp=lambda: fault("snapshot.after_temp"), sync_dir=False
            )
            fault("snapshot.after_write")
            if sst:
                checksums[_key(name, st)] = crc
            entries.append(FileEntry(rel, size, crc, name))
            uploaded.append(rel)
            moved.files_copied += 1
            moved.bytes_copied += size
        fs.sync_dirs(uploaded)
    finally:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    fault("snapshot.after_upload")
    return SnapshotRef(commit, tuple(entries))


def _corrupt(fs: CheckpointFS, entry: FileEntry, version: int, what: str) -> CheckpointCorruptError:
    path = fs.full(entry.path)
    return CheckpointCorruptError(
        f"checkpoint file {path}, needed by version {version}, {what}; the checkpoint is "
        "damaged: restore the file, or load an older version that does not need it",
        path,
        version,
    )


def _check(fs: CheckpointFS, entry: FileEntry, version: int, size: int, crc: int) -> None:
    if size != entry.size:
        raise _corrupt(
            fs, entry, version, f"has {size} bytes where its manifest records {entry.size}"
        )
    if crc != entry.crc32:
        raise _corrupt(
            fs,
            entry,
            version,
            f"has CRC-32 {crc:08x} where its manifest records {entry.crc32:08x}",
        )


def _parallel(
    threads: int, work: Callable[[FileEntry], object], items: Sequence[FileEntry]
) -> None:
    if threads <= 1 or len(items) <= 1:
        for item in items:
            work(item)
        return
    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        for _ in pool.map(work, items):
            pass


def download_snapshot(
    fs: CheckpointFS,
    snapshot: SnapshotRef,
    db_dir: Path,
    version: int,
    checksums: ChecksumCache,
    moved: Transfers,
    threads: int,
) -> None:
    """Download and verify a snapshot's files into the empty ``db_dir``."""
    fault("load.before_download")

    def one(entry: FileEntry) -> None:
        local = db_dir / entry.name
        try:
            size, crc = fs.download(entry.path, str(local))
        except FileNotFoundError:
            raise _corrupt(fs, entry, version, "is missing") from None
        _check(fs, entry, version, size, crc)
        if entry.name.endswith(".sst"):
            checksums[_key(entry.name, local.stat())] = crc

    _parallel(threads, one, snapshot.files)
    moved.files_copied += len(snapshot.files)
    moved.bytes_copied += sum(f.size for f in snapshot.files)
    fault("load.after_download")


def read_changelogs(
    fs: CheckpointFS, chain: Sequence[ChangelogRef], version: int, threads: int
) -> Iterator[_changelog.Changelog]:
    """The changelogs of ``chain`` in order, each verified against its entry
    and its own header; read ahead in ``threads`` threads."""

    def one(ref: ChangelogRef) -> _changelog.Changelog:
        try:
            data = fs.read_bytes(ref.file.path)
        except FileNotFoundError:
            raise _corrupt(fs, ref.file, version, "is missing") from None
        _check(fs, ref.file, version, len(data), zlib.crc32(data))
        try:
            log = _changelog.decode(data)
        except _changelog.ChangelogFormatError as exc:
            raise _corrupt(fs, ref.file, version, f"is not a valid changelog: {exc}") from exc
        if (log.version, log.commit_id) != (ref.commit.version, ref.commit.commit_id):
            raise _corrupt(
                fs,
                ref.file,
                version,
                f"holds commit {log.version}/{log.commit_id}, not "
                f"{ref.commit.version}/{ref.commit.commit_id}",
            )
        return log

    if threads <= 1 or len(chain) <= 1:
        yield from map(one, chain)
        return
    with ThreadPoolExecutor(min(threads, len(chain))) as pool:
        yield from pool.map(one, chain)
