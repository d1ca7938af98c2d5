"""The foreign-key table join (Kafka Streams KIP-213): its description,
which its two stages (:mod:`operators._fk_join.stages`) are built from.

The left table is keyed by K and its rows carry a foreign key FK; the right
table is keyed by FK. The join runs as two keyed stages per micro-batch
(docs/operators/fk-join.md):

1. ``subscriptions``, partitioned by FK: the right table and the
   subscriptions ``FK | K`` (with a hash of K's left row). A left change
   subscribes K to its FK (and a retraction unsubscribes it from the old one);
   each subscription and each right change answers every subscriber with a
   response ``(K, hash, right row)``.
2. ``results``, partitioned by K: the left table. Each K's result is resolved
   against K's left row as it stands at the end of the batch; a response whose
   hash is not that row's is stale and dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from operators.errors import InputError
from operators.typing import Joiner

__all__ = ["FK", "HASH", "RESPONSE_SEQUENCE", "FkJoinSpec", "left_row_hash"]

#: The left row's foreign key (a column of the left changelog the stages take)
#: and the hash of the row (computed by each stage from the row).
FK = "__fk"
HASH = "__hash"
#: The subscription stage's output column that orders its responses.
RESPONSE_SEQUENCE = "__seq"

_HOW = ("inner", "left")


def left_row_hash(row: Sequence[Any]) -> bytes:
    """A 128-bit digest of a left row: the version a response is checked
    against. ``repr`` of Arrow's Python values is stable across processes
    (Python's own ``hash`` is not)."""
    return hashlib.blake2b(repr(tuple(row)).encode(), digest_size=16).digest()


class FkJoinSpec:
    """A foreign-key join of a left and a right changelog table, as its
    stages see it (:class:`operators.FkJoin` adds it to a pipeline).

    ``left`` / ``right`` are the tables' schemas, ``left_key`` the left's
    primary key columns, ``right_key`` the right's key column. ``foreign_key``
    is a left column, or a picklable function of the left row (a tuple in
    ``left``'s order) that returns the FK or ``None``. ``how`` is ``"inner"``
    or ``"left"``. ``joiner`` maps ``(left_row, right_row or None)`` to an
    output row of schema ``output``; by default the output is the left row
    followed by the right row. The output must hold the left key columns,
    and the joiner must keep K's values there: the output is an upsert
    changelog keyed by them. ``sequence_column`` (int64, in both inputs)
    orders each table's changes; either table's schema may hold it as one of
    its columns (a changelog's own sequence number), but not as a key or the
    FK: it is then part of the row the joiner sees. A left row's identity
    (its hash) leaves it out, since a before-image carries the number of the
    change that retracts it. A right row is compared whole, so a right change
    that only brings a new sequence number still counts as a change and
    answers K's subscribers again.
    """

    def __init__(
        self,
        left: pa.Schema,
        left_key: Sequence[str],
        right: pa.Schema,
        right_key: str,
        foreign_key: str | Callable[[tuple[Any, ...]], Any],
        how: str = "inner",
        joiner: Joiner | None = None,
        output: pa.Schema | None = None,
        name: str = "fkjoin",
        sequence_column: str = "seq",
    ) -> None:
        if how not in _HOW:
            raise InputError(f"how must be one of {_HOW}, got {how!r}")
        for table, schema, cols in (("left", left, left_key), ("right", right, [right_key])):
            missing = [c for c in cols if c not in schema.names]
            if missing or not cols:
                raise InputError(
                    f"the {table} table's key {list(cols)} must be columns of it; it has "
                    f"{schema.names}"
                )
        _check_sequence_column(sequence_column, left, left_key, right, right_key, foreign_key)
        fk_type = right.field(right_key).type
        if isinstance(foreign_key, str):
            if foreign_key not in left.names:
                raise InputError(
                    f"foreign_key {foreign_key!r} is not a left column ({left.names}); give a "
                    "column or a function of the left row"
                )
            if left.field(foreign_key).type != fk_type:
                raise InputError(
                    f"foreign_key {foreign_key!r} has type {left.field(foreign_key).type}, the "
                    f"right key {right_key!r} has {fk_type}; cast one so that they hash alike"
                )
        if (joiner is None) != (output is None):
            raise InputError("give both a joiner and its output schema, or neither")
        if output is None:
            clash = set(left.names) & set(right.names)
            if clash:
                raise InputError(
                    f"the default output (left row then right row) would repeat columns "
                    f"{sorted(clash)}; rename them or give a joiner and its output schema"
                )
            output = pa.schema([*left, *right])
        missing = [c for c in left_key if c not in output.names]
        if missing:
            raise InputError(
                f"the output must hold the left key {list(left_key)} (it is keyed by it); "
                f"it has {output.names}"
            )
        self.left = left
        self.left_key = tuple(left_key)
        self.right = right
        self.right_key = right_key
        self.foreign_key = foreign_key
        self.how = how
        self.joiner: Joiner = joiner or _concatenate(len(right))
        # A delete carries only the key: every other column may be null.
        self.output = pa.schema(
            [f if f.name in self.left_key else f.with_nullable(True) for f in output]
        )
        self.name = name
        self.sequence_column = sequence_column
        self.fk_type = fk_type
        #: The left columns that make a row's identity: all but the sequence
        #: column; ``None`` when the left table does not hold it (the whole row).
        self._identity = (
            [i for i, n in enumerate(left.names) if n != sequence_column]
            if sequence_column in left.names
            else None
        )

    def with_sequence(self, schema: pa.Schema) -> pa.Schema:
        """``schema`` with the sequence column as a non-null int64: in its place
        where ``schema`` holds it, last otherwise."""
        seq = pa.field(self.sequence_column, pa.int64(), nullable=False)
        if self.sequence_column not in schema.names:
            return pa.schema([*schema, seq])
        return pa.schema([seq if f.name == seq.name else f for f in schema])

    def row_hash(self, row: Sequence[Any]) -> bytes:
        """The hash of a left row (in ``left``'s order) without its sequence
        column, if it has one: a ``-U``/``-D`` carries the number of the change
        that retracts the row, not the one that added it."""
        if self._identity is None:
            return left_row_hash(row)
        return left_row_hash([row[i] for i in self._identity])

    # -- preparing left rows -----------------------------------------------------------

    def foreign_key_of(self, row: tuple[Any, ...]) -> Any:
        """The FK of a left row (``None``: it joins nothing)."""
        if isinstance(self.foreign_key, str):
            return row[self.left.get_field_index(self.foreign_key)]
        return self.foreign_key(row)

    def keyed_left(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (left rows, other columns kept) with the row's FK as one
        more column, which the subscription stage is partitioned by. In Spark
        a column FK is that column itself and a function runs once per row
        before the shuffle (:func:`prepared`); this is the same, in Python."""
        if isinstance(self.foreign_key, str):
            fk_array = batch.column(self.foreign_key)
        else:
            columns = [batch.column(n).to_pylist() for n in self.left.names]
            fks = [self.foreign_key_of(r) for r in zip(*columns, strict=True)]
            try:
                fk_array = pa.array(fks, type=self.fk_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise InputError(
                    f"the foreign key of a left row must be a {self.fk_type} (the right key's "
                    f"type) or None: {exc}"
                ) from exc
        arrays = [*batch.columns, fk_array]
        return pa.RecordBatch.from_arrays(arrays, schema=self.keyed_schema(batch.schema))

    def keyed_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema :meth:`keyed_left` gives a left batch of ``schema``."""
        return pa.schema([*schema, pa.field(FK, self.fk_type)])

    def keyed_input(self) -> pa.Schema:
        """What both stages take as the left changelog: the left row (with
        the sequence column) and its FK (:meth:`keyed_left`)."""
        return pa.schema([*self.with_sequence(self.left), pa.field(FK, self.fk_type)])

    def row_hashes(self, columns: Sequence[list[Any]]) -> list[bytes]:
        """The hash of each left row, given the values of the left columns in
        ``left``'s order. Each stage computes it from the rows it is given,
        with this one function, so both see the same hash of a row."""
        return [self.row_hash(r) for r in zip(*columns, strict=True)]


def _check_sequence_column(
    name: str,
    left: pa.Schema,
    left_key: Sequence[str],
    right: pa.Schema,
    right_key: str,
    foreign_key: str | Callable[[tuple[Any, ...]], Any],
) -> None:
    """Raise :class:`InputError` if the sequence column is a key or the FK,
    or a table holds it as a column of another type than int64."""
    if name in (*left_key, right_key, foreign_key):
        raise InputError(
            f"the sequence column {name!r} is a key or the foreign key of the join; it "
            "numbers changes, so every change of a row would be another row: name another "
            "column as sequence_column"
        )
    for table, schema in (("left", left), ("right", right)):
        if name in schema.names and schema.field(name).type != pa.int64():
            raise InputError(
                f"the {table} table holds the sequence column {name!r} as "
                f"{schema.field(name).type}; it must be int64: cast it"
            )


def _concatenate(right_width: int) -> Joiner:
    return _Concatenate(right_width)


class _Concatenate:
    """The default joiner: the left row, then the right row (nulls without one)."""

    def __init__(self, right_width: int) -> None:
        self.right_width = right_width

    def __call__(self, left: tuple[Any, ...], right: tuple[Any, ...] | None) -> tuple[Any, ...]:
        return (*left, *(right if right is not None else (None,) * self.right_width))
