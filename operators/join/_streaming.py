"""StreamingJoin: a changelog join with retractions (Flink's
StreamingJoinOperator), inner, left, right or full outer.

Each side keeps its rows in a join state view (:mod:`operators.join._views`);
an outer side also keeps each row's number of associations, which says when a
null-padded row must be emitted or retracted. The emit rules, per input row
``r`` and its matches ``M`` among the other side's stored rows (same join key,
condition true):

- accumulate (``+I``/``+U``): a padded ``(nulls, m)`` of an outer ``m`` with no
  association yet is retracted, then ``(r, m)`` is emitted (``+I`` if either
  side is outer, else with ``r``'s kind); on an outer side with no match,
  ``+I(r, nulls)``;
- retract (``-U``/``-D``): ``(r, m)`` is retracted (``-D`` if either side is
  outer, else with ``r``'s kind), and an outer ``m`` left without association
  gets ``+I(nulls, m)``; on an outer side with no match, ``-D(r, nulls)``;
- an accumulate that finds a stored row with its unique key (an upsert)
  replaces it: matches both rows share are emitted again as ``(r, m)`` without
  raising any count; only gained and lost matches count.

The rules are written once, over a side's rows as
:class:`~operators.join._views.SideRows`: record at a time they read and
write the state views, on the batch path the rows an input batch holds
(:class:`~operators.join._batch.HeldSide`). docs/operators/join.md has the
examples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from encoding import PartitionLocal, Row, TableSchema, arrow_equal
from operators._api.changelog import RowKind, row_kinds
from operators._api.metrics import TOTAL, UNKNOWN_RETRACTIONS, side_metric
from operators._api.operator import Operator, OperatorContext
from operators.errors import InputError
from operators.join._batch import HELD_ROWS, HeldSide
from operators.join._bulk import JoinRun
from operators.join._spec import LEFT, RIGHT, JoinSpec, JoinType, output_schema, side_name
from operators.join._views import H, JoinStateView, SideRows
from operators.join._whole import join_whole
from statestore import ConsistencyMode

__all__ = ["StreamingJoin"]

Condition = Callable[[Row, Row], bool]

INS, DEL, UPA = RowKind.INSERT, RowKind.DELETE, RowKind.UPDATE_AFTER

#: When each side with a TTL is next swept for expired rows.
_SWEEPS = TableSchema(
    3,
    pa.schema(
        [
            pa.field("side", pa.int8(), nullable=False),
            pa.field("next_sweep_ms", pa.int64(), nullable=False),
        ]
    ),
    ["side"],
    name="ttl_sweeps",
    # A sweep only deletes what has expired, so an early one is harmless:
    # after a repartition each partition sweeps at the earliest old time.
    partition_by=PartitionLocal(least="next_sweep_ms"),
    auxiliary=True,
)


class StreamingJoin(Operator):
    """``left JOIN right ON left_keys = right_keys AND condition`` over two
    changelogs (side 0 left, side 1 right); the output is a changelog of
    ``left columns + right columns``.

    ``left_unique_key`` / ``right_unique_key`` name a side's unique key, if it
    has one: it picks the side's state view, and lets an accumulate replace
    the stored row with the same unique key (an upsert input). ``condition``
    is a picklable ``(left_row, right_row) -> bool`` checked on rows with equal
    keys. Null keys match nothing unless ``null_safe``. A side's row written
    at processing time ``t`` is gone from ``t + <side>_ttl_ms`` on (Flink's
    TTL boundary, :mod:`operators._api.ttl`). ``left_prefix`` /
    ``right_prefix`` rename the output columns.

    ``held_rows`` bounds the memory the batch path takes: a side whose table
    holds at most that many rows (in the partition) is read whole once a
    micro-batch asks it for many keys, and its rows are held as Python
    tuples for the micro-batch; a larger one is read by key, each input
    batch its own keys, which costs more per row (``docs/operators/join.md``,
    "Speed").

    ``whole_micro_batch`` (a join with no condition and no TTL, its
    columns of types Arrow compares as the key bytes do,
    :func:`~encoding.arrow_equal`, or floats outside the identity) joins
    each micro-batch whole in Arrow at its end
    (:mod:`operators.join._whole`): the same rows in the same order,
    emitted when the micro-batch's input is all in rather than with each
    input batch, several times faster.
    """

    # Every write follows a read of its key (find, records), so the tables
    # need not read it again; tests run the join strict all the same.
    consistency = ConsistencyMode.UNCHECKED

    def __init__(
        self,
        join_type: JoinType | str,
        left: pa.Schema,
        right: pa.Schema,
        left_keys: Sequence[str],
        right_keys: Sequence[str],
        left_unique_key: Sequence[str] | None = None,
        right_unique_key: Sequence[str] | None = None,
        condition: Condition | None = None,
        null_safe: bool = False,
        left_ttl_ms: int | None = None,
        right_ttl_ms: int | None = None,
        left_prefix: str = "",
        right_prefix: str = "",
        name: str = "join",
        held_rows: int = HELD_ROWS,
        whole_micro_batch: bool = False,
    ) -> None:
        self.spec = JoinSpec.of(join_type, left, right, left_keys, right_keys)
        if isinstance(held_rows, bool) or not isinstance(held_rows, int) or held_rows < 0:
            raise InputError(f"held_rows is a number of rows >= 0, got {held_rows!r}")
        self.held_rows = held_rows
        self.name = name
        # Rows with one join key meet: each side by its keys.
        self.partition_keys = self.spec.keys
        self.condition = condition
        self.null_safe = null_safe
        self.inputs = [left, right]
        self.output = output_schema(self.spec, left_prefix, right_prefix)
        unique_keys = (left_unique_key, right_unique_key)
        ttls = (left_ttl_ms, right_ttl_ms)
        self.views = tuple(
            JoinStateView(
                side + 1,
                side_name(side),
                self.spec.inputs[side],
                self.spec.keys[side],
                unique_keys[side],
                self.spec.is_outer(side),
                ttls[side],
            )
            for side in (LEFT, RIGHT)
        )
        self._nulls: tuple[Row, Row] = ((None,) * len(left), (None,) * len(right))
        self._join_key = tuple(v.join_key for v in self.views)
        self._names = (left.names, right.names)
        # The rows each batch run in progress (by context) holds: see
        # operators/join/_batch.py.
        self._held: dict[int, dict[str, HeldSide]] = {}
        #: Input batches may take the rules as steps over the batch
        #: (operators/join/_bulk.py): with no condition.
        self._in_bulk = condition is None
        tables = [v.table for v in self.views]
        self.tables = [*tables, _SWEEPS] if any(t is not None for t in ttls) else tables
        self.whole_micro_batch = self._check_whole(whole_micro_batch)
        #: The input batches of each micro-batch in progress (by context),
        #: joined whole at its end (``whole_micro_batch``).
        self._micro_batch: dict[int, list[tuple[int, pa.RecordBatch]]] = {}

    def _check_whole(self, whole: object) -> bool:
        """``whole_micro_batch``, refused where the join cannot take it."""
        if not isinstance(whole, bool):
            raise InputError(f"whole_micro_batch is True or False, got {whole!r}")
        if not whole:
            return False
        why = []
        if self.condition is not None:
            why.append("it has a condition")
        if any(v.ttl_ms is not None for v in self.views):
            why.append("a side has a TTL")
        for view, schema in zip(self.views, self.inputs, strict=True):
            for i, column in enumerate(schema):
                if arrow_equal(column.type):
                    continue
                if i in view.identity_indices:
                    why.append(
                        f"the {view.name} column {column.name!r} ({column.type}) is in its identity"
                    )
                elif not pa.types.is_floating(column.type):
                    why.append(f"the {view.name} column {column.name!r} is a {column.type}")
        if why:
            raise InputError(
                "whole_micro_batch takes joins with no condition and no TTL whose "
                "columns are integers, strings, binary, booleans, dates or timestamps, or "
                "floats outside a side's identity (its join key and unique key, or the whole "
                f"row without one); here {'; '.join(why)}"
            )
        return True

    @property
    def join_type(self) -> JoinType:
        """The join's type."""
        return self.spec.join_type

    # -- batch hooks -----------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        """Sweep each side with a TTL whose sweep is due (once per TTL)."""
        self._held[id(ctx)] = {}
        self._micro_batch.pop(id(ctx), None)
        now = ctx.processing_time
        for side, view in enumerate(self.views):
            if view.ttl_ms is None:
                continue
            sweeps = ctx.table(_SWEEPS.name)
            due = sweeps.get_row((side,))
            if due is None:
                sweeps.insert((side, now + view.ttl_ms))
            elif now >= due[1]:
                view.sweep(ctx)
                sweeps.update(due, (side, now + view.ttl_ms))

    def flush(self, ctx: OperatorContext) -> None:
        """Write the net change of each row the batch path held and changed
        in the micro-batch so far: one batch write per kind and side
        (:meth:`~operators.join._batch.HeldSide.flush`). Once per
        micro-batch, not per input batch: its input batches share the rows
        held, so a row written by several of them is written once. With
        ``whole_micro_batch``, the micro-batch's input is joined first."""
        runs = self._micro_batch.pop(id(ctx), None)
        if runs:
            self._flush_held(ctx)
            if join_whole(ctx, self.views, runs, self._names, self.held_rows):
                # It wrote the tables behind the rows held: let them go.
                self._held[id(ctx)] = {}
            else:
                for side, batch in runs:  # a row the rules must take one by one
                    self._process_batch(ctx, batch, side)
        self._flush_held(ctx)

    def _flush_held(self, ctx: OperatorContext) -> None:
        for held in self._held.get(id(ctx), {}).values():
            held.flush(ctx)

    def close(self, ctx: OperatorContext) -> None:
        """Write what is still held and report each side's state rows. The
        runner has flushed just before, so this writes nothing there; it
        keeps a wrapper that forwards ``close`` but not ``flush`` (one
        written before the hook existed) from losing the held rows."""
        self.flush(ctx)
        self._held.pop(id(ctx), None)
        for view in self.views:
            ctx.metrics[side_metric(view.name, TOTAL)] = ctx.table(view.name).row_count

    # -- one batch -------------------------------------------------------------------------

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Join ``batch`` (of input ``side``): kept for the micro-batch's end
        with ``whole_micro_batch`` (:meth:`flush`), else on the batch path."""
        if self.whole_micro_batch:
            self._micro_batch.setdefault(id(ctx), []).append((side, batch))
        else:
            self._process_batch(ctx, batch, side)

    def _process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """The batch path (:mod:`operators.join._batch`): read every row the
        batch may touch and is not held yet at once, apply the emit rules to
        each input row in order over the rows held (as steps over the whole
        batch where :mod:`operators.join._bulk` can); the net changes are
        written at the end of the micro-batch (:meth:`flush`). A side with a
        TTL expires rows as it reads them, and goes record at a time."""
        if any(v.ttl_ms is not None for v in self.views):
            super().process_batch(ctx, batch, side)
            return
        names = self.inputs[side].names
        columns = [batch.column(n).to_pylist() for n in names]
        rows: list[Row] = list(zip(*columns, strict=True))
        own, theirs = self._held_side(ctx, side), self._held_side(ctx, 1 - side)
        keys = list(map(self._join_key[side], rows))
        if not (own.complete and theirs.complete):  # else every row is held
            self._load(ctx, batch, rows, keys, own, theirs)
        kinds = row_kinds(batch)
        null_keys = not self.null_safe and any(
            batch.column(n).null_count for n in self.spec.keys[side]
        )
        states = (own, theirs) if side == LEFT else (theirs, own)

        def by_rule(i: int) -> None:
            self._rows(ctx, states, rows[i : i + 1], keys[i : i + 1], kinds[i : i + 1], side)

        if (
            self._in_bulk
            and not null_keys
            and JoinRun(ctx, own, theirs, side, self._nulls, by_rule).apply(rows, keys, kinds)
        ):
            return
        self._rows(ctx, states, rows, keys, kinds, side)
        # The tables are written at the end of the micro-batch (flush).

    def _load(
        self,
        ctx: OperatorContext,
        batch: pa.RecordBatch,
        rows: list[Row],
        keys: list[Row],
        own: HeldSide,
        theirs: HeldSide,
    ) -> None:
        """Read the rows of each side that ``batch`` (its ``rows``, their
        join ``keys``) may touch and are not held yet."""
        join_keys = set(keys)
        if not self.null_safe:
            join_keys = {k for k in join_keys if None not in k}
        # Many keys for the table's rows: one read of the whole table beats
        # a point read or a bounded scan per key.
        if own.read_whole(len(rows)):
            own.load_all(ctx)
        else:
            own.load_identities(rows, batch)
        if theirs.read_whole(len(join_keys)):
            theirs.load_all(ctx)
        elif theirs.one_per_join_key:
            theirs.load_join_key_rows(join_keys)
        else:
            theirs.load_join_keys(join_keys)

    def _held_side(self, ctx: OperatorContext, side: int) -> HeldSide:
        """The rows of ``side``'s table this batch run holds, while nothing
        else has written the table since."""
        view = self.views[side]
        held = self._held.setdefault(id(ctx), {})
        rows = held.get(view.name)
        if rows is None or not rows.current:
            rows = held[view.name] = HeldSide(view, ctx.table(view.name), self.held_rows)
        return rows

    # -- one row ---------------------------------------------------------------------------

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        left, right = self.views
        self._rows(ctx, (left, right), (row,), (self._join_key[side](row),), (kind,), side)

    def _rows(
        self,
        ctx: OperatorContext,
        states: tuple[SideRows[H], SideRows[H]],
        rows: Sequence[Row],
        keys: Sequence[Row],
        kinds: Sequence[RowKind],
        side: int,
    ) -> None:
        """The emit rules for input rows ``rows`` of ``side`` (``keys``:
        their join keys, ``kinds``: their row kinds), one after another,
        over each side's rows in ``states`` (its view record at a time, its
        held rows on the batch path). An upsert is :meth:`_replace`; any
        other row is accumulated or retracted here: padded or unpadded on an
        outer side, each match gained or lost, the row stored or removed.
        (One loop over a run of rows, not a call per row: what each row
        looks up on the sides and the join is looked up once, a cost per
        input row on the batch path.)"""
        view, other = states[side], states[1 - side]
        find, records, add, retract = view.find, other.records, view.add, view.retract
        outer, other_outer = view.outer, other.outer
        upserts = view.has_unique_key
        # Each match counts once per appearance: one, with a unique key.
        counted = None if other.has_unique_key else other.appearances
        null_safe, condition = self.null_safe, self.condition
        pad = self._nulls[1 - side]
        emit = ctx.emit
        gain, lose = self._gain, self._lose
        pairs = self._pairs
        unknown, unknown_metric = ctx.retracted_unknown, side_metric(view.name, UNKNOWN_RETRACTIONS)
        for row, key, kind in zip(rows, keys, kinds, strict=True):
            found = find(ctx, row, key)
            candidates: Sequence[H] = () if not null_safe and None in key else records(ctx, key)
            accumulate = kind is INS or kind is UPA  # kind.is_accumulate, inline
            if accumulate and found is not None and upserts:
                self._replace(ctx, states, side, row, kind, found, candidates)
                continue
            if not accumulate:
                if found is None:
                    # Unknown: the stage's policy says whether to apply it (Flink).
                    if not unknown(side, row, key, 1, unknown_metric):
                        continue
                else:  # with a unique key, retract what is stored under it
                    row = view.row(found)
            matches = (
                candidates if condition is None else self._matches(other, side, row, candidates)
            )
            padded = INS if accumulate else DEL
            joined = padded if outer or other_outer else kind
            if outer and not matches:
                emit(row + pad if side == LEFT else pad + row, padded)
            if other_outer:
                gain_or_lose = gain if accumulate else lose
                for m in matches:
                    gain_or_lose(ctx, other, side, row, m, joined)
            elif matches:
                pairs(ctx, other, side, row, matches, joined)
            if accumulate:
                gained = len(matches) if counted is None else sum(map(counted, matches))
                add(ctx, row, found, gained)
            elif found is not None:
                retract(ctx, found)

    def _matches(
        self, other: SideRows[H], side: int, row: Row, candidates: Sequence[H]
    ) -> Sequence[H]:
        condition = self.condition
        if condition is None:
            return candidates
        row_of = other.row
        if side == LEFT:
            return [m for m in candidates if condition(row, row_of(m))]
        return [m for m in candidates if condition(row_of(m), row)]

    def _gain(
        self, ctx: OperatorContext, other: SideRows[H], side: int, row: Row, m: H, kind: RowKind
    ) -> None:
        """``row`` newly matches ``m`` (a row of ``other``): per appearance of
        ``m``, retract its padded row if it had no association, emit the
        pair; count it."""
        if not other.outer:
            self._pairs(ctx, other, side, row, (m,), kind)
            return
        emit = ctx.emit
        m_row = other.row(m)
        pair = row + m_row if side == LEFT else m_row + row
        associations = other.associations(m)
        if associations == 0:
            padded = m_row + self._nulls[1] if side == RIGHT else self._nulls[0] + m_row
            for _ in range(other.appearances(m)):
                emit(padded, DEL)
                emit(pair, kind)
        else:
            for _ in range(other.appearances(m)):
                emit(pair, kind)
        other.set_associations(ctx, m, associations + 1)

    def _lose(
        self, ctx: OperatorContext, other: SideRows[H], side: int, row: Row, m: H, kind: RowKind
    ) -> None:
        """``row`` no longer matches ``m`` (a row of ``other``): per
        appearance of ``m``, retract the pair and pad ``m`` if that was its
        last association; count it. An outer ``m`` with no association has
        no pair to retract: only a row that was never stored (or expired)
        can meet it here."""
        if not other.outer:
            self._pairs(ctx, other, side, row, (m,), kind)
            return
        associations = other.associations(m)
        if associations <= 0:
            return
        emit = ctx.emit
        m_row = other.row(m)
        pair = row + m_row if side == LEFT else m_row + row
        if associations == 1:
            padded = m_row + self._nulls[1] if side == RIGHT else self._nulls[0] + m_row
            for _ in range(other.appearances(m)):
                emit(pair, kind)
                emit(padded, INS)
        else:
            for _ in range(other.appearances(m)):
                emit(pair, kind)
        other.set_associations(ctx, m, associations - 1)

    @staticmethod
    def _pairs(
        ctx: OperatorContext,
        other: SideRows[H],
        side: int,
        row: Row,
        matches: Sequence[H],
        kind: RowKind,
    ) -> None:
        """``row`` gains or loses ``matches`` of an inner side ``other``:
        either way the pair with each, once per appearance of the match.
        One call for all of a row's matches: a call per match counts on the
        batch path."""
        emit, row_of, appearances = ctx.emit, other.row, other.appearances
        for m in matches:
            m_row = row_of(m)
            pair = row + m_row if side == LEFT else m_row + row
            n = appearances(m)
            if n == 1:
                emit(pair, kind)
            else:
                for _ in range(n):
                    emit(pair, kind)

    def _replace(
        self,
        ctx: OperatorContext,
        states: tuple[SideRows[H], SideRows[H]],
        side: int,
        row: Row,
        kind: RowKind,
        found: H,
        candidates: Sequence[H],
    ) -> None:
        """An upsert: ``row`` replaces ``found``, the stored row with its unique
        key. A match of both is not an additional association."""
        view, other = states[side], states[1 - side]
        old = view.row(found)
        new_matches = set(self._matches(other, side, row, candidates))
        old_matches = set(self._matches(other, side, old, candidates))
        outer = view.outer or other.outer
        pad = self._nulls[1 - side]
        if view.outer and new_matches and not old_matches:
            ctx.emit(old + pad if side == LEFT else pad + old, DEL)
        associations = 0
        for m in candidates:
            is_new, was_old = m in new_matches, m in old_matches
            if is_new:
                associations += other.appearances(m)
            if is_new and was_old:
                m_row = other.row(m)
                pair = row + m_row if side == LEFT else m_row + row
                for _ in range(other.appearances(m)):
                    ctx.emit(pair, INS if outer else kind)
            elif is_new:
                self._gain(ctx, other, side, row, m, INS if outer else kind)
            elif was_old:
                self._lose(ctx, other, side, old, m, DEL)
        if view.outer and not new_matches:
            ctx.emit(row + pad if side == LEFT else pad + row, INS)
        view.add(ctx, row, found, associations)
