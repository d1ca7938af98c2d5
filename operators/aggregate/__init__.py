"""Group aggregation over a changelog or an append stream: SQL's ``count``,
``sum``, ``avg``, ``min``, ``max``, ``count(distinct)`` and custom aggregates,
with an upsert changelog out. docs/operators/aggregate.md has the rules."""

from operators.aggregate._functions import Aggregate, AggregateFunction
from operators.aggregate._group_aggregate import GroupAggregate

__all__ = ["Aggregate", "AggregateFunction", "GroupAggregate"]
