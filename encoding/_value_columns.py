"""How each column of a row is checked, stored and loaded in a value.

A :class:`ColumnPlan` holds, for one column, the check that turns a Python value
into its stored form (or raises :class:`EncodingError`), the struct code of
that form and the load that turns it back. The row and cell layouts build their
encoders and decoders from these plans. Every value begins with
:data:`FORMAT_VERSION`; ``docs/encoding.md`` describes the formats.
"""

from __future__ import annotations

import datetime as dt
import decimal
import reprlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from encoding._conversions import (
    DAY_BOUNDS,
    EPOCH,
    EPOCH_ORDINAL,
    EPOCH_UTC,
    UNIT_STEPS,
    arrow_tzinfo,
    count_bounds,
    date_of,
    decimal_unscaler,
    exact_context,
    is_int,
)
from encoding.errors import EncodingError

__all__ = [
    "FORMAT_VERSION",
    "MAX_VAR_LEN",
    "NAN",
    "VERSION",
    "ColumnPlan",
    "Row",
    "column_plan",
    "kind_of",
    "value_repr",
]

#: The first byte of every value; bump it when a format changes.
FORMAT_VERSION = 1

VERSION = bytes([FORMAT_VERSION])
MAX_VAR_LEN = 0xFFFF_FFFF
NAN = float("nan")
_UTC_NAMES = frozenset(
    {
        "UTC",
        "Etc/UTC",
        "Etc/UCT",
        "UCT",
        "Etc/Universal",
        "Universal",
        "Etc/Zulu",
        "Zulu",
        "GMT",
        "Etc/GMT",
        "Etc/GMT0",
        "GMT0",
        "Etc/Greenwich",
        "Greenwich",
    }
)
_INT_CODES = {8: "b", 16: "h", 32: "i", 64: "q"}

#: Values in error messages: short, whatever their size.
value_repr = reprlib.Repr()
value_repr.maxstring = value_repr.maxother = 60

#: A row as the codecs take and give it: its values in the schema's column order.
Row = tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class ColumnPlan:
    """How one column is checked, stored and loaded."""

    index: int
    name: str
    type: pa.DataType
    nullable: bool
    kind: str  # int, float, bool, str, bin, date, ts, dec or null
    code: str  # struct code of the stored field; "" for var-width and null columns
    zero: Any  # stored in place of a null
    check: Callable[[Any], Any]  # a non-None value -> its stored form, or EncodingError
    load: Callable[[Any], Any] | None  # stored form -> Python value; None: as stored
    np_type: str = ""  # numpy type of the stored field, for the batch paths
    bounds: tuple[int, int] | None = None  # stored range of date and timestamp columns

    def describe(self) -> str:
        return f"column {self.name!r} ({self.type})"


def column_plan(index: int, field: pa.Field) -> ColumnPlan:
    """The plan for column ``index``."""
    t = field.type
    name = field.name

    def fail(expected: str, value: Any) -> EncodingError:
        return EncodingError(
            f"column {name!r} ({t}): expected {expected}, got "
            f"{value_repr.repr(value)} ({type(value).__name__})"
        )

    def plan(kind: str, code: str, zero: Any, check: Callable[[Any], Any], **kw: Any) -> ColumnPlan:
        return ColumnPlan(index, name, t, field.nullable, kind, code, zero, check, **kw)

    if pa.types.is_integer(t):
        signed = pa.types.is_signed_integer(t)
        bits = t.bit_width
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        want = f"an integer in {lo}..{hi}"

        def check_int(v: Any) -> int:
            if v.__class__ is not int:
                if not is_int(v):
                    raise fail(want, v)
                v = int(v)
            if not lo <= v <= hi:
                raise fail(want, v)
            return int(v)

        code = _INT_CODES[bits] if signed else _INT_CODES[bits].upper()
        np_type = f"<{'i' if signed else 'u'}{bits // 8}"
        return plan("int", code, 0, check_int, load=None, np_type=np_type)

    if pa.types.is_floating(t):
        single = pa.types.is_float32(t)

        def check_float(v: Any) -> float:
            if not (is_int(v) or isinstance(v, (float, np.floating))):
                raise fail("a float", v)
            v = float(v)
            if v != v:
                return NAN
            if single:
                try:
                    struct.pack("<f", v)
                except OverflowError:
                    raise fail("a float within float32 range", v) from None
            return float(v)

        code, np_type = ("f", "<f4") if single else ("d", "<f8")
        return plan("float", code, 0.0, check_float, load=None, np_type=np_type)

    if pa.types.is_boolean(t):

        def check_bool(v: Any) -> bool:
            if v is True or v is False or isinstance(v, np.bool_):
                return bool(v)
            raise fail("a bool", v)

        return plan("bool", "?", False, check_bool, load=None, np_type="u1")

    if pa.types.is_string(t) or pa.types.is_large_string(t):

        def check_str(v: Any) -> bytes:
            if not isinstance(v, str):
                raise fail("a str", v)
            try:
                data = v.encode()
            except UnicodeEncodeError:
                raise fail("a str that UTF-8 can encode", v) from None
            if len(data) > MAX_VAR_LEN:
                raise fail(f"at most {MAX_VAR_LEN} bytes of UTF-8", v)
            return data

        return plan("str", "", b"", check_str, load=bytes.decode)

    if pa.types.is_binary(t) or pa.types.is_large_binary(t):

        def check_bin(v: Any) -> bytes:
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise fail("bytes", v)
            if len(v) > MAX_VAR_LEN:
                raise fail(f"at most {MAX_VAR_LEN} bytes", v)
            return bytes(v)

        return plan("bin", "", b"", check_bin, load=None)

    if pa.types.is_date32(t):
        lo, hi = DAY_BOUNDS

        def check_date(v: Any) -> int:
            if v.__class__ is dt.date or (
                isinstance(v, dt.date) and not isinstance(v, dt.datetime)
            ):
                return v.toordinal() - EPOCH_ORDINAL
            if is_int(v) and lo <= v <= hi:
                return int(v)
            raise fail(f"a datetime.date or a day count in {lo}..{hi}", v)

        return plan("date", "i", 0, check_date, load=date_of, np_type="<i4", bounds=(lo, hi))

    if pa.types.is_timestamp(t):
        return _timestamp_column(plan, fail, t)

    if pa.types.is_decimal(t):
        return _decimal_column(plan, fail, t)

    if pa.types.is_null(t):

        def check_null(v: Any) -> None:
            raise fail("None (the column has type null)", v)

        return plan("null", "", None, check_null, load=None)

    raise EncodingError(f"column {name!r} has type {t}, which relstate cannot encode")


