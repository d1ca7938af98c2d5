"""The local caches of state stores, and removing those that are orphaned.

Each store keeps a RocksDB cache of its partition's checkpoint in
``{root}/{key}/{operator_id}/{partition_id}`` (``root`` is
``StoreConfig.local_dir``, by default ``{system temp}/relstate``; ``key`` is
a hash of the partition's checkpoint directory). A cache is only a copy:
deleting one costs the next load a rebuild from the checkpoint, never state.

A cache is *closed for good* when nothing can load its state again: its
checkpoint is gone. Until then it is kept, since the task of the next batch
(or a restarted query) reopens it. So each cache records its checkpoint in
``{root}/{key}/ORIGIN.json``, and :func:`remove_orphaned_caches` deletes the
caches whose checkpoint is a local directory that no longer exists (test
runs, deleted demo directories), skipping any a store holds: it takes every
store lock inside first, then renames the directory aside and deletes it. A
checkpoint on another filesystem (S3, HDFS) is never checked, so its cache is
never removed here. A store sweeps its root once per process, when it opens
a cache it has not seen before.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path

from statestore._config import StoreConfig
from statestore._local import LocalDir
from statestore.errors import LockHeldError

__all__ = ["ORIGIN", "note_origin", "remove_orphaned_caches", "sweep_once"]

#: The file, in a checkpoint's cache directory, naming that checkpoint.
ORIGIN = "ORIGIN.json"
#: A cache directory renamed aside to be deleted.
_REMOVING = ".removing-"
#: The roots this process has swept.
_swept: set[Path] = set()


def note_origin(local: Path, filesystem: str, checkpoint: str) -> bool:
    """Record that the store cache ``local`` (``{root}/{key}/{op}/{part}``)
    caches ``checkpoint`` on ``filesystem`` (a ``pyarrow.fs`` type name);
    whether the cache had no record yet."""
    origin = local.parents[1] / ORIGIN
    if origin.exists():
        return False
    if filesystem == "local":
        checkpoint = os.path.abspath(checkpoint)  # a sweep may run in another directory
    origin.parent.mkdir(parents=True, exist_ok=True)
    tmp = origin.with_name(f"{ORIGIN}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps({"filesystem": filesystem, "checkpoint": checkpoint}))
    tmp.replace(origin)
    return True


def sweep_once(root: Path) -> list[Path]:
    """:func:`remove_orphaned_caches` of ``root``, the first time this
    process asks; later calls do nothing."""
    if root in _swept:
        return []
    _swept.add(root)
    return remove_orphaned_caches(root)


def remove_orphaned_caches(root: str | Path | None = None) -> list[Path]:
    """Delete every cache under ``root`` (default: ``StoreConfig().local_root``,
    ``{system temp}/relstate``) whose checkpoint is a local directory that no
    longer exists and that no open store holds; returns the cache
    directories removed. Leftovers of a removal that stopped half way go
    too. Caches without a record (written before relstate kept one) are left
    alone."""
    root = StoreConfig().local_root if root is None else Path(root)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        if entry.name.startswith(_REMOVING):
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_dir() and _orphaned(entry) and _remove(entry):
            removed.append(entry)
    return removed


def _orphaned(cache: Path) -> bool:
    """Whether ``cache``'s record names a local checkpoint that is gone."""
    try:
        origin = json.loads((cache / ORIGIN).read_text())
        local = origin["filesystem"] == "local"
        checkpoint = Path(origin["checkpoint"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return local and not checkpoint.exists()


def _remove(cache: Path) -> bool:
    """Delete ``cache`` if every store lock in it can be taken; whether it was."""
    held: list[LocalDir] = []
    try:
        for lock in sorted(cache.rglob("LOCK")):
            if any(p.name.startswith(("db-", "checkpoint-")) for p in lock.parents):
                continue  # RocksDB's own lock file, inside a store's directory
            store = LocalDir(lock.parent)
            store.lock()
            held.append(store)
        aside = cache.with_name(f"{_REMOVING}{cache.name}-{uuid.uuid4().hex[:8]}")
        cache.rename(aside)
    except (LockHeldError, OSError):
        return False
    finally:
        for store in held:
            with contextlib.suppress(OSError):
                store.unlock()
    shutil.rmtree(aside, ignore_errors=True)
    return True
