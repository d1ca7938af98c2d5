"""StateTable: typed rows with a primary key over a KV backend.

Writes go to the epoch's :class:`MemTable`; reads merge it over storage, the
MemTable winning (seed 001's read path); :meth:`StateTable.commit` writes the
epoch to the backend in one atomic batch.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import pyarrow as pa

from encoding import (
    CellCodec,
    EncodingError,
    KeyCodec,
    RowCodec,
    TableSchema,
    ValueLayout,
    prefix_successor,
)
from statestore._log import get_logger
from statestore._memtable import UNTOUCHED, KeyOp, MemTable, OpKind
from statestore._typing import KVBackend, WriteOp
from statestore.errors import EpochError, InconsistencyError

__all__ = ["ConsistencyMode", "StateTable", "TableMetrics", "meta_key"]

Row = tuple[Any, ...]

#: Keys of relstate's own per-table metadata (last epoch, row count) start with
#: the one table id that no user table may have.
_META_PREFIX = b"\xff\xff\xff\xff"
_META = struct.Struct(">qq")  # last committed epoch, committed row count
#: ``clean_below``'s default start: the table's first row (``None`` is a key value).
_TABLE_START: Any = object()


def meta_key(table_id: int) -> bytes:
    """The backend key of a table's metadata row."""
    return _META_PREFIX + table_id.to_bytes(4, "big")


class ConsistencyMode(enum.Enum):
    """What a write that contradicts the table does, and what it costs.

    ``STRICT`` raises :class:`InconsistencyError` and leaves the table as it was;
    it reads the current row before every insert, delete and update (one
    multi-get for a batch). ``RELAXED`` lets the newest operation win and logs
    the inconsistency; it reads nothing per write, and squares the epoch with
    storage in one multi-get at commit, which keeps the row count exact.
    ``UNCHECKED`` reads nothing at all: for an operator that reads a key before
    it writes it, and so already knows; the newest operation wins, what the
    MemTable sees is logged, and the row count follows the operations as issued.
    """

    STRICT = "strict"
    RELAXED = "relaxed"
    UNCHECKED = "unchecked"


@dataclass
class TableMetrics:
    """Counters of one table: the current epoch's operations and the row count."""

    inserted: int = 0
    deleted: int = 0
    updated: int = 0
    removed_by_range: int = 0
    inconsistencies: int = 0
    #: Rows in the table as of the last commit.
    committed_rows: int = 0

    def reset_epoch(self) -> None:
        self.inserted = self.deleted = self.updated = 0
        self.removed_by_range = self.inconsistencies = 0


