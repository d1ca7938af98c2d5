"""Streaming joins of two inputs. Append mode (Spark's stream-stream join):
:class:`AppendJoin`; see docs/operators/join-append.md."""

from operators.join._append import AppendJoin, JoinCondition
from operators.join._append_time import TimeRange, TimeWindows

__all__ = ["AppendJoin", "JoinCondition", "TimeRange", "TimeWindows"]
