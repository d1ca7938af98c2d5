"""The changelog join's batch path: a state table's rows held in memory for
a micro-batch, read in bulk and written in bulk.

Record at a time, each input row of :class:`~operators.join.StreamingJoin`
reads its own side's row (one point read), the other side's rows of its join
key (one prefix scan) and writes a few rows, each a call into the state
table. The batch path reads every row an input batch can touch at once (one
multi-get for the own side's rows, one ``scan_ranges`` for the other side's
join keys, or, when the keys are many for the table, the whole table once),
runs the very same emit rules over those rows in memory, and writes the net
change of each key in one batch write per kind at the end of the input
batch. What it read stays for the next input batch of the micro-batch, as
long as nothing else wrote the table. The rules see the rows they would
have seen record at a time, in the same key order, so the output is the
same row for row.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from encoding import key_equal_values
from operators._changelog import RowKind
from operators._operator import OperatorContext, Timer
from statestore import StateTable

__all__ = ["SEEK_ROWS", "WHOLE_TABLE_ROWS", "BatchContext", "BatchTable", "read_whole"]

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


class BatchTable:
    """The rows of one state table that an input batch may touch, held in
    memory: each key's row before the batch and now, and, for the join keys
    read whole (``prefix_len`` key columns), their keys in key order.

    It answers the reads and takes the writes the join's state views make
    (``get_row``, ``scan`` of a join key, ``insert``, ``update``,
    ``delete``) as the table itself would in unchecked mode; :meth:`flush`
    then writes the net change of each key, and counts the operations in the
    table's metrics as issued, as record at a time would.
    """

    def __init__(self, table: StateTable, prefix_len: int) -> None:
        self.table = table
        self._encode_key = table.keys.encode
        # Key values equal in Python encode alike (-0.0 and 0.0, one instant
        # in two time zones); a NaN is never equal, and is encoded each time.
        self._encoded: dict[tuple[Any, ...], bytes] = {}
        self._key_indices = table.schema.key_indices
        self._prefix_len = prefix_len
        self._before: dict[bytes, Row | None] = {}
        self._now: dict[bytes, Row | None] = {}
        #: Encoded join key -> the keys under it, in key order (those read
        #: whole, and those inserted since).
        self._prefixes: dict[bytes, list[bytes]] = {}
        #: Every row of the table is held (:meth:`load_all`).
        self.complete = False
        #: Keys written since the last flush.
        self._dirty: set[bytes] = set()
        self._inserted = self._updated = self._deleted = 0
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

    def _encode(self, values: Sequence[Any]) -> bytes:
        """The key bytes of (a prefix of) a primary key, remembered per batch."""
        pk = tuple(values)
        key = self._encoded.get(pk)
        if key is None:
            key = self._encoded[pk] = self._encode_key(pk)
        return key

    # -- bulk reads -----------------------------------------------------------------

    def load_rows(self, pks: Iterable[Sequence[Any]]) -> None:
        """Read the rows with primary keys ``pks`` (one multi-get)."""
        if self.complete:
            return
        wanted: dict[bytes, Sequence[Any]] = {}
        for pk in pks:
            key = self._encode(pk)
            if key not in self._now:
                wanted[key] = pk
        if not wanted:
            return
        rows = self.table.get_rows(list(wanted.values()))
        for key, row in zip(wanted, rows, strict=True):
            self._before[key] = self._now[key] = row

    def load_all(self) -> None:
        """Read the whole table (one scan, decoded once)."""
        if self.complete:
            return
        self._hold(self.table.scan_batch(), None)
        self.complete = True

    def _hold(self, batch: pa.RecordBatch, wanted: Mapping[bytes, Any] | None) -> None:
        """Hold the rows of ``batch``, under their join keys (those of
        ``wanted`` only, if given, which are already listed)."""
        keys = self.table.keys.encode_batch(batch)
        columns = [c.to_pylist() for c in batch.columns]
        rows: list[Row] = list(zip(*columns, strict=True)) if columns else []
        at = self._key_indices[: self._prefix_len]
        encode, found, before, now = self._encode, self._prefixes, self._before, self._now
        # The lists this read fills: those of ``wanted``, and those it
        # starts. A list that was there before holds its join key whole.
        fresh: set[bytes] = set() if wanted is None else set(wanted)
        for key, row in zip(keys, rows, strict=True):
            prefix = encode([row[i] for i in at])
            under = found.get(prefix)
            if under is None:
                if wanted is not None:
                    continue  # equal in Arrow, not in the key bytes
                under = found[prefix] = []
                fresh.add(prefix)
            elif prefix not in fresh:
                continue
            # Each scan comes in key order: appending keeps a list in order.
            under.append(key)
            if key not in now:  # else held already, perhaps changed since
                before[key] = now[key] = row

    def load_prefixes(self, prefixes: Iterable[Sequence[Any]]) -> None:
        """Read every row of each join key of ``prefixes``: one
        ``scan_ranges`` decoded once, or, when the join keys are many for
        the table's rows, the whole table in one read, kept to those keys
        in Arrow (:func:`read_whole`)."""
        if self.complete:
            return
        wanted: dict[bytes, Sequence[Any]] = {}
        for prefix in prefixes:
            encoded = self._encode(prefix)
            if encoded not in self._prefixes:
                wanted[encoded] = prefix
        if not wanted:
            return
        for encoded in wanted:
            self._prefixes[encoded] = []
        table = self.table
        whole = read_whole(len(wanted), table) and not any(None in p for p in wanted.values())
        if whole:
            batch = self._only(table.scan_batch(), list(wanted.values()))
        else:
            batch = table.scan_ranges((p, None, None) for p in wanted.values())
        self._hold(batch, wanted)

    def _only(self, batch: pa.RecordBatch, prefixes: list[Sequence[Any]]) -> pa.RecordBatch:
        """The rows of ``batch`` whose join key is one of ``prefixes`` (none
        null), in their order: a semi join in Arrow."""
        names = [batch.schema.names[i] for i in self._key_indices[: self._prefix_len]]
        probe = pa.table(
            {
                **{f"k{i}": key_equal_values(batch.column(n)) for i, n in enumerate(names)},
                "at": np.arange(batch.num_rows),
            }
        )
        wanted = pa.table(
            {
                f"k{i}": key_equal_values(
                    pa.array([p[i] for p in prefixes], type=batch.schema.field(n).type)
                )
                for i, n in enumerate(names)
            }
        )
        keys = [f"k{i}" for i in range(len(names))]
        kept = probe.join(wanted, keys, join_type="left semi")
        return batch.take(np.sort(np.asarray(kept.column("at"))))

    # -- what the views call ----------------------------------------------------------

    def get_row(self, pk: Sequence[Any]) -> Row | None:
        """The row with primary key ``pk`` as the batch left it."""
        key = self._encode(pk)
        if key in self._now:
            return self._now[key]
        if self.complete or self._encode(pk[: self._prefix_len]) in self._prefixes:
            return None  # its join key was read whole
        row = self.table.get_row(pk)
        self._before[key] = self._now[key] = row
        return row

    def scan(self, prefix: Sequence[Any] = ()) -> list[Row]:
        """The rows of join key ``prefix``, in key order."""
        encoded = self._encode(prefix)
        keys = self._prefixes.get(encoded)
        if keys is None:
            if self.complete:
                return []
            self.load_prefixes([prefix])
            keys = self._prefixes[encoded]
        now = self._now
        return [row for key in keys if (row := now[key]) is not None]

    def _key(self, row: Row) -> bytes:
        key = self._encode([row[i] for i in self._key_indices])
        if key not in self._before:
            # Written before it was read: what storage holds decides whether
            # this is an insert or an update at the flush.
            self._before[key] = self._now[key] = (
                None if self.complete else self.table.get_row([row[i] for i in self._key_indices])
            )
        self._dirty.add(key)
        return key

    def insert(self, row: Row) -> None:
        key = self._key(row)
        prefix = self._encode([row[i] for i in self._key_indices[: self._prefix_len]])
        under = self._prefixes.get(prefix)
        if under is None and self.complete:
            under = self._prefixes[prefix] = []
        if under is not None:
            at = bisect_left(under, key)
            if at == len(under) or under[at] != key:
                under.insert(at, key)
        self._now[key] = row
        self._inserted += 1

    def update(self, old: Row, new: Row) -> None:
        self._now[self._key(new)] = new
        self._updated += 1

    def delete(self, row: Row) -> None:
        self._now[self._key(row)] = None
        self._deleted += 1

    # -- the write --------------------------------------------------------------------

    def flush(self) -> None:
        """Write each key's net change: one batch insert, update and delete."""
        inserts: list[Row] = []
        updates: list[Row] = []
        deletes: list[Row] = []
        before, current = self._before, self._now
        for key in self._dirty:
            old, now = before[key], current[key]
            before[key] = now
            if now is old or now == old:
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
        # The operations as issued, as a record-at-a-time run counts them.
        metrics = table.metrics
        metrics.inserted += self._inserted - len(inserts)
        metrics.updated += self._updated - len(updates)
        metrics.deleted += self._deleted - len(deletes)
        self._inserted = self._updated = self._deleted = 0
        self._dirty.clear()
        self._seen = self._signature()


