"""The state variables at run time: ``ValueState``, ``ListState`` and
``MapState`` with Spark's calls, over the variables' state tables.

A batch reads each variable once for every grouping key of the input chunk
it works on, at the variable's first call (one multi-get or one decode of a
run of scans), and keeps what the processor writes in Python until the chunk
(or the timers) are done, when it goes to the tables in their batch forms. A
key met outside the chunk (a timer's) is read alone.

TTL is Spark's (``StateTTL``): an entry written at the batch's processing
time ``t`` with a TTL of ``d`` expires at ``t + d`` and is gone from the batch
whose processing time reaches it (``operators._ttl``). Expired entries are
removed when a batch opens, before the processor reads anything, so reads
need not check. A list's elements and a map's entries expire one by one,
each from its own write; ``exists()`` is then whether any is left.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from operators._api.ttl import expiry_time, live_from
from operators.errors import InputError
from operators.stateful._core.variables import EXPIRES_AT, StateVariable
from statestore import StateTable

__all__ = [
    "ListStateImpl",
    "MapStateImpl",
    "Scope",
    "ValueStateImpl",
    "VariableState",
    "rows_batch",
]

Key = tuple[Any, ...]
_MISSING: Any = object()
#: A map entry's expiry while it holds a value written in this chunk.
_WRITTEN: Any = object()


def rows_batch(fields: Sequence[pa.Field], rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """Rows (tuples in ``fields`` order) as one Arrow batch, converted in C."""
    schema = pa.schema(list(fields))
    if not rows:
        return pa.RecordBatch.from_pylist([], schema=schema)
    arrays = pa.array(rows, type=pa.struct(list(fields))).flatten()
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class Scope:
    """What every variable of one partition's batch shares: the grouping key
    being processed, the keys of the input chunk, the processing time."""

    def __init__(self, now: int, key_names: Sequence[str]) -> None:
        self.now = now
        self.key: Key = ()
        self.key_names = list(key_names)
        #: The distinct grouping keys of the chunk being processed, as Arrow
        #: (the table's key columns) and as tuples.
        self.chunk: pa.Table | None = None
        self.chunk_keys: set[Key] = set()


class VariableState(abc.ABC):
    """The part every kind shares: its tables, its scope and its name."""

    def __init__(
        self,
        variable: StateVariable,
        scope: Scope,
        table: StateTable,
        ttl_table: StateTable | None,
    ) -> None:
        self.variable = variable
        self.name = variable.name
        self._scope = scope
        self._table = table
        self._ttl_table = ttl_table
        self._ttl = variable.ttl_ms
        self._n_key = len(scope.key_names)
        self._n_value = len(variable.value)
        self._cache: dict[Key, Any] = {}
        self._dirty: set[Key] = set()
        self._prefetched = False

    def _expiry(self) -> int:
        assert self._ttl is not None
        return expiry_time(self._scope.now, self._ttl)

    def _value(self, value: Any, call: str) -> tuple[Any, ...]:
        """``value`` as a tuple of the variable's fields; Spark's calls take a
        tuple (or a Row)."""
        if value is None:
            raise InputError(
                f"state variable {self.name!r}: {call} of None; use clear() to remove the state"
            )
        try:
            values: tuple[Any, ...] = tuple(value)
        except TypeError:
            raise InputError(
                f"state variable {self.name!r}: {call} takes a tuple of "
                f"{self._n_value} value(s) {self.variable.value.names}, got {value!r}"
            ) from None
        if len(values) != self._n_value:
            raise InputError(
                f"state variable {self.name!r}: {call} of {values!r}, but its schema has "
                f"{self._n_value} field(s) {self.variable.value.names}"
            )
        return values

    def _entry(self, key: Key) -> Any:
        entry = self._cache.get(key, _MISSING)
        if entry is _MISSING:
            if not self._prefetched and key in self._scope.chunk_keys:
                self._prefetch()
                entry = self._cache[key]
            else:
                entry = self._cache[key] = self._load([key])[key]
        return entry

    def _prefetch(self) -> None:
        self._prefetched = True
        assert self._scope.chunk is not None
        loaded = self._load(list(self._scope.chunk_keys), self._scope.chunk)
        for key, entry in loaded.items():
            self._cache.setdefault(key, entry)

    @abc.abstractmethod
    def _load(self, keys: list[Key], arrow: pa.Table | None = None) -> dict[Key, Any]:
        """The stored entries of ``keys`` (``arrow``: the same keys as a table)."""

    def expire(self, now: int) -> int:
        """Remove every entry expired at ``now``; returns how many went."""
        if self._ttl_table is None:
            return 0
        bound = live_from(now)
        gone = self._ttl_table.scan_batch((), None, (bound,))
        if not gone.num_rows:
            return 0
        self._table.delete_keys(gone.drop_columns([EXPIRES_AT]))
        self._ttl_table.clean_below(bound)
        return int(gone.num_rows)

    def flush(self) -> None:
        """Write what the processor changed to the tables, forget the rest."""
        if self._dirty:
            try:
                self._write()
            except InputError:
                raise
            except Exception as exc:
                raise InputError(
                    f"state variable {self.name!r} ({self.variable.call}): a value does not fit "
                    f"its schema {self.variable.value}: {exc}"
                ) from exc
        self._cache.clear()
        self._dirty.clear()
        self._prefetched = False

    @abc.abstractmethod
    def _write(self) -> None:
        """Write the changed entries to the variable's tables."""

    def _index(self, adds: list[tuple[Any, ...]], drops: list[tuple[Any, ...]]) -> None:
        """Keep the TTL index: rows ``(expires_at, primary key...)``."""
        if self._ttl_table is None:
            return
        drops = [d for d in drops if d[0] is not None]  # written before the TTL was
        fields = list(self._ttl_table.schema.columns)
        if drops:
            self._ttl_table.delete_keys(rows_batch(fields, drops))
        if adds:
            self._ttl_table.insert_batch(rows_batch(fields, adds))

    def _fields(self) -> list[pa.Field]:
        return list(self._table.schema.columns)