def _timestamp_column(
    plan: Callable[..., ColumnPlan], fail: Callable[[str, Any], EncodingError], t: pa.DataType
) -> ColumnPlan:
    unit: str = t.unit
    load: Callable[[int], Any]
    if unit == "ns":
        # Only pyarrow knows the Python form of nanoseconds (pandas.Timestamp when
        # pandas is installed); ns state need not be fast.
        lo, hi = -(1 << 63), (1 << 63) - 1
        step = UNIT_STEPS["us"]

        def load_ns(count: int) -> Any:
            return pa.scalar(count, t).as_py()

        load = load_ns
    else:
        step = UNIT_STEPS[unit]
        lo, hi = count_bounds(step)
        tz = arrow_tzinfo(t)
        if tz is None:
            load = _epoch_plus(EPOCH, unit)
        elif isinstance(tz, dt.timezone) or str(tz) in _UTC_NAMES:
            # A fixed offset: wall-clock arithmetic from the epoch in that zone is exact.
            load = _epoch_plus(EPOCH_UTC.astimezone(tz), unit)
        else:
            naive = _epoch_plus(EPOCH, unit)
            fromutc = tz.fromutc

            def load_zoned(count: int) -> dt.datetime:
                return fromutc(naive(count).replace(tzinfo=tz))

            load = load_zoned
    want = f"a datetime.datetime or a count of {unit} in {lo}..{hi}"
    fraction = f"a datetime.datetime with no fraction of a {unit}"

    def check_ts(v: Any) -> int:
        if not isinstance(v, dt.datetime):
            if is_int(v) and lo <= v <= hi:
                return int(v)
            raise fail(want, v)
        if v.tzinfo is None:
            delta = v - EPOCH
        elif v.utcoffset() is None:
            delta = v.replace(tzinfo=None) - EPOCH
        else:
            delta = v - EPOCH_UTC
        if unit == "us":
            return delta // step
        if unit == "ns":
            return delta // step * 1000 + getattr(v, "nanosecond", 0)
        count, rest = divmod(delta, step)
        if rest:
            raise fail(fraction, v)
        return count

    return plan("ts", "q", 0, check_ts, load=load, np_type="<i8", bounds=(lo, hi))


def _epoch_plus(epoch: dt.datetime, unit: str) -> Callable[[int], dt.datetime]:
    """``count -> epoch + count units``."""
    # Positional timedelta arguments, the fastest: (days, seconds, microseconds, milliseconds).
    if unit == "s":
        return lambda n: epoch + dt.timedelta(0, n)
    if unit == "ms":
        return lambda n: epoch + dt.timedelta(0, 0, 0, n)
    return lambda n: epoch + dt.timedelta(0, 0, n)


def _decimal_column(
    plan: Callable[..., ColumnPlan], fail: Callable[[str, Any], EncodingError], t: pa.DataType
) -> ColumnPlan:
    precision: int = t.precision
    scale: int = t.scale
    limit = 10**precision
    # Up to 18 digits the unscaled value fits an int64 (Spark's compact decimals
    # are the same); wider ones take Arrow's 16 bytes.
    narrow = precision <= 18
    exact = exact_context(precision)
    want = f"a decimal.Decimal or int with at most {precision} digits, {scale} after the point"
    check_dec = decimal_unscaler(precision, scale, lambda v: fail(want, v), as_bytes=not narrow)

    def load_dec(unscaled: int) -> decimal.Decimal:
        if not -limit < unscaled < limit:
            raise ValueError(f"unscaled value {unscaled} exceeds precision {precision}")
        return decimal.Decimal(unscaled).scaleb(-scale, exact)

    if narrow:
        return plan("dec", "q", 0, check_dec, load=load_dec, np_type="<i8")

    def load_wide(raw: bytes) -> decimal.Decimal:
        return load_dec(int.from_bytes(raw, "little", signed=True))

    return plan("dec", "16s", bytes(16), check_dec, load=load_wide, np_type="V16")


def kind_of(t: pa.DataType) -> str:
    """The kind (int, float, ..., null) of Arrow type ``t``; EncodingError when
    relstate cannot encode it."""
    return column_plan(0, pa.field("x", t)).kind
