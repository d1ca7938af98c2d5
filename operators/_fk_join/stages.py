"""The two stages of the foreign-key join (see ``operators._fk_join.spec``).

:class:`SubscriptionStage` runs where the right table lives (partitioned by
FK); :class:`ResultStage` where the left table lives (partitioned by K).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from encoding import TableSchema
from operators._api.changelog import RowKind, row_kinds
from operators._api.metrics import UNKNOWN_RETRACTIONS
from operators._api.operator import Operator, OperatorContext
from operators._fk_join.spec import FK, HASH, RESPONSE_SEQUENCE, FkJoinSpec
from operators.errors import InputError, RunnerError
from statestore import ConsistencyMode

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = ["ResultStage", "SubscriptionStage"]

_ORDER = "__order"
_RIGHT = "__right_"
_EMITTED = "__emitted"
#: Retractions of a K whose held row is another one (another hash): K is
#: deleted all the same (docs/operators/fk-join.md, Metrics).
MISMATCHED_RETRACTIONS = "numRetractionsOfMismatchedRows"


class SubscriptionStage(Operator):
    """Keyed by FK: the right table, and which K subscribe to which FK.

    Input 0 is the left changelog with each row's FK; each row is a
    subscription ``(FK, K, hash, seq)``, its hash computed here: an
    accumulate row (``+I``/``+U``) subscribes K to FK and is answered at once
    with FK's right row; a retraction (``-U``/``-D``, the before-image)
    unsubscribes K, answered by nothing (KAFKA-16394: an FK change must not
    produce a null result of its own). Input 1 is the right changelog: an
    insert, update or delete of FK answers every K subscribed to FK (a prefix
    scan of ``FK | K``). A ``-U`` retracts the row as a ``-D`` does (it sorts
    before its ``+U``, which may carry another FK): the old row must not keep
    joining when an update moves it to another key.
    Every answer is a response ``(K, hash, right row or nulls, seq, order)``;
    ``order`` numbers the partition's responses as they are made, so the last
    one made for K is known even where rows share a sequence number.
    """

    # Every write follows a read of its key (a run's subscriptions are read
    # at once; upsert and delete_key read as they write), so the tables need
    # not read it again.
    consistency = ConsistencyMode.UNCHECKED

    def __init__(self, join: FkJoinSpec) -> None:
        self.join = join
        self.name = f"{join.name}-subscriptions"
        keys = [join.left.field(k) for k in join.left_key]
        digest = pa.field(HASH, pa.binary(), nullable=False)
        self.inputs = [join.keyed_input(), join.with_sequence(join.right)]
        #: A subscription as process_row takes it.
        self._subscription_row = [FK, *join.left_key, HASH, join.sequence_column]
        self.output = pa.schema(
            [
                *keys,
                digest,
                *[pa.field(_RIGHT + f.name, f.type) for f in join.right],
                pa.field(RESPONSE_SEQUENCE, pa.int64(), nullable=False),
                pa.field(_ORDER, pa.int64(), nullable=False),
            ]
        )
        subscription = pa.schema([pa.field(FK, join.fk_type, nullable=False), *keys, digest])
        self.tables = [
            TableSchema(1, join.right, [join.right_key], name="right"),
            TableSchema(2, subscription, [FK, *join.left_key], name="subscriptions"),
        ]
        self._right_key = join.right.get_field_index(join.right_key)
        self._right_width = len(join.right)
        self._right_seq = self.inputs[1].get_field_index(join.sequence_column)
        self._no_right = (None,) * len(join.right)
        #: Per partition in progress: how many responses it has made.
        self._made: dict[int, int] = {}
        #: Per partition in a run of subscriptions: what it read at once.
        self._runs: dict[int, _SubscriptionReads] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Batches in progress belong to this process; a pickled copy starts empty.
        return {**self.__dict__, "_made": {}, "_runs": {}}

    def open(self, ctx: OperatorContext) -> None:
        self._made[id(ctx)] = 0

    def _respond(
        self, ctx: OperatorContext, key: tuple[Any, ...], right: tuple[Any, ...], seq: int
    ) -> None:
        """Emit one response, numbered after the partition's earlier ones."""
        order = self._made[id(ctx)]
        self._made[id(ctx)] = order + 1
        ctx.emit((*key, *right, seq, order))

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        if side == 1:
            super().process_batch(ctx, batch, side)
            return
        if not batch.num_rows:
            return
        # One multi-get per table for the run. A run of subscriptions does not
        # write the right table, so its rows serve the whole run; a row of
        # ``FK | K`` writes that subscription only after reading it, so its
        # stored row serves the run's first row of ``FK | K`` alone.
        values = _left_values(self.join, batch, self._subscription_row)
        subscribed = [
            k
            for k in zip(*(values[n] for n in (FK, *self.join.left_key)), strict=True)
            if k[0] is not None
        ]
        fks = list(dict.fromkeys(k[0] for k in subscribed))
        keys = list(dict.fromkeys(subscribed))
        self._runs[id(ctx)] = _SubscriptionReads(
            dict(zip(fks, ctx.table("right").get_rows([(fk,) for fk in fks]), strict=True)),
            dict(zip(keys, ctx.table("subscriptions").get_rows(keys), strict=True)),
        )
        try:
            rows = _rows(values, self._subscription_row)
            for kind, row in zip(row_kinds(batch), rows, strict=True):
                self._subscription(ctx, row, kind)
        finally:
            del self._runs[id(ctx)]

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        # Left rows come in batches (process_batch), each with its hash.
        self._right_change(ctx, row, kind)

    def _subscription(self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind) -> None:
        fk, key, digest, seq = row[0], row[1:-2], row[-2], row[-1]
        if fk is None:
            return
        subscriptions = ctx.table("subscriptions")
        reads = self._runs.get(id(ctx))
        subscription = (fk, *key)
        if reads is None or subscription not in reads.subscriptions:
            if kind.is_retract:
                subscriptions.delete_key(subscription)
                return
            subscriptions.upsert((*subscription, digest))
        else:
            stored = reads.subscriptions.pop(subscription)
            if kind.is_retract:
                if stored is not None:
                    subscriptions.delete(stored)
                return
            if stored is None:
                subscriptions.insert((*subscription, digest))
            else:
                subscriptions.update(stored, (*subscription, digest))
        right = reads.right[fk] if reads is not None else ctx.table("right").get_row((fk,))
        self._respond(ctx, (*key, digest), right or self._no_right, seq)

    def _right_change(self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind) -> None:
        new, seq = row[: self._right_width], row[self._right_seq]
        fk = new[self._right_key]
        if fk is None:
            raise InputError(
                f"operator {self.name!r}: a right row with a null key {self.join.right_key!r}: "
                f"{new!r}; the right table is keyed by it"
            )
        right = ctx.table("right")
        if kind.is_retract:
            if right.delete_key((fk,)) is None:
                return
            answer = self._no_right
        else:
            if right.get_row((fk,)) == new:
                return
            right.upsert(new)
            answer = new
        for subscription in ctx.table("subscriptions").scan((fk,)):
            self._respond(ctx, subscription[1:], answer, seq)

    def close(self, ctx: OperatorContext) -> None:
        self._made.pop(id(ctx), None)
        ctx.count("numSubscriptionRows", ctx.table("subscriptions").row_count)


