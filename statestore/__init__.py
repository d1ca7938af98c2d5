"""Where rows live: KV backends, the MemTable, state tables, and the state
store that versions and checkpoints them."""

from statestore._caches import remove_orphaned_caches
from statestore._checkpoint import PartitionCheckpoint
from statestore._config import CommitInfo, LoadInfo, StoreConfig
from statestore._log import (
    LogConfig,
    apply_log_config,
    capture_events,
    configure_logging,
    current_log_config,
    get_logger,
)
from statestore._memory import MemoryBackend
from statestore._memory_store import MemoryStateStore
from statestore._memtable import KeyOp, MemTable, OpKind
from statestore._rocksdb import RocksDBBackend, RocksDBConfig
from statestore._store import StateStore
from statestore._table import ConsistencyMode, StateTable, TableMetrics
from statestore._typing import KVBackend, WriteOp
from statestore.errors import (
    AmbiguousVersionError,
    BackendClosedError,
    BackendError,
    CheckpointCorruptError,
    CorruptionError,
    EpochError,
    IncompatibleStateError,
    InconsistencyError,
    InvalidVersionError,
    LockHeldError,
    LogConfigError,
    StateStoreError,
    StoreStateError,
    VersionNotFoundError,
    WinnerConflictError,
)

__all__ = [
    "AmbiguousVersionError",
    "BackendClosedError",
    "BackendError",
    "CheckpointCorruptError",
    "CommitInfo",
    "ConsistencyMode",
    "CorruptionError",
    "EpochError",
    "IncompatibleStateError",
    "InconsistencyError",
    "InvalidVersionError",
    "KVBackend",
    "KeyOp",
    "LoadInfo",
    "LockHeldError",
    "LogConfig",
    "LogConfigError",
    "MemTable",
    "MemoryBackend",
    "MemoryStateStore",
    "OpKind",
    "PartitionCheckpoint",
    "RocksDBBackend",
    "RocksDBConfig",
    "StateStore",
    "StateStoreError",
    "StateTable",
    "StoreConfig",
    "StoreStateError",
    "TableMetrics",
    "VersionNotFoundError",
    "WinnerConflictError",
    "WriteOp",
    "apply_log_config",
    "capture_events",
    "configure_logging",
    "current_log_config",
    "get_logger",
    "remove_orphaned_caches",
]
