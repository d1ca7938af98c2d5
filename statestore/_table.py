"""StateTable: typed rows with a primary key over a KV backend.

Writes go to the epoch's :class:`MemTable`; reads merge it over storage, the
MemTable winning (seed 001's read path); :meth:`StateTable.commit` writes the
epoch to the backend in one atomic batch.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter, lt
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from encoding import (
    EncodingError,
    KeyCodec,
    Row,
    RowCodec,
    TableSchema,
    arrow_equal,
    prefix_successor,
)
from statestore._log import get_logger
from statestore._memtable import UNTOUCHED, KeyOp, MemTable, OpKind
from statestore._typing import KVBackend
from statestore._values import TableValues, values_of
from statestore._writes import Writes
from statestore.errors import EpochError, InconsistencyError

__all__ = [
    "ConsistencyMode",
    "StateTable",
    "TableMetrics",
    "check_tables",
    "meta_key",
    "prepare_tables",
]


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
        self.keys, self.rows = _codecs(schema)
        #: How rows lie in the backend (row or cell layout), chosen once.
        self.values: TableValues = values_of(schema, backend, self.rows, self.keys)
        self._encode = self.rows.encode
        self._decode = self.rows.decode
        self._encode_key = self.keys.encode
        self._get = self.values.get
        self._log = (logger or get_logger(__name__)).bind(table=schema.name)
        self._strict = self.consistency is ConsistencyMode.STRICT
        self._verify_at_commit = self.consistency is ConsistencyMode.RELAXED
        self._n_key = len(schema.primary_key)
        self._key_indices = schema.key_indices
        self._key_of: Callable[[Sequence[Any]], Sequence[Any]] = _getter(schema.key_indices)
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
        return self._encode_key(self._key_of(row))

    def _in_range_delete(self, key: bytes) -> bool:
        return any(lo <= key < hi for lo, hi in self._range_deletes)

    # -- reads from storage ----------------------------------------------------------

    def _stored(self, key: bytes) -> bytes | None:
        """The committed row at ``key`` (row-layout bytes); ``None`` if absent
        or removed by a pending range delete."""
        if self._range_deletes and self._in_range_delete(key):
            return None
        return self.values.get(key)

    def _stored_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        stored_rows = self.metrics.committed_rows + self._spilled_delta
        found = _read_many(self.values, keys, stored_rows)
        if self._range_deletes:
            found = [
                None if self._in_range_delete(k) else v for k, v in zip(keys, found, strict=True)
            ]
        return found

    def _current(self, key: bytes) -> bytes | None:
        """The row at ``key`` as the epoch sees it (MemTable over storage)."""
        found = self._mem.lookup(key)
        if found is not UNTOUCHED:
            return found  # type: ignore[return-value]
        if self._range_deletes and self._in_range_delete(key):
            return None
        return self._get(key)

    def _same_row(self, current: bytes, expected: bytes) -> bool:
        """Whether a stored row equals ``expected`` (row-layout bytes).

        A value written by an older schema has fewer columns, so unequal bytes
        are compared again after decoding under the current schema.
        """
        return current == expected or self._encode(self._decode(current)) == expected

    # -- point reads ---------------------------------------------------------------

    def get_row(self, pk: Sequence[Any]) -> Row | None:
        """The row with primary key ``pk``, or ``None``."""
        if len(pk) != self._n_key:
            self._pk(pk)  # raises, naming the key
        key = self._encode_key(pk)
        value = self._mem.lookup(key)
        if value is UNTOUCHED:
            value = self._stored(key) if self._range_deletes else self._get(key)
        return None if value is None else self._decode(value)  # type: ignore[arg-type]

    def get_rows(self, pks: Sequence[Sequence[Any]]) -> list[Row | None]:
        """The rows with primary keys ``pks``, in order: one multi-get for the
        keys the MemTable does not answer."""
        keys = [self._pk(pk) for pk in pks]
        decode = self._decode
        return [None if v is None else decode(v) for v in self._current_many(keys)]

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
        operations are merged over storage as two ordered streams. A short
        range that the epoch has not touched is read at once, through the
        backend's reused iterator (the common scan of one join key).
        """
        if start is None and end is None and 0 < len(prefix) <= self._n_key:
            lower = self._encode_key(prefix)
            upper = prefix_successor(lower)
        else:
            lower, upper = self._bounds(prefix, start, end)
        if not reverse and not self._range_deletes and not self._mem.touches(lower, upper):
            short = self.values.read_short(lower, upper)
            if short is not None:
                return map(self._decode, short)
        return self._scan(lower, upper, reverse)

    def _scan(self, lower: bytes, upper: bytes | None, reverse: bool) -> Iterator[Row]:
        decode = self._decode
        for _, value in self._merged(lower, upper, reverse):
            yield decode(value)

    def scan_batch(
        self,
        prefix: Sequence[Any] = (),
        start: Sequence[Any] | None = None,
        end: Sequence[Any] | None = None,
        reverse: bool = False,
    ) -> pa.RecordBatch:
        """The rows :meth:`scan` yields, as one Arrow record batch."""
        lower, upper = self._bounds(prefix, start, end)
        return self.rows.decode_batch(self._merged_values(lower, upper, reverse))

    def scan_ranges(
        self,
        ranges: Iterable[tuple[Sequence[Any], Sequence[Any] | None, Sequence[Any] | None]],
    ) -> pa.RecordBatch:
        """The rows of many scans, each ``(prefix, start, end)`` as in
        :meth:`scan`, one after another as one Arrow record batch: many short
        scans (one per join key, say) decode once, not once each. Plain
        prefixes (no ``start``, no ``end``) over storage the epoch has not
        written are read through one reused iterator, with no bounds built
        per prefix."""
        ranges = list(ranges)
        if not self._mem and not self._range_deletes:
            prefixes = [p for p, start, end in ranges if start is None and end is None]
            if len(prefixes) == len(ranges):
                _, found = self.values.read_prefixes(self._prefixes(prefixes))
                return self.rows.decode_batch(found)
        values: list[bytes] = []
        for prefix, start, end in ranges:
            lower, upper = self._bounds(prefix, start, end)
            values.extend(self._merged_values(lower, upper, False))
        return self.rows.decode_batch(values)

    def scan_prefixes(self, prefixes: Iterable[Sequence[Any]]) -> pa.RecordBatch:
        """The rows whose key starts with any of ``prefixes`` (each the values
        of the first key columns), each row once, in key order, as one Arrow
        record batch: one read through a reused iterator for all the
        prefixes, in key order, and the MemTable's rows under them merged
        over it at once. For a caller that wants the rows of many join
        keys or groups and not in an order of its own (else
        :meth:`scan_ranges`)."""
        encoded: list[bytes] = []
        for prefix in sorted(set(self._prefixes(list(prefixes)))):
            if not encoded or not prefix.startswith(encoded[-1]):
                encoded.append(prefix)  # else its rows are the last one's
        if self._range_deletes:
            values: list[bytes] = []
            for prefix in encoded:
                values.extend(self._merged_values(prefix, prefix_successor(prefix), False))
            return self.rows.decode_batch(values)
        keys, values = self.values.read_prefixes(encoded)
        if self._mem:
            pending = self._mem.under_prefixes(encoded)
            if pending:
                values = _laid_over(zip(keys, values, strict=True), pending, False)
        return self.rows.decode_batch(values)

    def _prefixes(self, prefixes: list[Sequence[Any]]) -> list[bytes]:
        """The key bytes of scan prefixes, each no longer than the key."""
        if prefixes and max(map(len, prefixes)) > self._n_key:
            for prefix in prefixes:
                self._bounds(prefix, None, None)  # raises the error a scan raises
        return list(map(self._encode_key, prefixes))

    def _storage(
        self, lower: bytes, upper: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes]]:
        keep = self._not_range_deleted if self._range_deletes else None
        return self.values.items(lower, upper, reverse, keep)

    def _not_range_deleted(self, key: bytes) -> bool:
        return not self._in_range_delete(key)

    def _merged_values(self, lower: bytes, upper: bytes | None, reverse: bool) -> list[bytes]:
        """The values :meth:`_merged` yields, as a list, without a Python step
        per row: storage is read in one call (a short range through the
        backend's reused iterator), and a MemTable range is merged in C
        (:func:`_laid_over`)."""
        pending = self._mem.range(lower, upper, reverse) if self._mem else []
        if not pending and not self._range_deletes and not reverse:
            short = self.values.read_short(lower, upper)
            return self.values.read_values(lower, upper) if short is None else short
        stored = self.values.read_range(lower, upper, reverse)
        if self._range_deletes:
            stored = [(k, v) for k, v in stored if not self._in_range_delete(k)]
        if not pending:
            return [v for _, v in stored]
        return _laid_over(stored, pending, reverse)

    def _merged(
        self, lower: bytes, upper: bytes | None, reverse: bool
    ) -> Iterator[tuple[bytes, bytes]]:
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
        value = self._encode(row)
        key = self._encode_key(self._key_of(row))
        if self._strict and self._current(key) is not None:
            raise self._inconsistent("insert over an existing row; use update", key)
        if not self._mem.insert(key, value):
            self._relaxed("insert over a row inserted in this epoch", key)
        self.metrics.inserted += 1
        if self.spill_at is not None:
            self._maybe_spill()

    def delete(self, row: Sequence[Any]) -> None:
        """Delete ``row``; in strict mode it must be the stored row."""
        value = self._encode(row)
        key = self._encode_key(self._key_of(row))
        if self._strict:
            self._check_old(key, value, "delete")
        if not self._mem.delete(key, value):
            self._relaxed("delete of a row deleted in this epoch", key)
        self.metrics.deleted += 1
        self._maybe_spill()

    def update(self, old: Sequence[Any], new: Sequence[Any]) -> None:
        """Replace ``old`` by ``new`` (same primary key); in strict mode ``old``
        must be the stored row."""
        old_value = self._encode(old)
        new_value = self._encode(new)
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
                f"{self._decode(current)!r}",
                key,
            )

    def upsert(self, row: Sequence[Any]) -> None:
        """Insert ``row``, or replace the row with its key (one read)."""
        key = self._row_key(row)
        value = self._encode(row)
        current = self._current(key)
        if current is None:
            self._mem.insert(key, value)
            self.metrics.inserted += 1
        else:
            self._mem.update(key, current, value)
            self.metrics.updated += 1
        self._maybe_spill()

    def delete_key(self, pk: Sequence[Any]) -> Row | None:
        """Delete the row with primary key ``pk`` and return it (``None``, and
        nothing done, if there is none)."""
        key = self._pk(pk)
        current = self._current(key)
        if current is None:
            return None
        self._mem.delete(key, current)
        self.metrics.deleted += 1
        self._maybe_spill()
        return self._decode(current)

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
        if len(set(keys)) == len(keys):  # the MemTable merges them in one pass
            conflicts = self._mem.delete_many(keys, values)
        else:
            delete = self._mem.delete
            conflicts = [k for k, v in zip(keys, values, strict=True) if not delete(k, v)]
        for key in conflicts:
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
        for key in self._mem.update_many(keys, olds, values):
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
            olds = [c for _, c in found]
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
        scanned = self._scan_batch(pks, keys)
        if scanned is not None:
            return scanned
        current = self._current_many(keys)
        found = [c for c in current if c is not None]
        mask = pa.array([c is not None for c in current], type=pa.bool_())
        return self.rows.decode_batch(found), mask

    def _scan_batch(
        self, pks: pa.RecordBatch | pa.Table, keys: list[bytes]
    ) -> tuple[pa.RecordBatch, pa.BooleanArray] | None:
        """:meth:`get_batch` by one scan of the keys' span, decoded at once and
        matched in Arrow, when it is the fastest way: the keys are many of the
        stored rows (see :func:`_read_many`), the epoch has touched nothing,
        and the key is one column whose Arrow equality is its encoding's
        (not a float: -0.0 and NaN). ``None`` otherwise."""
        if (
            self._mem
            or self._range_deletes
            or self._n_key != 1
            or len(keys) < _SORT_FROM
            or len(keys) * _SCAN_RATIO < self.metrics.committed_rows + self._spilled_delta
        ):
            return None
        name = self.schema.key_names[0]
        column = pks.column(name)
        if column.type != self.schema.columns.field(name).type or not arrow_equal(column.type):
            return None
        values = self.values.read_values(min(keys), prefix_successor(max(keys)))
        stored = self.rows.decode_batch(values)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        at = pc.index_in(column, value_set=stored.column(name), skip_nulls=False)
        return stored.take(at.drop_null()), pc.is_valid(at)

    def contains(self, pks: pa.RecordBatch | pa.Table) -> list[bool]:
        """Whether a row is stored under each primary key of ``pks`` (key
        columns by name): the keys the MemTable does not answer are looked
        up in storage at once, no row read (see :meth:`_stored_marks`)."""
        current = self._current_many(self.keys.encode_batch(pks), self._stored_marks)
        return [c is not None for c in current]

    def _stored_marks(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """What storage holds at each of ``keys`` as far as whether a row is
        there: a row's bytes or its key (read keys alone), ``None`` for none."""
        stored_rows = self.metrics.committed_rows + self._spilled_delta
        if len(keys) < _SORT_FROM or len(keys) * _KEY_SCAN_RATIO < stored_rows:
            return self._stored_many(keys)
        stored = set(self.values.read_keys(min(keys), prefix_successor(max(keys))))
        if self._range_deletes:
            return [k if k in stored and not self._in_range_delete(k) else None for k in keys]
        return [k if k in stored else None for k in keys]

    def _with_current(self, keys: Sequence[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
        return zip(keys, self._current_many(keys), strict=True)

    def _reject_twice(self, keys: Sequence[bytes], what: str) -> None:
        if len(set(keys)) != len(keys):
            seen: set[bytes] = set()
            dup = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise self._inconsistent(what, dup)

    def _current_or_missing(self, key: bytes, current: bytes | None) -> bytes:
        if current is None:
            raise self._inconsistent("update of a missing row", key)
        return current

    def _current_many(
        self,
        keys: Sequence[bytes],
        stored_many: Callable[[Sequence[bytes]], list[bytes | None]] | None = None,
    ) -> list[bytes | None]:
        """:meth:`_current` of many keys: one read of storage (``stored_many``,
        by default :meth:`_stored_many`) for those the MemTable has not touched."""
        read = self._stored_many if stored_many is None else stored_many
        if not self._mem:  # the epoch's first reads: storage alone answers
            return read(keys)
        out: list[Any] = self._mem.lookup_many(keys)
        missing = [i for i, v in enumerate(out) if v is UNTOUCHED]
        if missing:
            stored = read([keys[i] for i in missing])
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
        keep = self._not_range_deleted if self._range_deletes else None
        return self.values.count(lower, upper, keep)

    # -- commit ---------------------------------------------------------------------

    def prepare_commit(self, epoch: int) -> TableWrites:
        """The backend writes that commit this epoch (the MemTable's net
        operations, the metadata row, the range deletes), without writing them.

        A state store calls this for each of its tables and writes all of them in
        one batch; :meth:`commit` does it for this table alone.
        """
        self.check_epoch(epoch)
        writes = self._epoch_writes()
        meta_key, meta_value = self._meta_write(epoch)
        writes.keys.append(meta_key)
        writes.values.append(meta_value)
        return writes

    def check_epoch(self, epoch: int) -> None:
        """Raise :class:`EpochError` unless ``epoch`` may be committed next."""
        if epoch <= self._last_epoch:
            raise EpochError(
                f"table {self.schema.name!r}: epoch {epoch} is not above the last "
                f"committed epoch {self._last_epoch}; epochs must increase"
            )

    def _meta_write(self, epoch: int) -> tuple[bytes, bytes]:
        """The write of the metadata row that commits ``epoch``."""
        rows = self.metrics.committed_rows + self._pending_delta()
        return self._meta_key, _META.pack(epoch, rows)

    def _epoch_writes(self) -> TableWrites:
        """The MemTable's writes and range deletes, squared with storage first
        in relaxed mode."""
        if self._verify_at_commit:
            self._verify_relaxed()
        keys, values = self.values.writes(*self._mem.writes())
        return TableWrites(keys, values, list(self._range_deletes))

    def _maybe_spill(self) -> None:
        if (
            self.spill_at is not None
            and self.on_spill is not None
            and len(self._mem) >= self.spill_at
        ):
            self.on_spill(self)

    def spill(self) -> TableWrites:
        """Hand over the MemTable: its writes and range deletes, to be written to
        the backend *now*, as one batch, by the caller (a state store, which
        also logs them for the commit). The epoch goes on: reads then find
        those rows in the backend, and the next commit carries their effect on
        the row count. Only a caller that can undo the backend on abort (the
        state store reloads the last version) may spill.
        """
        writes = self._epoch_writes()
        self._spilled_delta = self._pending_delta()
        self._range_removed = 0
        self._mem.clear()
        self._range_deletes = []
        return writes

    def _verify_relaxed(self) -> None:
        """Turn the epoch's operations into ones that agree with storage, with
        one multi-get, so that the row count stays exact; log what disagreed.
        Only the disagreements are looked at one by one: the keys found
        stored that the epoch took for new, those it took for stored that
        are not, and the tombstones."""
        mem = self._mem
        keys = mem.keys()
        if not keys:
            return
        stored = self._stored_many(keys)
        present = {k for k, c in zip(keys, stored, strict=True) if c is not None}
        existed = mem.existed()
        suspects = present.symmetric_difference(existed)
        suspects.update(mem.tombstones())
        if not suspects:
            return
        current_of = dict(zip(keys, stored, strict=True))
        for key in [k for k in keys if k in suspects]:
            new: bytes | None = mem.lookup(key)  # type: ignore[assignment]
            current = current_of[key]
            if key not in existed and new is None:  # a tombstone: Insert + delete
                if current is None:
                    mem.replace(key, None)
                else:
                    mem.replace(key, KeyOp(OpKind.DELETE, current, None))
                    self._relaxed("insert over a committed row", key)
            elif current is not None:  # an Insert over a committed row
                assert new is not None
                mem.replace(key, KeyOp(OpKind.UPDATE, current, new))
                self._relaxed("insert over a committed row", key)
            elif new is None:  # a Delete of a row that is not committed
                mem.replace(key, None)
                self._relaxed("delete of a row that is not committed", key)
            else:  # an Update of a row that is not committed
                mem.replace(key, KeyOp(OpKind.INSERT, None, new))
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
        writes = self.prepare_commit(epoch)
        self.backend.write(writes.in_key_order(), writes.range_deletes)
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


@functools.lru_cache(maxsize=256)
def _codecs(schema: TableSchema) -> tuple[KeyCodec, RowCodec]:
    """The key and row codecs of ``schema``, built once per process: building
    one compiles its encoders (milliseconds a table), and a Spark task opens
    its store, and so builds its tables, again every batch. Codecs hold no
    state once built, so tables of equal schemas share them."""
    return KeyCodec(schema), RowCodec(schema)


def _getter(indices: Sequence[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """A function picking the values at ``indices`` out of a row, in C."""
    if len(indices) == 1:
        (i,) = indices
        return lambda row: (row[i],)
    if not indices:
        return lambda row: ()
    return itemgetter(*indices)


#: From this many keys a multi-get is made in key order, or made a scan.
_SORT_FROM = 64
#: A multi-get is made a scan of the keys' span when it asks for at least
#: one row in this many of those stored: a scan reads a row in about a
#: quarter of the time a multi-get finds one, so past that share the scan
#: reads less.
_SCAN_RATIO = 4
#: The same for a read of whether rows exist: a scan of keys alone reads one
#: in an eighth of the time a multi-get takes (0.19-0.23 us a key scanned).
_KEY_SCAN_RATIO = 8


def _laid_over(
    stored: Iterable[tuple[bytes, bytes]],
    pending: list[tuple[bytes, bytes | None]],
    reverse: bool,
) -> list[bytes]:
    """The values of ``stored`` pairs with the MemTable's ``pending`` ones
    (``None``: deleted) laid over them, in key order (``reverse``: from the
    end), merged in C: a dict of storage's pairs updated by the MemTable's,
    sorted (two presorted runs, one merge pass)."""
    rows: dict[bytes, bytes | None] = dict(stored)
    rows.update(pending)
    ordered = sorted(rows.items(), key=itemgetter(0), reverse=reverse)
    return [v for _, v in ordered if v is not None]


def _read_many(values: TableValues, keys: Sequence[bytes], stored_rows: int) -> list[bytes | None]:
    """``values.get_many(keys)``, read the fastest way: when the keys are
    many of the stored rows (an aggregate touching most of its groups in a
    batch), one scan from the least key to the greatest; else a multi-get
    of the keys in key order, as RocksDB's multi-get of sorted keys takes
    about half the time of one of keys in random order (each lookup lands
    near the last), more than the sort costs."""
    n = len(keys)
    if n < _SORT_FROM:
        return values.get_many(keys)
    if n * _SCAN_RATIO >= stored_rows:
        span = values.read_range(min(keys), prefix_successor(max(keys)), False)
        if not span:
            return [None] * n
        get = dict(span).get
        return [get(k) for k in keys]
    if all(map(lt, keys, islice(keys, 1, None))):
        return values.get_many(keys)
    order = sorted(range(n), key=keys.__getitem__)
    found = values.get_many([keys[i] for i in order])
    out: list[bytes | None] = [None] * n
    for i, value in zip(order, found, strict=True):
        out[i] = value
    return out


def prepare_tables(
    tables: Iterable[StateTable], epoch: int
) -> tuple[Writes, list[tuple[bytes, bytes]], int, int]:
    """Every table's commit writes for ``epoch`` as one batch, in key order, and
    the rows updated and removed (Spark's numUpdatedStateRows /
    numRemovedStateRows): what a state store writes, in memory or in RocksDB."""
    parts: list[Writes] = []
    meta_keys: list[bytes] = []
    meta_values: list[bytes | None] = []
    ranges: list[tuple[bytes, bytes]] = []
    updated = removed = 0
    # In key order RocksDB takes a batch several times faster (its
    # MemTable inserts find their place near the last one), and so does a
    # replay of the changelog. A table's keys all start with its id, so the
    # tables are sorted each on its own (their keys, mostly of one width,
    # sort fastest so) and laid one after another by id; the metadata rows,
    # under the one id above every table's, come last.
    tables = list(tables)
    for table in tables:
        table.check_epoch(epoch)
    for table in sorted(tables, key=lambda t: t.schema.table_id):
        writes = table._epoch_writes()
        meta_key, meta_value = table._meta_write(epoch)
        meta_keys.append(meta_key)
        meta_values.append(meta_value)
        if writes.keys:
            parts.append(writes.in_key_order())
        ranges += writes.range_deletes
        m = table.metrics
        updated += m.inserted + m.updated
        removed += m.deleted + m.removed_by_range
    parts.append(Writes.in_key_order(meta_keys, meta_values))
    return Writes.concat(parts, distinct=True), ranges, updated, removed


class TableWrites(NamedTuple):
    """One table's writes of an epoch: ``keys[i]`` gets ``values[i]``
    (``None``: delete it), in no particular order; the range deletes
    ``[start, end)`` apply first."""

    keys: list[bytes]
    values: list[bytes | None]
    range_deletes: list[tuple[bytes, bytes]]

    def in_key_order(self) -> Writes:
        """The point writes as one batch in key order."""
        return Writes.in_key_order(self.keys, self.values)


def check_tables(tables: Sequence[TableSchema]) -> dict[str, TableSchema]:
    """The tables of one store by name; each needs its own name and table id."""
    out: dict[str, TableSchema] = {}
    ids: set[int] = set()
    for schema in tables:
        if not isinstance(schema, TableSchema):
            raise TypeError(f"tables must be TableSchema objects, got {schema!r}")
        if schema.name in out or schema.table_id in ids:
            raise ValueError(
                f"table {schema.name!r} (id {schema.table_id}): every table of a store "
                "needs its own name and table id"
            )
        out[schema.name] = schema
        ids.add(schema.table_id)
    return out