@dataclass
class _SubscriptionReads:
    """What :class:`SubscriptionStage` read at once for a run of subscriptions."""

    #: The right row of each FK of the run.
    right: dict[Any, tuple[Any, ...] | None]
    #: Each ``FK | K`` of the run: its stored subscription, until the run's
    #: first row of it takes it.
    subscriptions: dict[tuple[Any, ...], tuple[Any, ...] | None]


@dataclass
class _Answer:
    """The responses ``ResultStage`` got for one version (hash) of K's left row."""

    #: The newest response's ``(seq, order)``.
    made: tuple[int, int]
    #: The newest response's right row (``None``: no right row).
    right: tuple[Any, ...] | None
    #: How many responses came.
    count: int = 1


@dataclass
class _Pending:
    """One partition's batch in progress in :class:`ResultStage`."""

    #: Every K the batch touched, in the order it first did.
    touched: dict[tuple[Any, ...], None] = field(default_factory=dict)
    #: For each K the left input touched: whether K had an output row before.
    prior: dict[tuple[Any, ...], bool] = field(default_factory=dict)
    #: For each K: per left-row hash, the responses that came for it.
    responses: dict[tuple[Any, ...], dict[bytes, _Answer]] = field(default_factory=dict)
    #: In a run of left rows: each K's stored row, read at once, until the
    #: run's first row of K takes it (later rows of K read the table).
    stored: dict[tuple[Any, ...], tuple[Any, ...] | None] = field(default_factory=dict)