class ValueStateImpl(VariableState):
    """Spark's ``ValueState``: one value per grouping key."""

    # Entry: (value tuple or None, stored expiry or _MISSING when not stored,
    # written value or _MISSING when unchanged).

    def _load(self, keys: list[Key], arrow: pa.Table | None = None) -> dict[Key, Any]:
        n, v = self._n_key, self._n_value
        entries: dict[Key, Any] = dict.fromkeys(keys)
        if arrow is None:
            for key, row in zip(keys, self._table.get_rows(keys), strict=True):
                entries[key] = None if row is None else row
        else:
            found, _ = self._table.get_batch(arrow)
            columns = [c.to_pylist() for c in found.columns]
            for row in zip(*columns, strict=True):
                entries[row[:n]] = row
        return {
            k: [None, _MISSING]
            if row is None
            else [tuple(row[n : n + v]), row[-1] if self._ttl else 0]
            for k, row in entries.items()
        }

    def exists(self) -> bool:
        """Whether the key has a (live) value."""
        return self._entry(self._scope.key)[0] is not None

    def get(self) -> tuple[Any, ...] | None:
        """The key's value, or ``None``."""
        return self._entry(self._scope.key)[0]  # type: ignore[no-any-return]

    def update(self, newValue: Any) -> None:
        """Set the key's value (and, with a TTL, its expiry from now)."""
        value = self._value(newValue, "update")
        key = self._scope.key
        self._entry(key)[0] = value
        self._dirty.add(key)

    def clear(self) -> None:
        """Remove the key's value."""
        key = self._scope.key
        self._entry(key)[0] = None
        self._dirty.add(key)

    def _write(self) -> None:
        ttl = self._ttl is not None
        expires = self._expiry() if ttl else None
        inserts: list[tuple[Any, ...]] = []
        updates: list[tuple[Any, ...]] = []
        deletes: list[Key] = []
        adds: list[tuple[Any, ...]] = []
        drops: list[tuple[Any, ...]] = []
        for key in self._dirty:
            entry = self._cache[key]
            value, stored = entry
            if value is None:
                if stored is not _MISSING:
                    deletes.append(key)
                    if ttl:
                        drops.append((stored, *key))
                continue
            row = (*key, *value, expires) if ttl else (*key, *value)
            (inserts if stored is _MISSING else updates).append(row)
            if ttl and stored != expires:
                if stored is not _MISSING:
                    drops.append((stored, *key))
                adds.append((expires, *key))
        fields = self._fields()
        if deletes:
            self._table.delete_keys(rows_batch(fields[: self._n_key], deletes))
        if updates:
            self._table.update_batch(rows_batch(fields, updates))
        if inserts:
            self._table.insert_batch(rows_batch(fields, inserts))
        self._index(adds, drops)


