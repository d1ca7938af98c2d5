"""Order-preserving (memcomparable) encoding of primary keys.

A key is ``table_id (u32, big-endian) | column_1 | column_2 | ...``. Each column's
bytes compare, byte by byte, in the order of its values under that column's
direction and null order, and no column's bytes are a prefix of another value's
bytes of the same column. So plain byte order of whole keys is the order of the
key tuples, and the encoding of a key's first ``i`` values is a byte prefix of the
encoding of the whole key. ``docs/encoding.md`` gives the layout of each type.
"""

from __future__ import annotations

import datetime as dt
import decimal
import importlib
import numbers
import operator
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from encoding._schema import Direction, KeyColumn, NullOrder, TableSchema
from encoding.errors import DecodingError, EncodingError

__all__ = ["KeyCodec", "prefix_successor"]

Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes, int], tuple[Any, int]]
Bytes2D = npt.NDArray[np.uint8]
Positions = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

_INVERT = bytes(range(255, -1, -1))
_Z = b"\x00"
_ZE = b"\x00\xff"
_END = b"\x00\x01"
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = _EPOCH.replace(tzinfo=dt.UTC)
_EPOCH_ORDINAL = _EPOCH.toordinal()
_DAY = dt.timedelta(days=1)
_MICROSECOND = dt.timedelta(microseconds=1)
_DECIMAL_CONTEXT = decimal.Context(prec=40)
_LARGE_EMPTY = pa.scalar(b"", pa.large_binary())


def prefix_successor(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string that starts with ``prefix``.

    ``None`` when there is none: ``prefix`` is empty or all ``0xFF``.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _validity(arr: pa.Array) -> Mask | None:
    """The validity of ``arr`` as a bool array, ``None`` when it has no nulls."""
    if arr.null_count == 0:
        return None
    mask: Mask = arr.is_valid().to_numpy(zero_copy_only=False)
    return mask


def _values(arr: pa.Array, dtype: str) -> npt.NDArray[Any]:
    """The fixed-width data buffer of ``arr`` as numpy values (no copy)."""
    n, offset = len(arr), arr.offset
    values: npt.NDArray[Any] = np.frombuffer(arr.buffers()[1], dtype=dtype, count=offset + n)[
        offset:
    ]
    return values


def _validity_buffer(valid: Mask) -> tuple[pa.Buffer | None, int]:
    """An Arrow validity bitmap for ``valid`` and its null count."""
    null_count = int(valid.size - np.count_nonzero(valid))
    if null_count == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), null_count


def _binary_rows(matrix: Bytes2D) -> pa.Array:
    """The rows of a byte matrix as a large_binary array (no per-row Python)."""
    n, width = matrix.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
    data = np.ascontiguousarray(matrix)
    return pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


class _Column:
    """The codec of one key column: scalar encoder and decoder, array forms.

    Subclasses implement one type family. ``width`` is the number of value
    bytes of a fixed-width column, ``None`` for strings and binary.
    """

    width: int | None = None

    def __init__(self, table: str, key: KeyColumn, field: pa.Field) -> None:
        self.name = key.name
        self.dtype = field.type
        self.nullable = bool(field.nullable)
        self.desc = key.direction is Direction.DESC
        # The null marker is never inverted: nulls FIRST/LAST hold in both directions.
        first = key.null_order is NullOrder.FIRST
        self.present, self.null = (1, 0) if first else (0, 1)
        self.where = f"key column {key.name!r} ({field.type}) of table {table!r}"

    # -- errors ---------------------------------------------------------------

    def mismatch(self, expected: str, value: Any) -> EncodingError:
        """The error for a value that does not fit the column."""
        return EncodingError(
            f"{self.where} expects {expected}, got {value!r} ({type(value).__name__})"
        )

    def null_error(self) -> EncodingError:
        """The error for a None in a non-nullable column."""
        return EncodingError(
            f"{self.where} is not nullable, got None; give it a value or make the field nullable"
        )

    def corrupt(self, what: str) -> DecodingError:
        """The error for stored bytes this column cannot have written."""
        return DecodingError(f"{self.where}: {what}")

    def null_bytes(self, head: bytes) -> bytes:
        """``head`` plus the encoding of a null, or raise if nulls are not allowed."""
        if not self.nullable:
            raise self.null_error()
        return head + bytes([self.null]) + bytes(self.width or 0)

    def check_nulls(self, arr: pa.Array) -> Mask | None:
        """The validity of a batch column; raise if it has nulls it may not."""
        valid = _validity(arr)
        if valid is not None and not self.nullable:
            raise EncodingError(
                f"{self.where} is not nullable, but the batch column has {arr.null_count} nulls"
            )
        return valid

    # -- to implement -----------------------------------------------------------

    def encoder(self, head: bytes) -> Encoder:
        """A function from one value to ``head`` plus the value's key bytes."""
        raise NotImplementedError

    def decoder(self) -> Decoder:
        """A function from (key bytes, position) to (value, position after it)."""
        raise NotImplementedError

    def encode_array(self, arr: pa.Array) -> Bytes2D | pa.Array:
        """Key bytes of every row: an (n, 1 + width) matrix, or a binary array."""
        raise NotImplementedError

    def decode_array(
        self, data: Bytes2D, pos: Positions, ends: Positions
    ) -> tuple[pa.Array, Positions]:
        """Decode this column of many keys laid end to end in ``data``.

        ``pos`` is where the column starts in each key, ``ends`` where each key
        ends; returns the column and where the next one starts.
        """
        raise NotImplementedError


