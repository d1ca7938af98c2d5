"""The state of one side of an append-mode join: its rows, keyed join key
first so that one prefix scan over a time sub-range finds every match, and an
index by time so that eviction is a range scan below the state watermark.

``rows``:  ``join key | time | seq`` -> ``(time, seq, *input row, matched)``
``index``: ``time | join key | seq`` -> nothing

``time`` is the event time (a range join) or the window start (a window
join), in microseconds; ``seq`` tells apart rows with equal key and time.

``floors``: ``side`` -> ``floor``, no stored time of the side below it. An
eviction scans the index from there, not from the table's start, where
RocksDB would step over the tombstones of every earlier eviction. Without a
floor a side is never evicted, so a repartition gives every new partition the
least old floor (a lower bound still).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from encoding import PartitionLocal, TableSchema
from operators.errors import InputError

__all__ = ["FLOORS", "SIDE_NAMES", "SideState", "side_state"]

#: The word for each side in table names and metrics.
SIDE_NAMES = ("left", "right")

_TIME = "__t"
_SEQ = "__seq"
_MATCHED = "__matched"

#: The least stored time per side (see the module docstring).
FLOORS = TableSchema(
    5,
    pa.schema(
        [
            pa.field("side", pa.int8(), nullable=False),
            pa.field("floor", pa.int64(), nullable=False),
        ]
    ),
    ["side"],
    name="floors",
    # A lower bound: the least of the old partitions' floors bounds every
    # new partition's rows.
    partition_by=PartitionLocal(least="floor"),
    auxiliary=True,
)


@dataclass(frozen=True)
class SideState:
    """The two tables of one side. A ``rows`` row is ``(time, seq, *input
    row, matched)``; an ``index`` row is ``(time, *join key, seq)``, the
    primary key of the ``rows`` row it names, column for column."""

    rows: TableSchema
    index: TableSchema
    #: Positions of the join key columns in an input row.
    key_positions: tuple[int, ...]


def side_state(side: int, schema: pa.Schema, keys: Sequence[str]) -> SideState:
    """The tables of ``side`` (ids 1, 2 for the left, 3, 4 for the right) for
    an input ``schema`` joined on ``keys``."""
    name = SIDE_NAMES[side]
    reserved = [n for n in schema.names if n.startswith("__")]
    if reserved:
        raise InputError(
            f"the {name} input has column(s) {reserved}; names starting with '__' are the "
            "join's own state columns, so rename them"
        )
    time = pa.field(_TIME, pa.int64(), nullable=False)
    seq = pa.field(_SEQ, pa.int64(), nullable=False)
    rows = pa.schema([time, seq, *schema, pa.field(_MATCHED, pa.bool_(), nullable=False)])
    index = pa.schema([time, *(schema.field(k) for k in keys), seq])
    return SideState(
        rows=TableSchema(1 + 2 * side, rows, [*keys, _TIME, _SEQ], name=f"{name}_rows"),
        index=TableSchema(
            2 + 2 * side,
            index,
            index.names,
            name=f"{name}_index",
            partition_by=tuple(keys),
            auxiliary=True,
        ),
        key_positions=tuple(schema.names.index(k) for k in keys),
    )
