"""Example operators written on the public operator API (the tutorial's
subject, in docs/custom-operators.md)."""

from operators.examples.running_aggregate import RunningAggregate
from operators.examples.sessions import Sessions

__all__ = ["RunningAggregate", "Sessions"]
