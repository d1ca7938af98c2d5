"""The local directory of one state store: a cache of its checkpoint.

It holds the RocksDB directory in use (``db-<id>``), temporary checkpoint
directories of snapshots in progress, a lock file, and a marker that says which
commit the RocksDB directory holds. The WAL is off (the checkpoint is the
durable copy), so the marker is written only after a flush at a clean close, and
removed before the directory is written again: a directory without a valid
marker is rebuilt from the checkpoint, never trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from statestore._manifest import CommitRef
from statestore.errors import LockHeldError

__all__ = ["LocalDir", "Marker"]

_MARKER = "LOCAL_COMMIT.json"


@dataclass(frozen=True)
class Marker:
    """The commit a cleanly closed RocksDB directory holds."""

    db: str
    commit: CommitRef


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalDir:
    """Lock, RocksDB directories and marker of one store's local directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_file: IO[bytes] | None = None

    def lock(self) -> None:
        """Take the directory's lock; :class:`LockHeldError` if a store in this
        or another process holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        f = open(self.path / "LOCK", "ab")  # noqa: SIM115 - held until unlock()
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise LockHeldError(
                f"the local state directory {self.path} is in use by another state "
                "store (this process or another); close that store first, or give "
                "this one another StoreConfig.local_dir"
            ) from None
        self._lock_file = f

    def unlock(self) -> None:
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def read_marker(self) -> Marker | None:
        """The marker, or ``None`` if there is none or it is unreadable."""
        try:
            obj = json.loads((self.path / _MARKER).read_bytes())
            marker = Marker(str(obj["db"]), CommitRef(int(obj["version"]), str(obj["commit_id"])))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not (self.path / marker.db).is_dir():
            return None
        return marker

    def write_marker(self, db: Path, commit: CommitRef) -> None:
        """Record durably that ``db`` holds ``commit`` (after a flush)."""
        data = json.dumps(
            {"db": db.name, "version": commit.version, "commit_id": commit.commit_id}
        ).encode()
        tmp = self.path / f"{_MARKER}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / _MARKER)
        _fsync_dir(self.path)

    def clear_marker(self) -> None:
        """Remove the marker, durably, before the directory it names changes."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / _MARKER).unlink()
            _fsync_dir(self.path)

    def new_db_dir(self) -> Path:
        """A fresh, empty RocksDB directory."""
        path = self.path / f"db-{uuid.uuid4().hex[:16]}"
        path.mkdir()
        return path

    def new_checkpoint_dir(self) -> Path:
        """A name for a RocksDB checkpoint (which creates the directory)."""
        return self.path / f"checkpoint-{uuid.uuid4().hex[:16]}"

    def spill_dir(self) -> Path:
        """The directory of the epoch's spill segments (created if missing)."""
        path = self.path / "spill"
        path.mkdir(exist_ok=True)
        return path

    def clear_spills(self) -> None:
        """Delete the epoch's spill segments."""
        shutil.rmtree(self.path / "spill", ignore_errors=True)

    def remove_stale(self, keep: Path | None) -> None:
        """Delete every RocksDB and checkpoint directory but ``keep``: what
        earlier loads and crashed processes left."""
        for entry in self.path.iterdir():
            if entry == keep or not entry.is_dir():
                continue
            if entry.name.startswith(("db-", "checkpoint-")) or entry.name == "spill":
                shutil.rmtree(entry, ignore_errors=True)
