"""State store configuration and the metrics of a commit and a load."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from statestore._rocksdb import RocksDBConfig

__all__ = ["CommitInfo", "LoadInfo", "StoreConfig"]


@dataclass(frozen=True)
class StoreConfig:
    """How a :class:`~statestore.StateStore` checkpoints and caches its state."""

    #: A snapshot is taken when this many changelogs would otherwise have to be
    #: replayed to load a version (1 = every commit).
    snapshot_interval: int = 10
    #: ``False`` takes a snapshot at every commit and writes no changelogs
    #: (Spark's checkpointing without changelogs).
    changelog: bool = True
    #: How many of the newest versions stay loadable.
    retain_versions: int = 20
    #: Root of the local RocksDB caches; each store uses
    #: ``{local_dir}/{location hash}/{operator_id}/{partition_id}``.
    #: ``None`` is ``{system temp}/relstate``.
    local_dir: str | None = None
    rocksdb: RocksDBConfig = field(default_factory=RocksDBConfig)
    #: The number of partitions of the operator; recorded in every manifest and
    #: checked on load (``None`` = not checked, the recorded one is kept).
    partition_count: int | None = None
    #: Threads that download snapshot files and read changelogs in parallel.
    io_threads: int = 4
    #: A table's MemTable is spilled into the local database (and a local
    #: segment file for the changelog) when it holds this many keys, so that an
    #: epoch need not fit in memory; ``None`` never spills.
    spill_rows: int | None = 500_000

    def __post_init__(self) -> None:
        for name in ("snapshot_interval", "retain_versions", "io_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"StoreConfig.{name} must be an integer >= 1, got {value!r}")
        if self.spill_rows is not None and (
            not isinstance(self.spill_rows, int) or self.spill_rows < 1
        ):
            raise ValueError(
                f"StoreConfig.spill_rows must be None or an integer >= 1, got {self.spill_rows!r}"
            )
        if self.partition_count is not None and (
            not isinstance(self.partition_count, int) or self.partition_count < 1
        ):
            raise ValueError(
                f"StoreConfig.partition_count must be None or an integer >= 1, got "
                f"{self.partition_count!r}"
            )

    @property
    def local_root(self) -> Path:
        """The root of the local caches: ``local_dir``, or ``{system temp}/relstate``."""
        return Path(self.local_dir) if self.local_dir else Path(tempfile.gettempdir()) / "relstate"

    def local_path(self, checkpoint_root: str, operator_id: str, partition_id: int) -> Path:
        """The local directory of the store of one partition."""
        key = hashlib.blake2b(checkpoint_root.encode(), digest_size=8).hexdigest()
        return self.local_root / key / operator_id / str(partition_id)


def _ms(value: float) -> float:
    return round(value, 3)


@dataclass(frozen=True)
class CommitInfo:
    """What one commit did and how long its steps took (milliseconds)."""

    version: int
    commit_id: str
    parent_commit_id: str | None
    snapshot: bool
    num_total_rows: int
    num_updated_rows: int
    num_removed_rows: int
    local_write_ms: float
    changelog_ms: float
    snapshot_ms: float
    upload_ms: float
    manifest_ms: float
    cleanup_ms: float
    commit_ms: float
    files_copied: int
    files_reused: int
    bytes_copied: int
    memory_used_bytes: int

    def event(self) -> dict[str, Any]:
        """The fields of the ``state_store.commit`` log event (Spark's metric
        names where Spark has one)."""
        out = asdict(self)
        out["numTotalStateRows"] = out.pop("num_total_rows")
        out["numUpdatedStateRows"] = out.pop("num_updated_rows")
        out["numRemovedStateRows"] = out.pop("num_removed_rows")
        return {k: _ms(v) if isinstance(v, float) else v for k, v in out.items()}


@dataclass(frozen=True)
class LoadInfo:
    """What one load did: ``files_copied`` is 0 when the local database already
    held the version (or an ancestor, then only changelogs are replayed)."""

    version: int | None
    commit_id: str | None
    rebuilt: bool
    num_total_rows: int
    load_ms: float
    files_copied: int
    files_reused: int
    bytes_copied: int
    changelogs_replayed: int
    memory_used_bytes: int

    def event(self) -> dict[str, Any]:
        """The fields of the ``state_store.load`` log event."""
        out = asdict(self)
        out["numTotalStateRows"] = out.pop("num_total_rows")
        return {k: _ms(v) if isinstance(v, float) else v for k, v in out.items()}