class _ListEntry:
    __slots__ = ("appended", "current", "stored")

    def __init__(self, stored: list[tuple[int, tuple[Any, ...], int]]) -> None:
        #: (position, value, expires_at) of the stored elements, in order.
        self.stored = stored
        #: The whole list once put or cleared in this chunk, else None.
        self.current: list[tuple[Any, ...]] | None = None
        #: Elements appended to the stored ones (when ``current`` is None).
        self.appended: list[tuple[Any, ...]] = []

    def values(self) -> list[tuple[Any, ...]]:
        if self.current is not None:
            return self.current
        return [v for _, v, _ in self.stored] + self.appended


class ListStateImpl(VariableState):
    """Spark's ``ListState``: a list of values per grouping key, each element
    a row keyed ``(grouping key, position)``."""

    def _load(self, keys: list[Key], arrow: pa.Table | None = None) -> dict[Key, Any]:
        n, v = self._n_key, self._n_value
        entries = {k: _ListEntry([]) for k in keys}
        batch = self._table.scan_ranges([(k, None, None) for k in keys])
        columns = [c.to_pylist() for c in batch.columns]
        ttl = self._ttl is not None
        for row in zip(*columns, strict=True):
            value = tuple(row[n + 1 : n + 1 + v])
            entries[row[:n]].stored.append((row[n], value, row[-1] if ttl else 0))
        return entries

    def exists(self) -> bool:
        """Whether the key's list has a (live) element."""
        return bool(self._entry(self._scope.key).values())

    def get(self) -> Iterator[tuple[Any, ...]]:
        """The key's list, in order (live elements only)."""
        return iter(list(self._entry(self._scope.key).values()))

    def _values(self, values: Any, call: str) -> list[tuple[Any, ...]]:
        if values is None:
            raise InputError(f"state variable {self.name!r}: {call} of None")
        out = [self._value(v, call) for v in values]
        if not out:
            # Spark refuses an empty list here (requireNonEmptyListStateValue).
            raise InputError(
                f"state variable {self.name!r}: {call} of an empty list; Spark refuses it "
                "too: use clear() to empty the list"
            )
        return out

    def put(self, newState: Any) -> None:
        """Replace the key's list."""
        values = self._values(newState, "put")
        key = self._scope.key
        entry = self._entry(key)
        entry.current = values
        entry.appended = []
        self._dirty.add(key)

    def appendValue(self, newState: Any) -> None:
        """Append one value to the key's list."""
        value = self._value(newState, "appendValue")
        self._append([value])

    def appendList(self, newState: Any) -> None:
        """Append values to the key's list."""
        self._append(self._values(newState, "appendList"))

    def _append(self, values: list[tuple[Any, ...]]) -> None:
        key = self._scope.key
        entry = self._entry(key)
        if entry.current is not None:
            entry.current.extend(values)
        else:
            entry.appended.extend(values)
        self._dirty.add(key)

    def clear(self) -> None:
        """Remove the key's list."""
        key = self._scope.key
        entry = self._entry(key)
        entry.current = []
        entry.appended = []
        self._dirty.add(key)

    def _write(self) -> None:
        ttl = self._ttl is not None
        expires = self._expiry() if ttl else None
        fields = self._fields()
        inserts: list[tuple[Any, ...]] = []
        deletes: list[tuple[Any, ...]] = []
        adds: list[tuple[Any, ...]] = []
        drops: list[tuple[Any, ...]] = []
        for key in self._dirty:
            entry: _ListEntry = self._cache[key]
            if entry.current is None:
                start = entry.stored[-1][0] + 1 if entry.stored else 0
                new = entry.appended
            else:
                for pos, _, stored in entry.stored:
                    deletes.append((*key, pos))
                    if ttl:
                        drops.append((stored, *key, pos))
                start, new = 0, entry.current
            for pos, value in enumerate(new, start):
                inserts.append((*key, pos, *value, expires) if ttl else (*key, pos, *value))
                if ttl:
                    adds.append((expires, *key, pos))
        if deletes:
            self._table.delete_keys(rows_batch(fields[: self._n_key + 1], deletes))
        if inserts:
            # A position deleted above and written again is an update of it
            # (the MemTable's insert after delete).
            self._table.insert_batch(rows_batch(fields, inserts))
        self._index(adds, drops)


