"""Streaming joins of two inputs.

Changelog mode with retractions, :class:`StreamingJoin` (Flink's semantics),
and append mode, :class:`AppendJoin` (Spark's stream-stream join, a drop-in
for it); docs/operators/join.md says which to choose.
"""

from operators.join._append import AppendJoin, JoinCondition
from operators.join._append_time import TimeRange, TimeWindows
from operators.join._batch import HELD_ROWS
from operators.join._spec import JoinType
from operators.join._streaming import StreamingJoin
from operators.join._views import ViewKind

__all__ = [
    "HELD_ROWS",
    "AppendJoin",
    "JoinCondition",
    "JoinType",
    "StreamingJoin",
    "TimeRange",
    "TimeWindows",
    "ViewKind",
]
