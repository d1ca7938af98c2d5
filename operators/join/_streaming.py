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

docs/operators/join.md has the examples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from encoding import PartitionLocal, TableSchema
from operators._changelog import RowKind, row_kinds
from operators._operator import Operator, OperatorContext
from operators.join._batch import BatchContext, BatchTable, read_whole
from operators.join._metrics import TOTAL, UNKNOWN_RETRACTIONS, side_metric
from operators.join._spec import LEFT, RIGHT, JoinSpec, JoinType, output_schema, side_name
from operators.join._views import JoinStateView, Record, ViewKind
from statestore import ConsistencyMode

__all__ = ["StreamingJoin"]

Row = tuple[Any, ...]
Condition = Callable[[Row, Row], bool]

INS, DEL = RowKind.INSERT, RowKind.DELETE

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
    TTL boundary, :mod:`operators._ttl`). ``left_prefix`` /
    ``right_prefix`` rename the output columns.
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
    ) -> None:
        self.spec = JoinSpec.of(join_type, left, right, left_keys, right_keys)
        self.name = name
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
        self._nulls = tuple((None,) * len(s) for s in self.spec.inputs)
        # The rows each batch run in progress (by context) holds: see
        # operators/join/_batch.py.
        self._held: dict[int, dict[str, BatchTable]] = {}
        tables = [v.table for v in self.views]
        self.tables = [*tables, _SWEEPS] if any(t is not None for t in ttls) else tables

    @property
    def join_type(self) -> JoinType:
        """The join's type."""
        return self.spec.join_type

    # -- batch hooks -----------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        """Sweep each side with a TTL whose sweep is due (once per TTL)."""
        self._held[id(ctx)] = {}
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

    def close(self, ctx: OperatorContext) -> None:
        """Report each side's state rows."""
        self._held.pop(id(ctx), None)
        for view in self.views:
            ctx.metrics[side_metric(view.name, TOTAL)] = ctx.table(view.name).row_count

    # -- one batch -------------------------------------------------------------------------

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """The batch path (:mod:`operators.join._batch`): read every row the
        batch may touch at once, apply :meth:`process_row` to each input row
        in order over them, write the net changes at once. A side with a TTL
        expires rows as it reads them, and goes record at a time."""
        if any(v.ttl_ms is not None for v in self.views):
            super().process_batch(ctx, batch, side)
            return
        view, other = self.views[side], self.views[1 - side]
        names = self.inputs[side].names
        columns = [batch.column(n).to_pylist() for n in names]
        rows: list[Row] = list(zip(*columns, strict=True))
        own, theirs = self._held_table(ctx, view), self._held_table(ctx, other)
        join_keys = {view.join_key(row) for row in rows}
        if not self.null_safe:
            join_keys = {k for k in join_keys if None not in k}
        # Many keys for the table's rows: one read of the whole table beats
        # a point read or a bounded scan per key.
        if read_whole(len(rows), own.table):
            own.load_all()
        else:
            own.load_rows(view.identity(row) for row in rows)
        if read_whole(len(join_keys), theirs.table):
            theirs.load_all()
        elif other.kind is ViewKind.JOIN_KEY_CONTAINS_UNIQUE_KEY:
            theirs.load_rows(join_keys)
        else:
            theirs.load_prefixes(join_keys)
        batch_ctx = BatchContext(ctx, {view.name: own, other.name: theirs})
        for kind, row in zip(row_kinds(batch), rows, strict=True):
            self.process_row(batch_ctx, row, kind, side)
        own.flush()
        theirs.flush()

    def _held_table(self, ctx: OperatorContext, view: JoinStateView) -> BatchTable:
        """The rows of ``view``'s table this batch run holds, while nothing
        else has written the table since."""
        held = self._held.setdefault(id(ctx), {})
        table = held.get(view.name)
        if table is None or not table.current:
            table = held[view.name] = BatchTable(ctx.table(view.name), len(view.join_key_indices))
        return table

    # -- one row ---------------------------------------------------------------------------

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        view, other = self.views[side], self.views[1 - side]
        found = view.find(ctx, row)
        key = view.join_key(row)
        if not self.null_safe and None in key:
            candidates: list[Record] = []
        else:
            candidates = other.records(ctx, key)
        if kind.is_accumulate and found is not None and view.has_unique_key:
            self._replace(ctx, side, row, kind, found, candidates)
            return
        if kind.is_retract:
            if found is None:
                ctx.count(side_metric(view.name, UNKNOWN_RETRACTIONS))
            else:  # with a unique key, retract what is stored under it
                row = found.row
        self._apply(ctx, side, row, kind, found, candidates)

    def _matches(self, side: int, row: Row, candidates: list[Record]) -> list[Record]:
        condition = self.condition
        if condition is None:
            return candidates
        if side == LEFT:
            return [m for m in candidates if condition(row, m.row)]
        return [m for m in candidates if condition(m.row, row)]

    def _emit(self, ctx: OperatorContext, side: int, row: Row, other: Row, kind: RowKind) -> None:
        ctx.emit(row + other if side == LEFT else other + row, kind)

    def _apply(
        self,
        ctx: OperatorContext,
        side: int,
        row: Row,
        kind: RowKind,
        found: Record | None,
        candidates: list[Record],
    ) -> None:
        """Accumulate or retract ``row`` (not an upsert): pad or unpad it on
        an outer side, gain or lose each match, store or remove it."""
        view, other = self.views[side], self.views[1 - side]
        matches = self._matches(side, row, candidates)
        accumulate = kind.is_accumulate
        padded = INS if accumulate else DEL
        joined = padded if view.outer or other.outer else kind
        if view.outer and not matches:
            self._emit(ctx, side, row, self._nulls[1 - side], padded)
        change = self._gain if accumulate else self._lose
        for m in matches:
            change(ctx, side, row, m, joined)
        if accumulate:
            view.add(ctx, row, found, sum(m.appearances for m in matches))
        elif found is not None:
            view.retract(ctx, found)

    def _gain(self, ctx: OperatorContext, side: int, row: Row, m: Record, kind: RowKind) -> None:
        """``row`` newly matches ``m``: per appearance of ``m``, retract its
        padded row if it had no association, emit the pair; count it."""
        other = self.views[1 - side]
        for _ in range(m.appearances):
            if other.outer and m.associations == 0:
                self._emit(ctx, 1 - side, m.row, self._nulls[side], DEL)
            self._emit(ctx, side, row, m.row, kind)
        if other.outer:
            other.set_associations(ctx, m, m.associations + 1)

    def _lose(self, ctx: OperatorContext, side: int, row: Row, m: Record, kind: RowKind) -> None:
        """``row`` no longer matches ``m``: per appearance of ``m``, retract the
        pair and pad ``m`` if that was its last association; count it. An
        outer ``m`` with no association has no pair to retract: only a row
        that was never stored (or expired) can meet it here."""
        other = self.views[1 - side]
        if other.outer and m.associations <= 0:
            return
        for _ in range(m.appearances):
            self._emit(ctx, side, row, m.row, kind)
            if other.outer and m.associations == 1:
                self._emit(ctx, 1 - side, m.row, self._nulls[side], INS)
        if other.outer:
            other.set_associations(ctx, m, m.associations - 1)

    def _replace(
        self,
        ctx: OperatorContext,
        side: int,
        row: Row,
        kind: RowKind,
        found: Record,
        candidates: list[Record],
    ) -> None:
        """An upsert: ``row`` replaces ``found``, the stored row with its unique
        key. A match of both is not an additional association."""
        view, other = self.views[side], self.views[1 - side]
        old = found.row
        new_matches = {id(m) for m in self._matches(side, row, candidates)}
        old_matches = {id(m) for m in self._matches(side, old, candidates)}
        outer = view.outer or other.outer
        if view.outer and new_matches and not old_matches:
            self._emit(ctx, side, old, self._nulls[1 - side], DEL)
        associations = 0
        for m in candidates:
            is_new, was_old = id(m) in new_matches, id(m) in old_matches
            if is_new:
                associations += m.appearances
            if is_new and was_old:
                for _ in range(m.appearances):
                    self._emit(ctx, side, row, m.row, INS if outer else kind)
            elif is_new:
                self._gain(ctx, side, row, m, INS if outer else kind)
            elif was_old:
                self._lose(ctx, side, old, m, DEL)
        if view.outer and not new_matches:
            self._emit(ctx, side, row, self._nulls[1 - side], INS)
        view.add(ctx, row, found, associations)
