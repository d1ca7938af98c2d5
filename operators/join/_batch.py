"""The changelog join's batch path: one side's rows that a micro-batch
touches, held as Python objects, read in bulk and written in bulk.

Record at a time, each input row of :class:`~operators.join.StreamingJoin`
reads its own side's row (one point read), the other side's rows of its join
key (one prefix scan) and writes a few rows, each a call into the state
table that encodes a key. The batch path reads every row an input batch can
touch at once (one multi-get of the own side's rows, one ``scan_ranges`` of
the other side's join keys, or, when the keys are many for the table, the
whole table once) into :class:`HeldSide`: per side, identity -> record and
join key -> its records in key order, keyed by Python tuples, as a join on
plain dicts keeps them (a table read whole makes a join key's records when
the rules first ask for it). The emit rules run over those records in memory, the
same rules as record at a time (the held side answers the calls a state
view answers); at the end of the input batch each record written gets its
net change, in one batch write per kind. What was read stays for the next
input batch of the micro-batch, as long as nothing else wrote the table. The
rules see the rows they would have seen record at a time, in the same key
order, so the output is the same row for row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

from encoding import key_equal_values
from operators._operator import OperatorContext
from operators.join._views import JoinStateView, Record, ViewKind, values_at
from statestore import StateTable

__all__ = ["SEEK_ROWS", "WHOLE_TABLE_ROWS", "HeldSide", "read_whole"]

Row = tuple[Any, ...]

#: An input batch reads a whole table when it has at least a hundredth as
#: many keys as the table has rows: the rows read stay for the micro-batch's
#: later input batches, so one read of the whole table is soon cheaper than
#: a bounded scan (or a point read) per key of every input batch (measured
#: with ``relstate bench --suite join``).
SEEK_ROWS = 100
#: ... and at most this many rows, which are then held as Python tuples.
WHOLE_TABLE_ROWS = 1_000_000


def read_whole(keys: int, table: StateTable) -> bool:
    """Whether ``keys`` keys are many enough for ``table`` to read it whole
    (:data:`SEEK_ROWS`, :data:`WHOLE_TABLE_ROWS`)."""
    rows = table.row_count
    return keys * SEEK_ROWS >= rows and rows <= WHOLE_TABLE_ROWS


class _NaN:
    """Stands for a float NaN in a held key: NaN equals nothing in Python,
    but every NaN key encodes alike, so the state table finds one by another."""

    def __repr__(self) -> str:
        return "NaN"


_NAN = _NaN()


def _one_nan(values: Iterable[Any]) -> Row:
    """Key values as a tuple in which every NaN is one value."""
    return tuple(_NAN if v != v else v for v in values)


def _getter(indices: Sequence[int], floats: bool) -> Callable[[Sequence[Any]], Row]:
    """The values at ``indices`` of a row as a tuple that is equal for two
    rows exactly when their encoded keys are (``floats``: a key column is a
    float, whose NaNs become one value)."""
    get = values_at(indices)
    if not floats:
        return get
    return lambda row: _one_nan(get(row))


class HeldSide:
    """One side's rows that the micro-batch read, held for its input batches.

    ``by_identity`` maps each identity read (join key and unique key, or the
    whole row) to its record: the row, its appearances (0: not in the side
    any more) and associations, and ``stored``, the row as the state table
    holds it since the last :meth:`flush`. ``by_join_key`` maps each join key
    read whole to its records in the side, in key order. It answers the
    calls of :class:`~operators.join._views.JoinStateView` that the emit
    rules make (``find``, ``records``, ``add``, ``retract``,
    ``set_associations``) with no call into the table; every identity and
    join key an input batch asks for must have been read first
    (:meth:`load_identities`, :meth:`load_join_keys`,
    :meth:`load_join_key_rows`, :meth:`load_all`).
    """

    def __init__(self, view: JoinStateView, table: StateTable) -> None:
        self.view = view
        self.table = table
        self.name = view.name
        self.outer = view.outer
        self.has_unique_key = view.has_unique_key
        self.one_per_join_key = view.kind is ViewKind.JOIN_KEY_CONTAINS_UNIQUE_KEY
        columns = table.schema.columns
        floats = any(pa.types.is_floating(columns.field(i).type) for i in view.identity_indices)
        self.identity: Callable[[Sequence[Any]], Row] = _getter(view.identity_indices, floats)
        self.join_key: Callable[[Sequence[Any]], Row] = _getter(view.join_key_indices, floats)
        #: A key column is a float: held keys fold its NaNs into one value.
        self.floats = floats
        #: Held keys are the rows' key values as they are, and a join key
        #: may have many rows: a table read whole can wait to make a join
        #: key's records until they are asked for (:meth:`_defer`).
        self.plain = not floats and not self.one_per_join_key
        self.by_identity: dict[Row, Record] = {}
        self.by_join_key: dict[Row, list[Record]] = {}
        #: Join keys whose list took a record at its end since it was sorted.
        self.unsorted: set[Row] = set()
        #: Every row of the table is held (:meth:`load_all`).
        self.complete = False
        #: Join keys of a table read whole whose records are not made yet,
        #: each with its run of rows in :attr:`_deferred` (:meth:`_defer`).
        self.pending: dict[Row, tuple[int, int]] = {}
        self._deferred: tuple[list[Row], list[Any] | None, list[Any] | None] = ([], None, None)
        #: Records written since the last flush.
        self.written: set[Record] = set()
        #: The last row :meth:`find` looked for, and its identity.
        self._found: tuple[Row, Row] = ((), ())
        #: The operations as issued since the last flush (the table's
        #: metrics) and the view's counters, as record at a time counts them.
        self.inserted = self.updated = self.deleted = 0
        self._seen = self._signature()

    def _signature(self) -> tuple[int, ...]:
        """What changes whenever anything writes the table."""
        m = self.table.metrics
        return (m.inserted, m.deleted, m.updated, m.removed_by_range, self.table.row_count)

    @property
    def current(self) -> bool:
        """Whether the rows held are still the table's: nothing but this
        object wrote it since (each write moves its metrics)."""
        return self._signature() == self._seen

    def _held_key(self, join_key: Row) -> Row:
        """A join key as the held maps key it."""
        return _one_nan(join_key) if self.floats else join_key

    # -- bulk reads -----------------------------------------------------------------

    def _hold(self, stored_rows: pa.RecordBatch) -> tuple[list[Record], list[Row]]:
        """The records of the table rows ``stored_rows`` and their join keys:
        the records held already (the same, as nothing else wrote the
        table), else new ones. Column at a time, not row at a time."""
        n = stored_rows.num_rows
        if not n:
            return [], []
        view = self.view
        columns = [c.to_pylist() for c in stored_rows.columns]
        rows: list[Row] = list(zip(*columns[: view.width], strict=True))
        stored = list(zip(*columns, strict=True)) if len(columns) > view.width else rows
        at = view.counts_at
        appearances = repeat(1) if at[0] is None else columns[at[0]]
        associations = repeat(-1) if at[1] is None else columns[at[1]]
        if self.floats:
            keys = list(map(self.identity, rows))
            join_keys = list(map(self.join_key, rows))
        else:
            keys = list(zip(*[columns[i] for i in view.identity_indices], strict=True))
            join_keys = list(zip(*[columns[i] for i in view.join_key_indices], strict=True))
        read = dict(zip(keys, map(Record, rows, appearances, associations, stored), strict=False))
        held = self.by_identity
        if not held:
            self.by_identity = held = read
        else:
            setdefault = held.setdefault
            for key, record in read.items():
                setdefault(key, record)
        return list(map(held.__getitem__, keys)), join_keys

    def load_identities(self, rows: Sequence[Row], batch: pa.RecordBatch) -> None:
        """Read the rows with the identities of ``rows`` (the input rows of
        ``batch``), those not held: one multi-get, decoded at once."""
        if self.complete:
            return
        held, identity = self.by_identity, self.identity
        wanted = [i for i, row in enumerate(rows) if identity(row) not in held]
        if not wanted:
            return
        names = self.table.schema.key_names
        pks = pa.RecordBatch.from_arrays([batch.column(n) for n in names], names=list(names))
        if len(wanted) < len(rows):
            pks = pks.take(pa.array(wanted, type=pa.int64()))
        found, _ = self.table.get_batch(pks)
        self._hold(found)

    def load_join_key_rows(self, join_keys: Iterable[Row]) -> None:
        """Read the row of each join key of ``join_keys`` not held, on a side
        whose join key is its identity: one multi-get, decoded at once."""
        if self.complete:
            return
        held, _held_key = self.by_identity, self._held_key
        wanted = [k for k in join_keys if _held_key(k) not in held]
        if not wanted:
            return
        names = self.table.schema.key_names
        columns = self.table.schema.columns
        pks = pa.RecordBatch.from_arrays(
            [
                pa.array([k[i] for k in wanted], type=columns.field(n).type)
                for i, n in enumerate(names)
            ],
            names=list(names),
        )
        found, _ = self.table.get_batch(pks)
        self._hold(found)

    def load_join_keys(self, join_keys: Iterable[Row]) -> None:
        """Read every row of each join key of ``join_keys`` not held: one
        ``scan_ranges`` decoded once, or, when the join keys are many for the
        table's rows, the whole table in one read, kept to those keys in
        Arrow (:func:`read_whole`)."""
        if self.complete:
            return
        wanted: dict[Row, Row] = {}
        for join_key in join_keys:
            key = self._held_key(join_key)
            if key not in self.by_join_key:
                wanted[key] = join_key
        if not wanted:
            return
        table = self.table
        values = list(wanted.values())
        whole = read_whole(len(wanted), table) and not any(None in k for k in values)
        if whole:
            stored_rows = self._only(table.scan_batch(), values)
        else:
            stored_rows = table.scan_ranges((k, None, None) for k in values)
        found = self.by_join_key
        for key in wanted:
            found[key] = []
        # Each scan comes in key order: appending keeps a list in order.
        records, keys = self._hold(stored_rows)
        for key, record in zip(keys, records, strict=True):
            under = found.get(key)
            if under is not None:  # else equal in Arrow, not in the key bytes
                under.append(record)

    def load_all(self) -> None:
        """Read the whole table (one scan, decoded once). On a :attr:`plain`
        side that holds nothing yet, a join key's records are made when the
        rules first ask for it (:meth:`_defer`)."""
        if self.complete:
            return
        self.complete = True
        if self.plain and not self.by_identity and not self.by_join_key:
            self._defer(self.table.scan_batch())
            return
        records, join_keys = self._hold(self.table.scan_batch())
        if self.one_per_join_key:
            return
        self.unsorted.clear()
        # A scan comes in key order, the join key first: a join key's
        # records are in a run, in order.
        found: dict[Row, list[Record]] = {}
        self.by_join_key = found
        for key, record in zip(join_keys, records, strict=True):
            under = found.get(key)
            if under is None:
                found[key] = [record]
            else:
                under.append(record)

    def _defer(self, stored_rows: pa.RecordBatch) -> None:
        """Keep the rows of the whole table as tuples and each join key's
        run of them (a scan comes in key order, the join key first), and
        make no record: a micro-batch touches a few of a table's join keys,
        and every record made is a Python object the garbage collector
        walks for as long as it is held."""
        if not stored_rows.num_rows:
            return
        view = self.view
        columns = [c.to_pylist() for c in stored_rows.columns]
        at = view.counts_at
        self._deferred = (
            list(zip(*columns[: view.width], strict=True)),
            None if at[0] is None else columns[at[0]],
            None if at[1] is None else columns[at[1]],
        )
        indices = view.join_key_indices
        one = len(indices) == 1
        # One value per row for a one-column join key: a tuple only per run.
        values: Iterable[Any] = (
            columns[indices[0]] if one else zip(*[columns[i] for i in indices], strict=True)
        )
        runs = self.pending
        start = 0
        last: Any = None
        value: Any
        for i, value in enumerate(values):
            if i and value != last:
                runs[(last,) if one else last] = (start, i)
                start = i
            last = value
        runs[(last,) if one else last] = (start, stored_rows.num_rows)

    def take(self, join_key: Row) -> list[Record]:
        """The records of a pending join key (:attr:`pending`), made now and
        held under it and their identities, in key order."""
        start, stop = self.pending.pop(join_key)
        rows, appearances, associations = self._deferred
        stored_row, identity, held = self.view.stored_row, self.identity, self.by_identity
        records = []
        for i in range(start, stop):
            row = rows[i]
            a = 1 if appearances is None else appearances[i]
            c = -1 if associations is None else associations[i]
            record = held[identity(row)] = Record(row, a, c, stored_row(row, a, c))
            records.append(record)
        self.by_join_key[join_key] = records
        return records

    def _only(self, batch: pa.RecordBatch, join_keys: list[Row]) -> pa.RecordBatch:
        """The rows of ``batch`` whose join key is one of ``join_keys`` (none
        null), in their order: a semi join in Arrow."""
        names = [batch.schema.names[i] for i in self.view.join_key_indices]
        probe = pa.table(
            {
                **{f"k{i}": key_equal_values(batch.column(n)) for i, n in enumerate(names)},
                "at": np.arange(batch.num_rows),
            }
        )
        wanted = pa.table(
            {
                f"k{i}": key_equal_values(
                    pa.array([k[i] for k in join_keys], type=batch.schema.field(n).type)
                )
                for i, n in enumerate(names)
            }
        )
        keys = [f"k{i}" for i in range(len(names))]
        kept = probe.join(wanted, keys, join_type="left semi")
        return batch.take(np.sort(np.asarray(kept.column("at"))))

    # -- what the emit rules call ----------------------------------------------------

    def find(self, ctx: OperatorContext, row: Row) -> Record | None:
        """The record in the side with ``row``'s identity."""
        if self.pending:
            join_key = self.join_key(row)
            if join_key in self.pending:
                self.take(join_key)
        key = self.identity(row)
        # The rules add the row they found nothing for next: its identity
        # is then at hand.
        self._found = row, key
        record = self.by_identity.get(key)
        return record if record is not None and record.appearances else None

    def records(self, ctx: OperatorContext, join_key: Row) -> list[Record]:
        """The records in the side with ``join_key``, in key order."""
        if self.floats:
            join_key = _one_nan(join_key)
        if self.one_per_join_key:
            record = self.by_identity.get(join_key)
            return [record] if record is not None and record.appearances else []
        if join_key in self.pending:
            return self.take(join_key)
        under = self.by_join_key.get(join_key)
        if under is None:
            return []  # the table is held whole, and has none
        if join_key in self.unsorted:
            self.unsorted.discard(join_key)
            encode, identity = self.table.keys.encode, self.view.identity
            under.sort(key=lambda r: encode(identity(r.row)))
        return under

    def add(self, ctx: OperatorContext, row: Row, found: Record | None, associations: int) -> None:
        """One more appearance of ``row`` (replacing ``found``, the record
        with its identity, if any) with ``associations``."""
        if found is None:
            last_row, key = self._found
            if row is not last_row:
                key = self.identity(row)
            record = self.by_identity.get(key)
            if record is None:
                record = self.by_identity[key] = Record(row, 1, associations, None)
            else:  # held, and gone from the side since
                record.row, record.appearances, record.associations = row, 1, associations
            self._under_join_key(record)
            self.inserted += 1
        else:
            record = found
            record.row, record.associations = row, associations
            if not self.has_unique_key:
                record.appearances += 1
            self.updated += 1
        self.written.add(record)

    def _under_join_key(self, record: Record) -> None:
        """List a record back in the side under its join key, if that join
        key is held whole; sorted when next read."""
        if self.one_per_join_key:
            return
        key = self.join_key(record.row)
        under = self.by_join_key.get(key)
        if under is None:
            if not self.complete:
                return  # read from the table, after a flush, when asked for
            under = self.by_join_key[key] = []
        under.append(record)
        if len(under) > 1:
            self.unsorted.add(key)

    def retract(self, ctx: OperatorContext, found: Record) -> None:
        """Remove one appearance of a record."""
        if found.appearances > 1:
            found.appearances -= 1
            self.updated += 1
        else:
            found.appearances = 0
            self.deleted += 1
            if not self.one_per_join_key:
                under = self.by_join_key.get(self.join_key(found.row))
                if under is not None:
                    under.remove(found)
        self.written.add(found)

    def set_associations(self, ctx: OperatorContext, record: Record, associations: int) -> None:
        """A new number of associations for an outer side's record."""
        record.associations = associations
        self.updated += 1
        self.written.add(record)

    # -- the write --------------------------------------------------------------------

    def flush(self, ctx: OperatorContext) -> None:
        """Write each written record's net change: one batch insert, update
        and delete; count the operations as record at a time issues them."""
        inserts: list[Row] = []
        updates: list[Row] = []
        deletes: list[Row] = []
        stored_row = self.view.stored_row
        for record in self.written:
            old = record.stored
            now = (
                stored_row(record.row, record.appearances, record.associations)
                if record.appearances
                else None
            )
            record.stored = now
            if now == old:
                continue
            if old is None:
                inserts.append(now)  # type: ignore[arg-type]
            elif now is None:
                deletes.append(old)
            else:
                updates.append(now)
        table = self.table
        columns = table.schema.columns
        if deletes:
            table.delete_batch(_batch(columns, deletes))
        if updates:
            table.update_batch(_batch(columns, updates))
        if inserts:
            table.insert_batch(_batch(columns, inserts))
        metrics = table.metrics
        metrics.inserted += self.inserted - len(inserts)
        metrics.updated += self.updated - len(updates)
        metrics.deleted += self.deleted - len(deletes)
        self.view.count(ctx, self.inserted + self.updated, self.deleted)
        self.inserted = self.updated = self.deleted = 0
        self.written.clear()
        self._seen = self._signature()


def _batch(schema: pa.Schema, rows: Sequence[Row]) -> pa.RecordBatch:
    """Row tuples in ``schema``'s column order as one Arrow batch."""
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)],
        schema=schema,
    )
