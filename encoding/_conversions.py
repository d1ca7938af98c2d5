"""Dates, timestamps and decimals as the integers Arrow stores for them.

A date32 is days since 1970-01-01, a timestamp a count of its unit since the
epoch and a decimal its unscaled integer, in keys and in values alike. What the
two codecs share of those conversions and ranges lives here; each codec keeps
its own rules for which Python values it takes and how it says no.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from encoding.errors import EncodingError

__all__ = [
    "DAY_BOUNDS",
    "EPOCH",
    "EPOCH_ORDINAL",
    "EPOCH_UTC",
    "UNIT_STEPS",
    "arrow_tzinfo",
    "count_bounds",
    "date_of",
    "days_of",
    "decimal_unscaler",
    "exact_context",
    "is_int",
]

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_UTC = EPOCH.replace(tzinfo=dt.UTC)
EPOCH_ORDINAL = EPOCH.toordinal()
#: The day counts of ``datetime.date.min`` and ``datetime.date.max``.
DAY_BOUNDS = (
    dt.date.min.toordinal() - EPOCH_ORDINAL,
    dt.date.max.toordinal() - EPOCH_ORDINAL,
)
#: One unit of a timestamp type as a timedelta; ``ns`` is finer than timedelta.
UNIT_STEPS = {
    "s": dt.timedelta(seconds=1),
    "ms": dt.timedelta(milliseconds=1),
    "us": dt.timedelta(microseconds=1),
}
_NO_MARGIN = dt.timedelta(0)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an int or a numpy integer (a bool is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def days_of(date: dt.date) -> int:
    """The date32 of ``date``: days since 1970-01-01."""
    return date.toordinal() - EPOCH_ORDINAL


def date_of(days: int) -> dt.date:
    """The date of a date32 day count."""
    return dt.date.fromordinal(days + EPOCH_ORDINAL)


def count_bounds(step: dt.timedelta, margin: dt.timedelta = _NO_MARGIN) -> tuple[int, int]:
    """The least and greatest count of ``step`` since the epoch that stays
    ``margin`` inside the range of ``datetime``."""
    return (dt.datetime.min + margin - EPOCH) // step, (dt.datetime.max - margin - EPOCH) // step


def arrow_tzinfo(dtype: pa.DataType) -> dt.tzinfo | None:
    """The tzinfo of the datetimes ``to_pylist`` gives for timestamp type
    ``dtype``; None when the type has no time zone."""
    if dtype.tz is None:
        return None
    tzinfo: dt.tzinfo = pa.scalar(0, dtype).as_py().tzinfo
    return tzinfo


def exact_context(precision: int) -> decimal.Context:
    """A context under which ``scaleb()`` raises rather than drop a nonzero
    digit of a ``precision``-digit decimal."""
    return decimal.Context(prec=precision, traps=[decimal.Inexact, decimal.Overflow])


def decimal_unscaler(
    precision: int, scale: int, fail: Callable[[Any], EncodingError], *, as_bytes: bool = False
) -> Callable[[Any], Any]:
    """``value -> its unscaled integer`` for decimal128(``precision``, ``scale``).

    ``value`` is a Decimal or an integer (:func:`is_int`). It must fit the type
    exactly: no digit is dropped to make it fit. Anything else raises
    ``fail(value)``, with ``value`` as a Decimal once it is one. ``as_bytes``:
    the integer as Arrow stores it, 16 bytes of little-endian two's complement.
    """
    limit = 10**precision
    exact = exact_context(precision)

    def unscaled(v: Any) -> Any:
        if v.__class__ is not decimal.Decimal:
            if is_int(v):
                v = decimal.Decimal(int(v))
            elif not isinstance(v, decimal.Decimal):
                raise fail(v)
        # A value whose integer part has more digits than the type holds is
        # refused before scaling: int() of 1E+1000000 takes tens of seconds.
        if v.is_finite() and v and v.adjusted() >= precision - scale:
            raise fail(v)
        try:
            scaled = v.scaleb(scale, exact)
            number = int(scaled)
        except (decimal.DecimalException, ValueError, OverflowError):  # also NaN, Infinity
            raise fail(v) from None
        if scaled != number or not -limit < number < limit:
            raise fail(v)
        return number.to_bytes(16, "little", signed=True) if as_bytes else number

    return unscaled