class _FixedColumn(_Column):
    """A column whose present values all take ``width`` bytes.

    A null is the null marker followed by ``width`` zero bytes, so that every
    row of a batch has the same width and a batch is one numpy matrix.
    """

    width: int = 0

    def markers(self, valid: Mask | None, n: int) -> Bytes2D:
        """An (n, 1 + width) matrix with the markers set and the values to fill."""
        matrix = np.zeros((n, 1 + self.width), dtype=np.uint8)
        matrix[:, 0] = self.present
        if valid is not None:
            matrix[~valid, 0] = self.null
        return matrix

    def encode_array(self, arr: pa.Array) -> Bytes2D:
        valid = self.check_nulls(arr)
        matrix = self.markers(valid, len(arr))
        if self.width:
            matrix[:, 1:] = self.value_bytes(arr, valid)
            if valid is not None:
                matrix[~valid, 1:] = 0
        return matrix

    def value_bytes(self, arr: pa.Array, valid: Mask | None) -> Bytes2D:
        """The (n, width) value bytes of every row (anything in null rows)."""
        raise NotImplementedError

    def decode_array(
        self, data: Bytes2D, pos: Positions, ends: Positions
    ) -> tuple[pa.Array, Positions]:
        size = 1 + self.width
        if (pos + size > ends).any():
            raise self.corrupt("key is truncated")
        markers = data[pos]
        valid = markers == self.present
        if not valid.all() and (not self.nullable or not ((markers == self.null) | valid).all()):
            raise self.corrupt("bad null marker")
        values = data[(pos + 1)[:, None] + np.arange(self.width)]
        if values[~valid].any():
            raise self.corrupt("a null has non-zero padding")
        return self.array_from(values, valid), pos + size

    def array_from(self, values: Bytes2D, valid: Mask) -> pa.Array:
        """The Arrow column from the (n, width) value bytes and the validity."""
        raise NotImplementedError


class _IntColumn(_FixedColumn):
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
        values = _values(arr, self.storage.str)
        self.check_range(values, valid)
        encoded = values.view(self.unsigned) ^ self.unsigned.type(self.xor)
        big: Bytes2D = encoded.astype(self.unsigned.newbyteorder(">")).view(np.uint8)
        return big.reshape(len(arr), self.width)

    def array_from(self, values: Bytes2D, valid: Mask) -> pa.Array:
        big = values.view(self.unsigned.newbyteorder(">")).ravel()
        stored = (big.astype(self.unsigned) ^ self.unsigned.type(self.xor)).view(self.storage)
        stored[~valid] = 0
        self.check_decoded_range(stored, valid)
        validity, null_count = _validity_buffer(valid)
        return pa.Array.from_buffers(
            self.dtype, len(valid), [validity, pa.py_buffer(stored)], null_count
        )

    def check_decoded_range(self, values: npt.NDArray[Any], valid: Mask) -> None:
        """Raise :class:`DecodingError` if a present value is outside ``lo..hi``."""
        try:
            self.check_range(values, valid)
        except EncodingError as exc:
            raise self.corrupt(f"stored value out of range ({exc})") from None


class _DateColumn(_IntColumn):
    """date32: days since 1970-01-01 as int32, limited to ``datetime.date``'s range."""

    expected = "a datetime.date or an int (days since 1970-01-01)"
    fast_type = dt.date

    def __init__(self, table: str, key: KeyColumn, field: pa.Field) -> None:
        super().__init__(table, key, field, 32, True)
        self.lo = dt.date.min.toordinal() - _EPOCH_ORDINAL
        self.hi = dt.date.max.toordinal() - _EPOCH_ORDINAL
        self.checks_range = True

    def to_int(self, value: Any) -> int:
        if isinstance(value, dt.datetime):
            raise self.mismatch(self.expected, value)
        if isinstance(value, dt.date):
            return value.toordinal() - _EPOCH_ORDINAL
        return super().to_int(value)

    def fast_convert(self) -> Callable[[Any], int]:
        def convert(value: dt.date) -> int:
            return value.toordinal() - _EPOCH_ORDINAL

        return convert

    def from_int(self) -> Callable[[int], Any]:
        def convert(days: int) -> dt.date:
            return dt.date.fromordinal(days + _EPOCH_ORDINAL)

        return convert


