"""Hypothesis strategies shared by the test suite: Arrow types, typed values,
table schemas and rows that fit them."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from encoding import Direction, KeyColumn, NullOrder, TableSchema, ValueLayout

__all__ = [
    "SUPPORTED_TYPES",
    "arrow_types",
    "bad_values_of",
    "key_columns",
    "key_schemas",
    "keys_for",
    "rows_for",
    "table_schemas",
    "values_of",
]

_INT_BOUNDS = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.uint8(): (0, 2**8 - 1),
    pa.uint16(): (0, 2**16 - 1),
    pa.uint32(): (0, 2**32 - 1),
    pa.uint64(): (0, 2**64 - 1),
}

#: Every type a column (key or value) may have, in the shapes worth testing:
#: every width, both string and binary sizes, every timestamp unit with and
#: without a time zone (named, DST-observing, fixed offset), decimals of every
#: scale sign.
SUPPORTED_TYPES: list[pa.DataType] = [
    *_INT_BOUNDS,
    pa.float32(),
    pa.float64(),
    pa.bool_(),
    pa.string(),
    pa.large_string(),
    pa.binary(),
    pa.large_binary(),
    pa.date32(),
    pa.timestamp("s"),
    pa.timestamp("ms"),
    pa.timestamp("us"),
    pa.timestamp("ns"),
    pa.timestamp("us", tz="UTC"),
    pa.timestamp("ms", tz="Europe/Paris"),
    pa.timestamp("ns", tz="America/New_York"),
    pa.timestamp("s", tz="+05:30"),
    pa.decimal128(10, 2),
    pa.decimal128(38, 0),
    pa.decimal128(5, 5),
    pa.decimal128(18, 4),
    pa.decimal128(4, -2),
    pa.null(),
]


def arrow_types() -> st.SearchStrategy[pa.DataType]:
    """Any supported Arrow type."""
    return st.sampled_from(SUPPORTED_TYPES)


_EPOCH = dt.datetime(1970, 1, 1)
_DAY_NS = 86_400 * 10**9
_UNIT_STEPS = {
    "s": dt.timedelta(seconds=1),
    "ms": dt.timedelta(milliseconds=1),
    "us": dt.timedelta(microseconds=1),
}
#: Decimals are scaled exactly: the default context rounds to 28 digits.
_EXACT = decimal.Context(prec=40)


def _timestamps(dtype: pa.DataType) -> st.SearchStrategy[Any]:
    """Timestamps of ``dtype`` over its whole range, as ``to_pylist`` gives them.

    The range stops a day inside what ``datetime`` (or pandas, for ns) can hold,
    so that any time zone fits.
    """
    if dtype.unit == "ns":
        # Not pandas' NaT (-2**63).
        nanos = st.integers(-(2**63) + _DAY_NS, 2**63 - 1 - _DAY_NS)
        return nanos.map(lambda n: pa.scalar(n, dtype).as_py())
    step = _UNIT_STEPS[dtype.unit]
    day = dt.timedelta(days=1)
    lo = (dt.datetime.min + day - _EPOCH) // step
    hi = (dt.datetime.max - day - _EPOCH) // step
    naive = st.integers(lo, hi).map(lambda n: _EPOCH + n * step)
    if dtype.tz is None:
        return naive
    tzinfo = pa.scalar(0, dtype).as_py().tzinfo
    return naive.map(lambda d: d.replace(tzinfo=dt.UTC).astimezone(tzinfo))


def values_of(dtype: pa.DataType, nullable: bool = True) -> st.SearchStrategy[Any]:
    """Values of ``dtype`` over its whole range, in the form ``pyarrow``'s
    ``to_pylist`` gives them; ``None`` too when ``nullable``."""
    base: st.SearchStrategy[Any]
    if pa.types.is_null(dtype):
        return st.none()
    if dtype in _INT_BOUNDS:
        lo, hi = _INT_BOUNDS[dtype]
        base = st.integers(lo, hi)
    elif pa.types.is_float32(dtype):
        base = st.floats(width=32)
    elif pa.types.is_float64(dtype):
        base = st.floats()
    elif pa.types.is_boolean(dtype):
        base = st.booleans()
    elif pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        base = st.text(max_size=12)
    elif pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        base = st.binary(max_size=12)
    elif pa.types.is_date32(dtype):
        base = st.dates()
    elif pa.types.is_timestamp(dtype):
        base = _timestamps(dtype)
    elif pa.types.is_decimal(dtype):
        limit = 10**dtype.precision
        base = st.integers(-limit + 1, limit - 1).map(
            lambda n: _EXACT.scaleb(decimal.Decimal(n), -dtype.scale)
        )
    else:  # pragma: no cover - SUPPORTED_TYPES lists every supported type
        raise AssertionError(dtype)
    return st.one_of(st.none(), base) if nullable else base


def key_columns(names: list[str]) -> st.SearchStrategy[tuple[KeyColumn, ...]]:
    """Key columns over ``names`` with random directions and null orders."""
    one = st.tuples(st.sampled_from(list(Direction)), st.sampled_from(list(NullOrder)))
    return st.lists(one, min_size=len(names), max_size=len(names)).map(
        lambda orders: tuple(KeyColumn(n, d, o) for n, (d, o) in zip(names, orders, strict=True))
    )


def _fields(draw: st.DrawFn, prefix: str, n: int) -> list[pa.Field]:
    types = draw(st.lists(arrow_types(), min_size=n, max_size=n))
    nullable = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return [
        pa.field(f"{prefix}{i}", t, nullable=nl or pa.types.is_null(t))
        for i, (t, nl) in enumerate(zip(types, nullable, strict=True))
    ]


@st.composite
def table_schemas(
    draw: st.DrawFn,
    min_key: int = 1,
    max_key: int = 3,
    max_values: int = 6,
    layouts: tuple[ValueLayout, ...] = (ValueLayout.ROW, ValueLayout.CELL),
) -> TableSchema:
    """A table whose columns have any supported type and nullability (a null
    column is always nullable), with the key columns anywhere in the row."""
    n_key = draw(st.integers(min_key, max_key))
    fields = _fields(draw, "c", n_key + draw(st.integers(0, max_values)))
    order = draw(st.permutations(range(len(fields))))
    keys = draw(key_columns([f"c{i}" for i in order[:n_key]]))
    return TableSchema(
        table_id=draw(st.integers(0, 2**32 - 2)),
        columns=fields,
        primary_key=keys,
        layout=draw(st.sampled_from(layouts)),
    )


@st.composite
def key_schemas(draw: st.DrawFn, max_key: int = 3) -> TableSchema:
    """A table whose key columns have any type, direction, null order and
    nullability, in any key order, beside one value column."""
    n_key = draw(st.integers(1, max_key))
    fields = [*_fields(draw, "k", n_key), pa.field("value", pa.int64())]
    order = draw(st.permutations(range(n_key)))
    keys = draw(key_columns([f"k{i}" for i in order]))
    return TableSchema(table_id=draw(st.integers(0, 2**32 - 2)), columns=fields, primary_key=keys)


def rows_for(schema: TableSchema) -> st.SearchStrategy[tuple[Any, ...]]:
    """Full rows (tuples in column order) that fit ``schema``."""
    return st.tuples(*(values_of(f.type, f.nullable) for f in schema.columns))


def keys_for(schema: TableSchema) -> st.SearchStrategy[tuple[Any, ...]]:
    """Full primary keys (tuples in key order) that fit ``schema``."""
    fields = [schema.columns.field(i) for i in schema.key_indices]
    return st.tuples(*(values_of(f.type, f.nullable) for f in fields))


def _outside(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(max_value=lo - 1), st.integers(min_value=hi + 1))


def bad_values_of(dtype: pa.DataType) -> st.SearchStrategy[Any]:
    """Values that do not fit a column of ``dtype``: a Python type it does not
    take, or a value out of its range. Never None."""
    text, raw, bools = st.text(max_size=3), st.binary(max_size=3), st.booleans()
    fractions = st.decimals(allow_nan=False, allow_infinity=False, places=1)
    if pa.types.is_null(dtype):
        return st.one_of(st.integers(), text, raw, bools)
    if dtype in _INT_BOUNDS:
        return st.one_of(_outside(*_INT_BOUNDS[dtype]), st.floats(), bools, text, raw, fractions)
    if pa.types.is_floating(dtype):
        bad = [bools, text, raw, fractions, st.dates()]
        if pa.types.is_float32(dtype):
            big = st.floats(min_value=3.5e38, allow_infinity=False)
            bad += [big, big.map(lambda f: -f)]
        return st.one_of(*bad)
    if pa.types.is_boolean(dtype):
        return st.one_of(st.integers(), st.floats(), text, raw)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        # Lone surrogates: a str that UTF-8 cannot encode.
        return st.one_of(raw, st.integers(), bools, st.characters(categories=["Cs"]))
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return st.one_of(text, st.integers(), bools, st.floats())
    if pa.types.is_date32(dtype):
        days = (dt.date.min - _EPOCH.date()).days, (dt.date.max - _EPOCH.date()).days
        return st.one_of(st.datetimes(), _outside(*days), text, st.floats(), bools)
    if pa.types.is_timestamp(dtype):
        bad = [st.dates(), text, st.floats(), bools]
        if dtype.unit == "ns":
            bad.append(_outside(-(2**63), 2**63 - 1))
        else:
            step = _UNIT_STEPS[dtype.unit]
            lo = (dt.datetime.min - _EPOCH) // step
            hi = (dt.datetime.max - _EPOCH) // step
            bad.append(_outside(lo, hi))
        if dtype.unit in ("s", "ms"):
            # A fraction of the unit: an odd number of microseconds.
            bad.append(st.datetimes().map(lambda d: d.replace(microsecond=d.microsecond | 1)))
        return st.one_of(*bad)
    if pa.types.is_decimal(dtype):
        too_wide = st.integers(min_value=10 ** (dtype.precision - dtype.scale))
        return st.one_of(
            st.floats(),
            text,
            bools,
            st.sampled_from([decimal.Decimal("NaN"), decimal.Decimal("-Infinity")]),
            too_wide.map(decimal.Decimal),
            too_wide.map(lambda n: -n),
            st.integers(1, 9).map(lambda n: decimal.Decimal(n).scaleb(-dtype.scale - 1)),
        )
    raise AssertionError(dtype)  # pragma: no cover - ALL_TYPES lists every supported type