class ResultStage(Operator):
    """Keyed by K: the left table, and each K's result.

    Input 0 is the left changelog with each row's FK (its hash is computed
    here, from the row), which must carry before-images: ``-U``/``-D``
    retract the row the table holds, ``+I``/``+U`` add one where none is. As
    in Kafka's keyed left table, a retraction deletes K whatever row K holds
    (one whose before-image is another row counts in
    ``numRetractionsOfMismatchedRows``), and one for a K the table does not
    hold does nothing but count in ``numRetractionsOfUnknownRows``. Input 1
    is the responses. At the end of the batch each touched K is resolved
    against its left row as it then stands: only a response with that row's
    hash counts (the newest: by sequence, then by the order the subscription
    stage made them). The responses with another hash were computed for an
    older version of the row (every one, if K has no row or no FK): they are
    dropped, each counted in ``numResultsDroppedAsStale``. Each touched K
    gets one output row: its joined row (``+I``, or ``+U`` over an earlier
    one), or a delete if it had an output and has no result now.
    """

    # Every write of the left table follows a read of its key (the row's
    # stored one, K's row when resolving), so the table need not read it again.
    consistency = ConsistencyMode.UNCHECKED

    def __init__(self, join: FkJoinSpec) -> None:
        self.join = join
        self.name = f"{join.name}-results"
        fk = pa.field(FK, join.fk_type)
        digest = pa.field(HASH, pa.binary(), nullable=False)
        self.inputs = [join.keyed_input(), SubscriptionStage(join).output]
        # A left row as process_row takes it: the row, its FK and hash, then
        # the sequence column unless the row holds it; a row's first
        # width + 2 values are what the table keeps.
        width = len(join.left)
        left = join.with_sequence(join.left).names
        self._left_row = [*left[:width], FK, HASH, *left[width:]]
        self.output = join.output
        emitted = pa.field(_EMITTED, pa.bool_(), nullable=False)
        self.tables = [
            TableSchema(1, pa.schema([*join.left, fk, digest, emitted]), join.left_key, name="left")
        ]
        self._width = len(join.left)
        self._keys = [join.left.get_field_index(k) for k in join.left_key]
        self._out_keys = [join.output.get_field_index(k) for k in join.left_key]
        self._right_key = join.right.get_field_index(join.right_key)
        self._pending: dict[int, _Pending] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Batches in progress belong to this process; a pickled copy starts empty.
        return {**self.__dict__, "_pending": {}}

    def open(self, ctx: OperatorContext) -> None:
        self._pending[id(ctx)] = _Pending()

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        if side == 1:
            super().process_batch(ctx, batch, side)
            return
        if not batch.num_rows:
            return
        # One multi-get of the run's left keys. A row of K writes K only after
        # reading it, so each K's stored row serves the first row of K alone.
        pending = self._pending[id(ctx)]
        values = _left_values(self.join, batch, self._left_row)
        keys = list(dict.fromkeys(_rows(values, self.join.left_key)))
        pending.stored = dict(zip(keys, ctx.table("left").get_rows(keys), strict=True))
        try:
            rows = _rows(values, self._left_row)
            for kind, row in zip(row_kinds(batch), rows, strict=True):
                self._left_change(ctx, pending, row, kind)
        finally:
            pending.stored = {}

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        # Left rows come in batches (process_batch), each with its hash; these
        # are responses.
        pending = self._pending[id(ctx)]
        n = len(self._keys)
        key, digest, right, made = row[:n], row[n], row[n + 1 : -2], (row[-2], row[-1])
        pending.touched[key] = None
        answers = pending.responses.setdefault(key, {})
        answer = answers.get(digest)
        joined = right if right[self._right_key] is not None else None
        if answer is None:
            answers[digest] = _Answer(made, joined)
            return
        answer.count += 1
        # Responses for one row (one hash, so one FK) all come from one
        # subscription partition, which made them in sequence order.
        if answer.made < made:
            answer.made, answer.right = made, joined

    def _left_change(
        self, ctx: OperatorContext, pending: _Pending, row: tuple[Any, ...], kind: RowKind
    ) -> None:
        key = tuple(row[i] for i in self._keys)
        table = ctx.table("left")
        stored = pending.stored.pop(key) if key in pending.stored else table.get_row(key)
        if kind.is_retract:
            # Kafka's left table is keyed by K: a tombstone deletes K, whatever
            # the row it held, and one for a K it does not hold does nothing.
            if stored is None:
                ctx.count(UNKNOWN_RETRACTIONS)
                return
            if stored[self._width + 1] != row[self._width + 1]:
                ctx.count(MISMATCHED_RETRACTIONS)
            pending.touched[key] = None
            pending.prior.setdefault(key, stored[-1])
            table.delete(stored)
        else:
            pending.touched[key] = None
            if stored is not None:
                raise InputError(
                    f"operator {self.name!r}: a {kind} row for left key {key!r}, which the "
                    "table already holds; send the old row's -U (its before-image) first, "
                    "ordered by the sequence column"
                )
            pending.prior.setdefault(key, False)
            table.insert((*row[: self._width + 2], False))

    def close(self, ctx: OperatorContext) -> None:
        pending = self._pending.pop(id(ctx), _Pending())
        keys = list(pending.touched)
        # One multi-get: resolving K writes only K's row.
        rows = ctx.table("left").get_rows(keys) if keys else []
        for key, row in zip(keys, rows, strict=True):
            self._resolve(ctx, key, row, pending)

    def _resolve(
        self,
        ctx: OperatorContext,
        key: tuple[Any, ...],
        row: tuple[Any, ...] | None,
        pending: _Pending,
    ) -> None:
        """Emit K's result if it changed (``row``: K's left row as the batch
        leaves it); count the responses dropped as stale."""
        table = ctx.table("left")
        answers = pending.responses.get(key, {})
        stale = sum(a.count for a in answers.values())
        prior = pending.prior[key] if key in pending.prior else bool(row and row[-1])
        result = None
        if row is None or row[self._width] is None:
            if row is not None and self.join.how == "left":
                result = self.join.joiner(row[: self._width], None)
        else:
            digest = row[self._width + 1]
            match = answers.get(digest)
            if match is None:
                if key in pending.prior:
                    raise RunnerError(
                        f"operator {self.name!r}: no subscription response for left key "
                        f"{key!r}, whose row changed in this batch; the stages were not fed "
                        "the same left rows"
                    )
                ctx.count("numResultsDroppedAsStale", stale)
                return
            stale -= match.count
            if match.right is not None or self.join.how == "left":
                result = self.join.joiner(row[: self._width], match.right)
        if stale:
            ctx.count("numResultsDroppedAsStale", stale)
        if result is not None:
            result = tuple(result)
            self._check_key(key, result)
            ctx.emit(result, RowKind.UPDATE_AFTER if prior else RowKind.INSERT)
        elif prior:
            ctx.emit(self._delete(key), RowKind.DELETE)
        emitted = result is not None
        if row is not None and row[-1] != emitted:
            table.update(row, (*row[:-1], emitted))

    def _check_key(self, key: tuple[Any, ...], result: tuple[Any, ...]) -> None:
        """Raise :class:`InputError` unless the joiner kept K in ``result``: the
        output is keyed by K, so another key would add a row for a key that no
        later change of K updates or deletes."""
        if len(result) != len(self.output):
            return  # the runner refuses the row with its own message
        got = tuple(result[i] for i in self._out_keys)
        if got != key:
            raise InputError(
                f"operator {self.name!r}: the joiner returned left key {got!r} for the row "
                f"of left key {key!r}; the output is keyed by {list(self.join.left_key)}, "
                "so the joiner must keep those columns' values"
            )

    def _delete(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        out: list[Any] = [None] * len(self.output)
        for index, value in zip(self._out_keys, key, strict=True):
            out[index] = value
        return tuple(out)


def _left_values(join: FkJoinSpec, batch: pa.RecordBatch, names: list[str]) -> dict[str, list[Any]]:
    """The Python values of the columns of left ``batch`` that ``names``
    and the row's hash need, each converted once, by name; and :data:`HASH`,
    each row's hash."""
    wanted = [n for n in dict.fromkeys([*join.left.names, *names]) if n != HASH]
    values = {n: batch.column(n).to_pylist() for n in wanted}
    values[HASH] = join.row_hashes([values[n] for n in join.left.names])
    return values


def _rows(values: dict[str, list[Any]], names: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """The rows of ``values`` as tuples of ``names``' values."""
    return zip(*(values[n] for n in names), strict=True)