#: Per timestamp unit: the timedelta step and the multiple of it that is one unit.
_TIMESTAMP_STEPS = {
    "s": (dt.timedelta(seconds=1), 1),
    "ms": (dt.timedelta(milliseconds=1), 1),
    "us": (_MICROSECOND, 1),
    "ns": (_MICROSECOND, 1000),
}
_NANOS_PER_UNIT = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


class _TimestampColumn(_IntColumn):
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
        self.tzinfo = pa.scalar(0, field.type).as_py().tzinfo if self.aware else None
        self.epoch = _EPOCH_UTC if self.aware else _EPOCH
        self.step, self.multiple = _TIMESTAMP_STEPS[unit]
        kind = "an aware" if self.aware else "a naive"
        self.expected = f"{kind} datetime.datetime or an int (count of {unit})"
        margin = _DAY if self.aware else dt.timedelta(0)
        if unit == "ns":
            # All of int64 but pandas' NaT (-2**63), less the margin.
            day = 86_400 * 10**9 if self.aware else 0
            self.lo, self.hi = -(2**63) + max(day, 1), 2**63 - 1 - day
        else:
            self.lo = (dt.datetime.min + margin - _EPOCH) // self.step
            self.hi = (dt.datetime.max - margin - _EPOCH) // self.step
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
                return _EPOCH + count * step

            return naive

        def aware(count: int) -> dt.datetime:
            return (_EPOCH_UTC + count * step).astimezone(tzinfo)

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
                value = _EPOCH + (count // 1000) * _MICROSECOND
                if tzinfo is None:
                    return value
                return value.replace(tzinfo=dt.UTC).astimezone(tzinfo)

            return micros

        def nanos(count: int) -> Any:
            return timestamp(count, tz=tzinfo, unit="ns")

        return nanos


class _FloatColumn(_FixedColumn):
    """float32/64: IEEE bits with -0.0 as 0.0 and one NaN, above +inf.

    A positive value gets its sign bit set, a negative one all its bits
    inverted, so that unsigned big-endian order is numeric order.
    """

    def __init__(self, table: str, key: KeyColumn, field: pa.Field, bits: int) -> None:
        super().__init__(table, key, field)
        self.width = bits // 8
        self.fmt, self.float_fmt = ("I", "f") if bits == 32 else ("Q", "d")
        self.mask = (1 << bits) - 1
        self.sign_bit = 1 << (bits - 1)
        self.canonical_nan = 0x7FC0_0000 if bits == 32 else 0x7FF8_0000_0000_0000
        flip = self.mask if self.desc else 0
        self.positive_xor, self.negative_xor = self.sign_bit ^ flip, self.mask ^ flip
        self.floats = np.dtype(f"<f{self.width}")
        self.unsigned = np.dtype(f"<u{self.width}")

    def transform(self, bits: int) -> int:
        """The encoded unsigned value of a float's bits."""
        return bits ^ (self.negative_xor if bits & self.sign_bit else self.positive_xor)

    def to_float(self, value: Any) -> float:
        """A non-null accepted value as a float (ints and numpy floats too)."""
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise self.mismatch("a float", value) from None
        raise self.mismatch("a float (or an int)", value)

    def encoder(self, head: bytes) -> Encoder:
        pack = struct.Struct(f">{len(head)}sB{self.fmt}").pack
        float_bits = struct.Struct(f">{self.float_fmt}").pack
        unsigned = struct.Struct(f">{self.fmt}").unpack
        present, sign_bit = self.present, self.sign_bit
        positive_xor, negative_xor = self.positive_xor, self.negative_xor
        nan = pack(head, present, self.transform(self.canonical_nan))

        def encode(value: Any) -> bytes:
            if type(value) is not float:
                if value is None:
                    return self.null_bytes(head)
                value = self.to_float(value)
            if value != value:
                return nan
            try:
                (bits,) = unsigned(float_bits(value + 0.0))  # + 0.0 turns -0.0 into 0.0
            except OverflowError:
                raise self.mismatch(f"a float within {self.dtype}'s range", value) from None
            return pack(head, present, bits ^ (negative_xor if bits & sign_bit else positive_xor))

        return encode

    def decoder(self) -> Decoder:
        unpack = struct.Struct(f">B{self.fmt}").unpack_from
        to_float = struct.Struct(f">{self.float_fmt}").unpack
        from_bits = struct.Struct(f">{self.fmt}").pack
        size, present, sign_bit, mask = 1 + self.width, self.present, self.sign_bit, self.mask
        flip = mask if self.desc else 0
        null = self.null if self.nullable else -1

        def decode(data: bytes, pos: int) -> tuple[Any, int]:
            marker, bits = unpack(data, pos)
            if marker == present:
                bits ^= flip
                bits ^= sign_bit if bits & sign_bit else mask
                return to_float(from_bits(bits))[0], pos + size
            if marker == null and bits == 0:
                return None, pos + size
            raise self.corrupt(f"bad null marker {marker} or padding")

        return decode

    def value_bytes(self, arr: pa.Array, valid: Mask | None) -> Bytes2D:
        values = _values(arr, self.floats.str) + 0.0
        bits = values.view(self.unsigned)
        bits[np.isnan(values)] = self.canonical_nan
        negative = (bits & self.unsigned.type(self.sign_bit)) != 0
        bits ^= np.where(negative, self.negative_xor, self.positive_xor).astype(self.unsigned)
        big: Bytes2D = bits.astype(self.unsigned.newbyteorder(">")).view(np.uint8)
        return big.reshape(len(arr), self.width)

    def array_from(self, values: Bytes2D, valid: Mask) -> pa.Array:
        bits = values.view(self.unsigned.newbyteorder(">")).ravel().astype(self.unsigned)
        if self.desc:
            bits ^= self.unsigned.type(self.mask)
        positive = (bits & self.unsigned.type(self.sign_bit)) != 0
        bits ^= np.where(positive, self.sign_bit, self.mask).astype(self.unsigned)
        bits[~valid] = 0
        validity, null_count = _validity_buffer(valid)
        return pa.Array.from_buffers(
            self.dtype, len(valid), [validity, pa.py_buffer(bits)], null_count
        )


class _BoolColumn(_FixedColumn):
    """bool: one byte, 0 for False and 1 for True."""

    width = 1

    def encoder(self, head: bytes) -> Encoder:
        flip = 0xFF if self.desc else 0
        true = head + bytes([self.present, 1 ^ flip])
        false = head + bytes([self.present, flip])

        def encode(value: Any) -> bytes:
            if value is True:
                return true
            if value is False:
                return false
            if value is None:
                return self.null_bytes(head)
            if isinstance(value, np.bool_):
                return true if value else false
            raise self.mismatch("a bool", value)

        return encode

    def decoder(self) -> Decoder:
        flip = 0xFF if self.desc else 0
        present = self.present
        null = self.null if self.nullable else -1

        def decode(data: bytes, pos: int) -> tuple[Any, int]:
            marker, byte = data[pos], data[pos + 1]
            if marker == present and byte ^ flip <= 1:
                return byte ^ flip == 1, pos + 2
            if marker == null and byte == 0:
                return None, pos + 2
            raise self.corrupt(f"bad bool bytes {marker} {byte}")

        return decode

    def value_bytes(self, arr: pa.Array, valid: Mask | None) -> Bytes2D:
        bitmap = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
        bits = np.unpackbits(bitmap, bitorder="little")[arr.offset : arr.offset + len(arr)]
        if self.desc:
            bits ^= 0xFF
        return bits.reshape(len(arr), 1)

    def array_from(self, values: Bytes2D, valid: Mask) -> pa.Array:
        bits = values[:, 0] ^ (0xFF if self.desc else 0)
        if (bits[valid] > 1).any():
            raise self.corrupt("a bool byte is neither 0 nor 1")
        validity, null_count = _validity_buffer(valid)
        data = pa.py_buffer(np.packbits(bits.astype(bool) & valid, bitorder="little"))
        return pa.Array.from_buffers(pa.bool_(), len(valid), [validity, data], null_count)


class _DecimalColumn(_FixedColumn):
    """decimal128: the unscaled value at the column's scale, as a 16-byte signed
    integer with its sign bit flipped (big-endian)."""

    width = 16

    def __init__(self, table: str, key: KeyColumn, field: pa.Field) -> None:
        super().__init__(table, key, field)
        self.precision, self.scale = field.type.precision, field.type.scale
        self.limit = 10**self.precision
        mask, bias = (1 << 128) - 1, 1 << 127
        self.base, self.sign = (mask - bias, -1) if self.desc else (bias, 1)

    def unscaled(self, value: Any) -> int:
        """The unscaled integer of a Decimal or int, checked against the type."""
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            value = decimal.Decimal(operator.index(value))
        if not isinstance(value, decimal.Decimal) or not value.is_finite():
            raise self.mismatch("a finite decimal.Decimal or an int", value)
        if not value:
            return 0
        fits = f"a Decimal of at most {self.precision} digits, {self.scale} after the point"
        if value.adjusted() >= self.precision - self.scale:
            raise self.mismatch(fits, value)
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        coefficient = int(decimal.Decimal((0, digits, 0)))
        shift = exponent + self.scale
        if shift >= 0:
            number = coefficient * 10**shift
        else:
            if -shift > len(digits):
                raise self.mismatch(fits, value)
            number, rest = divmod(coefficient, 10**-shift)
            if rest:
                raise self.mismatch(fits, value)
        if number >= self.limit:
            raise self.mismatch(fits, value)
        return int(-number if sign else number)

    def encoder(self, head: bytes) -> Encoder:
        head_present = head + bytes([self.present])
        base, sign, unscaled = self.base, self.sign, self.unscaled

        def encode(value: Any) -> bytes:
            if value is None:
                return self.null_bytes(head)
            return head_present + (base + sign * unscaled(value)).to_bytes(16, "big")

        return encode

    def decoder(self) -> Decoder:
        present, base, sign, scale = self.present, self.base, self.sign, -self.scale
        null = self.null if self.nullable else -1
        scaleb = _DECIMAL_CONTEXT.scaleb

        def decode(data: bytes, pos: int) -> tuple[Any, int]:
            marker, raw = data[pos], data[pos + 1 : pos + 17]
            if len(raw) != 16:
                raise self.corrupt("key is truncated")
            number = int.from_bytes(raw, "big")
            if marker == present:
                return scaleb(decimal.Decimal((number - base) * sign), scale), pos + 17
            if marker == null and number == 0:
                return None, pos + 17
            raise self.corrupt(f"bad null marker {marker} or padding")

        return decode

    def value_bytes(self, arr: pa.Array, valid: Mask | None) -> Bytes2D:
        raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
        little = raw.reshape(-1, 16)[arr.offset : arr.offset + len(arr)]
        big = little[:, ::-1].copy()  # Arrow stores little-endian two's complement.
        big[:, 0] ^= 0x80
        if self.desc:
            big ^= 0xFF
        return big

    def array_from(self, values: Bytes2D, valid: Mask) -> pa.Array:
        big = values ^ 0xFF if self.desc else values.copy()
        big[:, 0] ^= 0x80
        little = np.ascontiguousarray(big[:, ::-1])
        little[~valid] = 0
        validity, null_count = _validity_buffer(valid)
        return pa.Array.from_buffers(
            self.dtype, len(valid), [validity, pa.py_buffer(little)], null_count
        )


class _NullColumn(_FixedColumn):
    """The null type: only the null marker, as every value is null."""

    width = 0

    def encoder(self, head: bytes) -> Encoder:
        def encode(value: Any) -> bytes:
            if value is None:
                return self.null_bytes(head)
            raise self.mismatch("None (the column has the null type)", value)

        return encode

    def decoder(self) -> Decoder:
        null = self.null if self.nullable else -1

        def decode(data: bytes, pos: int) -> tuple[Any, int]:
            if data[pos] != null:
                raise self.corrupt(f"bad null marker {data[pos]}")
            return None, pos + 1

        return decode

    def decode_array(
        self, data: Bytes2D, pos: Positions, ends: Positions
    ) -> tuple[pa.Array, Positions]:
        if (pos >= ends).any():
            raise self.corrupt("key is truncated")
        if not self.nullable or (data[pos] != self.null).any():
            raise self.corrupt("bad null marker")
        return pa.nulls(len(pos)), pos + 1


class _BytesColumn(_Column):
    """string and binary: the bytes (UTF-8 for strings) with 0x00 escaped as
    0x00 0xFF, terminated by 0x00 0x01. No encoding is a prefix of another, so
    inverting every byte for descending reverses the order."""

    def __init__(self, table: str, key: KeyColumn, field: pa.Field) -> None:
        super().__init__(table, key, field)
        self.text = pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
        # As stored: descending inverts the terminator with the value bytes.
        self.terminator = _END.translate(_INVERT) if self.desc else _END

    def raw(self, value: Any) -> bytes:
        """The bytes of a non-null accepted value that is not exactly str/bytes."""
        if self.text and isinstance(value, str):
            try:
                return value.encode()
            except UnicodeEncodeError:
                raise self.mismatch("a str that UTF-8 can encode", value) from None
        if not self.text and isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise self.mismatch("a str" if self.text else "bytes", value)

    def encoder(self, head: bytes) -> Encoder:
        head_present, invert = head + bytes([self.present]), self.desc

        def slow(value: Any) -> bytes:
            if value is None:
                return self.null_bytes(head)
            escaped = self.raw(value).replace(_Z, _ZE) + _END
            return head_present + (escaped.translate(_INVERT) if invert else escaped)

        # One closure per case keeps the common path to a type check and two calls.
        if self.text and not invert:

            def encode(value: Any) -> bytes:
                if type(value) is str:
                    try:
                        return head_present + value.encode().replace(_Z, _ZE) + _END
                    except UnicodeEncodeError:
                        pass
                return slow(value)

        elif self.text:

            def encode(value: Any) -> bytes:
                if type(value) is str:
                    try:
                        escaped = value.encode().replace(_Z, _ZE) + _END
                        return head_present + escaped.translate(_INVERT)
                    except UnicodeEncodeError:
                        pass
                return slow(value)

        elif not invert:

            def encode(value: Any) -> bytes:
                if type(value) is bytes:
                    return head_present + value.replace(_Z, _ZE) + _END
                return slow(value)

        else:

            def encode(value: Any) -> bytes:
                if type(value) is bytes:
                    escaped = value.replace(_Z, _ZE) + _END
                    return head_present + escaped.translate(_INVERT)
                return slow(value)

        return encode

    def decoder(self) -> Decoder:
        present, terminator, text, desc = self.present, self.terminator, self.text, self.desc
        null = self.null if self.nullable else -1

        def decode(data: bytes, pos: int) -> tuple[Any, int]:
            marker = data[pos]
            if marker == present:
                end = data.find(terminator, pos + 1)
                if end < 0:
                    raise self.corrupt("key is truncated (no terminator)")
                raw = data[pos + 1 : end]
                if desc:
                    raw = raw.translate(_INVERT)
                if 0 in raw:  # an int needle: far quicker than b"\x00"
                    if raw.count(_Z) != raw.count(_ZE):
                        raise self.corrupt("0x00 not escaped")
                    raw = raw.replace(_ZE, _Z)
                return (raw.decode() if text else raw), end + 2
            if marker == null:
                return None, pos + 1
            raise self.corrupt(f"bad null marker {marker}")

        return decode

    def encode_array(self, arr: pa.Array) -> pa.Array:
        valid = self.check_nulls(arr)
        raw = arr.cast(pa.large_binary())
        escaped = pc.replace_substring(raw, _Z, _ZE)
        body = pc.binary_join_element_wise(
            escaped, pa.scalar(_END, pa.large_binary()), _LARGE_EMPTY
        )
        if self.desc:
            body = _invert_values(body)
        piece = pc.binary_join_element_wise(
            pa.scalar(bytes([self.present]), pa.large_binary()), body, _LARGE_EMPTY
        )
        if valid is not None:
            piece = piece.fill_null(pa.scalar(bytes([self.null]), pa.large_binary()))
        return piece

    def decode_array(
        self, data: Bytes2D, pos: Positions, ends: Positions
    ) -> tuple[pa.Array, Positions]:
        n = len(pos)
        if (pos >= ends).any():
            raise self.corrupt("key is truncated")
        markers = data[pos]
        valid = markers == self.present
        if not valid.all() and (not self.nullable or not ((markers == self.null) | valid).all()):
            raise self.corrupt("bad null marker")
        starts = pos[valid] + 1
        first, second = self.terminator
        candidates = np.flatnonzero((data[:-1] == first) & (data[1:] == second))
        found = np.searchsorted(candidates, starts)
        if (found >= len(candidates)).any():
            raise self.corrupt("key is truncated (no terminator)")
        stops = candidates[found]
        if (stops + 2 > ends[valid]).any():
            raise self.corrupt("key is truncated (no terminator)")
        content, lengths = _gather(data, starts, stops - starts)
        if self.desc:
            content ^= 0xFF
        content, lengths = self._unescape(content, lengths)
        all_lengths = np.zeros(n, dtype=np.int64)
        all_lengths[valid] = lengths
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(all_lengths, out=offsets[1:])
        large = pa.types.is_large_string(self.dtype) or pa.types.is_large_binary(self.dtype)
        if not large:
            if offsets[-1] >= 2**31:
                raise self.corrupt("column too large for 32-bit offsets")
            offsets = offsets.astype(np.int32)
        validity, null_count = _validity_buffer(valid)
        array = pa.Array.from_buffers(
            self.dtype,
            n,
            [validity, pa.py_buffer(offsets), pa.py_buffer(content)],
            null_count,
        )
        if self.text:
            try:
                array.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise self.corrupt(f"invalid UTF-8 ({exc})") from None
        next_pos = pos + 1
        next_pos[valid] = stops + 2
        return array, next_pos

    def _unescape(self, content: Bytes2D, lengths: Positions) -> tuple[Bytes2D, Positions]:
        """Drop the 0xFF after each 0x00, checking each 0x00 has one."""
        zeros = np.flatnonzero(content == 0)
        if zeros.size == 0:
            return content, lengths
        row_ends = np.cumsum(lengths)
        rows = np.searchsorted(row_ends, zeros, side="right")
        after = zeros + 1
        unpaired = after >= row_ends[rows]
        if unpaired.any() or (content[after[~unpaired]] != 0xFF).any():
            raise self.corrupt("0x00 not escaped")
        keep = np.ones(len(content), dtype=bool)
        keep[after] = False
        removed = np.bincount(rows, minlength=len(lengths))
        return content[keep], lengths - removed


def _gather(data: Bytes2D, starts: Positions, lengths: Positions) -> tuple[Bytes2D, Positions]:
    """The bytes ``data[starts[i] : starts[i] + lengths[i]]`` of every i, concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.uint8), lengths
    run_starts = np.cumsum(lengths) - lengths
    index = np.arange(total, dtype=np.int64) + np.repeat(starts - run_starts, lengths)
    return data[index], lengths


def _invert_values(arr: pa.Array) -> pa.Array:
    """``arr`` (large_binary) with every byte of its values inverted."""
    validity, offsets, data = arr.buffers()
    if data is None:
        return arr
    inverted = np.bitwise_not(np.frombuffer(data, dtype=np.uint8))
    return pa.Array.from_buffers(
        arr.type, len(arr), [validity, offsets, pa.py_buffer(inverted)],
        arr.null_count, arr.offset,
    )  # fmt: skip


#: What a column decoder raises on bytes it cannot read (besides DecodingError).
_DECODE_FAILURES = (struct.error, IndexError, ValueError, OverflowError)


def _reader(decoders: Sequence[Decoder]) -> Callable[[bytes], tuple[tuple[Any, ...], int]]:
    """Decoding of every key column after the table id: (key, end).

    Unrolled for one and two columns, the common keys.
    """
    if len(decoders) == 1:
        (first,) = decoders

        def read_one(data: bytes) -> tuple[tuple[Any, ...], int]:
            value, end = first(data, 4)
            return (value,), end

        return read_one
    if len(decoders) == 2:
        first, second = decoders

        def read_two(data: bytes) -> tuple[tuple[Any, ...], int]:
            value, pos = first(data, 4)
            other, end = second(data, pos)
            return (value, other), end

        return read_two

    def read(data: bytes) -> tuple[tuple[Any, ...], int]:
        pos, values = 4, []
        for decode in decoders:
            value, pos = decode(data, pos)
            values.append(value)
        return tuple(values), pos

    return read


def _column(table: str, key: KeyColumn, field: pa.Field) -> _Column:
    """The codec of one key column, by its Arrow type."""
    dtype = field.type
    if pa.types.is_integer(dtype):
        return _IntColumn(table, key, field, dtype.bit_width, pa.types.is_signed_integer(dtype))
    if pa.types.is_floating(dtype):
        return _FloatColumn(table, key, field, dtype.bit_width)
    if pa.types.is_boolean(dtype):
        return _BoolColumn(table, key, field)
    if pa.types.is_date32(dtype):
        return _DateColumn(table, key, field)
    if pa.types.is_timestamp(dtype):
        return _TimestampColumn(table, key, field)
    if pa.types.is_decimal128(dtype):
        return _DecimalColumn(table, key, field)
    if pa.types.is_null(dtype):
        return _NullColumn(table, key, field)
    return _BytesColumn(table, key, field)


class KeyCodec:
    """Encodes and decodes the primary keys of one table.

    One encoder and one decoder per key column are built here, once, so that
    encoding a key costs a call per column and little else.
    """

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        #: The table id as 4 bytes, big-endian: the first bytes of every key.
        self.prefix: bytes = schema.prefix
        self._columns = [
            _column(schema.name, key, schema.columns.field(index))
            for key, index in zip(schema.primary_key, schema.key_indices, strict=True)
        ]
        # The first encoder writes the table prefix too: one concatenation less.
        self._encoders = [
            column.encoder(self.prefix if i == 0 else b"") for i, column in enumerate(self._columns)
        ]
        self._first = self._encoders[0]
        self._second = self._encoders[1] if len(self._encoders) > 1 else None
        decoders = [column.decoder() for column in self._columns]
        self._only = decoders[0] if len(decoders) == 1 else None
        self._read = _reader(decoders)
        self._prefix_bytes = np.frombuffer(self.prefix, dtype=np.uint8)

    def encode(self, key: Sequence[Any]) -> bytes:
        """The bytes of ``key``: the values of the first ``len(key)`` key columns.

        A shorter key encodes to a byte prefix of a longer one with the same first
        values, which is what prefix scans rely on.
        """
        try:
            size = len(key)
        except TypeError:
            raise EncodingError(f"a key is a sequence of values, got {key!r}") from None
        if size == 1:
            return self._first(key[0])
        if size == 2 and self._second is not None:
            return self._first(key[0]) + self._second(key[1])
        if size == 0:
            return self.prefix
        if size > len(self._encoders):
            raise EncodingError(
                f"table {self.schema.name!r} has {len(self._encoders)} key columns "
                f"{list(self.schema.key_names)}, got {size} values: {key!r}"
            )
        return b"".join([encode(value) for encode, value in zip(self._encoders, key, strict=False)])

    def decode(self, data: bytes) -> tuple[Any, ...]:
        """The full key that ``data`` encodes; nothing may follow it."""
        if data[:4] != self.prefix:
            raise self._wrong_table(data)
        try:
            if self._only is not None:  # a call less for the most common key
                value, end = self._only(data, 4)
                key: tuple[Any, ...] = (value,)
            else:
                key, end = self._read(data)
        except DecodingError:
            raise
        except _DECODE_FAILURES as exc:
            raise self._undecodable(data, exc) from exc
        if end != len(data):
            raise DecodingError(
                f"key of table {self.schema.name!r} has {len(data) - end} bytes "
                f"after its last column: {data.hex()}"
            )
        return key

    def decode_prefix(self, data: bytes) -> tuple[tuple[Any, ...], int]:
        """The full key at the start of ``data`` and how many bytes it takes.

        Bytes may follow the key (a cell key ends with a column id).
        """
        if data[:4] != self.prefix:
            raise self._wrong_table(data)
        try:
            return self._read(data)
        except DecodingError:
            raise
        except _DECODE_FAILURES as exc:
            raise self._undecodable(data, exc) from exc

    def _undecodable(self, data: bytes, exc: Exception) -> DecodingError:
        return DecodingError(
            f"cannot decode a key of table {self.schema.name!r} from {data[:64].hex()}: {exc}"
        )

    def _wrong_table(self, data: bytes) -> DecodingError:
        if len(data) < 4:
            return DecodingError(
                f"a key is at least 4 bytes (the table id), got {len(data)}: {data.hex()}"
            )
        found = int.from_bytes(data[:4], "big")
        return DecodingError(
            f"key belongs to table id {found}, not to table {self.schema.name!r} "
            f"(id {self.schema.table_id})"
        )

    def encode_batch(self, batch: pa.RecordBatch | pa.Table) -> list[bytes]:
        """The key bytes of every row of ``batch``, as :meth:`encode` gives them.

        Key columns are found by name and must have exactly the schema's types.
        """
        arrays = [self._batch_column(batch, column) for column in self._columns]
        n = batch.num_rows
        if n == 0:
            return []
        # Runs of fixed-width columns become one numpy matrix; strings become
        # Arrow binary arrays; Arrow concatenates the pieces row by row.
        pieces: list[pa.Array] = []
        run: list[Bytes2D] = [np.broadcast_to(self._prefix_bytes, (n, 4))]
        for column, arr in zip(self._columns, arrays, strict=True):
            piece = column.encode_array(arr)
            if isinstance(piece, np.ndarray):
                run.append(piece)
                continue
            if run:
                pieces.append(_binary_rows(np.hstack(run)))
                run = []
            pieces.append(piece)
        if run:
            pieces.append(_binary_rows(np.hstack(run)))
        if len(pieces) == 1:
            rows: list[bytes] = pieces[0].to_pylist()
            return rows
        keys: list[bytes] = pc.binary_join_element_wise(*pieces, _LARGE_EMPTY).to_pylist()
        return keys

    def _batch_column(self, batch: pa.RecordBatch | pa.Table, column: _Column) -> pa.Array:
        index = batch.schema.get_field_index(column.name)
        if index < 0:
            raise EncodingError(
                f"{column.where} is missing from the batch, or named twice in it; "
                f"the batch has columns {batch.schema.names}"
            )
        arr = batch.column(index)
        if arr.type != column.dtype:
            raise EncodingError(
                f"{column.where} has type {arr.type} in the batch; cast it to "
                f"{column.dtype} first (key columns must have exactly their type)"
            )
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        return arr

    def decode_batch(self, keys: Sequence[bytes]) -> list[pa.Array]:
        """The key columns of many full keys, one Arrow array per key column."""
        if not keys:
            return [pa.array([], column.dtype) for column in self._columns]
        try:
            binary = pa.array(keys, pa.large_binary())
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DecodingError(f"keys must be bytes ({exc})") from None
        if binary.null_count:
            raise DecodingError("keys must be bytes, got None")
        _, offset_buffer, data_buffer = binary.buffers()
        offsets = np.frombuffer(offset_buffer, dtype=np.int64)[: len(keys) + 1]
        data: Bytes2D = (
            np.frombuffer(data_buffer, dtype=np.uint8)
            if data_buffer is not None
            else np.zeros(0, dtype=np.uint8)
        )
        starts, ends = offsets[:-1], offsets[1:]
        too_short = np.flatnonzero(ends - starts < 4)
        if too_short.size:
            raise self._wrong_table(keys[int(too_short[0])])
        table_ids = data[starts[:, None] + np.arange(4)]
        wrong = np.flatnonzero((table_ids != self._prefix_bytes).any(axis=1))
        if wrong.size:
            raise self._wrong_table(keys[int(wrong[0])])
        pos = starts + 4
        columns = []
        for column in self._columns:
            array, pos = column.decode_array(data, pos, ends)
            columns.append(array)
        trailing = np.flatnonzero(pos != ends)
        if trailing.size:
            raise DecodingError(
                f"key of table {self.schema.name!r} has bytes after its last "
                f"column: {keys[int(trailing[0])].hex()}"
            )
        return columns
