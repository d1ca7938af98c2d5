"""The MemTable: one epoch's operations on a state table, keyed by encoded key.

Values are the row-layout encoding of whole rows, so that a commit of a ``row``
table writes them as they are and a strict-mode check compares bytes.
"""

from __future__ import annotations

import enum
from bisect import bisect_left
from collections.abc import Iterator, KeysView, Sequence
from typing import NamedTuple

from sortedcontainers import SortedList

from encoding import prefix_successor

__all__ = ["UNTOUCHED", "KeyOp", "MemTable", "OpKind"]

#: :meth:`MemTable.under_prefixes` reads a range per prefix when the touched
#: keys are more than this many times the prefixes, else sorts them once.
_SORT_PER_PREFIX = 32

#: What :meth:`MemTable.lookup` returns for a key the epoch has not touched.
UNTOUCHED: object = object()


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
    """One epoch's net operation per key, merged by RisingWave's rules.

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

    The operations are held as two dicts rather than one object per key: ``new``
    maps every touched key to its row after the epoch (``None``: deleted), and
    ``old`` maps the keys that existed before the epoch to their row then. A key
    in ``new`` but not in ``old`` is an Insert; in both, a Delete when its new row
    is ``None`` and an Update otherwise. A bulk insert is then one
    ``dict.update``, and ``new``'s items are the commit's writes as they stand
    (:meth:`writes` hands them over, in no particular order).

    With ``blind_inserts`` (callers that insert without checking storage) an
    Insert may cover a committed row, so Insert + delete cannot be "nothing":
    it leaves a *tombstone*, a key in ``new`` with ``None`` but not in ``old``,
    which deletes whatever storage holds and counts as neither an insert nor a
    delete.
    """

    __slots__ = (
        "_blind",
        "_new",
        "_old",
        "_read_once",
        "_sorted",
        "_unsorted",
        "deletes",
        "inserts",
    )

    def __init__(self, blind_inserts: bool = False) -> None:
        self._blind = blind_inserts
        self._new: dict[bytes, bytes | None] = {}
        self._old: dict[bytes, bytes] = {}
        # Built on the second ordered read of the epoch, so that an epoch of
        # writes alone never pays for ordering, nor one with a single range
        # read (an eviction's, at the end of a batch), which sorts only the
        # keys in its range; keys new since the last ordered read wait in
        # ``_unsorted`` and join it at the next one, so that writes after the
        # epoch's last read never pay either.
        self._sorted: SortedList | None = None
        self._unsorted: list[bytes] = []
        self._read_once = False
        #: Keys whose net operation is an Insert / a Delete, kept as operations
        #: merge, so the epoch's effect on the row count needs no pass.
        self.inserts = 0
        self.deletes = 0

    def __len__(self) -> int:
        return len(self._new)

    def __bool__(self) -> bool:
        return bool(self._new)

    def __contains__(self, key: bytes) -> bool:
        return key in self._new

    def lookup_many(self, keys: Sequence[bytes]) -> list[object]:
        """:meth:`lookup` of many keys."""
        new = self._new
        if not new:
            return [UNTOUCHED] * len(keys)
        get = new.get
        return [get(k, UNTOUCHED) for k in keys]

    def lookup(self, key: bytes) -> object:
        """The row ``key`` has after the epoch so far: bytes, ``None`` when the
        epoch deleted it, or :data:`UNTOUCHED` when the epoch has not touched
        it."""
        return self._new.get(key, UNTOUCHED)

    def get(self, key: bytes) -> KeyOp | None:
        """The net operation on ``key`` in this epoch, if any."""
        new = self._new.get(key, UNTOUCHED)
        if new is UNTOUCHED:
            return None
        assert new is None or isinstance(new, bytes)
        old = self._old.get(key)
        if old is None:
            if new is None:  # a tombstone
                return KeyOp(OpKind.DELETE, None, None)
            return KeyOp(OpKind.INSERT, None, new)
        return KeyOp(OpKind.DELETE if new is None else OpKind.UPDATE, old, new)

    # -- the merge rules -------------------------------------------------------

    def _add_key(self, key: bytes) -> None:
        if self._sorted is not None:
            self._unsorted.append(key)

    def _forget(self, key: bytes) -> None:
        del self._new[key]
        self._old.pop(key, None)
        if self._sorted is not None:
            self._ordered().remove(key)

    def insert(self, key: bytes, new: bytes) -> bool:
        """Record an insert of ``new``; ``False`` if it was a conflict."""
        prev = self._new.get(key, UNTOUCHED)
        self._new[key] = new
        if prev is UNTOUCHED:
            if self._sorted is not None:
                self._unsorted.append(key)
            self.inserts += 1
            return True
        if prev is None:  # Delete(a) + insert(v) = Update(a, v)
            self._revive(key)
            return True
        return False  # over Insert / Update: the newest row wins

    def _revive(self, key: bytes) -> None:
        """A deleted key gets a row again: an Update, or after a tombstone an
        Insert."""
        if key in self._old:
            self.deletes -= 1
        else:
            self.inserts += 1

    def delete(self, key: bytes, old: bytes) -> bool:
        """Record a delete of ``old``; ``False`` if it was a conflict."""
        prev = self._new.get(key, UNTOUCHED)
        if prev is UNTOUCHED:
            self._new[key] = None
            self._old[key] = old
            self._add_key(key)
            self.deletes += 1
            return True
        if prev is None:
            return False  # Delete over Delete: still deleted
        if key in self._old:  # Update(a, b) + delete = Delete(a)
            self._new[key] = None
            self.deletes += 1
        elif self._blind:  # Insert(a) + delete = a tombstone
            self._new[key] = None
            self.inserts -= 1
        else:  # Insert(a) + delete = nothing
            self._forget(key)
            self.inserts -= 1
        return True

    def update(self, key: bytes, old: bytes, new: bytes) -> bool:
        """Record an update from ``old`` to ``new``; ``False`` if a conflict."""
        prev = self._new.get(key, UNTOUCHED)
        self._new[key] = new
        if prev is UNTOUCHED:
            self._old[key] = old
            self._add_key(key)
            return True
        if prev is None:
            # Update of a deleted row: the newest operation makes it exist again.
            self._revive(key)
            return False
        return True  # Insert stays Insert(new); Update(a, b) becomes Update(a, new)

    def insert_many(self, keys: list[bytes], values: list[bytes]) -> list[bytes]:
        """Record inserts of ``values`` at ``keys``; returns the keys whose
        insert was a conflict. Keys the epoch has not touched go in one pass,
        the common case of a bulk load."""
        new = self._new
        if new.keys().isdisjoint(keys):
            before = len(new)
            new.update(zip(keys, values, strict=True))
            if len(new) - before == len(keys):  # and no key twice in ``keys``
                self.inserts += len(keys)
                if self._sorted is not None:
                    self._unsorted.extend(keys)
                return []
            for k in keys:  # a key twice: undo, and merge one at a time
                new.pop(k, None)
        return [k for k, v in zip(keys, values, strict=True) if not self.insert(k, v)]

    def update_many(self, keys: list[bytes], olds: list[bytes], values: list[bytes]) -> list[bytes]:
        """Record updates from ``olds`` to ``values`` at ``keys``; returns the
        keys whose update was a conflict. Distinct keys the epoch has not
        touched go in one pass, the common case of a batch of changed rows."""
        new = self._new
        if new.keys().isdisjoint(keys) and len(set(keys)) == len(keys):
            new.update(zip(keys, values, strict=True))
            self._old.update(zip(keys, olds, strict=True))
            if self._sorted is not None:
                self._unsorted.extend(keys)
            return []
        return [k for k, o, v in zip(keys, olds, values, strict=True) if not self.update(k, o, v)]

    def delete_many(self, keys: list[bytes], olds: list[bytes]) -> list[bytes]:
        """Record deletes of ``olds`` at ``keys``, which must be distinct;
        returns the keys whose delete was a conflict. Keys the epoch has not
        touched go in one pass."""
        new = self._new
        if new.keys().isdisjoint(keys):
            new.update(dict.fromkeys(keys))
            self._old.update(zip(keys, olds, strict=True))
            self.deletes += len(keys)
            if self._sorted is not None:
                self._unsorted.extend(keys)
            return []
        return [k for k, v in zip(keys, olds, strict=True) if not self.delete(k, v)]

    def replace(self, key: bytes, op: KeyOp | None) -> None:
        """Set ``key``'s net operation outright, without merging (``None``
        forgets the key): for a caller that has squared the epoch with
        storage."""
        if key in self._new:
            prev = self.get(key)
            assert prev is not None
            if prev.kind is OpKind.INSERT:
                self.inserts -= 1
            elif prev.kind is OpKind.DELETE and prev.old is not None:  # not a tombstone
                self.deletes -= 1
            self._forget(key)
        if op is None:
            return
        self._new[key] = op.new
        if op.old is not None:
            self._old[key] = op.old
        self._add_key(key)
        if op.kind is OpKind.INSERT:
            self.inserts += 1
        elif op.kind is OpKind.DELETE and op.old is not None:
            self.deletes += 1

    def drop_range(self, lower: bytes, upper: bytes) -> list[tuple[bytes, KeyOp]]:
        """Remove and return every operation with ``lower <= key < upper``."""
        keys = self._keys_in(lower, upper)
        dropped = []
        for k in keys:
            op = self.get(k)
            assert op is not None
            dropped.append((k, op))
            self.replace(k, None)
        return dropped

    # -- reads -------------------------------------------------------------------

    def _keys_in(self, lower: bytes, upper: bytes | None, reverse: bool = False) -> list[bytes]:
        """The touched keys with ``lower <= key < upper``, in key order (or
        reversed). The epoch's first ordered read filters every key and sorts
        those in range, a pass cheaper than building the ordered index; the
        index is built by the second, and serves every later one."""
        if self._sorted is None and not self._read_once:
            self._read_once = True
            keys = [k for k in self._new if lower <= k and (upper is None or k < upper)]
            keys.sort(reverse=reverse)
            return keys
        return list(self._ordered().irange(lower, upper, inclusive=(True, False), reverse=reverse))

    def _ordered(self) -> SortedList:
        if self._sorted is None:
            self._sorted = SortedList(self._new)
        elif self._unsorted:
            self._sorted.update(self._unsorted)
            self._unsorted = []
        return self._sorted

    def touches(self, lower: bytes, upper: bytes | None) -> bool:
        """Whether the epoch has an operation with ``lower <= key < upper``."""
        if not self._new:
            return False
        if self._sorted is None and not self._read_once:
            self._read_once = True
            return any(lower <= k and (upper is None or k < upper) for k in self._new)
        keys = self._ordered().irange(lower, upper, inclusive=(True, False))
        return next(keys, None) is not None

    def range(
        self, lower: bytes, upper: bytes | None, reverse: bool = False
    ) -> list[tuple[bytes, bytes | None]]:
        """``(key, new row or None)`` with ``lower <= key < upper``, in key
        order; a list, so writes during a scan do not disturb it (a snapshot,
        like the storage iterator)."""
        new = self._new
        return [(k, new[k]) for k in self._keys_in(lower, upper, reverse)]

    def under_prefixes(self, prefixes: Sequence[bytes]) -> list[tuple[bytes, bytes | None]]:
        """``(key, new row or None)`` of each touched key that starts with
        one of ``prefixes`` (ascending, none the start of the next), in key
        order. Few prefixes of many keys: a range read each. Many: the keys
        sorted once and a binary search per prefix, where a range read each
        would walk the ordered index once a prefix."""
        if not self._new or not prefixes:
            return []
        if len(prefixes) * _SORT_PER_PREFIX < len(self._new):
            return [op for p in prefixes for op in self.range(p, prefix_successor(p))]
        keys = sorted(self._new)  # in C, the batch writes' runs in order already
        new = self._new
        out: list[tuple[bytes, bytes | None]] = []
        at, end = 0, len(keys)
        for prefix in prefixes:
            at = bisect_left(keys, prefix, at)
            while at < end and keys[at].startswith(prefix):
                key = keys[at]
                out.append((key, new[key]))
                at += 1
        return out

    def entries(self) -> list[tuple[bytes, bytes | None, bool]]:
        """Every touched key with its row after the epoch and whether it
        existed before the epoch (``False``: its net operation is an Insert)."""
        old = self._old
        return [(k, v, k in old) for k, v in self._new.items()]

    def keys(self) -> list[bytes]:
        """Every touched key, in no particular order."""
        return list(self._new)

    def existed(self) -> KeysView[bytes]:
        """The touched keys that existed before the epoch (a live view)."""
        return self._old.keys()

    def tombstones(self) -> list[bytes]:
        """The keys of tombstones (see the class docstring)."""
        new = self._new
        if None not in new.values():
            return []
        old = self._old
        return [k for k, v in new.items() if v is None and k not in old]

    def writes(self) -> tuple[list[bytes], list[bytes | None]]:
        """Every touched key, and at the same position its row after the epoch
        (``None``: delete it): the epoch's writes for the row layout, in no
        particular order (a caller that wants key order sorts them)."""
        return list(self._new), list(self._new.values())

    def items(self) -> Iterator[tuple[bytes, KeyOp]]:
        """Every net operation, in no particular order."""
        for key in list(self._new):
            op = self.get(key)
            assert op is not None
            yield key, op

    def clear(self) -> None:
        """Forget every operation (after a commit or an abort)."""
        self._new = {}
        self._old = {}
        self._sorted = None
        self._unsorted = []
        self._read_once = False
        self.inserts = self.deletes = 0
