"""The changelog join's batch path: one side's rows that a micro-batch
touches, held as Python objects, read in bulk and written in bulk.

Record at a time, each input row of :class:`~operators.join.StreamingJoin`
reads its own side's row (one point read), the other side's rows of its join
key (one prefix scan) and writes a few rows, each a call into the state
table that encodes a key. The batch path reads every row an input batch can
touch at once (one multi-get of the own side's rows, one ``scan_prefixes`` of
the other side's join keys, or, when the keys are many for the table, the
whole table once) into :class:`HeldSide`: per side, identity -> row and
join key -> its rows in key order, keyed by Python tuples, as a join on
plain dicts keeps them, a row named by its index in parallel lists (no
Python object per row). The emit rules run over those rows in memory, the
same rules as record at a time (the held side answers the calls a state
view answers). What was read and written stays for the next input batch of
the micro-batch; at its end (the operator's ``flush``) each row written gets
its net change, in one batch write per kind, so a row that several input
batches change is written once. Until then the table holds the rows as of
the last flush, and a later read of some of its keys is laid under the rows
held (held rows win, rows added since are listed with the rows read); a read
of the whole table writes the side's changes first and maps the table from
nothing, in C loops rather than row by row. The rules see
the rows they would have seen record at a time, in the same key order, so
the output is the same row for row; where they can, they run as steps over
the whole input batch (:mod:`operators.join._bulk`, with the ``*_run``
calls below).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from encoding import Direction, Row, key_equal_values
from operators._api.operator import OperatorContext
from operators.join._views import JoinStateView, ViewKind, values_at
from statestore import StateTable

__all__ = ["HELD_ROWS", "SEEK_ROWS", "HeldSide", "key_runs", "read_whole"]


#: A side's whole table is read once the micro-batch's input batches have
#: asked it for at least a hundredth as many keys as the table has rows
#: (:meth:`HeldSide.read_whole`): the rows read stay for the micro-batch's
#: later input batches, so one read of the whole table is soon cheaper than
#: a bounded scan (or a point read) per key of every input batch.
SEEK_ROWS = 100
#: ... and has at most this many rows, which are then held as Python
#: tuples: the default of :class:`~operators.join.StreamingJoin`'s
#: ``held_rows`` (``relstate bench --suite join`` measures both sides of
#: the bound).
HELD_ROWS = 1_000_000


def read_whole(keys: int, table: StateTable, held_rows: int) -> bool:
    """Whether ``keys`` keys are many enough for ``table`` to read it whole,
    and the table is small enough (:data:`SEEK_ROWS`, ``held_rows``)."""
    rows = table.row_count
    return keys * SEEK_ROWS >= rows and rows <= held_rows


class _NaN:
    """Stands for a float NaN in a held key: NaN equals nothing in Python,
    but every NaN key encodes alike, so the state table finds one by another."""

    def __repr__(self) -> str:
        return "NaN"


_NAN = _NaN()


def _one_nan(values: Iterable[Any]) -> Row:
    """Key values as a tuple in which every NaN is one value."""
    return tuple(_NAN if v != v else v for v in values)


def _getter(indices: Sequence[int], floats: bool) -> Callable[[Row], Row]:
    """The values at ``indices`` of a row as a tuple that is equal for two
    rows exactly when their encoded keys are (``floats``: a key column is a
    float, whose NaNs become one value)."""
    get = values_at(indices)
    if not floats:
        return get
    return lambda row: _one_nan(get(row))


class HeldSide:
    """One side's rows that the micro-batch read, held for its input batches.

    The rows are held as parallel lists, and a row is its index in them
    (the handle the emit rules get, :class:`~operators.join._views.SideRows`):
    its input row (:attr:`row`), appearances (0: not in the side any more)
    and associations. A micro-batch holds tens of thousands of rows; as
    indices they are no Python object each for the garbage collector to walk
    (a record per row, and a list per join key, cost the batch path more in
    collections than in the rules). ``by_identity`` maps each identity read
    (join key and unique key, or the whole row) to its row; ``by_join_key``
    maps each join key read whole to its rows in the side, in key order, as
    indices (a ``range`` of a table read whole, a tuple). It answers the calls of
    :class:`~operators.join._views.JoinStateView` that the emit rules make
    (``find``, ``records``, ``add``, ``retract``, ``set_associations``)
    with no call into the table; every identity and join key an input batch
    asks for must have been read first (:meth:`load_identities`,
    :meth:`load_join_keys`, :meth:`load_join_key_rows`, :meth:`load_all`).
    """

    def __init__(self, view: JoinStateView, table: StateTable, held_rows: int) -> None:
        self.view = view
        self.table = table
        #: The most rows of the table read whole (:func:`read_whole`).
        self.held_rows = held_rows
        self.name = view.name
        self.outer = view.outer
        self.has_unique_key = view.has_unique_key
        self.one_per_join_key = view.kind is ViewKind.JOIN_KEY_CONTAINS_UNIQUE_KEY
        columns = table.schema.columns
        floats = any(pa.types.is_floating(columns.field(i).type) for i in view.identity_indices)
        #: A row without a unique key is its own identity (the key is its
        #: columns, join key first: equal exactly when the rows are), so a
        #: side with no float key holds it by the row itself (``tuple`` gives
        #: back a tuple as it is): no key made per row.
        self.row_is_identity = not view.has_unique_key and not floats
        self.identity: Callable[[Row], Row] = (
            tuple if self.row_is_identity else _getter(view.identity_indices, floats)
        )
        #: The key values of a row in key order (sorting, :meth:`_in_key_order`).
        self.key_values: Callable[[Row], Row] = values_at(view.identity_indices)
        self.join_key: Callable[[Row], Row] = _getter(view.join_key_indices, floats)
        #: A key column is a float: held keys fold its NaNs into one value.
        self.floats = floats
        #: Held keys are the rows' key values as they are (Arrow finds equal
        #: keys as Python does), and a join key may have many rows: a table
        #: read whole is mapped in C loops (:meth:`_hold_whole`).
        self.plain = not floats and not self.one_per_join_key
        #: Every key column ascending, of an integer or string type: the key
        #: bytes sort as the key values do (UTF-8 keeps code point order),
        #: so a join key's rows sort by their identities with nothing encoded.
        self.natural_order = all(
            k.direction is Direction.ASC and _natural(columns.field(k.name).type)
            for k in table.schema.primary_key
        )
        #: The row the state table holds for a row and its counts
        #: (:meth:`~operators.join._views.JoinStateView.stored_row`), picked once.
        self.stored_row = _stored_row(*(at is not None for at in view.counts_at))
        # The held rows, one index each; only ever changed in place, as
        # the handles' getters below are bound to them.
        self._rows: list[Row] = []
        self._appearances: list[int] = []
        self._associations: list[int] = []
        self.row: Callable[[int], Row] = self._rows.__getitem__
        self.appearances: Callable[[int], int] = self._appearances.__getitem__
        self.associations: Callable[[int], int] = self._associations.__getitem__
        self.by_identity: dict[Row, int] = {}
        #: A join key's rows: a ``range`` of a table read whole (no object
        #: for the garbage collector), a tuple once changed.
        self.by_join_key: dict[Row, Sequence[int]] = {}
        #: Join keys whose rows took a row at their end since sorted.
        self.unsorted: set[Row] = set()
        #: Rows added since the last flush under a join key not held whole:
        #: perhaps not in the table, so listed with its rows when read.
        self.unlisted: dict[Row, list[int]] = {}
        #: Every row of the table is held (:meth:`load_all`).
        self.complete = False
        #: The rows written since the last flush, each with what the state
        #: table holds for it: its row, appearances and associations
        #: (``None``: the table does not hold it).
        self.written: dict[int, tuple[Row, int, int] | None] = {}
        #: Keys the micro-batch's input batches asked of the side so far.
        self.asked = 0
        #: The last row :meth:`find` looked for, its identity, join key and
        #: held index (``None``: not held).
        self._found_row: Row = ()
        self._found_key: Row = ()
        self._found_join_key: Row = ()
        self._found_at: int | None = None
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

    def _columns(self, stored_rows: pa.RecordBatch) -> tuple[list[list[Any]], list[Row]]:
        """The columns of the table rows ``stored_rows`` as Python lists, and
        their input rows."""
        columns = [c.to_pylist() for c in stored_rows.columns]
        rows: list[Row] = list(zip(*columns[: self.view.width], strict=True))
        return columns, rows

    def _identities(self, columns: list[list[Any]]) -> list[Row]:
        """The identities of rows given by their columns."""
        return list(zip(*[columns[i] for i in self.view.identity_indices], strict=True))

    def _extend(self, columns: list[list[Any]], rows: list[Row]) -> None:
        """Hold ``rows`` (with their counts in ``columns``) at the next indices."""
        n = len(rows)
        at = self.view.counts_at
        self._rows.extend(rows)
        self._appearances.extend([1] * n if at[0] is None else columns[at[0]])
        self._associations.extend([-1] * n if at[1] is None else columns[at[1]])

    def _hold(self, stored_rows: pa.RecordBatch) -> tuple[list[int], list[Row]]:
        """The rows of the table rows ``stored_rows`` and their join keys:
        those held already (the same, as nothing else wrote the table),
        else held now. Column at a time, not row at a time."""
        if not stored_rows.num_rows:
            return [], []
        view = self.view
        columns, rows = self._columns(stored_rows)
        if self.floats:
            keys = list(map(self.identity, rows))
            join_keys = list(map(self.join_key, rows))
        else:
            keys = rows if self.row_is_identity else self._identities(columns)
            join_keys = list(zip(*[columns[i] for i in view.join_key_indices], strict=True))
        held = self.by_identity
        if not held:
            start = len(self._rows)
            self._extend(columns, rows)
            held.update(zip(keys, range(start, start + len(rows)), strict=True))
        else:
            at = view.counts_at
            held_rows, appearances, associations = (
                self._rows,
                self._appearances,
                self._associations,
            )
            for i, key in enumerate(keys):
                if key not in held:
                    held[key] = len(held_rows)
                    held_rows.append(rows[i])
                    appearances.append(1 if at[0] is None else columns[at[0]][i])
                    associations.append(-1 if at[1] is None else columns[at[1]][i])
        return list(map(held.__getitem__, keys)), join_keys

    def read_whole(self, keys: int) -> bool:
        """Whether an input batch that asks the side for ``keys`` keys reads
        its table whole: counted with the keys the micro-batch's earlier
        input batches asked, they are many for the table's rows
        (:func:`read_whole`). Many small input batches read the table once
        rather than by key each."""
        self.asked += keys
        return read_whole(self.asked, self.table, self.held_rows)

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
        ``scan_prefixes`` decoded once, or, when the join keys are many for the
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
        whole = read_whole(len(wanted), table, self.held_rows) and not any(
            None in k for k in values
        )
        if whole:
            stored_rows = self._only(table.scan_batch(), values)
        else:  # in key order: RocksDB seeks near its last position faster
            stored_rows = table.scan_prefixes(values)
        found: dict[Row, list[int]] = {key: [] for key in wanted}
        # Each scan comes in key order: appending keeps a list in order.
        indices, keys = self._hold(stored_rows)
        for key, i in zip(keys, indices, strict=True):
            under = found.get(key)
            if under is not None:  # else equal in Arrow, not in the key bytes
                under.append(i)
        self._list(found)

    def _list(self, found: dict[Row, list[int]]) -> None:
        """Hold ``found``, each join key's rows read from the table in key
        order, as the join keys' rows in the side: with no row gone since
        the last flush, with the rows added since (:attr:`unlisted`)."""
        appearances, unlisted = self._appearances, self.unlisted
        written = self.written
        for key, under in found.items():
            added = unlisted.pop(key, None) if unlisted else None
            if written:
                under = [i for i in under if appearances[i]]
            if added:
                under = list(dict.fromkeys([*under, *(i for i in added if appearances[i])]))
                self.unsorted.add(key)
            self.by_join_key[key] = tuple(under)

    def load_all(self, ctx: OperatorContext) -> None:
        """Read the whole table (one scan, decoded once). A side that holds
        rows already writes what it changed (:meth:`flush`) and lets them go
        first, so the table is always mapped from nothing: in C loops on a
        :attr:`plain` side (:meth:`_hold_whole`), never laid row by row
        under the rows held."""
        if self.complete:
            return
        if self.by_identity or self.by_join_key:  # rows unlisted are held too
            self.flush(ctx)
            self._let_go()
        self.complete = True
        if self.plain:
            self._hold_whole(self.table.scan_batch())
            return
        indices, join_keys = self._hold(self.table.scan_batch())
        if self.one_per_join_key:
            return
        # A scan comes in key order, the join key first: a join key's
        # rows are in a run, in order.
        found: dict[Row, list[int]] = {}
        for key, i in zip(join_keys, indices, strict=True):
            under = found.get(key)
            if under is None:
                found[key] = [i]
            else:
                under.append(i)
        self.by_join_key.update((key, tuple(under)) for key, under in found.items())

    def _let_go(self) -> None:
        """Hold nothing, as when made (after a flush: nothing unwritten).
        The lists are emptied in place, as the getters are bound to them."""
        self._rows.clear()
        self._appearances.clear()
        self._associations.clear()
        self.by_identity.clear()
        self.by_join_key.clear()
        self.unsorted.clear()
        self._found_row = self._found_key = self._found_join_key = ()
        self._found_at = None

    def _hold_whole(self, stored_rows: pa.RecordBatch) -> None:
        """Hold the rows of the whole table, map their identities and list
        each join key's run of them (a scan comes in key order, the join key
        first), each in one loop in C: no Python step per row."""
        if not stored_rows.num_rows:
            return
        columns, rows = self._columns(stored_rows)
        self._extend(columns, rows)  # the side holds nothing: indices from 0
        keys = rows if self.row_is_identity else self._identities(columns)
        self.by_identity.update(zip(keys, range(len(rows)), strict=True))
        indices = self.view.join_key_indices
        starts, stops = key_runs([stored_rows.column(i) for i in indices])
        # A run's key is made of the values its first row holds (no second
        # copy of them from Arrow to make and drop).
        join_keys = zip(*[map(columns[i].__getitem__, starts) for i in indices], strict=True)
        self.by_join_key.update(zip(join_keys, map(range, starts, stops), strict=True))

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

    def find(self, ctx: OperatorContext, row: Row, join_key: Row) -> int | None:
        """The row in the side with ``row``'s identity (``join_key``: its
        join key)."""
        if self.floats:
            join_key = _one_nan(join_key)
        key = self.identity(row)
        # The rules add the row they found nothing for next: its keys are
        # then at hand (kept apart: no tuple made per input row).
        i = self.by_identity.get(key)
        self._found_row, self._found_key, self._found_join_key = row, key, join_key
        self._found_at = i
        return i if i is not None and self._appearances[i] else None

    def records(self, ctx: OperatorContext, join_key: Row) -> Sequence[int]:
        """The rows in the side with ``join_key``, in key order."""
        if self.floats:
            join_key = _one_nan(join_key)
        if self.one_per_join_key:
            i = self.by_identity.get(join_key)
            return (i,) if i is not None and self._appearances[i] else ()
        under = self.by_join_key.get(join_key)
        if under is None:
            return ()  # the table is held whole, and has none
        if join_key in self.unsorted:
            under = self._sort(join_key)
        return under

    def _sort(self, join_key: Row) -> tuple[int, ...]:
        """Put a join key that took rows at its end back in key order."""
        self.unsorted.discard(join_key)
        under = self.by_join_key[join_key] = self._in_key_order(self.by_join_key[join_key])
        return under

    def _in_key_order(self, under: Sequence[int]) -> tuple[int, ...]:
        """Rows ``under`` in the order of their keys in the table."""
        key_values, rows = self.key_values, self._rows
        if self.natural_order:
            try:
                return tuple(sorted(under, key=lambda i: key_values(rows[i])))
            except TypeError:  # a null beside a value: the key bytes order them
                pass
        encode = self.table.keys.encode
        return tuple(sorted(under, key=lambda i: encode(self.view.identity(rows[i]))))

    def _write(self, i: int) -> None:
        """Note the row as the table holds it before ``i``'s first change
        since the last flush."""
        if i not in self.written:
            a = self._appearances[i]
            self.written[i] = (self._rows[i], a, self._associations[i]) if a else None

    def add(self, ctx: OperatorContext, row: Row, found: int | None, associations: int) -> None:
        """One more appearance of ``row`` (replacing ``found``, the row with
        its identity, if any) with ``associations``."""
        if found is not None:
            if found not in self.written:
                self._write(found)
            self._rows[found], self._associations[found] = row, associations
            if not self.has_unique_key:
                self._appearances[found] += 1
            self.updated += 1
            return
        by_identity, rows = self.by_identity, self._rows
        if row is self._found_row:  # no write since find: its index holds
            key, join_key, i = self._found_key, self._found_join_key, self._found_at
        else:
            key, join_key = self.identity(row), self.join_key(row)
            i = by_identity.get(key)
        if i is None:
            i = by_identity[key] = len(rows)
            rows.append(row)
            self._appearances.append(1)
            self._associations.append(associations)
            self.written[i] = None
        else:  # held, and gone from the side since
            self._write(i)
            rows[i], self._appearances[i], self._associations[i] = row, 1, associations
        self.inserted += 1
        if not self.one_per_join_key:
            self._list_added((join_key,), (i,))

    def _list_added(self, join_keys: Iterable[Row], added: Iterable[int]) -> None:
        """List rows ``added``, just added, in the side under their
        ``join_keys``: now, if that join key is held whole (sorted when next
        read), else when it is read."""
        by_join_key, unsorted, unlisted = self.by_join_key, self.unsorted, self.unlisted
        complete = self.complete
        for join_key, i in zip(join_keys, added, strict=True):
            under = by_join_key.get(join_key)
            if under:
                by_join_key[join_key] = (*under, i)
                unsorted.add(join_key)
            elif under is not None or complete:
                by_join_key[join_key] = (i,)
            else:
                unlisted.setdefault(join_key, []).append(i)

    def retract(self, ctx: OperatorContext, found: int) -> None:
        """Remove one appearance of a row."""
        if found not in self.written:
            self._write(found)
        if self._appearances[found] > 1:
            self._appearances[found] -= 1
            self.updated += 1
        else:
            self._appearances[found] = 0
            self.deleted += 1
            if not self.one_per_join_key:
                key = self.join_key(self._rows[found])
                under = self.by_join_key.get(key)
                if under is not None:
                    self.by_join_key[key] = tuple([i for i in under if i != found])

    def set_associations(self, ctx: OperatorContext, record: int, associations: int) -> None:
        """A new number of associations for an outer side's row."""
        if record not in self.written:
            self._write(record)
        self._associations[record] = associations
        self.updated += 1

    # -- a run of input rows at once (operators/join/_bulk.py) --------------------------

    def identities(self, rows: Sequence[Row]) -> list[Row]:
        """The identities of ``rows``, in a C loop. Not on a side with
        float keys (:attr:`floats`), whose NaNs need folding."""
        return list(rows) if self.row_is_identity else list(map(self.identity, rows))

    def held(self, identities: Sequence[Row]) -> list[int | None]:
        """The row held with each identity of ``identities`` (``None``: none,
        not even one gone from the side since), in a C loop."""
        return list(map(self.by_identity.get, identities))

    def in_side(self, held: Sequence[int | None]) -> list[int | None]:
        """Of rows ``held``, those still in the side (else ``None``), as
        :meth:`find` answers."""
        appearances = self._appearances
        return [i if i is not None and appearances[i] else None for i in held]

    def records_run(self, join_keys: Sequence[Row]) -> list[Sequence[int]]:
        """:meth:`records` of each join key of ``join_keys``, in C loops."""
        if self.one_per_join_key:
            return [() if i is None else (i,) for i in self.in_side(self.held(join_keys))]
        if self.unsorted:
            for join_key in self.unsorted.intersection(join_keys):
                self._sort(join_key)
        return [() if u is None else u for u in map(self.by_join_key.get, join_keys)]

    def add_run(
        self,
        rows: Sequence[Row],
        identities: Sequence[Row],
        join_keys: Sequence[Row],
        associations: Sequence[int],
    ) -> None:
        """:meth:`add` of each row of ``rows`` (``identities``, ``join_keys``:
        theirs) with its ``associations``, none of them held: held at the
        next indices at once."""
        start, n = len(self._rows), len(rows)
        added = range(start, start + n)
        self._rows.extend(rows)
        self._appearances.extend([1] * n)
        self._associations.extend(associations)
        self.by_identity.update(zip(identities, added, strict=True))
        self.written.update(dict.fromkeys(added))
        self.inserted += n
        if not self.one_per_join_key:
            self._list_added(join_keys, added)

    def set_associations_run(self, associations: dict[int, int], calls: int) -> None:
        """:meth:`set_associations` of each row of ``associations`` to its
        value, standing for ``calls`` calls."""
        written = self.written
        for i in associations:
            if i not in written:
                self._write(i)
        held = self._associations
        for i, n in associations.items():
            held[i] = n
        self.updated += calls

    # -- the write --------------------------------------------------------------------

    def _stored_batch(self, indices: list[int]) -> pa.RecordBatch:
        """Rows ``indices`` as the state table holds them, as one Arrow
        batch: the row tuples read by Arrow as one struct array (no column
        tuples made in Python), then the counts the side keeps."""
        fields = list(self.table.schema.columns)
        width = self.view.width
        rows = pa.array(list(map(self._rows.__getitem__, indices)), type=pa.struct(fields[:width]))
        held_counts = (self._appearances, self._associations)
        counts = [
            list(map(held.__getitem__, indices))
            for at, held in zip(self.view.counts_at, held_counts, strict=True)
            if at is not None
        ]
        arrays = [
            *rows.flatten(),
            *(pa.array(c, type=f.type) for c, f in zip(counts, fields[width:], strict=True)),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.table.schema.columns)

    def flush(self, ctx: OperatorContext) -> None:
        """Write each written row's net change: one batch insert, update
        and delete; count the operations as record at a time issues them."""
        updates: list[int] = []
        deletes: list[Row] = []
        rows, appearances, associations = self._rows, self._appearances, self._associations
        written = self.written
        # Most rows written are new (the table does not hold them): those
        # still in the side are inserts, picked in comprehensions.
        inserts = [i for i, old in written.items() if old is None and appearances[i]]
        for i, old in [(i, old) for i, old in written.items() if old is not None]:
            a = appearances[i]
            if not a:
                deletes.append(self.stored_row(*old))
            else:
                old_row, old_a, old_c = old
                if old_a != a or old_c != associations[i] or old_row != rows[i]:
                    updates.append(i)
        table = self.table
        if deletes:
            table.delete_batch(_batch(table.schema.columns, deletes))
        if updates:
            table.update_batch(self._stored_batch(updates))
        if inserts:
            table.insert_batch(self._stored_batch(inserts))
        metrics = table.metrics
        metrics.inserted += self.inserted - len(inserts)
        metrics.updated += self.updated - len(updates)
        metrics.deleted += self.deleted - len(deletes)
        self.view.count(ctx, self.inserted + self.updated, self.deleted)
        self.inserted = self.updated = self.deleted = 0
        self.written.clear()
        self.unlisted.clear()  # in the table now
        self._seen = self._signature()


