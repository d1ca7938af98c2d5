"""Where rows live: KV backends, the MemTable, and state tables."""

from statestore._memory import MemoryBackend
from statestore._memtable import KeyOp, MemTable, OpKind
from statestore._rocksdb import RocksDBBackend, RocksDBConfig
from statestore._table import ConsistencyMode, StateTable, TableMetrics
from statestore._typing import KVBackend, WriteOp
from statestore.errors import (
    BackendClosedError,
    BackendError,
    CorruptionError,
    EpochError,
    InconsistencyError,
    LockHeldError,
    StateStoreError,
)

__all__ = [
    "BackendClosedError",
    "BackendError",
    "ConsistencyMode",
    "CorruptionError",
    "EpochError",
    "InconsistencyError",
    "KVBackend",
    "KeyOp",
    "LockHeldError",
    "MemTable",
    "MemoryBackend",
    "OpKind",
    "RocksDBBackend",
    "RocksDBConfig",
    "StateStoreError",
    "StateTable",
    "TableMetrics",
    "WriteOp",
]
