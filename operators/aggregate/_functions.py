"""What a :class:`~operators.aggregate.GroupAggregate` computes: the built-in
aggregates (SQL's ``count``, ``sum``, ``avg``, ``min``, ``max``,
``count(distinct)``) and the interface of a custom one.

A built-in aggregate is worked a whole batch at a time in Arrow; a custom one
is called per row with its accumulator, which lives in the group's result row.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from encoding.errors import SchemaError

__all__ = ["Aggregate", "AggregateFunction", "Kind"]


class AggregateFunction(abc.ABC):
    """A custom aggregate: an accumulator that rows are added to and taken
    back out of, and the result it gives.

    The accumulator is a tuple of values, one per field of
    :meth:`state_fields`; it is stored in the group's result row, so it must
    stay small (a count, a sum, not the rows). Rows whose input value is null
    are passed as ``None``: skip them, as SQL's aggregates do, or count them.
    The object is pickled to Spark's Python workers, so it holds
    configuration only.
    """

    @abc.abstractmethod
    def state_fields(self, input_type: pa.DataType) -> Sequence[pa.Field]:
        """The accumulator's fields (names local to this aggregate)."""

    @abc.abstractmethod
    def result_type(self, input_type: pa.DataType) -> pa.DataType:
        """The type of :meth:`result`."""

    @abc.abstractmethod
    def init(self) -> tuple[Any, ...]:
        """The accumulator of a group without rows."""

    @abc.abstractmethod
    def accumulate(self, acc: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
        """The accumulator with one more row of input ``value``."""

    @abc.abstractmethod
    def retract(self, acc: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
        """The accumulator with one row of input ``value`` taken back out
        (a row that was accumulated before)."""

    @abc.abstractmethod
    def result(self, acc: tuple[Any, ...]) -> Any:
        """The aggregate's value for the accumulator."""


class Kind(enum.Enum):
    """Which aggregate an :class:`Aggregate` is."""

    COUNT_STAR = "count(*)"
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    COUNT_DISTINCT = "count(distinct)"
    CUSTOM = "custom"


@dataclass(frozen=True)
class Aggregate:
    """One output column of a group aggregate: an aggregate of an input
    column (none for ``count(*)``) under an output name. Build it with the
    class methods, ``Aggregate.sum("amount", "revenue")`` say."""

    kind: Kind
    column: str | None
    name: str
    function: AggregateFunction | None = None

    @classmethod
    def _of(cls, kind: Kind, column: str, name: str | None) -> Aggregate:
        """The built-in ``kind`` of ``column``, named ``name`` or by default
        ``<kind>_<column>`` (``sum_amount``, ``count_distinct_customer``)."""
        return cls(kind, column, name or f"{kind.name.lower()}_{column}")

    @classmethod
    def count(cls, column: str | None = None, name: str | None = None) -> Aggregate:
        """``count(*)`` (no column) or ``count(column)``: rows, or rows whose
        ``column`` is not null."""
        if column is None:
            return cls(Kind.COUNT_STAR, None, name or "count")
        return cls._of(Kind.COUNT, column, name)

    @classmethod
    def sum(cls, column: str, name: str | None = None) -> Aggregate:
        """``sum(column)``: null for a group without a non-null value."""
        return cls._of(Kind.SUM, column, name)

    @classmethod
    def avg(cls, column: str, name: str | None = None) -> Aggregate:
        """``avg(column)`` as a double: null without a non-null value."""
        return cls._of(Kind.AVG, column, name)

    @classmethod
    def min(cls, column: str, name: str | None = None) -> Aggregate:
        """``min(column)``, nulls left out."""
        return cls._of(Kind.MIN, column, name)

    @classmethod
    def max(cls, column: str, name: str | None = None) -> Aggregate:
        """``max(column)``, nulls left out."""
        return cls._of(Kind.MAX, column, name)

    @classmethod
    def count_distinct(cls, column: str, name: str | None = None) -> Aggregate:
        """``count(distinct column)``: distinct non-null values."""
        return cls._of(Kind.COUNT_DISTINCT, column, name)

    @classmethod
    def custom(cls, function: AggregateFunction, column: str, name: str) -> Aggregate:
        """A custom aggregate of ``column``."""
        return cls(Kind.CUSTOM, column, name, function)

    def result_type(self, input_type: pa.DataType | None) -> pa.DataType:
        """The output column's type, Spark's: counts are ``bigint``, a sum of
        integers ``bigint`` and of floats ``double``, an average ``double``,
        min and max the input's type."""
        if self.kind in (Kind.COUNT_STAR, Kind.COUNT, Kind.COUNT_DISTINCT):
            return pa.int64()
        assert input_type is not None
        if self.kind is Kind.CUSTOM:
            assert self.function is not None
            return self.function.result_type(input_type)
        if self.kind in (Kind.MIN, Kind.MAX):
            return input_type
        if not (pa.types.is_integer(input_type) or pa.types.is_floating(input_type)):
            raise SchemaError(
                f"{self.kind.value}({self.column}) needs an integer or float column; "
                f"{self.column!r} is {input_type}"
            )
        if self.kind is Kind.AVG or pa.types.is_floating(input_type):
            return pa.float64()
        return pa.int64()