def _natural(data_type: pa.DataType) -> bool:
    """Whether values of ``data_type`` sort in Python as their key bytes do."""
    t = pa.types
    return bool(t.is_integer(data_type) or t.is_string(data_type) or t.is_large_string(data_type))


def _stored_row(appearances: bool, associations: bool) -> Callable[[Row, int, int], Row]:
    """A row as the state table holds it, with the counts its side keeps."""
    if appearances and associations:
        return lambda row, a, c: (*row, a, c)
    if appearances:
        return lambda row, a, c: (*row, a)
    if associations:
        return lambda row, a, c: (*row, c)
    return lambda row, a, c: row


def key_runs(columns: Sequence[pa.Array | pa.ChunkedArray]) -> tuple[list[int], list[int]]:
    """The first and past-last position of each run of equal keys in
    ``columns`` (the key's columns, in key order: equal keys in a run); a
    null equals a null, as in the key bytes. In Arrow, not row by row."""
    n = len(columns[0])
    changed = np.zeros(max(n - 1, 0), dtype=bool)
    for column in columns:
        after, before = column.slice(1), column.slice(0, n - 1)
        differs = pc.not_equal(after, before)
        differs = pc.if_else(
            pc.is_null(differs), pc.xor(pc.is_null(after), pc.is_null(before)), differs
        )
        changed |= differs.to_numpy(zero_copy_only=False)
    starts = np.concatenate(([0], np.flatnonzero(changed) + 1))
    stops = np.append(starts[1:], n)
    return starts.tolist(), stops.tolist()


def _batch(schema: pa.Schema, rows: Sequence[Row]) -> pa.RecordBatch:
    """Row tuples in ``schema``'s column order as one Arrow batch."""
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)],
        schema=schema,
    )
