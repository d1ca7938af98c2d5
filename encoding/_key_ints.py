"""Key columns stored as integers: the integer types, date32 and timestamp.

Value bytes are the integer plus ``2**(bits-1)`` (signed) as unsigned
big-endian, so that byte order is numeric order. Dates and timestamps are their
date32 and int64 integers, with their Python forms converted on the way.
"""

from __future__ import annotations

import datetime as dt
import importlib
import numbers
import operator
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from encoding._batch import Bytes2D, Mask, fixed_array, fixed_values
from encoding._conversions import (
    DAY_BOUNDS,
    EPOCH,
    EPOCH_UTC,
    UNIT_STEPS,
    arrow_tzinfo,
    count_bounds,
    date_of,
    days_of,
)
from encoding._key_column import Decoder, Encoder, FixedColumn
from encoding._schema import KeyColumn
from encoding.errors import DecodingError, EncodingError

__all__ = ["DateColumn", "IntColumn", "TimestampColumn"]

_DAY = dt.timedelta(days=1)
_MICROSECOND = UNIT_STEPS["us"]


class IntColumn(FixedColumn):
    """Integers, and the types stored as integers (date32, timestamp).

    Value bytes are the integer plus ``2**(bits-1)`` (signed) as unsigned
    big-endian: the sign bit flipped. Descending stores ``~`` of that.
    """

    expected = "an int"
    fast_type: type = int

    def __init__(
        self, table: str, key: KeyColumn, field: pa.Field, bits: int, signed: bool
    ) -> None:
        super().__init__(table, key, field)
        self.width = bits // 8
        self.fmt = {8: "B", 16: "H", 32: "I", 64: "Q"}[bits]
        mask = (1 << bits) - 1
        bias = 1 << (bits - 1) if signed else 0
        # Encoded unsigned value: base + sign * value.
        self.base, self.sign = (mask - bias, -1) if self.desc else (bias, 1)
        self.xor = bias ^ mask if self.desc else bias
        self.lo, self.hi = -bias, mask - bias
        self.storage = np.dtype(f"<{'i' if signed else 'u'}{self.width}")
        self.unsigned = np.dtype(f"<u{self.width}")
        self.checks_range = False

    def out_of_range(self, value: Any) -> EncodingError:
        """The error for a value outside ``lo..hi``."""
        return self.mismatch(f"{self.expected} in {self.lo}..{self.hi}", value)

    def to_int(self, value: Any) -> int:
        """The stored integer of any accepted non-null value, range-checked."""
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            number = operator.index(value)
            if self.lo <= number <= self.hi:
                return number
            raise self.out_of_range(value)
        raise self.mismatch(self.expected, value)

    def fast_convert(self) -> Callable[[Any], int] | None:
        """Conversion of a value of exactly ``fast_type``; ``None``: it is the int."""
        return None

    def from_int(self) -> Callable[[int], Any] | None:
        """Conversion of a decoded integer to the Python value; ``None``: the int."""
        return None

    def encoder(self, head: bytes) -> Encoder:
        pack = struct.Struct(f">{len(head)}sB{self.fmt}").pack
        present, base, sign = self.present, self.base, self.sign
        fast_type, convert, to_int = self.fast_type, self.fast_convert(), self.to_int

        def slow(value: Any) -> bytes:
            if value is None:
                return self.null_bytes(head)
            return pack(head, present, base + sign * to_int(value))

        if convert is None:

            def encode(value: Any) -> bytes:
                if type(value) is int:
                    try:
                        return pack(head, present, base + sign * value)
                    except struct.error:
                        pass
                return slow(value)

        else:
            fast = convert

            def encode(value: Any) -> bytes:
                if type(value) is fast_type:
                    try:
                        return pack(head, present, base + sign * fast(value))
                    except (struct.error, TypeError, OverflowError):
                        pass
                return slow(value)

        return encode

    def decoder(self) -> Decoder:
        unpack = struct.Struct(f">B{self.fmt}").unpack_from
        size, present, base, sign = 1 + self.width, self.present, self.base, self.sign
        null = self.null if self.nullable else -1
        convert = self.from_int()

        def absent(marker: int, unsigned: int) -> None:
            if marker != null or unsigned != 0:
                raise self.corrupt(f"bad null marker {marker} or padding")

        if convert is None:

            def decode(data: bytes, pos: int) -> tuple[Any, int]:
                marker, unsigned = unpack(data, pos)
                if marker == present:
                    return (unsigned - base) * sign, pos + size
                absent(marker, unsigned)
                return None, pos + size

        else:
            to_value = convert

            def decode(data: bytes, pos: int) -> tuple[Any, int]:
                marker, unsigned = unpack(data, pos)
                if marker == present:
                    return to_value((unsigned - base) * sign), pos + size
                absent(marker, unsigned)
                return None, pos + size

        return decode

    def check_range(self, values: npt.NDArray[Any], valid: Mask | None) -> None:
        """Raise if a present value is outside ``lo..hi``."""
        if not self.checks_range or values.size == 0:
            return
        outside = (values < self.lo) | (values > self.hi)
        if valid is not None:
            outside &= valid
        if outside.any():
            raise self.out_of_range(values[outside][0].item())

    def value_bytes(self, arr: pa.Array, valid: Mask | None) -> Bytes2D:
        values = fixed_values(arr, self.storage.str)
        self.check_range(values, valid)
        encoded = values.view(self.unsigned) ^ self.unsigned.type(self.xor)
        big: Bytes2D = encoded.astype(self.unsigned.newbyteorder(">")).view(np.uint8)
        return big.reshape(len(arr), self.width)

    def array_from(self, values: Bytes2D, valid: Mask) -> pa.Array:
        big = values.view(self.unsigned.newbyteorder(">")).ravel()
        stored = (big.astype(self.unsigned) ^ self.unsigned.type(self.xor)).view(self.storage)
        stored[~valid] = 0
        self.check_decoded_range(stored, valid)
        return fixed_array(self.dtype, stored, valid)

    def check_decoded_range(self, values: npt.NDArray[Any], valid: Mask) -> None:
        """Raise :class:`DecodingError` if a present value is outside ``lo..hi``."""
        try:
            self.check_range(values, valid)
        except EncodingError as exc:
            raise self.corrupt(f"stored value out of range ({exc})") from None


