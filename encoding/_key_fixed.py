"""Fixed-width key columns not stored as integers: float, bool, decimal128
and the null type."""

from __future__ import annotations

import decimal
import numbers
import operator
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from encoding._batch import Bytes2D, Mask, Positions, fixed_array, fixed_values
from encoding._conversions import decimal_unscaler
from encoding._key_column import Decoder, Encoder, FixedColumn
from encoding._schema import KeyColumn

__all__ = ["BoolColumn", "DecimalColumn", "FloatColumn", "NullColumn"]

_DECIMAL_CONTEXT = decimal.Context(prec=40)


class FloatColumn(FixedColumn):
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
        values = fixed_values(arr, self.floats.str) + 0.0
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
        return fixed_array(self.dtype, bits, valid)


class BoolColumn(FixedColumn):
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
        data = np.packbits(bits.astype(bool) & valid, bitorder="little")
        return fixed_array(pa.bool_(), data, valid)


class DecimalColumn(FixedColumn):
    """decimal128: the unscaled value at the column's scale, as a 16-byte signed
    integer with its sign bit flipped (big-endian)."""

    width = 16

    def __init__(self, table: str, key: KeyColumn, field: pa.Field) -> None:
        super().__init__(table, key, field)
        self.precision, self.scale = field.type.precision, field.type.scale
        mask, bias = (1 << 128) - 1, 1 << 127
        self.base, self.sign = (mask - bias, -1) if self.desc else (bias, 1)
        self.fits = f"a Decimal of at most {self.precision} digits, {self.scale} after the point"
        self.exact_unscaled = decimal_unscaler(
            self.precision, self.scale, lambda value: self.mismatch(self.fits, value)
        )

    def unscaled(self, value: Any) -> int:
        """The unscaled integer of a Decimal or int, checked against the type."""
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            value = decimal.Decimal(operator.index(value))
        if not isinstance(value, decimal.Decimal) or not value.is_finite():
            raise self.mismatch("a finite decimal.Decimal or an int", value)
        # Too large for the type: said before the exact conversion, which can
        # take seconds for a huge exponent.
        if value and value.adjusted() >= self.precision - self.scale:
            raise self.mismatch(self.fits, value)
        number: int = self.exact_unscaled(value)
        return number

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
        return fixed_array(self.dtype, little, valid)


class NullColumn(FixedColumn):
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

    def value_bytes(self, arr: pa.Array, valid: Mask | None) -> Bytes2D:
        return np.zeros((len(arr), 0), dtype=np.uint8)

    def array_from(self, values: Bytes2D, valid: Mask) -> pa.Array:
        return pa.nulls(len(values))

    def decode_array(
        self, data: Bytes2D, pos: Positions, ends: Positions
    ) -> tuple[pa.Array, Positions]:
        if (pos >= ends).any():
            raise self.corrupt("key is truncated")
        if not self.nullable or (data[pos] != self.null).any():
            raise self.corrupt("bad null marker")
        return pa.nulls(len(pos)), pos + 1
