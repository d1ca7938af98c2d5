"""Example operators written on the public operator API (the tutorial's
subject, in docs/custom-operators.md), and a custom aggregate (docs/operators/aggregate.md)."""

from operators.examples.running_aggregate import RunningAggregate
from operators.examples.sessions import Sessions
from operators.examples.variance import Variance

__all__ = ["RunningAggregate", "Sessions", "Variance"]