class DateColumn(IntColumn):
    """date32: days since 1970-01-01 as int32, limited to ``datetime.date``'s range."""

    expected = "a datetime.date or an int (days since 1970-01-01)"
    fast_type = dt.date

    def __init__(self, table: str, key: KeyColumn, field: pa.Field) -> None:
        super().__init__(table, key, field, 32, True)
        self.lo, self.hi = DAY_BOUNDS
        self.checks_range = True

    def to_int(self, value: Any) -> int:
        if isinstance(value, dt.datetime):
            raise self.mismatch(self.expected, value)
        if isinstance(value, dt.date):
            return days_of(value)
        return super().to_int(value)

    def fast_convert(self) -> Callable[[Any], int]:
        return days_of

    def from_int(self) -> Callable[[int], Any]:
        return date_of


#: Per timestamp unit: the timedelta step and the multiple of it that is one unit.
_TIMESTAMP_STEPS = {
    **{unit: (step, 1) for unit, step in UNIT_STEPS.items()},
    "ns": (_MICROSECOND, 1000),
}
_NANOS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


class TimestampColumn(IntColumn):
    """timestamp: the int64 count of the column's unit since the epoch (UTC).

    The time zone of the type does not change the instant, so it does not change
    the bytes. Values are limited to those ``to_pylist`` can return: the range
    of ``datetime`` (a day less at each end for a type with a time zone, so the
    conversion to it cannot overflow), and not pandas' NaT for ``ns``.
    """

    fast_type = dt.datetime

    def __init__(self, table: str, key: KeyColumn, field: pa.Field) -> None:
        super().__init__(table, key, field, 64, True)
        unit, tz = field.type.unit, field.type.tz
        self.unit = unit
        self.aware = tz is not None
        self.tzinfo = arrow_tzinfo(field.type)
        self.epoch = EPOCH_UTC if self.aware else EPOCH
        self.step, self.multiple = _TIMESTAMP_STEPS[unit]
        kind = "an aware" if self.aware else "a naive"
        self.expected = f"{kind} datetime.datetime or an int (count of {unit})"
        margin = _DAY if self.aware else dt.timedelta(0)
        if unit == "ns":
            # All of int64 but pandas' NaT (-2**63), less the margin.
            day = 86_400 * 10**9 if self.aware else 0
            self.lo, self.hi = -(2**63) + max(day, 1), 2**63 - 1 - day
        else:
            self.lo, self.hi = count_bounds(self.step, margin)
        self.checks_range = True

    def to_int(self, value: Any) -> int:
        if isinstance(value, dt.datetime):
            if (value.utcoffset() is not None) is not self.aware:
                raise self.mismatch(self.expected, value)
            # A subclass (pandas.Timestamp) may not subtract like a datetime, and
            # may carry nanoseconds.
            plain = dt.datetime(
                value.year, value.month, value.day, value.hour, value.minute,
                value.second, value.microsecond, value.tzinfo, fold=value.fold,
            )  # fmt: skip
            micros = (plain - self.epoch) // _MICROSECOND
            nanos = micros * 1000 + int(getattr(value, "nanosecond", 0))
            count, rest = divmod(nanos, _NANOS_PER_UNIT[self.unit])
            if rest:
                raise self.mismatch(f"a datetime with no precision finer than {self.unit}", value)
            if not self.lo <= count <= self.hi:
                raise self.out_of_range(value)
            return count
        if isinstance(value, dt.date):
            raise self.mismatch(self.expected, value)
        return super().to_int(value)

    def fast_convert(self) -> Callable[[Any], int]:
        epoch, step, multiple, lo, hi = self.epoch, self.step, self.multiple, self.lo, self.hi
        naive = not self.aware
        to_int = self.to_int

        def convert(value: dt.datetime) -> int:
            if (value.tzinfo is None) is naive:
                count, rest = divmod(value - epoch, step)
                count *= multiple
                if not rest and lo <= count <= hi:
                    return count
            return to_int(value)

        return convert

    def from_int(self) -> Callable[[int], Any]:
        tzinfo, step = self.tzinfo, self.step
        if self.unit == "ns":
            return self._nanos_from_int()
        if tzinfo is None:

            def naive(count: int) -> dt.datetime:
                return EPOCH + count * step

            return naive

        def aware(count: int) -> dt.datetime:
            return (EPOCH_UTC + count * step).astimezone(tzinfo)

        return aware

    def _nanos_from_int(self) -> Callable[[int], Any]:
        """What pyarrow's ``to_pylist`` gives for ns: pandas.Timestamp if it can."""
        tzinfo = self.tzinfo
        try:
            timestamp = importlib.import_module("pandas").Timestamp
        except ImportError:

            def micros(count: int) -> dt.datetime:
                if count % 1000:
                    raise DecodingError(
                        f"{self.where}: {count} ns is not a whole microsecond; "
                        "install pandas to decode nanosecond timestamps"
                    )
                value = EPOCH + (count // 1000) * _MICROSECOND
                if tzinfo is None:
                    return value
                return value.replace(tzinfo=dt.UTC).astimezone(tzinfo)

            return micros

        def nanos(count: int) -> Any:
            return timestamp(count, tz=tzinfo, unit="ns")

        return nanos