class StateTable:
    """A relational state table (seed 001) over one :class:`KVBackend`.

    Rows are tuples in ``schema.columns`` order; primary keys are tuples in
    ``schema.primary_key`` order. Several tables may share a backend: the table
    id at the front of every key keeps them apart.
    """

    def __init__(
        self,
        schema: TableSchema,
        backend: KVBackend,
        consistency: ConsistencyMode | str = ConsistencyMode.STRICT,
        logger: Any | None = None,
        spill_at: int | None = None,
        on_spill: Callable[[StateTable], None] | None = None,
    ) -> None:
        self.schema = schema
        self.backend = backend
        self.consistency = ConsistencyMode(consistency)
        self.keys = KeyCodec(schema)
        self.rows = RowCodec(schema)
        self._cells = CellCodec(schema) if schema.layout is ValueLayout.CELL else None
        # Every cell a row may have: one per value column, and the marker cell of
        # a row written while the table had no value columns.
        self._suffixes = (*(i.to_bytes(2, "big") for i in schema.value_indices), b"\xff\xff")
        self._log = (logger or get_logger(__name__)).bind(table=schema.name)
        self._strict = self.consistency is ConsistencyMode.STRICT
        self._verify_at_commit = self.consistency is ConsistencyMode.RELAXED
        self._n_key = len(schema.primary_key)
        self._key_indices = schema.key_indices
        self._prefix = schema.prefix
        self._upper = prefix_successor(self._prefix)
        self._meta_key = meta_key(schema.table_id)
        self._mem = MemTable(blind_inserts=not self._strict)
        self._range_deletes: list[tuple[bytes, bytes]] = []
        # The epoch's effect on the row count from operations already spilled,
        # and rows removed by range deletes not yet spilled.
        self._spilled_delta = 0
        self._range_removed = 0
        #: When the MemTable holds this many keys, ``on_spill`` is called (a
        #: state store then calls :meth:`spill`), so a large epoch need not fit
        #: in memory.
        self.spill_at = spill_at
        self.on_spill = on_spill
        self.metrics = TableMetrics()
        self._last_epoch, self.metrics.committed_rows = self._read_meta()

    # -- metadata ---------------------------------------------------------------

    def _read_meta(self) -> tuple[int, int]:
        raw = self.backend.get(self._meta_key)
        if raw is None:
            return -1, 0
        epoch, rows = _META.unpack(raw)
        return epoch, rows

    @property
    def last_epoch(self) -> int | None:
        """The epoch of the last commit, or ``None`` before the first."""
        return None if self._last_epoch < 0 else self._last_epoch

    @property
    def row_count(self) -> int:
        """Rows in the table, the uncommitted epoch included.

        Exact in strict mode. In relaxed mode exact at each commit; between
        commits it counts the epoch's operations as issued, as unchecked mode
        always does.
        """
        return self.metrics.committed_rows + self._pending_delta()

    def _pending_delta(self) -> int:
        mem = self._mem
        return self._spilled_delta + mem.inserts - mem.deletes - self._range_removed

    # -- keys -------------------------------------------------------------------

    def _pk(self, pk: Sequence[Any]) -> bytes:
        if len(pk) != self._n_key:
            raise EncodingError(
                f"table {self.schema.name!r} has a {self._n_key}-column primary key "
                f"{self.schema.key_names}, got {len(pk)} values {tuple(pk)!r}"
            )
        return self.keys.encode(pk)

    def _row_key(self, row: Sequence[Any]) -> bytes:
        return self.keys.encode([row[i] for i in self._key_indices])

    def _in_range_delete(self, key: bytes) -> bool:
        return any(lo <= key < hi for lo, hi in self._range_deletes)

    # -- reads from storage ----------------------------------------------------------

    def _stored(self, key: bytes) -> Row | bytes | None:
        """The committed row at ``key``: row-layout bytes, or a tuple for the
        cell layout; ``None`` if absent or removed by a pending range delete."""
        if self._range_deletes and self._in_range_delete(key):
            return None
        if self._cells is None:
            return self.backend.get(key)
        suffixes = self._suffixes
        values = self.backend.multi_get([key + s for s in suffixes])
        return self._cells_row(key, zip(suffixes, values, strict=True))

    def _stored_many(self, keys: Sequence[bytes]) -> list[Row | bytes | None]:
        if self._cells is None:
            found: list[Row | bytes | None] = list(self.backend.multi_get(keys))
        else:
            suffixes = self._suffixes
            n = len(suffixes)
            flat = self.backend.multi_get([k + s for k in keys for s in suffixes])
            found = [
                self._cells_row(k, zip(suffixes, flat[i * n : (i + 1) * n], strict=True))
                for i, k in enumerate(keys)
            ]
        if self._range_deletes:
            found = [
                None if self._in_range_delete(k) else v for k, v in zip(keys, found, strict=True)
            ]
        return found

    def _cells_row(self, key: bytes, cells: Iterable[tuple[bytes, bytes | None]]) -> Row | None:
        assert self._cells is not None
        present = [(s, v) for s, v in cells if v is not None]
        if not present:
            return None
        return self._cells.decode(self.keys.decode(key), present)

    def _current(self, key: bytes) -> Row | bytes | None:
        """The row at ``key`` as the epoch sees it (MemTable over storage)."""
        found = self._mem.lookup(key)
        if found is UNTOUCHED:
            return self._stored(key)
        return found  # type: ignore[return-value]

    def _as_row(self, value: Row | bytes) -> Row:
        return self.rows.decode(value) if isinstance(value, bytes) else value

    def _as_bytes(self, value: Row | bytes) -> bytes:
        return value if isinstance(value, bytes) else self.rows.encode(value)

    def _same_row(self, current: Row | bytes, expected: bytes) -> bool:
        """Whether a stored row equals ``expected`` (row-layout bytes).

        A value written by an older schema has fewer columns, so unequal bytes
        are compared again after decoding under the current schema.
        """
        if isinstance(current, bytes):
            if current == expected:
                return True
            current = self.rows.decode(current)
        return self.rows.encode(current) == expected

    # -- point reads ---------------------------------------------------------------

    def get_row(self, pk: Sequence[Any]) -> Row | None:
        """The row with primary key ``pk``, or ``None``."""
        value = self._current(self._pk(pk))
        if value is None:
            return None
        return self.rows.decode(value) if isinstance(value, bytes) else value

    def get_rows(self, pks: Sequence[Sequence[Any]]) -> list[Row | None]:
        """The rows with primary keys ``pks``, in order: one multi-get for the
        keys the MemTable does not answer."""
        keys = [self._pk(pk) for pk in pks]
        out = self._current_many(keys)
        decode = self.rows.decode
        return [None if v is None else (decode(v) if isinstance(v, bytes) else v) for v in out]

    # -- scans ----------------------------------------------------------------------

    def _bounds(
        self, prefix: Sequence[Any], start: Sequence[Any] | None, end: Sequence[Any] | None
    ) -> tuple[bytes, bytes | None]:
        if len(prefix) > self._n_key:
            raise EncodingError(
                f"scan prefix {tuple(prefix)!r} is longer than the primary key "
                f"{self.schema.key_names} of table {self.schema.name!r}"
            )
        for part, label in ((start, "start"), (end, "end")):
            if part is not None and len(prefix) + len(part) > self._n_key:
                raise EncodingError(
                    f"scan {label} {tuple(part)!r} after prefix {tuple(prefix)!r} is "
                    f"longer than the primary key {self.schema.key_names}"
                )
        encoded_prefix = self.keys.encode(prefix)
        lower = encoded_prefix if start is None else self.keys.encode([*prefix, *start])
        if end is None:
            upper = prefix_successor(encoded_prefix)
        else:
            upper = self.keys.encode([*prefix, *end])
        return lower, upper

    def scan(
        self,
        prefix: Sequence[Any] = (),
        start: Sequence[Any] | None = None,
        end: Sequence[Any] | None = None,
        reverse: bool = False,
    ) -> Iterator[Row]:
        """Rows whose key starts with ``prefix``, in key order.

        ``start`` (included) and ``end`` (excluded) bound the next key columns
        after the prefix; ``reverse=True`` walks from the end. The MemTable's
        operations are merged over storage as two ordered streams.
        """
        lower, upper = self._bounds(prefix, start, end)
        decode = self.rows.decode
        if not self._mem and not self._range_deletes and self._cells is None:
            # Nothing to merge: the stored values are the rows.
            for _, raw in self.backend.items(lower, upper, reverse):
                yield decode(raw)
            return
        for _, value in self._merged(lower, upper, reverse):
            yield decode(value) if isinstance(value, bytes) else value

    def scan_batch(
        self,
        prefix: Sequence[Any] = (),
        start: Sequence[Any] | None = None,
        end: Sequence[Any] | None = None,
        reverse: bool = False,
    ) -> pa.RecordBatch:
        """The rows :meth:`scan` yields, as one Arrow record batch."""
        lower, upper = self._bounds(prefix, start, end)
        return self._values_batch(self._merged_values(lower, upper, reverse))

    def scan_ranges(
        self,
        ranges: Iterable[tuple[Sequence[Any], Sequence[Any] | None, Sequence[Any] | None]],
    ) -> pa.RecordBatch:
        """The rows of many scans, each ``(prefix, start, end)`` as in
        :meth:`scan`, one after another as one Arrow record batch: many short
        scans (one per join key, say) decode once, not once each."""
        values: list[Row | bytes] = []
        for prefix, start, end in ranges:
            lower, upper = self._bounds(prefix, start, end)
            values.extend(self._merged_values(lower, upper, False))
        return self._values_batch(values)

    def _values_batch(self, values: list[Row | bytes]) -> pa.RecordBatch:
        """Stored values (row-layout bytes, or the cell layout's tuples) as a batch."""
        if self._cells is not None:
            return self._rows_batch([self._as_row(v) for v in values])
        return self.rows.decode_batch(values)  # type: ignore[arg-type]

    def _storage(
        self, lower: bytes, upper: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, Row | bytes]]:
        items = self.backend.items(lower, upper, reverse)
        if self._range_deletes:
            items = ((k, v) for k, v in items if not self._in_range_delete(k))
        if self._cells is None:
            return items
        return self._group_cells(items, reverse)

    def _group_cells(
        self, items: Iterator[tuple[bytes, bytes]], reverse: bool
    ) -> Iterator[tuple[bytes, Row]]:
        cut = -self._cells.suffix_len if self._cells else 0
        row_key: bytes | None = None
        cells: list[tuple[bytes, bytes]] = []
        for key, value in items:
            rk = key[:cut]
            if rk != row_key:
                if row_key is not None:
                    row = self._cells_row(row_key, cells)
                    if row is not None:
                        yield row_key, row
                row_key, cells = rk, []
            cells.append((key[cut:], value))
        if row_key is not None:
            row = self._cells_row(row_key, cells)
            if row is not None:
                yield row_key, row

    def _merged_values(self, lower: bytes, upper: bytes | None, reverse: bool) -> list[Row | bytes]:
        """The values :meth:`_merged` yields, as a list, for the row layout
        without a Python step per row: storage is read in one call, and a
        MemTable range is merged in C (a dict of storage's pairs updated by
        the MemTable's, sorted: two presorted runs, one merge pass)."""
        if self._cells is not None:
            return [v for _, v in self._merged(lower, upper, reverse)]
        pending = self._mem.range(lower, upper, reverse) if self._mem else []
        if not pending and not self._range_deletes and not reverse:
            return self.backend.read_values(lower, upper)  # type: ignore[return-value]
        stored = self.backend.read_range(lower, upper, reverse)
        if self._range_deletes:
            stored = [(k, v) for k, v in stored if not self._in_range_delete(k)]
        if not pending:
            return [v for _, v in stored]
        rows: dict[bytes, Row | bytes | None] = dict(stored)
        rows.update(pending)
        ordered = sorted(rows.items(), key=itemgetter(0), reverse=reverse)
        return [v for _, v in ordered if v is not None]

    def _merged(
        self, lower: bytes, upper: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, Row | bytes]]:
        """Merge the MemTable's range over storage's: equal keys take the
        MemTable's row, or nothing when it deleted the key."""
        storage = self._storage(lower, upper, reverse)
        if not self._mem:
            yield from storage
            return
        mem = iter(self._mem.range(lower, upper, reverse))
        m_key, m_new = next(mem, (None, None))
        for s_key, s_val in storage:
            while m_key is not None and (m_key > s_key if reverse else m_key < s_key):
                if m_new is not None:
                    yield m_key, m_new
                m_key, m_new = next(mem, (None, None))
            if m_key == s_key:
                if m_new is not None:
                    yield m_key, m_new
                m_key, m_new = next(mem, (None, None))
            else:
                yield s_key, s_val
        while m_key is not None:
            if m_new is not None:
                yield m_key, m_new
            m_key, m_new = next(mem, (None, None))

    # -- writes ---------------------------------------------------------------------

    def _inconsistent(self, what: str, key: bytes) -> InconsistencyError:
        pk = self.keys.decode(key)
        return InconsistencyError(
            f"table {self.schema.name!r}, key {pk!r}: {what}", self.schema.name, pk
        )

    def _relaxed(self, what: str, key: bytes) -> None:
        self.metrics.inconsistencies += 1
        self._log.warning("state_table.inconsistency", key=repr(self.keys.decode(key)), detail=what)

    def insert(self, row: Sequence[Any]) -> None:
        """Insert ``row``; in strict mode its key must not exist."""
        value = self.rows.encode(row)
        key = self._row_key(row)
        if self._strict and self._current(key) is not None:
            raise self._inconsistent("insert over an existing row; use update", key)
        if not self._mem.insert(key, value):
            self._relaxed("insert over a row inserted in this epoch", key)
        self.metrics.inserted += 1
        self._maybe_spill()

    def delete(self, row: Sequence[Any]) -> None:
        """Delete ``row``; in strict mode it must be the stored row."""
        value = self.rows.encode(row)
        key = self._row_key(row)
        if self._strict:
            self._check_old(key, value, "delete")
        if not self._mem.delete(key, value):
            self._relaxed("delete of a row deleted in this epoch", key)
        self.metrics.deleted += 1
        self._maybe_spill()

    def update(self, old: Sequence[Any], new: Sequence[Any]) -> None:
        """Replace ``old`` by ``new`` (same primary key); in strict mode ``old``
        must be the stored row."""
        old_value = self.rows.encode(old)
        new_value = self.rows.encode(new)
        key = self._row_key(new)
        if self._row_key(old) != key:
            raise EncodingError(
                f"update of table {self.schema.name!r} changes the primary key from "
                f"{self.schema.key_of(old)!r} to {self.schema.key_of(new)!r}; "
                "delete the old row and insert the new one instead"
            )
        if self._strict:
            self._check_old(key, old_value, "update")
        if not self._mem.update(key, old_value, new_value):
            self._relaxed("update of a row deleted in this epoch", key)
        self.metrics.updated += 1
        self._maybe_spill()

    def _check_old(self, key: bytes, old: bytes, action: str) -> None:
        current = self._current(key)
        if current is None:
            raise self._inconsistent(f"{action} of a missing row", key)
        if not self._same_row(current, old):
            raise self._inconsistent(
                f"{action} names old row {self.rows.decode(old)!r} but the table holds "
                f"{self._as_row(current)!r}",
                key,
            )

    def upsert(self, row: Sequence[Any]) -> None:
        """Insert ``row``, or replace the row with its key (one read)."""
        key = self._row_key(row)
        value = self.rows.encode(row)
        current = self._current(key)
        if current is None:
            self._mem.insert(key, value)
            self.metrics.inserted += 1
        else:
            self._mem.update(key, self._as_bytes(current), value)
            self.metrics.updated += 1
        self._maybe_spill()

    def delete_key(self, pk: Sequence[Any]) -> Row | None:
        """Delete the row with primary key ``pk`` and return it (``None``, and
        nothing done, if there is none)."""
        key = self._pk(pk)
        current = self._current(key)
        if current is None:
            return None
        self._mem.delete(key, self._as_bytes(current))
        self.metrics.deleted += 1
        self._maybe_spill()
        return self._as_row(current)

    # -- batch writes -------------------------------------------------------------

    def insert_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Insert every row of ``batch`` (columns by name); in strict mode all
        keys must be new and distinct, else nothing is written."""
        keys = self.keys.encode_batch(batch)
        values = self.rows.encode_batch(batch)
        if self._strict:
            self._reject_twice(keys, "inserted twice in one batch")
            for key, current in zip(keys, self._current_many(keys), strict=True):
                if current is not None:
                    raise self._inconsistent("insert over an existing row; use update", key)
        for key in self._mem.insert_many(keys, values):
            self._relaxed("insert over a row inserted in this epoch", key)
        self.metrics.inserted += len(keys)
        self._maybe_spill()

    def delete_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Delete every row of ``batch``; in strict mode each must be the stored
        row, else nothing is written."""
        keys = self.keys.encode_batch(batch)
        values = self.rows.encode_batch(batch)
        if self._strict:
            self._reject_twice(keys, "deleted twice in one batch")
            for key, old, current in zip(keys, values, self._current_many(keys), strict=True):
                if current is None:
                    raise self._inconsistent("delete of a missing row", key)
                if not self._same_row(current, old):
                    raise self._inconsistent(
                        "delete names a row that differs from the stored one", key
                    )
        delete = self._mem.delete
        for key, value in zip(keys, values, strict=True):
            if not delete(key, value):
                self._relaxed("delete of a row deleted in this epoch", key)
        self.metrics.deleted += len(keys)
        self._maybe_spill()

    def update_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Replace the rows with the keys of ``batch``'s rows by them; in strict
        mode each key must be stored, else nothing is written. Relaxed and
        unchecked mode read nothing (relaxed mode squares the epoch with
        storage at the commit, as for :meth:`update`)."""
        keys = self.keys.encode_batch(batch)
        values = self.rows.encode_batch(batch)
        if self._strict:
            self._reject_twice(keys, "named twice in one batch")
            olds = [self._current_or_missing(k, c) for k, c in self._with_current(keys)]
        else:
            # Only a strict check compares old rows; the MemTable needs to
            # know that the key existed, not what it held.
            olds = [b""] * len(keys)
        update = self._mem.update
        for key, old, value in zip(keys, olds, values, strict=True):
            if not update(key, old, value):
                self._relaxed("update of a row deleted in this epoch", key)
        self.metrics.updated += len(keys)
        self._maybe_spill()

    def delete_keys(self, pks: pa.RecordBatch | pa.Table) -> int:
        """Delete the rows whose primary keys are the rows of ``pks`` (the key
        columns, by name); the batch form of :meth:`delete_key`. Strict and
        relaxed mode skip keys that are not stored (one multi-get); unchecked
        mode reads nothing and deletes every key. A key named twice is an
        inconsistency in strict mode and is deleted once in the others.
        Returns the rows deleted."""
        keys = self.keys.encode_batch(pks)
        if self._strict:
            self._reject_twice(keys, "named twice in one batch")
        else:
            keys = list(dict.fromkeys(keys))
        if self.consistency is ConsistencyMode.UNCHECKED:
            olds = [b""] * len(keys)
        else:
            found = [(k, c) for k, c in self._with_current(keys) if c is not None]
            keys = [k for k, _ in found]
            olds = [self._as_bytes(c) for _, c in found]
        for key in self._mem.delete_many(keys, olds):
            self._relaxed("delete of a row deleted in this epoch", key)
        self.metrics.deleted += len(keys)
        self._maybe_spill()
        return len(keys)

    def get_batch(self, pks: pa.RecordBatch | pa.Table) -> tuple[pa.RecordBatch, pa.BooleanArray]:
        """The rows with the primary keys of ``pks`` (key columns by name):
        the rows found, in order, as one Arrow batch, and for each key whether
        it was found. One multi-get for the keys the MemTable does not answer."""
        keys = self.keys.encode_batch(pks)
        current = self._current_many(keys)
        found = [c for c in current if c is not None]
        mask = pa.array([c is not None for c in current], type=pa.bool_())
        return self._values_batch(found), mask

    def contains(self, pks: pa.RecordBatch | pa.Table) -> list[bool]:
        """Whether a row is stored under each primary key of ``pks`` (key
        columns by name): one multi-get for the keys the MemTable does not
        answer, nothing decoded."""
        return [c is not None for c in self._current_many(self.keys.encode_batch(pks))]

    def _with_current(self, keys: Sequence[bytes]) -> Iterator[tuple[bytes, Row | bytes | None]]:
        return zip(keys, self._current_many(keys), strict=True)

    def _reject_twice(self, keys: Sequence[bytes], what: str) -> None:
        if len(set(keys)) != len(keys):
            seen: set[bytes] = set()
            dup = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise self._inconsistent(what, dup)

    def _current_or_missing(self, key: bytes, current: Row | bytes | None) -> bytes:
        if current is None:
            raise self._inconsistent("update of a missing row", key)
        return self._as_bytes(current)

    def _rows_batch(self, rows: Sequence[Row]) -> pa.RecordBatch:
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(self.schema.columns)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(list(c), type=f.type)
                for c, f in zip(columns, self.schema.columns, strict=True)
            ],
            schema=self.schema.columns,
        )

    def _current_many(self, keys: Sequence[bytes]) -> list[Row | bytes | None]:
        """:meth:`_current` of many keys: one multi-get for those the MemTable
        has not touched."""
        lookup = self._mem.lookup
        out: list[Any] = [lookup(k) for k in keys]
        missing = [i for i, v in enumerate(out) if v is UNTOUCHED]
        if missing:
            stored = self._stored_many([keys[i] for i in missing])
            for i, value in zip(missing, stored, strict=True):
                out[i] = value
        return out

    # -- watermark cleaning ---------------------------------------------------------

    def clean_below(self, watermark: Any, start: Any = _TABLE_START) -> int:
        """Remove every row whose first key column sorts before ``watermark`` in
        the table's key order (nulls included when they sort first), and, given
        ``start``, not before ``start``: a caller that knows nothing is stored
        below ``start`` (an earlier clean's watermark) saves the count its
        walk over those keys, and over the earlier cleans' tombstones.

        Storage is cleared by one range delete at commit; the rows are counted
        with a key-only iteration so that the row count stays exact. Returns the
        number of rows removed.
        """
        upper = self.keys.encode([watermark])
        lower = self._prefix if start is _TABLE_START else self.keys.encode([start])
        if lower >= upper:
            return 0
        dropped = self._mem.drop_range(lower, upper)
        # Rows visible before the clean: the pending ones that exist, and the
        # stored ones that no pending operation shadows. Strict mode knows from
        # the op kind whether a key is stored; relaxed mode asks storage once.
        if self._strict:
            shadowed = sum(1 for _, op in dropped if op.kind is not OpKind.INSERT)
        else:
            found = self._stored_many([k for k, _ in dropped])
            shadowed = sum(1 for v in found if v is not None)
        pending = sum(1 for _, op in dropped if op.new is not None)
        stored = self._count_stored(lower, upper)
        self._range_deletes.append((lower, upper))
        self.metrics.removed_by_range += stored
        self._range_removed += stored
        return pending + stored - shadowed

    def _count_stored(self, lower: bytes, upper: bytes) -> int:
        keys = self.backend.keys(lower, upper)
        if self._range_deletes:
            keys = (k for k in keys if not self._in_range_delete(k))
        if self._cells is None:
            return sum(1 for _ in keys)
        cut = -self._cells.suffix_len
        count, last = 0, None
        for k in keys:
            if k[:cut] != last:
                count, last = count + 1, k[:cut]
        return count

    # -- commit ---------------------------------------------------------------------

    def prepare_commit(self, epoch: int) -> tuple[list[WriteOp], list[tuple[bytes, bytes]]]:
        """The backend writes that commit this epoch (the MemTable's net
        operations, the metadata row, the range deletes), without writing them.

        A state store calls this for each of its tables and writes all of them in
        one batch; :meth:`commit` does it for this table alone.
        """
        if epoch <= self._last_epoch:
            raise EpochError(
                f"table {self.schema.name!r}: epoch {epoch} is not above the last "
                f"committed epoch {self._last_epoch}; epochs must increase"
            )
        ops, range_deletes = self._epoch_writes()
        rows = self.metrics.committed_rows + self._pending_delta()
        ops.append((self._meta_key, _META.pack(epoch, rows)))
        return ops, range_deletes

    def _epoch_writes(self) -> tuple[list[WriteOp], list[tuple[bytes, bytes]]]:
        """The MemTable's writes and range deletes, squared with storage first
        in relaxed mode."""
        if self._verify_at_commit:
            self._verify_relaxed()
        ops: list[WriteOp] = []
        if self._cells is None:
            ops.extend(self._mem.writes())
        else:
            for key, op in self._mem.items():
                ops.extend(self._cell_ops(key, op))
        return ops, list(self._range_deletes)

    def _maybe_spill(self) -> None:
        if (
            self.spill_at is not None
            and self.on_spill is not None
            and len(self._mem) >= self.spill_at
        ):
            self.on_spill(self)

    def spill(self) -> tuple[list[WriteOp], list[tuple[bytes, bytes]]]:
        """Hand over the MemTable: its writes and range deletes, to be written to
        the backend *now*, as one batch, by the caller (a state store, which
        also logs them for the commit). The epoch goes on: reads then find
        those rows in the backend, and the next commit carries their effect on
        the row count. Only a caller that can undo the backend on abort (the
        state store reloads the last version) may spill.
        """
        ops, range_deletes = self._epoch_writes()
        self._spilled_delta = self._pending_delta()
        self._range_removed = 0
        self._mem.clear()
        self._range_deletes = []
        return ops, range_deletes

    def _cell_ops(self, key: bytes, op: KeyOp) -> Iterator[WriteOp]:
        assert self._cells is not None
        if op.new is None:
            # Every cell the row may have, written under any schema so far.
            for suffix in self._suffixes:
                yield key + suffix, None
            return
        for suffix, cell in self._cells.encode(self.rows.decode(op.new)):
            yield key + suffix, cell

    def _verify_relaxed(self) -> None:
        """Turn the epoch's operations into ones that agree with storage, with
        one multi-get, so that the row count stays exact; log what disagreed.
        Only the disagreements build operations."""
        entries = self._mem.entries()
        if not entries:
            return
        stored = self._stored_many([k for k, _, _ in entries])
        for (key, new, existed), current in zip(entries, stored, strict=True):
            if not existed and new is None:  # a tombstone: Insert + delete
                if current is None:
                    self._mem.replace(key, None)
                else:
                    old = self._as_bytes(current)
                    self._mem.replace(key, KeyOp(OpKind.DELETE, old, None))
                    self._relaxed("insert over a committed row", key)
                continue
            if existed == (current is not None):
                continue
            if current is not None:  # an Insert over a committed row
                assert new is not None
                old = self._as_bytes(current)
                self._mem.replace(key, KeyOp(OpKind.UPDATE, old, new))
                self._relaxed("insert over a committed row", key)
            elif new is None:  # a Delete of a row that is not committed
                self._mem.replace(key, None)
                self._relaxed("delete of a row that is not committed", key)
            else:  # an Update of a row that is not committed
                self._mem.replace(key, KeyOp(OpKind.INSERT, None, new))
                self._relaxed("update of a row that is not committed", key)

    def finish_commit(self, epoch: int) -> None:
        """Record that the writes of :meth:`prepare_commit` are durable."""
        self.metrics.committed_rows += self._pending_delta()
        self._last_epoch = epoch
        self._clear_epoch()

    def _clear_epoch(self) -> None:
        self._mem.clear()
        self._range_deletes = []
        self._spilled_delta = self._range_removed = 0
        self.metrics.reset_epoch()

    def commit(self, epoch: int) -> None:
        """Write the epoch to the backend in one atomic batch."""
        ops, range_deletes = self.prepare_commit(epoch)
        self.backend.write(ops, range_deletes)
        self.finish_commit(epoch)

    def abort(self) -> None:
        """Drop the epoch's uncommitted operations (not those already spilled:
        the spiller undoes those in the backend)."""
        self._clear_epoch()

    def reload(self) -> None:
        """Drop the epoch and re-read the metadata from the backend (after the
        backend was restored to another version)."""
        self.abort()
        self._last_epoch, self.metrics.committed_rows = self._read_meta()

    @property
    def pending(self) -> int:
        """Keys the uncommitted epoch touches."""
        return len(self._mem)
