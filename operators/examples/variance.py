"""A custom aggregate for :class:`~operators.aggregate.GroupAggregate`:
the population variance of a numeric column, ``var_pop`` in SQL.

Its accumulator is three numbers (the count of non-null values, their sum
and their sum of squares), so a retraction takes a value back out exactly as
an accumulation put it in, and the group's result row stays small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from operators.aggregate import AggregateFunction

__all__ = ["Variance"]


class Variance(AggregateFunction):
    """``var_pop(column)``: null for a group without a non-null value."""

    def state_fields(self, input_type: pa.DataType) -> Sequence[pa.Field]:
        """The count, sum and sum of squares of the non-null values."""
        return [
            pa.field("n", pa.int64(), nullable=False),
            pa.field("sum", pa.float64(), nullable=False),
            pa.field("squares", pa.float64(), nullable=False),
        ]

    def result_type(self, input_type: pa.DataType) -> pa.DataType:
        """A double, as Spark's ``var_pop``."""
        return pa.float64()

    def init(self) -> tuple[Any, ...]:
        """No values yet."""
        return (0, 0.0, 0.0)

    def accumulate(self, acc: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
        """Add a value; a null changes nothing."""
        if value is None:
            return acc
        n, total, squares = acc
        return (n + 1, total + value, squares + value * value)

    def retract(self, acc: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
        """Take a value back out; a null changes nothing."""
        if value is None:
            return acc
        n, total, squares = acc
        if n == 1:
            return self.init()  # no rounding left behind
        return (n - 1, total - value, squares - value * value)

    def result(self, acc: tuple[Any, ...]) -> Any:
        """``E[x²] - E[x]²``, never below zero."""
        n, total, squares = acc
        if not n:
            return None
        mean = total / n
        return max(squares / n - mean * mean, 0.0)
