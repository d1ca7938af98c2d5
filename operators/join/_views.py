"""Join state views (seed 000): how one side of a join keeps its rows.

A side's rows live in one state table keyed join key first, so that one prefix
scan finds every row that a row of the other side may match. The rest of the
key follows what the side's unique key allows:

==============================  ==========================  ==============
view                            key                         rows per key
==============================  ==========================  ==============
join key contains unique key    ``join key``                one row
side has a unique key           ``join key, unique key``    one row
side has no unique key          ``join key, whole row``     a row and its
                                                            appearances
==============================  ==========================  ==============

An outer side also keeps, per row, its number of associations: how many rows
of the other side match it, the join condition included. With a time to live,
each row keeps when it was last written; written at ``t`` with a TTL of
``d`` ms, it is visible while ``now < t + d`` and expired from ``now >= t + d``
on (Flink's rule, :mod:`operators._api.ttl`): reads skip it and delete it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from encoding import Row, TableSchema
from operators._api.metrics import EXPIRED, REMOVED, UPDATED, side_metric
from operators._api.operator import OperatorContext
from operators._api.ttl import expired, expiry_time
from operators.errors import InputError

__all__ = ["H", "JoinStateView", "Record", "SideRows", "ViewKind", "values_at"]


#: How a side names one of its rows to the emit rules: a :class:`Record`
#: record at a time, a row index on the batch path.
H = TypeVar("H")

#: Which counts a side's stored rows carry after the input columns.
_NO_COUNTS, _APPEARANCES_ONLY, _ASSOCIATIONS_ONLY, _BOTH_COUNTS = "", "a", "c", "ac"

APPEARANCES = "__appearances"
ASSOCIATIONS = "__associations"
WRITTEN = "__written_ms"


def values_at(indices: Sequence[int]) -> Callable[[Row], Row]:
    """The values at ``indices`` of a row (a tuple), as a tuple: a getter
    in C, called a few times per input row."""
    if len(indices) == 1:
        (at,) = indices
        # A tuple's slice is a tuple.
        one: Callable[[Row], Row] = itemgetter(slice(at, at + 1))
        return one
    get: Callable[[Row], Row] = itemgetter(*indices)
    return get


class ViewKind(enum.Enum):
    """The three state layouts of seed 000, fastest first."""

    JOIN_KEY_CONTAINS_UNIQUE_KEY = "join key contains unique key"
    INPUT_SIDE_HAS_UNIQUE_KEY = "input side has unique key"
    INPUT_SIDE_HAS_NO_UNIQUE_KEY = "input side has no unique key"


@dataclass(slots=True, eq=False)
class Record:
    """One stored row of a side with what the view keeps beside it (one
    object per row: records are equal only to themselves)."""

    #: The input row, in the side's input column order.
    row: Row
    #: How many times the row is in the side (always 1 with a unique key).
    appearances: int
    #: Rows of the other side that match it (outer sides; -1 on inner ones).
    associations: int
    #: The row as the state table holds it (input columns, then the view's);
    #: ``None`` for a row the batch path holds that the table does not.
    stored: Row | None


class SideRows(Protocol[H]):
    """A side's rows as the emit rules read and write them: a
    :class:`JoinStateView` on the state table, record at a time, or the rows
    a batch holds (:class:`~operators.join._batch.HeldSide`). The rules name
    a row by a handle of the side's own (``H``: a :class:`Record`, or an
    index into the held rows) and read its row and counts through the side,
    so that the batch path needs no Python object per row."""

    @property
    def name(self) -> str: ...

    @property
    def outer(self) -> bool: ...

    @property
    def has_unique_key(self) -> bool: ...

    @property
    def row(self) -> Callable[[H], Row]:
        """The input row of a handle."""

    @property
    def appearances(self) -> Callable[[H], int]:
        """How many times a handle's row is in the side."""

    @property
    def associations(self) -> Callable[[H], int]:
        """A handle's rows of the other side that match it (outer sides)."""

    def find(self, ctx: OperatorContext, row: Row, join_key: Row) -> H | None:
        """The row in the side with ``row``'s identity (``join_key``: its
        join key)."""

    def records(self, ctx: OperatorContext, join_key: Row) -> Sequence[H]:
        """The rows in the side with ``join_key``, in key order."""

    def add(self, ctx: OperatorContext, row: Row, found: H | None, associations: int) -> None:
        """One more appearance of ``row``, replacing ``found``."""

    def retract(self, ctx: OperatorContext, found: H) -> None:
        """One appearance of ``found`` less."""

    def set_associations(self, ctx: OperatorContext, record: H, associations: int) -> None:
        """A new number of associations for an outer side's row."""


