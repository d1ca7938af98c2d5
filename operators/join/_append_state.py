"""The state of one side of an append-mode join: its rows, keyed time first,
so that eviction below the state watermark is one range delete and the rows
a batch can meet are one range scan over the times it reaches.

``rows``: ``time | join key | seq`` -> ``(time, seq, *input row, matched)``

``time`` is the event time (a range join) or the window start (a window
join), in microseconds; ``seq`` tells apart rows with equal key and time.

``floors``: ``side`` -> ``floor``, no stored time of the side below it. An
eviction's range delete (and its count of the rows it removes) starts there,
not at the table's start, where RocksDB would step over the deleted keys of
every earlier eviction. Without a floor a side is never evicted, so a
repartition gives every new partition the least old floor (a lower bound
still).
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
    """The table of one side: a ``rows`` row is ``(time, seq, *input row,
    matched)``, keyed ``(time, *join key, seq)``."""

    rows: TableSchema
    #: Positions of the join key columns in an input row.
    key_positions: tuple[int, ...]


def side_state(side: int, schema: pa.Schema, keys: Sequence[str]) -> SideState:
    """The table of ``side`` (id 1 for the left, 3 for the right) for an
    input ``schema`` joined on ``keys``."""
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
    return SideState(
        rows=TableSchema(
            1 + 2 * side,
            rows,
            [_TIME, *keys, _SEQ],
            name=f"{name}_rows",
            # The time leads the key; the query's key is the join key.
            partition_by=tuple(keys),
        ),
        key_positions=tuple(schema.names.index(k) for k in keys),
    )
