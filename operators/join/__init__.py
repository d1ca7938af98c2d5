"""Streaming joins of two inputs: changelog mode with retractions
(:class:`StreamingJoin`, Flink's semantics); see docs/operators/join.md."""

from operators.join._spec import JoinType
from operators.join._streaming import StreamingJoin
from operators.join._views import ViewKind

__all__ = [
    "JoinType",
    "StreamingJoin",
    "ViewKind",
]