def _batch(schema: pa.Schema, rows: Sequence[Row]) -> pa.RecordBatch:
    """Row tuples in ``schema``'s column order as one Arrow batch."""
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)],
        schema=schema,
    )


class BatchContext(OperatorContext):
    """The context of one input batch on the batch path: the operator's
    context, but the tables named in ``tables`` are :class:`BatchTable`\\ s."""

    def __init__(self, ctx: OperatorContext, tables: Mapping[str, BatchTable]) -> None:
        self._ctx = ctx
        self._batch_tables = tables
        self.batch_id = ctx.batch_id
        self.partition_id = ctx.partition_id
        self.watermark = ctx.watermark
        self.previous_watermark = ctx.previous_watermark
        self.processing_time = ctx.processing_time
        self.metrics = ctx.metrics
        self.log = ctx.log

    def table(self, name: str) -> StateTable:
        found = self._batch_tables.get(name)
        # A BatchTable stands in for the few StateTable methods the views call.
        return self._ctx.table(name) if found is None else found  # type: ignore[return-value]

    @property
    def tables(self) -> Mapping[str, StateTable]:
        return self._ctx.tables

    def emit(self, row: Sequence[Any], kind: RowKind = RowKind.INSERT) -> None:
        self._ctx.emit(row, kind)

    def emit_batch(
        self, columns: Sequence[pa.Array | pa.ChunkedArray], kind: RowKind = RowKind.INSERT
    ) -> None:
        self._ctx.emit_batch(columns, kind)

    def register_timer(self, timer: Timer) -> None:
        self._ctx.register_timer(timer)

    def delete_timer(self, timer: Timer) -> None:
        self._ctx.delete_timer(timer)
