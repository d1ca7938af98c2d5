"""How a state table's rows lie in its backend: the value layout, as an object.

A :class:`StateTable` deals in row-layout bytes only (the MemTable's values,
the strict checks, the commit); a layout object, chosen once when the table is
built, turns them into backend reads and writes. This is RisingWave's value
serde as a type parameter of its state table, rather than a branch on the
layout in every method:

* :class:`RowValues`: one KV pair per row, the value the row-layout bytes
  themselves; reads and writes go to the backend as they are.
* :class:`CellValues`: one KV pair per non-key column (``key | column index``),
  and a marker cell for a row written while the table had no value columns;
  reads gather a row's cells and hand back its row-layout bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import Protocol

from encoding import CellCodec, KeyCodec, RowCodec, TableSchema, ValueLayout, prefix_successor
from statestore._typing import KVBackend

__all__ = ["CellValues", "RowValues", "TableValues", "values_of"]

#: A filter of backend keys: ``True`` keeps the key.
KeyFilter = Callable[[bytes], bool]
#: How many pairs a short read takes through the backend's reused iterator
#: before it hands the range to a streaming read.
PAGE = 64


class TableValues(Protocol):
    """A table's rows in its backend, each value the row-layout bytes."""

    def get(self, key: bytes) -> bytes | None:
        """The row at ``key``, or ``None``."""
        ...

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The rows at ``keys``, in order, ``None`` where absent."""
        ...

    def items(
        self, lower: bytes, upper: bytes | None, reverse: bool, keep: KeyFilter | None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(row key, row)`` in ``[lower, upper)``, in key order, skipping
        backend keys that ``keep`` refuses."""
        ...

    def read_range(
        self, lower: bytes, upper: bytes | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        """What :meth:`items` yields (no filter), read at once."""
        ...

    def read_values(self, lower: bytes, upper: bytes | None) -> list[bytes]:
        """The rows of :meth:`read_range`, ascending."""
        ...

    def read_keys(self, lower: bytes, upper: bytes | None) -> list[bytes]:
        """The keys of the rows in ``[lower, upper)``, ascending, read at once
        without reading a row."""
        ...

    def read_short(self, lower: bytes, upper: bytes | None) -> list[bytes] | None:
        """The rows in ``[lower, upper)``, ascending, if there are at most
        :data:`PAGE` of them (one seek of a reused iterator); ``None`` if there
        are more (the caller then streams the range)."""
        ...

    def read_prefixes(self, prefixes: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
        """The row keys and rows whose keys start with each of ``prefixes``
        (row-key prefixes), one prefix's after another, each in key order."""
        ...

    def count(self, lower: bytes, upper: bytes | None, keep: KeyFilter | None) -> int:
        """Rows in ``[lower, upper)``, reading keys only."""
        ...

    def writes(
        self, keys: list[bytes], rows: list[bytes | None]
    ) -> tuple[list[bytes], list[bytes | None]]:
        """The backend writes (keys, and values or ``None`` to delete) that
        store the row ``rows[i]`` (``None``: no row) at ``keys[i]``."""
        ...


def values_of(
    schema: TableSchema, backend: KVBackend, rows: RowCodec, keys: KeyCodec
) -> TableValues:
    """The layout object of ``schema``'s value layout on ``backend``."""
    if schema.layout is ValueLayout.CELL:
        return CellValues(schema, backend, rows, keys)
    return RowValues(backend)


class _ShortRead(Protocol):
    def __call__(self, lower: bytes, upper: bytes | None, limit: int) -> list[bytes] | None: ...


def _short_reader(backend: KVBackend) -> _ShortRead:
    """The backend's own short read (a reused iterator), or one built on
    :meth:`~statestore.KVBackend.items` for a backend that has none."""
    own: _ShortRead | None = getattr(backend, "read_short", None)
    if own is not None:
        return own

    def read_short(lower: bytes, upper: bytes | None, limit: int) -> list[bytes] | None:
        page = [v for _, v in islice(backend.items(lower, upper), limit + 1)]
        return None if len(page) > limit else page

    return read_short


class _PrefixRead(Protocol):
    def __call__(self, prefixes: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]: ...


def _prefix_reader(backend: KVBackend) -> _PrefixRead:
    """The backend's own read of many prefixes (one reused iterator), or
    one built on :meth:`~statestore.KVBackend.read_range` for a backend
    that has none."""
    own: _PrefixRead | None = getattr(backend, "read_prefixes", None)
    return own if own is not None else partial(_read_each, backend.read_range)


def _read_each(
    read_range: Callable[[bytes, bytes | None, bool], list[tuple[bytes, bytes]]],
    prefixes: Sequence[bytes],
) -> tuple[list[bytes], list[bytes]]:
    """The keys and values under each of ``prefixes``, one range read a prefix."""
    pairs: list[tuple[bytes, bytes]] = []
    for prefix in prefixes:
        pairs.extend(read_range(prefix, prefix_successor(prefix), False))
    return [k for k, _ in pairs], [v for _, v in pairs]


class RowValues:
    """The ``row`` layout: the backend's pairs are the rows."""

    def __init__(self, backend: KVBackend) -> None:
        # The hot reads are the backend's own methods, not a call through this one.
        self.get: Callable[[bytes], bytes | None] = backend.get
        self.get_many: Callable[[Sequence[bytes]], list[bytes | None]] = backend.multi_get
        self.read_values: Callable[[bytes, bytes | None], list[bytes]] = backend.read_values
        self.read_keys: Callable[[bytes, bytes | None], list[bytes]] = backend.read_keys
        self.read_range: Callable[[bytes, bytes | None, bool], list[tuple[bytes, bytes]]] = (
            backend.read_range
        )
        self.read_short: Callable[[bytes, bytes | None], list[bytes] | None] = partial(
            _short_reader(backend), limit=PAGE
        )
        self.read_prefixes: _PrefixRead = _prefix_reader(backend)
        self._backend = backend

    def items(
        self, lower: bytes, upper: bytes | None, reverse: bool, keep: KeyFilter | None
    ) -> Iterator[tuple[bytes, bytes]]:
        items = self._backend.items(lower, upper, reverse)
        if keep is None:
            return items
        return ((k, v) for k, v in items if keep(k))

    def count(self, lower: bytes, upper: bytes | None, keep: KeyFilter | None) -> int:
        own: Callable[[bytes, bytes | None], int] | None = getattr(self._backend, "count", None)
        if keep is None and own is not None:
            return own(lower, upper)  # the backend's own count (RocksDB's, in C)
        keys = self._backend.keys(lower, upper)
        if keep is not None:
            keys = filter(keep, keys)
        return sum(1 for _ in keys)

    def writes(
        self, keys: list[bytes], rows: list[bytes | None]
    ) -> tuple[list[bytes], list[bytes | None]]:
        return keys, rows


class CellValues:
    """The ``cell`` layout: a row is the cells under its key."""

    def __init__(self, schema: TableSchema, backend: KVBackend, rows: RowCodec, keys: KeyCodec):
        self._backend = backend
        self._rows = rows
        self._keys = keys
        self._cells = CellCodec(schema)
        self._cut = -self._cells.suffix_len
        # Every cell a row may have: one per value column, and the marker cell of
        # a row written while the table had no value columns.
        self._suffixes = (*(i.to_bytes(2, "big") for i in schema.value_indices), b"\xff\xff")

    def _row(self, key: bytes, cells: Iterable[tuple[bytes, bytes | None]]) -> bytes | None:
        present = [(s, v) for s, v in cells if v is not None]
        if not present:
            return None
        return self._rows.encode(self._cells.decode(self._keys.decode(key), present))

    def get(self, key: bytes) -> bytes | None:
        suffixes = self._suffixes
        values = self._backend.multi_get([key + s for s in suffixes])
        return self._row(key, zip(suffixes, values, strict=True))

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        suffixes = self._suffixes
        n = len(suffixes)
        flat = self._backend.multi_get([k + s for k in keys for s in suffixes])
        return [
            self._row(k, zip(suffixes, flat[i * n : (i + 1) * n], strict=True))
            for i, k in enumerate(keys)
        ]

    def items(
        self, lower: bytes, upper: bytes | None, reverse: bool, keep: KeyFilter | None
    ) -> Iterator[tuple[bytes, bytes]]:
        items = self._backend.items(lower, upper, reverse)
        if keep is not None:
            items = ((k, v) for k, v in items if keep(k))
        return self._grouped(items)

    def _grouped(self, items: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        cut = self._cut
        row_key: bytes | None = None
        cells: list[tuple[bytes, bytes]] = []
        for key, value in items:
            rk = key[:cut]
            if rk != row_key:
                if row_key is not None:
                    row = self._row(row_key, cells)
                    if row is not None:
                        yield row_key, row
                row_key, cells = rk, []
            cells.append((key[cut:], value))
        if row_key is not None:
            row = self._row(row_key, cells)
            if row is not None:
                yield row_key, row

    def read_range(
        self, lower: bytes, upper: bytes | None, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        return list(self.items(lower, upper, reverse, None))

    def read_values(self, lower: bytes, upper: bytes | None) -> list[bytes]:
        return [v for _, v in self.items(lower, upper, False, None)]

    def read_keys(self, lower: bytes, upper: bytes | None) -> list[bytes]:
        # A row is stored while one of its cells is.
        cut = self._cut
        out: list[bytes] = []
        for key in self._backend.read_keys(lower, upper):
            row_key = key[:cut]
            if not out or out[-1] != row_key:
                out.append(row_key)
        return out

    def read_prefixes(self, prefixes: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
        return _read_each(self.read_range, prefixes)

    def read_short(self, lower: bytes, upper: bytes | None) -> list[bytes] | None:
        rows = list(islice(self.items(lower, upper, False, None), PAGE + 1))
        return None if len(rows) > PAGE else [v for _, v in rows]

    def count(self, lower: bytes, upper: bytes | None, keep: KeyFilter | None) -> int:
        keys = self._backend.keys(lower, upper)
        if keep is not None:
            keys = filter(keep, keys)
        cut = self._cut
        count, last = 0, None
        for k in keys:
            if k[:cut] != last:
                count, last = count + 1, k[:cut]
        return count

    def writes(
        self, keys: list[bytes], rows: list[bytes | None]
    ) -> tuple[list[bytes], list[bytes | None]]:
        cell_keys: list[bytes] = []
        cells: list[bytes | None] = []
        for key, new in zip(keys, rows, strict=True):
            if new is None:
                # Every cell the row may have, written under any schema so far.
                cell_keys.extend(key + suffix for suffix in self._suffixes)
                cells.extend([None] * len(self._suffixes))
            else:
                for suffix, cell in self._cells.encode(self._rows.decode(new)):
                    cell_keys.append(key + suffix)
                    cells.append(cell)
        return cell_keys, cells
