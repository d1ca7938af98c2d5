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
    "KEY_TYPES",
    "MORE_KEY_TYPES",
    "arrow_types",
    "full_rows_for",
    "key_columns",
    "key_schemas",
    "key_values_of",
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

#: Every type a key column may have.
KEY_TYPES: list[pa.DataType] = [
    *_INT_BOUNDS,
    pa.float32(),
    pa.float64(),
    pa.bool_(),
    pa.string(),
    pa.binary(),
    pa.date32(),
    pa.timestamp("s"),
    pa.timestamp("ms"),
    pa.timestamp("us"),
    pa.timestamp("us", tz="UTC"),
    pa.timestamp("ms", tz="Europe/Paris"),
    pa.decimal128(10, 2),
    pa.decimal128(38, 0),
    pa.null(),
]


def arrow_types() -> st.SearchStrategy[pa.DataType]:
    """Any supported Arrow type."""
    return st.sampled_from(KEY_TYPES)


_EPOCH = dt.datetime(1970, 1, 1)


def values_of(dtype: pa.DataType, nullable: bool = True) -> st.SearchStrategy[Any]:
    """Python values of ``dtype`` in the form ``pyarrow``'s ``to_pylist`` gives."""
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
    elif pa.types.is_string(dtype):
        base = st.text(max_size=12)
    elif pa.types.is_binary(dtype):
        base = st.binary(max_size=12)
    elif pa.types.is_date32(dtype):
        base = st.dates()
    elif pa.types.is_timestamp(dtype):
        step = {"s": 1_000_000, "ms": 1_000, "us": 1}[dtype.unit]
        micros = st.integers(-(2**40), 2**40).map(lambda n: n * step)
        naive = micros.map(lambda us: _EPOCH + dt.timedelta(microseconds=us))
        if dtype.tz is None:
            base = naive
        else:
            base = naive.map(
                lambda d: pa.scalar(d.replace(tzinfo=dt.timezone.utc), dtype).as_py()
            )
    elif pa.types.is_decimal(dtype):
        digits = dtype.precision
        base = st.integers(-(10**digits) + 1, 10**digits - 1).map(
            lambda n: decimal.Decimal(n).scaleb(-dtype.scale)
        )
    else:  # pragma: no cover - KEY_TYPES lists every supported type
        raise AssertionError(dtype)
    return st.one_of(st.none(), base) if nullable else base


def key_columns(names: list[str]) -> st.SearchStrategy[tuple[KeyColumn, ...]]:
    """Key columns over ``names`` with random directions and null orders."""
    one = st.builds(
        KeyColumn,
        st.just(""),
        st.sampled_from(list(Direction)),
        st.sampled_from(list(NullOrder)),
    )
    return st.lists(one, min_size=len(names), max_size=len(names)).map(
        lambda ks: tuple(
            KeyColumn(n, k.direction, k.nulls) for n, k in zip(names, ks, strict=True)
        )
    )


@st.composite
def table_schemas(
    draw: st.DrawFn,
    min_key: int = 1,
    max_key: int = 3,
    max_values: int = 4,
    layouts: tuple[ValueLayout, ...] = (ValueLayout.ROW, ValueLayout.CELL),
) -> TableSchema:
    """A table with random key and value columns of every supported type."""
    n_key = draw(st.integers(min_key, max_key))
    n_val = draw(st.integers(0, max_values))
    types = draw(st.lists(arrow_types(), min_size=n_key + n_val, max_size=n_key + n_val))
    fields = [pa.field(f"c{i}", t, nullable=True) for i, t in enumerate(types)]
    order = draw(st.permutations(range(n_key + n_val)))
    key_names = [f"c{i}" for i in order[:n_key]]
    keys = draw(key_columns(key_names))
    return TableSchema(
        table_id=draw(st.integers(0, 2**32 - 2)),
        columns=pa.schema(fields),
        primary_key=keys,
        layout=draw(st.sampled_from(layouts)),
    )


def rows_for(schema: TableSchema) -> st.SearchStrategy[tuple[Any, ...]]:
    """Full rows (tuples in column order) that fit ``schema``."""
    return st.tuples(*(values_of(f.type, f.nullable) for f in schema.columns))


#: Key types that KEY_TYPES leaves out: the large string and binary types,
#: nanosecond timestamps, a fixed-offset time zone, more decimal shapes.
MORE_KEY_TYPES: list[pa.DataType] = [
    pa.large_string(),
    pa.large_binary(),
    pa.timestamp("ns"),
    pa.timestamp("ns", tz="America/New_York"),
    pa.timestamp("s", tz="+05:30"),
    pa.decimal128(5, 5),
    pa.decimal128(18, 4),
    pa.decimal128(4, -2),
]

_DAY_NS = 86_400 * 10**9
_UNIT_STEPS = {
    "s": dt.timedelta(seconds=1),
    "ms": dt.timedelta(milliseconds=1),
    "us": dt.timedelta(microseconds=1),
}


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


_EXACT = decimal.Context(prec=40)


def key_values_of(dtype: pa.DataType, nullable: bool = True) -> st.SearchStrategy[Any]:
    """Like :func:`values_of`, for every type of KEY_TYPES and MORE_KEY_TYPES, with
    timestamps over their whole range and decimals of all their digits."""
    base: st.SearchStrategy[Any]
    if pa.types.is_decimal(dtype):
        # values_of scales with the default context, which rounds to 28 digits.
        limit = 10**dtype.precision
        base = st.integers(-limit + 1, limit - 1).map(
            lambda n: _EXACT.scaleb(decimal.Decimal(n), -dtype.scale)
        )
    elif pa.types.is_large_string(dtype):
        base = st.text(max_size=12)
    elif pa.types.is_large_binary(dtype):
        base = st.binary(max_size=12)
    elif pa.types.is_timestamp(dtype):
        base = _timestamps(dtype)
    else:
        return values_of(dtype, nullable)
    return st.one_of(st.none(), base) if nullable else base


@st.composite
def key_schemas(draw: st.DrawFn, max_key: int = 3) -> TableSchema:
    """A table whose key columns have any key type, direction, null order and
    nullability, in any order, beside one value column."""
    n_key = draw(st.integers(1, max_key))
    types = draw(
        st.lists(st.sampled_from(KEY_TYPES + MORE_KEY_TYPES), min_size=n_key, max_size=n_key)
    )
    nullable = draw(st.lists(st.booleans(), min_size=n_key, max_size=n_key))
    fields = [
        pa.field(f"k{i}", t, nullable=n or pa.types.is_null(t))
        for i, (t, n) in enumerate(zip(types, nullable, strict=True))
    ]
    fields.append(pa.field("value", pa.int64()))
    order = draw(st.permutations(range(n_key)))
    keys = draw(key_columns([f"k{i}" for i in order]))
    return TableSchema(table_id=draw(st.integers(0, 2**32 - 2)), columns=fields, primary_key=keys)


def full_rows_for(schema: TableSchema) -> st.SearchStrategy[tuple[Any, ...]]:
    """Like :func:`rows_for`, with values from :func:`key_values_of`."""
    return st.tuples(*(key_values_of(f.type, f.nullable) for f in schema.columns))


def keys_for(schema: TableSchema) -> st.SearchStrategy[tuple[Any, ...]]:
    """Full primary keys (tuples in key order) that fit ``schema``."""
    fields = [schema.columns.field(i) for i in schema.key_indices]
    return st.tuples(*(key_values_of(f.type, f.nullable) for f in fields))
