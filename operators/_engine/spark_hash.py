"""Spark's partition of a key, computed without Spark.

The runner repartitions each batch by its key columns, so a key's state lives
in partition ``pmod(hash(k1, ..., kn), n)`` where ``hash`` is Spark's
``Murmur3Hash`` with seed 42 (``F.hash``): Murmur3 x86 32-bit, each column
hashed with the previous column's hash as its seed, a null column leaving the
seed unchanged. ``relstate repartition`` needs it to move rows to their new
partitions; the tests pin it against ``F.hash``.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

__all__ = ["SEED", "spark_hash", "spark_partition", "supported"]

SEED = 42
_MASK = 0xFFFF_FFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _MASK
    return (_rotl(k1, 15) * _C2) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    h1 = _rotl(h1 ^ k1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    return h1 ^ (h1 >> 16)


def _hash_int(value: int, seed: int) -> int:
    return _fmix(_mix_h1(seed, _mix_k1(value & _MASK)), 4)


def _hash_long(value: int, seed: int) -> int:
    value &= 0xFFFF_FFFF_FFFF_FFFF
    h1 = _mix_h1(seed, _mix_k1(value & _MASK))
    h1 = _mix_h1(h1, _mix_k1(value >> 32))
    return _fmix(h1, 8)


def _hash_bytes(data: bytes, seed: int) -> int:
    """Spark's ``hashUnsafeBytes``: whole little-endian ints, then each
    remaining byte (sign-extended) mixed on its own."""
    aligned = len(data) - len(data) % 4
    h1 = seed
    for (word,) in struct.iter_unpack("<I", data[:aligned]):
        h1 = _mix_h1(h1, _mix_k1(word))
    for byte in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((byte - 256 if byte > 127 else byte) & _MASK))
    return _fmix(h1, len(data))


def supported(dtype: pa.DataType) -> bool:
    """Whether :func:`spark_hash` hashes a column of this type as Spark does."""
    t = pa.types
    return (
        t.is_boolean(dtype)
        or (t.is_integer(dtype) and t.is_signed_integer(dtype))
        or (t.is_floating(dtype) and not t.is_float16(dtype))
        or t.is_string(dtype)
        or t.is_large_string(dtype)
        or t.is_binary(dtype)
        or t.is_large_binary(dtype)
        or t.is_date32(dtype)
        or t.is_timestamp(dtype)
        or (t.is_decimal(dtype) and dtype.precision <= 18)
    )


def _hash_value(value: Any, dtype: pa.DataType, seed: int) -> int:
    t = pa.types
    if t.is_boolean(dtype):
        return _hash_int(1 if value else 0, seed)
    if t.is_int64(dtype):
        return _hash_long(value, seed)
    if t.is_integer(dtype):
        return _hash_int(value, seed)
    if t.is_float32(dtype):
        bits = 0 if value == 0.0 else _float_bits(value, "<f", "<I")
        return _hash_int(bits, seed)
    if t.is_floating(dtype):
        bits = 0 if value == 0.0 else _float_bits(value, "<d", "<Q")
        return _hash_long(bits, seed)
    if t.is_string(dtype) or t.is_large_string(dtype):
        return _hash_bytes(value.encode(), seed)
    if t.is_binary(dtype) or t.is_large_binary(dtype):
        return _hash_bytes(bytes(value), seed)
    if t.is_date32(dtype):
        return _hash_int((value - datetime.date(1970, 1, 1)).days, seed)
    if t.is_timestamp(dtype):
        return _hash_long(_micros(value), seed)
    if t.is_decimal(dtype) and dtype.precision <= 18:
        unscaled = int(decimal.Decimal(value).scaleb(dtype.scale))
        return _hash_long(unscaled, seed)
    raise TypeError(f"Spark's hash of a {dtype} column is not computed by relstate")


def _float_bits(value: float, packed: str, unpacked: str) -> int:
    if math.isnan(value):
        value = math.nan  # Java's canonical NaN
    (bits,) = struct.unpack(unpacked, struct.pack(packed, value))
    return int(bits)


def _micros(value: datetime.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def spark_hash(values: Sequence[Any], types: Sequence[pa.DataType]) -> int:
    """``F.hash(*columns)`` of one row, as a signed 32-bit integer."""
    h = SEED
    for value, dtype in zip(values, types, strict=True):
        if value is not None:
            h = _hash_value(value, dtype, h)
    return h - (1 << 32) if h >= 1 << 31 else h


def spark_partition(values: Sequence[Any], types: Sequence[pa.DataType], partitions: int) -> int:
    """The partition Spark's hash partitioning gives a key: ``pmod(hash, n)``."""
    return spark_hash(values, types) % partitions
