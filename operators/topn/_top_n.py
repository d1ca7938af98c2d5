"""``ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) <= N`` over a changelog:
the top N rows per partition key, with an offset and WITH TIES, and a
changelog of the top-N set out.

State is one table of every row, keyed ``(partition, order columns..., row
identity)`` with a multiplicity, so a partition's top is the first rows of
one prefix scan and, when a row of the top is retracted, the row that moves
up is the next one of the same scan (RisingWave's managed top-N state; the
table is the truth, nothing is cached across batches).

A batch is folded per partition: its rows are applied, and the top before
and after are compared; rows that left the top go out as ``-D``, rows that
entered as ``+I`` (RisingWave's TopN, Flink's retract rank without the rank
number). A partition whose changed rows all sort after a full top is not
read again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pyarrow as pa

from encoding import KeyColumn, PartitionLocal, Row, TableSchema
from operators._api.changelog import RowKind
from operators._api.operator import Operator, OperatorContext
from operators._api.relational import (
    Pending,
    add_counts,
    check_names,
    key_tuples,
    net_changes,
    report_unheld,
    signs,
)
from operators.errors import InputError
from operators.topn._whole_batch import top_n_batch
from statestore import ConsistencyMode, StateTable

__all__ = ["TopN"]


_COUNT = "__n"


class TopN(Operator):
    """The top ``limit`` rows per ``partition_by`` key by ``order_by``.

    ``order_by`` holds column names (ascending, nulls first) or
    :class:`~encoding.KeyColumn` objects with a direction and null order.
    ``offset`` skips that many rows first (``ROW_NUMBER() > offset``);
    ``with_ties`` also keeps the rows that tie with the last one (as SQL's
    ``FETCH FIRST n ROWS WITH TIES``: ``RANK() <= n`` without offset). Rows
    that tie on every order column are ranked by the row identity,
    ascending: ``row_key`` (columns that identify a row) or by default all
    other columns, identical rows counted. ``partition_by`` is what the
    query is partitioned by (:attr:`key_columns`); without it there is one
    top for the whole input, so run it as a keyless stage (``keys=()``),
    which has one partition.

    Input is a changelog (or an append stream); the output has the input's
    schema and is the changelog of the top-N set: ``+I`` for a row that
    enters it, ``-D`` for one that leaves.
    """

    consistency = ConsistencyMode.UNCHECKED

    def __init__(
        self,
        schema: pa.Schema,
        order_by: Sequence[str | KeyColumn],
        limit: int,
        partition_by: Sequence[str] = (),
        offset: int = 0,
        with_ties: bool = False,
        row_key: Sequence[str] | None = None,
        name: str = "top_n",
    ) -> None:
        order = [o if isinstance(o, KeyColumn) else KeyColumn(o) for o in order_by]
        if not order:
            raise InputError("name at least one order_by column")
        if not isinstance(limit, int) or limit < 1:
            raise InputError(f"limit is a positive integer, got {limit!r}")
        if not isinstance(offset, int) or offset < 0:
            raise InputError(f"offset is a non-negative integer, got {offset!r}")
        order_names = [o.name for o in order]
        check_names(schema, [*partition_by, *order_names], "partition_by and order_by")
        if row_key is not None:
            check_names(schema, row_key, "row_key")
        self.name = name
        self.key_columns = tuple(partition_by)
        self.partition_keys = (self.key_columns,)
        self.order_by = order
        self.limit = limit
        self.offset = offset
        self.with_ties = with_ties
        self.inputs = [schema]
        self.output = schema
        self._pending = Pending()
        taken = {*partition_by, *order_names}
        rest = [n for n in schema.names if n not in taken]
        identity = rest if row_key is None else [n for n in row_key if n not in taken]
        values = [n for n in rest if n not in identity]
        stored = [*partition_by, *order_names, *identity, *values]
        self._p = len(partition_by)
        self._o = len(order)
        self._pk = self._p + self._o + len(identity)
        self._stored = stored
        # Without ties kept, and with every column in the key, a batch's
        # change of its tops is worked in Arrow (``_whole_batch``).
        self._whole_batch = not with_ties and not values
        #: Where each input column sits in a stored row.
        self._to_input = [stored.index(n) for n in schema.names]
        self.tables = [
            TableSchema(
                1,
                [*(schema.field(n) for n in stored), pa.field(_COUNT, pa.int64(), nullable=False)],
                [*partition_by, *order, *identity],
                name="rows",
                # A global top lives on one partition: its rows cannot move.
                partition_by=None if partition_by else PartitionLocal(),
            )
        ]

    def open(self, ctx: OperatorContext) -> None:
        """A micro-batch begins: nothing gathered yet."""
        self._pending.start(ctx)

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Check a chunk of the micro-batch's rows and gather it: the batch
        is folded as a whole at :meth:`close`."""
        signs(batch, self.name, True)  # bad row kinds fail here
        self._pending.add(ctx, batch)

    def close(self, ctx: OperatorContext) -> None:
        """Fold the micro-batch per row and partition, apply it, and emit
        each touched partition's change of its top."""
        batch = self._pending.take(ctx)
        if batch is None:
            return
        net = net_changes([batch.column(n) for n in self._stored], signs(batch, self.name, True))
        rows = net.select(range(len(self._stored))).rename_columns(self._stored)
        deltas = net.column("__s_sum")
        table = ctx.table("rows")
        if self._whole_batch:
            top_n_batch(ctx, table, rows, deltas, self._p, self.offset, self.limit, self._to_input)
            return
        # Each net row's index, by partition (in order of first appearance).
        changed: dict[Row, list[int]] = {}
        for i, partition in enumerate(key_tuples(rows.columns[: self._p], rows.num_rows)):
            changed.setdefault(partition, []).append(i)
        # The tops before the batch, of the partitions whose changes can reach them.
        before: dict[Row, list[Row]] = {}
        cut = self._p + self._o if self.with_ties else self._pk
        keys: list[Row] = []  # each net row's key up to ``cut``, once needed
        for partition, at in changed.items():
            top, boundary = self._top(table, partition)
            if boundary is not None:
                keys = keys or key_tuples(rows.columns[:cut], rows.num_rows)
                if all(table.keys.encode(keys[i]) > boundary for i in at):
                    continue  # every change sorts past a full top: it cannot change
            before[partition] = top
        report_unheld(ctx, rows, add_counts(table, rows, deltas)[1], self._p)
        left: list[Row] = []
        entered: list[Row] = []
        for partition, top in before.items():
            old, new = Counter(top), Counter(self._top(table, partition)[0])
            left.extend((old - new).elements())
            entered.extend((new - old).elements())
        for kind, out in ((RowKind.DELETE, left), (RowKind.INSERT, entered)):
            if out:
                columns = list(zip(*out, strict=True))
                ctx.emit_batch(
                    [
                        pa.array(list(columns[i]), f.type)
                        for i, f in zip(self._to_input, self.output, strict=True)
                    ],
                    kind,
                )

    def _top(self, table: StateTable, partition: Row) -> tuple[list[Row], bytes | None]:
        """The rows of ``partition``'s top (each identical row once per copy),
        and, if the top is full, the key bytes past which a change cannot
        reach it (``None`` when it is not full)."""
        want = self.offset + self.limit
        top: list[Row] = []
        rank = 0
        last: Row | None = None
        last_order: Row | None = None
        for stored in table.scan(partition):
            order = stored[self._p : self._p + self._o]
            if rank >= want and not (self.with_ties and _same(order, last_order)):
                break
            row = stored[:-1]
            for _ in range(stored[-1]):
                if rank >= want and not (self.with_ties and _same(order, last_order)):
                    break
                if rank >= self.offset:
                    top.append(row)
                rank += 1
                if rank == want:
                    last_order = order
            last = row
        if rank < want or last is None:
            return top, None
        if self.with_ties:
            return top, table.keys.encode(last[: self._p + self._o])
        return top, table.keys.encode(last[: self._pk])


def _same(a: Row | None, b: Row | None) -> bool:
    """Equal order values, a NaN equal to a NaN."""
    if a is None or b is None:
        return False
    return all(x == y or (x != x and y != y) for x, y in zip(a, b, strict=True))
