"""The MemTable: one epoch's operations on a state table, keyed by encoded key.

Values are the row-layout encoding of whole rows, so that a commit of a ``row``
table writes them as they are and a strict-mode check compares bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import NamedTuple

from sortedcontainers import SortedList

__all__ = ["KeyOp", "MemTable", "OpKind"]


class OpKind(enum.IntEnum):
    """What one key's net operation in the epoch is."""

    INSERT = 0
    DELETE = 1
    UPDATE = 2


class KeyOp(NamedTuple):
    """The net operation on one key: ``old`` is the row the epoch started from
    (``None`` for an insert), ``new`` the row it ends with (``None`` for a
    delete)."""

    kind: OpKind
    old: bytes | None
    new: bytes | None


class MemTable:
    """One epoch's :class:`KeyOp` per key, merged by RisingWave's rules.

    ======================  ==============  ===============  ====================
    previous \\ new          insert(v)       delete(old)      update(old, new)
    ======================  ==============  ===============  ====================
    none                    Insert(v)       Delete(old)      Update(old, new)
    Insert(a)               *conflict*      nothing          Insert(new)
    Delete(a)               Update(a, v)    *conflict*       *conflict*
    Update(a, b)            *conflict*      Delete(a)        Update(a, new)
    ======================  ==============  ===============  ====================

    A *conflict* is an inconsistency. The MemTable resolves it so that the newest
    operation wins and reports it by returning ``False``; strict callers check
    before they write, so they never reach one. Whether an ``old`` row matches is
    the caller's check too.
    """

    __slots__ = ("_ops", "_sorted")

    def __init__(self) -> None:
        self._ops: dict[bytes, KeyOp] = {}
        # Built on the first ordered read of the epoch, then kept up to date, so
        # that an epoch of writes alone never pays for ordering.
        self._sorted: SortedList | None = None

    def __len__(self) -> int:
        return len(self._ops)

    def __bool__(self) -> bool:
        return bool(self._ops)

    def __contains__(self, key: bytes) -> bool:
        return key in self._ops

    def get(self, key: bytes) -> KeyOp | None:
        """The net operation on ``key`` in this epoch, if any."""
        return self._ops.get(key)

    def _set(self, key: bytes, op: KeyOp) -> None:
        if self._sorted is not None and key not in self._ops:
            self._sorted.add(key)
        self._ops[key] = op

    def _drop(self, key: bytes) -> None:
        del self._ops[key]
        if self._sorted is not None:
            self._sorted.remove(key)

    def insert(self, key: bytes, new: bytes) -> bool:
        """Record an insert of ``new``; ``False`` if it was a conflict."""
        prev = self._ops.get(key)
        if prev is None:
            self._set(key, KeyOp(OpKind.INSERT, None, new))
            return True
        if prev.kind is OpKind.DELETE:
            self._set(key, KeyOp(OpKind.UPDATE, prev.old, new))
            return True
        # Insert over Insert / Update: the newest row wins, the origin is kept.
        self._set(key, KeyOp(prev.kind, prev.old, new))
        return False

    def delete(self, key: bytes, old: bytes) -> bool:
        """Record a delete of ``old``; ``False`` if it was a conflict."""
        prev = self._ops.get(key)
        if prev is None:
            self._set(key, KeyOp(OpKind.DELETE, old, None))
            return True
        if prev.kind is OpKind.INSERT:
            self._drop(key)
            return True
        if prev.kind is OpKind.UPDATE:
            self._set(key, KeyOp(OpKind.DELETE, prev.old, None))
            return True
        return False  # Delete over Delete: still deleted

    def update(self, key: bytes, old: bytes, new: bytes) -> bool:
        """Record an update from ``old`` to ``new``; ``False`` if a conflict."""
        prev = self._ops.get(key)
        if prev is None:
            self._set(key, KeyOp(OpKind.UPDATE, old, new))
            return True
        if prev.kind is OpKind.DELETE:
            # The row was gone: the newest operation makes it exist again.
            self._set(key, KeyOp(OpKind.UPDATE, prev.old, new))
            return False
        self._set(key, KeyOp(prev.kind, prev.old, new))
        return True

    def drop_range(self, lower: bytes, upper: bytes) -> list[tuple[bytes, KeyOp]]:
        """Remove and return every operation with ``lower <= key < upper``."""
        keys = list(self._ordered().irange(lower, upper, inclusive=(True, False)))
        dropped = [(k, self._ops[k]) for k in keys]
        for k in keys:
            self._drop(k)
        return dropped

    def _ordered(self) -> SortedList:
        if self._sorted is None:
            self._sorted = SortedList(self._ops)
        return self._sorted

    def range(
        self, lower: bytes, upper: bytes | None, reverse: bool = False
    ) -> Iterator[tuple[bytes, KeyOp]]:
        """Operations with ``lower <= key < upper`` in key order.

        The keys are taken when the call is made, so writes during iteration do
        not disturb it (a snapshot, like the storage iterator).
        """
        keys = list(
            self._ordered().irange(lower, upper, inclusive=(True, False), reverse=reverse)
        )
        ops = self._ops
        return iter([(k, ops[k]) for k in keys])

    def items(self) -> Iterator[tuple[bytes, KeyOp]]:
        """Every operation, in no particular order."""
        return iter(self._ops.items())

    def clear(self) -> None:
        """Forget every operation (after a commit or an abort)."""
        self._ops = {}
        self._sorted = None
