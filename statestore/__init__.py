"""Where rows live: KV backends, the MemTable, state tables, and the state
store that versions and checkpoints them."""

from statestore._caches import remove_orphaned_caches
from statestore._checkpoint import PartitionCheckpoint
from statestore._config import CommitInfo, LoadInfo, StoreConfig
from statestore._faults import ENV_VAR as FAULT_ENV_VAR
from statestore._faults import fault
from statestore._filesystems import S3_OPTIONS, filesystem_for, redact, write_atomically
from statestore._log import (
    LogConfig,
    apply_log_config,
    capture_events,
    configure_logging,
    current_log_config,
    get_logger,
)
from statestore._manifest import Manifest
from statestore._memory import MemoryBackend
from statestore._memory_store import MemoryStateStore
from statestore._memtable import KeyOp, MemTable, OpKind
from statestore._metadata import TableMeta
from statestore._rocksdb import RocksDBBackend, RocksDBConfig
from statestore._store import StateStore
from statestore._store_tables import StoreTables
from statestore._table import ConsistencyMode, StateTable, TableMetrics
from statestore._transfer import read_changelogs
from statestore._typing import KVBackend, WriteOp
from statestore._writes import Writes
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
    RelstateError,
    StateStoreError,
    StoreStateError,
    VersionNotFoundError,
    WinnerConflictError,
)

__all__ = [
    "FAULT_ENV_VAR",
    "S3_OPTIONS",
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
    "Manifest",
    "MemTable",
    "MemoryBackend",
    "MemoryStateStore",
    "OpKind",
    "PartitionCheckpoint",
    "RelstateError",
    "RocksDBBackend",
    "RocksDBConfig",
    "StateStore",
    "StateStoreError",
    "StateTable",
    "StoreConfig",
    "StoreStateError",
    "StoreTables",
    "TableMeta",
    "TableMetrics",
    "VersionNotFoundError",
    "WinnerConflictError",
    "WriteOp",
    "Writes",
    "apply_log_config",
    "capture_events",
    "configure_logging",
    "current_log_config",
    "fault",
    "filesystem_for",
    "get_logger",
    "read_changelogs",
    "redact",
    "remove_orphaned_caches",
    "write_atomically",
]