class JoinStateView:
    """One side's rows in a state table named ``name`` with id ``table_id``.

    ``name`` prefixes the side's counters (:mod:`operators._api.metrics`):
    ``<name>.numUpdatedStateRows`` (rows written), ``<name>.numRemovedStateRows``
    (rows deleted, expired ones included) and ``<name>.numExpiredStateRows``.
    """

    def __init__(
        self,
        table_id: int,
        name: str,
        schema: pa.Schema,
        join_key: Sequence[str],
        unique_key: Sequence[str] | None,
        outer: bool,
        ttl_ms: int | None,
    ) -> None:
        for column in (APPEARANCES, ASSOCIATIONS, WRITTEN):
            if column in schema.names:
                raise InputError(
                    f"the {name} input has a column {column!r}, a name the join keeps for its "
                    "state; rename the column"
                )
        unique = list(unique_key or ())
        missing = [c for c in unique if c not in schema.names]
        if missing:
            raise InputError(
                f"the {name} unique key names {missing}, which are not columns of the {name} "
                f"input {schema.names}"
            )
        if ttl_ms is not None and ttl_ms <= 0:
            raise InputError(f"the {name} TTL is a number of milliseconds > 0, got {ttl_ms}")
        self.name = name
        #: A record's row and counts (:class:`SideRows`).
        self.row: Callable[[Record], Row] = attrgetter("row")
        self.appearances: Callable[[Record], int] = attrgetter("appearances")
        self.associations: Callable[[Record], int] = attrgetter("associations")
        self._updated = side_metric(name, UPDATED)
        self._removed = side_metric(name, REMOVED)
        self._expired_metric = side_metric(name, EXPIRED)
        self.outer = outer
        self.ttl_ms = ttl_ms
        self.width = len(schema)
        names = schema.names
        self._jk = tuple(names.index(c) for c in join_key)
        #: The join key of an input row, as a tuple.
        self.join_key: Callable[[Row], Row] = values_at(self._jk)
        if not unique:
            self.kind = ViewKind.INPUT_SIDE_HAS_NO_UNIQUE_KEY
            rest = [c for c in names if c not in join_key]
        elif set(unique) <= set(join_key):
            self.kind = ViewKind.JOIN_KEY_CONTAINS_UNIQUE_KEY
            rest = []
        else:
            self.kind = ViewKind.INPUT_SIDE_HAS_UNIQUE_KEY
            rest = [c for c in unique if c not in join_key]
        self.has_unique_key = self.kind is not ViewKind.INPUT_SIDE_HAS_NO_UNIQUE_KEY
        self._identity = self._jk + tuple(names.index(c) for c in rest)
        extra: list[pa.Field] = []
        if not self.has_unique_key:
            extra.append(pa.field(APPEARANCES, pa.int64(), nullable=False))
        if outer:
            extra.append(pa.field(ASSOCIATIONS, pa.int64(), nullable=False))
        if ttl_ms is not None:
            extra.append(pa.field(WRITTEN, pa.int64(), nullable=False))
        self.table = TableSchema(
            table_id, pa.schema([*schema, *extra]), [*join_key, *rest], name=name
        )
        columns = self.table.columns.names
        self._appearances = columns.index(APPEARANCES) if APPEARANCES in columns else None
        self._associations = columns.index(ASSOCIATIONS) if outer else None
        self._written = columns.index(WRITTEN) if ttl_ms is not None else None
        self._counts = (
            (_NO_COUNTS, _ASSOCIATIONS_ONLY),
            (_APPEARANCES_ONLY, _BOTH_COUNTS),
        )[self._appearances is not None][outer]

    # -- rows and records ----------------------------------------------------------

    @property
    def join_key_indices(self) -> tuple[int, ...]:
        """Positions of the join key columns in an input row."""
        return self._jk

    @property
    def counts_at(self) -> tuple[int | None, int | None]:
        """Positions in a stored row of its appearances and associations
        (``None``: the side keeps no such column)."""
        return self._appearances, self._associations

    @property
    def identity_indices(self) -> tuple[int, ...]:
        """Positions in an input row of its identity's columns."""
        return self._identity

    def identity(self, row: Row) -> list[Any]:
        """The primary key of an input row's stored record: its join key and
        unique key, or, without one, the whole row (what :meth:`find` reads)."""
        return [row[i] for i in self._identity]

    def record(self, stored: Row) -> Record:
        """The record of a row as the state table holds it."""
        a, c = self._appearances, self._associations
        return Record(
            stored[: self.width],
            1 if a is None else stored[a],
            -1 if c is None else stored[c],
            stored,
        )

    def _stored(self, row: Row, appearances: int, associations: int, now: int) -> Row:
        out = list(row)
        if self._appearances is not None:
            out.append(appearances)
        if self._associations is not None:
            out.append(associations)
        if self._written is not None:
            out.append(now)
        return tuple(out)

    def stored_row(self, row: Row, appearances: int, associations: int) -> Row:
        """The row the state table holds for a record (no TTL)."""
        # ``==``, not ``is``: an unpickled view (a Spark task's) holds its
        # own copy of the string.
        counts = self._counts
        if counts == _NO_COUNTS:
            return row
        if counts == _APPEARANCES_ONLY:
            return (*row, appearances)
        if counts == _ASSOCIATIONS_ONLY:
            return (*row, associations)
        return (*row, appearances, associations)

    def count(self, ctx: OperatorContext, updated: int, removed: int) -> None:
        """Count ``updated`` rows written and ``removed`` rows deleted."""
        if updated:
            ctx.count(self._updated, updated)
        if removed:
            ctx.count(self._removed, removed)

    def _expired(self, stored: Row, now: int) -> bool:
        return (
            self._written is not None
            and self.ttl_ms is not None
            and expired(expiry_time(stored[self._written], self.ttl_ms), now)
        )

    def _expire(self, ctx: OperatorContext, stored: Row) -> None:
        ctx.table(self.name).delete(stored)
        ctx.count(self._removed)
        ctx.count(self._expired_metric)

    # -- reads ---------------------------------------------------------------------

    def find(self, ctx: OperatorContext, row: Row, join_key: Row) -> Record | None:
        """The live stored record with ``row``'s identity: the same unique key,
        or, without one, the same row."""
        table = ctx.table(self.name)
        stored = table.get_row(self.identity(row))
        if stored is None:
            return None
        if self._expired(stored, ctx.processing_time):
            self._expire(ctx, stored)
            return None
        return self.record(stored)

    def records(self, ctx: OperatorContext, join_key: Row) -> list[Record]:
        """Every live record with ``join_key``, in key order."""
        table = ctx.table(self.name)
        if self.kind is ViewKind.JOIN_KEY_CONTAINS_UNIQUE_KEY:
            one = table.get_row(join_key)
            found = [] if one is None else [one]
        else:
            found = list(table.scan(join_key))
        if self._written is None:
            return [self.record(s) for s in found]
        now = ctx.processing_time
        live = []
        for stored in found:
            if self._expired(stored, now):
                self._expire(ctx, stored)
            else:
                live.append(self.record(stored))
        return live

    # -- writes --------------------------------------------------------------------

    def add(self, ctx: OperatorContext, row: Row, found: Record | None, associations: int) -> None:
        """Store one more appearance of ``row`` (replacing ``found``, the
        record with its identity, if any) with ``associations``."""
        table = ctx.table(self.name)
        now = ctx.processing_time
        if found is None:
            table.insert(self._stored(row, 1, associations, now))
        else:
            appearances = 1 if self.has_unique_key else found.appearances + 1
            table.update(_stored_of(found), self._stored(row, appearances, associations, now))
        ctx.count(self._updated)

    def retract(self, ctx: OperatorContext, found: Record) -> None:
        """Remove one appearance of a stored record."""
        table = ctx.table(self.name)
        if found.appearances > 1:
            new = self._stored(
                found.row, found.appearances - 1, found.associations, ctx.processing_time
            )
            table.update(_stored_of(found), new)
            ctx.count(self._updated)
        else:
            table.delete(_stored_of(found))
            ctx.count(self._removed)

    def set_associations(self, ctx: OperatorContext, record: Record, associations: int) -> None:
        """Store a new number of associations for an outer side's record."""
        new = self._stored(record.row, record.appearances, associations, ctx.processing_time)
        ctx.table(self.name).update(_stored_of(record), new)
        ctx.count(self._updated)

    def sweep(self, ctx: OperatorContext) -> int:
        """Delete every expired row (a scan of the whole side); returns how
        many."""
        if self._written is None:
            return 0
        now = ctx.processing_time
        expired = [s for s in ctx.table(self.name).scan() if self._expired(s, now)]
        for stored in expired:
            self._expire(ctx, stored)
        return len(expired)


def _stored_of(record: Record) -> Row:
    """The stored row of a record read from the table."""
    assert record.stored is not None, "a record read from the table has its stored row"
    return record.stored