class MapStateImpl(VariableState):
    """Spark's ``MapState``: a map per grouping key, each entry a row keyed
    ``(grouping key, user key)``."""

    def _load(self, keys: list[Key], arrow: pa.Table | None = None) -> dict[Key, Any]:
        n, v = self._n_key, self._n_value
        assert self.variable.user_key is not None
        u = len(self.variable.user_key)
        entries: dict[Key, Any] = {k: [{}, None] for k in keys}
        batch = self._table.scan_ranges([(k, None, None) for k in keys])
        columns = [c.to_pylist() for c in batch.columns]
        ttl = self._ttl is not None
        for row in zip(*columns, strict=True):
            stored = entries[row[:n]][0]
            stored[tuple(row[n : n + u])] = (tuple(row[n + u : n + u + v]), row[-1] if ttl else 0)
        return entries

    def _user_key(self, key: Any, call: str) -> tuple[Any, ...]:
        assert self.variable.user_key is not None
        try:
            user_key: tuple[Any, ...] = tuple(key)
        except TypeError:
            raise InputError(
                f"state variable {self.name!r}: {call} takes the user key as a tuple, got {key!r}"
            ) from None
        if len(user_key) != len(self.variable.user_key):
            raise InputError(
                f"state variable {self.name!r}: {call} of user key {user_key!r}, but its user "
                f"key schema has {len(self.variable.user_key)} field(s)"
            )
        return user_key

    def _view(self) -> dict[tuple[Any, ...], Any]:
        entry = self._entry(self._scope.key)
        return entry[0] if entry[1] is None else entry[1]  # type: ignore[no-any-return]

    def _writable(self) -> dict[tuple[Any, ...], Any]:
        key = self._scope.key
        entry = self._entry(key)
        if entry[1] is None:
            entry[1] = dict(entry[0])
        self._dirty.add(key)
        return entry[1]  # type: ignore[no-any-return]

    def exists(self) -> bool:
        """Whether the key's map has a (live) entry."""
        return bool(self._view())

    def getValue(self, key: Any) -> tuple[Any, ...] | None:
        """The value of user key ``key``, or ``None``."""
        found = self._view().get(self._user_key(key, "getValue"))
        if found is None:
            return None
        value: tuple[Any, ...] = found[0]
        return value

    def containsKey(self, key: Any) -> bool:
        """Whether user key ``key`` is in the map."""
        return self._user_key(key, "containsKey") in self._view()

    def updateValue(self, key: Any, value: Any) -> None:
        """Set user key ``key`` to ``value`` (and its expiry from now)."""
        user_key = self._user_key(key, "updateValue")
        new = self._value(value, "updateValue")
        self._writable()[user_key] = (new, _WRITTEN)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """The map's (user key, value) pairs."""
        return iter([(k, v[0]) for k, v in self._view().items()])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        """The map's user keys."""
        return iter(list(self._view()))

    def values(self) -> Iterator[tuple[Any, ...]]:
        """The map's values."""
        return iter([v[0] for v in self._view().values()])

    def removeKey(self, key: Any) -> None:
        """Remove user key ``key``."""
        self._writable().pop(self._user_key(key, "removeKey"), None)

    def clear(self) -> None:
        """Remove the key's map."""
        key = self._scope.key
        entry = self._entry(key)
        entry[1] = {}
        self._dirty.add(key)

    def _write(self) -> None:
        ttl = self._ttl is not None
        expires = self._expiry() if ttl else None
        fields = self._fields()
        assert self.variable.user_key is not None
        width = self._n_key + len(self.variable.user_key)
        inserts: list[tuple[Any, ...]] = []
        updates: list[tuple[Any, ...]] = []
        deletes: list[tuple[Any, ...]] = []
        adds: list[tuple[Any, ...]] = []
        drops: list[tuple[Any, ...]] = []
        for key in self._dirty:
            stored, current = self._cache[key]
            if current is None:
                continue
            for user_key, (_, old_expiry) in stored.items():
                if user_key not in current:
                    deletes.append((*key, *user_key))
                    if ttl:
                        drops.append((old_expiry, *key, *user_key))
            for user_key, (value, written) in current.items():
                if written is not _WRITTEN:
                    continue  # unchanged since it was read
                old = stored.get(user_key)
                row = (*key, *user_key, *value, expires) if ttl else (*key, *user_key, *value)
                (inserts if old is None else updates).append(row)
                if ttl and (old is None or old[1] != expires):
                    if old is not None:
                        drops.append((old[1], *key, *user_key))
                    adds.append((expires, *key, *user_key))
        if deletes:
            self._table.delete_keys(rows_batch(fields[:width], deletes))
        if updates:
            self._table.update_batch(rows_batch(fields, updates))
        if inserts:
            self._table.insert_batch(rows_batch(fields, inserts))
        self._index(adds, drops)
