"""Order-preserving key encoding: byte order is key order, round trips, batches."""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import itertools
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from encoding import (
    DecodingError,
    Direction,
    EncodingError,
    KeyCodec,
    KeyColumn,
    NullOrder,
    TableSchema,
    prefix_successor,
)
from tests.strategies import key_schemas, keys_for, rows_for, table_schemas

PROPERTY = settings(max_examples=200, deadline=None)

ASC, DESC = Direction.ASC, Direction.DESC
FIRST, LAST = NullOrder.FIRST, NullOrder.LAST


def codec(
    *types: pa.DataType,
    direction: Direction = ASC,
    nulls: NullOrder | None = None,
    nullable: bool = True,
    table_id: int = 7,
) -> KeyCodec:
    """A codec for a table keyed by columns k0, k1, ... of ``types``."""
    fields = [pa.field(f"k{i}", t, nullable=nullable) for i, t in enumerate(types)]
    keys = [KeyColumn(f.name, direction, nulls) for f in fields]
    return KeyCodec(TableSchema(table_id, [*fields, pa.field("v", pa.int64())], keys))


def compare_values(a: Any, b: Any) -> int:
    """-1, 0, 1 for two non-null values; -0.0 == 0.0, NaN == NaN, NaN above +inf."""
    if isinstance(a, float):
        a_nan, b_nan = math.isnan(a), math.isnan(b)
        if a_nan or b_nan:
            return int(a_nan) - int(b_nan)
    return int(a > b) - int(a < b)


def compare_keys(a: Sequence[Any], b: Sequence[Any], keys: Sequence[KeyColumn]) -> int:
    """Tuple order with each column's direction and null order (nulls ignore direction)."""
    for x, y, key in zip(a, b, keys, strict=True):
        if x is None or y is None:
            if x is None and y is None:
                continue
            first = -1 if x is None else 1
            return first if key.null_order is FIRST else -first
        order = compare_values(x, y)
        if order:
            return order if key.direction is ASC else -order
    return 0


def same(a: Any, b: Any) -> bool:
    """Equal values of the same type, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b) or a != b:
        return False
    return not isinstance(a, dt.datetime) or a.tzinfo == b.tzinfo


def same_keys(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Keys of equal values, as :func:`same` has it."""
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


def sign(n: int) -> int:
    return (n > 0) - (n < 0)


def key_batch(schema: TableSchema, keys: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """A batch holding ``keys`` in the key columns and 0 in every other column."""
    columns = []
    for index, fld in enumerate(schema.columns):
        if index in schema.key_indices:
            position = schema.key_indices.index(index)
            columns.append(pa.array([k[position] for k in keys], fld.type))
        else:
            columns.append(pa.nulls(len(keys), fld.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema.columns)


@st.composite
def schema_and_keys(draw: st.DrawFn, max_keys: int = 8) -> tuple[TableSchema, list[Any]]:
    """A key schema and keys that often share values, so ties and shared prefixes occur."""
    schema = draw(key_schemas())
    keys = draw(st.lists(keys_for(schema), min_size=1, max_size=max_keys))
    width = len(schema.primary_key)
    mixed = [
        tuple(draw(st.sampled_from([k[i] for k in keys])) for i in range(width))
        for _ in range(draw(st.integers(0, 4)))
    ]
    return schema, keys + mixed


class TestPrefixSuccessor:
    """prefix_successor: the exclusive upper bound of a prefix scan."""

    @pytest.mark.parametrize(
        ("prefix", "successor"),
        [
            (b"\x00\x00\x00\x07", b"\x00\x00\x00\x08"),
            (b"a\xff\xff", b"b"),
            (b"\x00\xff", b"\x01"),
            (b"", None),
            (b"\xff\xff", None),
        ],
    )
    def test_examples(self, prefix: bytes, successor: bytes | None) -> None:
        """The last byte below 0xFF goes up by one and the 0xFF bytes after it go."""
        assert prefix_successor(prefix) == successor

    @PROPERTY
    @given(st.binary(max_size=4), st.binary(max_size=6))
    def test_bounds_exactly_the_prefixed_strings(self, prefix: bytes, other: bytes) -> None:
        """Every string with the prefix is below the successor; every greater other is not."""
        successor = prefix_successor(prefix)
        if successor is None:
            assert prefix.strip(b"\xff") == b""
            return
        assert prefix + other < successor
        if not other.startswith(prefix) and other > prefix:
            assert other >= successor


class TestKeyOrder:
    """KeyCodec.encode: byte order of keys is the order of the key tuples."""

    @PROPERTY
    @given(schema_and_keys())
    def test_byte_order_is_key_order(self, drawn: tuple[TableSchema, list[Any]]) -> None:
        """encode(a) < / == / > encode(b) exactly when a sorts before / ties / after b."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        encoded = [keycodec.encode(k) for k in keys]
        for (a, ea), (b, eb) in itertools.product(zip(keys, encoded, strict=True), repeat=2):
            expected = compare_keys(a, b, schema.primary_key)
            assert sign((ea > eb) - (ea < eb)) == expected, (a, b, ea.hex(), eb.hex())

    @PROPERTY
    @given(schema_and_keys())
    def test_sorting_bytes_sorts_keys(self, drawn: tuple[TableSchema, list[Any]]) -> None:
        """Keys sorted by their bytes are sorted by tuple order."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        by_bytes = sorted(keys, key=keycodec.encode)

        def compare(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
            return compare_keys(a, b, schema.primary_key)

        order = functools.cmp_to_key(compare)
        assert [order(k) for k in by_bytes] == sorted(order(k) for k in keys)

    @PROPERTY
    @given(schema_and_keys())
    def test_shorter_key_is_byte_prefix(self, drawn: tuple[TableSchema, list[Any]]) -> None:
        """encode(k[:i]) is a byte prefix of encode(k) for every i, encode(()) the table id."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        for key in keys:
            full = keycodec.encode(key)
            assert keycodec.encode(()) == schema.prefix
            for i in range(len(key) + 1):
                assert full.startswith(keycodec.encode(key[:i]))

    @pytest.mark.parametrize("dtype", [pa.float32(), pa.float64()])
    @pytest.mark.parametrize("direction", list(Direction))
    def test_negative_zero_is_zero(self, dtype: pa.DataType, direction: Direction) -> None:
        """-0.0 and 0.0 encode to the same bytes, which decode to 0.0."""
        keycodec = codec(dtype, direction=direction)
        assert keycodec.encode((-0.0,)) == keycodec.encode((0.0,))
        assert math.copysign(1.0, keycodec.decode(keycodec.encode((-0.0,)))[0]) == 1.0

    @pytest.mark.parametrize("dtype", [pa.float32(), pa.float64()])
    def test_nan_is_one_value_above_infinity(self, dtype: pa.DataType) -> None:
        """Every NaN encodes alike, above +inf; -inf < -1 < -tiny < 0 < tiny < 1 < inf."""
        keycodec = codec(dtype)
        negative_nan = struct.unpack(">d", bytes.fromhex("fff8000000000001"))[0]
        payload_nan = struct.unpack(">d", bytes.fromhex("7ff0000000000001"))[0]
        nans = {keycodec.encode((v,)) for v in (math.nan, -math.nan, negative_nan, payload_nan)}
        assert len(nans) == 1
        ordered = [-math.inf, -1.0, -1e-30, 0.0, 1e-30, 1.0, math.inf, math.nan]
        encoded = [keycodec.encode((v,)) for v in ordered]
        assert encoded == sorted(encoded)
        assert len(set(encoded)) == len(encoded)

    def test_descending_reverses(self) -> None:
        """A descending column sorts ints, strings and bytes in reverse."""
        cases: list[tuple[pa.DataType, list[Any]]] = [
            (pa.int64(), [-(2**63), -1, 0, 1, 2**63 - 1]),
            (pa.string(), ["", "a", "a\x00", "ab", "b"]),
            (pa.binary(), [b"", b"\x00", b"\x00\x00", b"\x00\xff", b"\xff"]),
        ]
        for dtype, values in cases:
            keycodec = codec(dtype, direction=DESC)
            encoded = [keycodec.encode((v,)) for v in values]
            assert encoded == sorted(encoded, reverse=True), dtype

    @pytest.mark.parametrize("direction", list(Direction))
    def test_nulls_first_and_last(self, direction: Direction) -> None:
        """Nulls FIRST sort below every value, LAST above, in both directions."""
        values = [-5, 0, 7]
        first = codec(pa.int32(), direction=direction, nulls=FIRST)
        last = codec(pa.int32(), direction=direction, nulls=LAST)
        assert all(first.encode((None,)) < first.encode((v,)) for v in values)
        assert all(last.encode((None,)) > last.encode((v,)) for v in values)

    @pytest.mark.parametrize(("direction", "reverse"), [(ASC, False), (DESC, True)])
    def test_string_prefixes(self, direction: Direction, reverse: bool) -> None:
        """Ascending, "a" < "a\\x00" < "ab": a string sorts before its extensions."""
        keycodec = codec(pa.string(), direction=direction)
        encoded = [keycodec.encode((v,)) for v in ["a", "a\x00", "ab"]]
        assert encoded == sorted(encoded, reverse=reverse)

    def test_layout_example(self) -> None:
        """Key (42, "ab") of table 7: table id, 01 then 42 sign-flipped, 01 "ab" 00 01."""
        keycodec = codec(pa.int64(), pa.string())
        assert keycodec.encode((42, "ab")).hex(" ") == (
            "00 00 00 07 01 80 00 00 00 00 00 00 2a 01 61 62 00 01"
        )

    def test_null_layout(self) -> None:
        """A null is its marker, then zeros for a fixed width; the marker is not inverted."""
        asc_first = codec(pa.int16(), pa.string(), nulls=FIRST)
        desc_last = codec(pa.int16(), pa.string(), direction=DESC, nulls=LAST)
        assert asc_first.encode((None, None)).hex() == "00000007" + "000000" + "00"
        assert desc_last.encode((None, None)).hex() == "00000007" + "010000" + "01"
        assert desc_last.encode((1, "")).hex() == "00000007" + "007ffe" + "00fffe"

    @pytest.mark.parametrize(
        ("dtype", "integer", "value"),
        [
            (pa.date32(), 1, dt.date(1970, 1, 2)),
            (pa.timestamp("ms"), 1500, dt.datetime(1970, 1, 1, 0, 0, 1, 500_000)),
            (pa.timestamp("s", tz="UTC"), 60, dt.datetime(1970, 1, 1, 0, 1, tzinfo=dt.UTC)),
            (pa.decimal128(6, 2), 12, decimal.Decimal("12.00")),
        ],
    )
    def test_accepts_ints(self, dtype: pa.DataType, integer: int, value: Any) -> None:
        """An int is days (date32), a count of the unit (timestamp) or a whole number (decimal)."""
        keycodec = codec(dtype)
        assert keycodec.encode((integer,)) == keycodec.encode((value,))

    def test_accepts_numpy_and_pandas_scalars(self) -> None:
        """numpy numbers and bools, bytearray and pandas.Timestamp encode like the plain values."""
        pd = pytest.importorskip("pandas")
        cases = [
            (pa.int64(), np.int64(5), 5),
            (pa.float32(), np.float32(1.5), 1.5),
            (pa.float64(), np.float64(-0.0), 0.0),
            (pa.float64(), 3, 3.0),
            (pa.bool_(), np.bool_(True), True),
            (pa.binary(), bytearray(b"x"), b"x"),
            (pa.timestamp("us"), pd.Timestamp("2024-03-01 12:00"), dt.datetime(2024, 3, 1, 12)),
            (pa.timestamp("ns", tz="UTC"), pd.Timestamp(5, tz="UTC"), 5),
        ]
        for dtype, value, plain in cases:
            keycodec = codec(dtype)
            assert keycodec.encode((value,)) == keycodec.encode((plain,)), dtype

    def test_time_zone_keeps_the_instant(self) -> None:
        """The same instant in two time zones encodes alike; decode gives the column's zone."""
        keycodec = codec(pa.timestamp("us", tz="Europe/Paris"))
        utc = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
        tokyo = utc.astimezone(dt.timezone(dt.timedelta(hours=9)))
        assert keycodec.encode((utc,)) == keycodec.encode((tokyo,))
        (decoded,) = keycodec.decode(keycodec.encode((tokyo,)))
        assert decoded == utc
        assert str(decoded.tzinfo) == "Europe/Paris"


class TestRoundTrip:
    """KeyCodec.decode / decode_prefix: the inverse of encode."""

    @PROPERTY
    @given(schema_and_keys(max_keys=3))
    def test_decode_inverts_encode(self, drawn: tuple[TableSchema, list[Any]]) -> None:
        """decode(encode(k)) == k, with -0.0 read back as 0.0 and NaN as NaN."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        for key in keys:
            assert same_keys(keycodec.decode(keycodec.encode(key)), key)

    @PROPERTY
    @given(schema_and_keys(max_keys=3))
    def test_values_are_what_to_pylist_gives(self, drawn: tuple[TableSchema, list[Any]]) -> None:
        """Each decoded value equals, with type and time zone, pyarrow's to_pylist of it."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        for key in keys:
            decoded = keycodec.decode(keycodec.encode(key))
            for value, dtype in zip(decoded, schema.key_types, strict=True):
                assert same(value, pa.array([value], dtype).to_pylist()[0])

    @PROPERTY
    @given(schema_and_keys(max_keys=3), st.binary(max_size=4))
    def test_decode_prefix_reports_length(
        self, drawn: tuple[TableSchema, list[Any]], suffix: bytes
    ) -> None:
        """decode_prefix reads the key from the front of longer bytes and says where it ends."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        for key in keys:
            encoded = keycodec.encode(key)
            decoded, end = keycodec.decode_prefix(encoded + suffix)
            assert end == len(encoded)
            assert same_keys(decoded, key)


class TestEncodeErrors:
    """KeyCodec.encode rejects what does not fit the key columns."""

    @pytest.mark.parametrize(
        ("dtype", "value", "fragment"),
        [
            (pa.int8(), 300, "in -128..127"),
            (pa.uint8(), -1, "in 0..255"),
            (pa.int64(), 2**63, "in -9223372036854775808..9223372036854775807"),
            (pa.int64(), "x", "expects an int"),
            (pa.int64(), 1.5, "expects an int"),
            (pa.int64(), True, "expects an int"),
            (pa.float64(), "1.0", "expects a float"),
            (pa.float32(), 1e39, "float within float's range"),
            (pa.bool_(), 1, "expects a bool"),
            (pa.string(), b"x", "expects a str"),
            (pa.string(), "\ud800", "UTF-8"),
            (pa.binary(), "x", "expects bytes"),
            (pa.date32(), dt.datetime(2020, 1, 1), "datetime.date"),
            (pa.date32(), 10**7, "datetime.date or an int"),
            (pa.timestamp("us"), dt.datetime(2020, 1, 1, tzinfo=dt.UTC), "a naive datetime"),
            (pa.timestamp("us", tz="UTC"), dt.datetime(2020, 1, 1), "an aware datetime"),
            (pa.timestamp("s"), dt.datetime(2020, 1, 1, 0, 0, 0, 5), "no precision finer than s"),
            (pa.timestamp("us"), 2**62, "in "),
            (pa.timestamp("us"), dt.date(2020, 1, 1), "datetime.datetime"),
            (pa.decimal128(5, 2), decimal.Decimal("1.234"), "2 after the point"),
            (pa.decimal128(5, 2), decimal.Decimal("1000"), "at most 5 digits"),
            (pa.decimal128(5, 2), decimal.Decimal("NaN"), "finite"),
            (pa.decimal128(5, 2), 1.5, "decimal.Decimal or an int"),
            (pa.null(), 0, "None"),
        ],
    )
    def test_value_does_not_fit(self, dtype: pa.DataType, value: Any, fragment: str) -> None:
        """A wrong type or range is an EncodingError naming column, expectation, value."""
        keycodec = codec(pa.int32(), dtype)
        with pytest.raises(EncodingError) as info:
            keycodec.encode((1, value))
        message = str(info.value)
        assert fragment in message
        assert "'k1'" in message and repr(value) in message

    def test_too_many_values(self) -> None:
        """More values than key columns is an EncodingError that names the key columns."""
        with pytest.raises(EncodingError, match=r"2 key columns \['k0', 'k1'\], got 3"):
            codec(pa.int64(), pa.int64()).encode((1, 2, 3))

    def test_null_in_non_nullable_column(self) -> None:
        """None in a column whose field is not nullable is an EncodingError."""
        with pytest.raises(EncodingError, match=r"'k0'.*not nullable"):
            codec(pa.string(), nullable=False).encode((None,))

    def test_not_a_sequence(self) -> None:
        """A key that is not a sequence is an EncodingError."""
        with pytest.raises(EncodingError, match="sequence"):
            codec(pa.int64()).encode(5)  # type: ignore[arg-type]


class TestDecodeErrors:
    """KeyCodec.decode rejects bytes that encode did not write."""

    @PROPERTY
    @given(schema_and_keys(max_keys=2))
    def test_truncated(self, drawn: tuple[TableSchema, list[Any]]) -> None:
        """Every proper prefix of a full key is a DecodingError, one by one and in a batch."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        for key in keys:
            encoded = keycodec.encode(key)
            for end in range(len(encoded)):
                with pytest.raises(DecodingError):
                    keycodec.decode(encoded[:end])
                with pytest.raises(DecodingError):
                    keycodec.decode_batch([encoded, encoded[:end]])

    def test_wrong_table(self) -> None:
        """A key of another table is a DecodingError naming both table ids."""
        key = codec(pa.int64(), table_id=8).encode((1,))
        for decode in (codec(pa.int64()).decode, lambda k: codec(pa.int64()).decode_batch([k])):
            with pytest.raises(DecodingError, match=r"table id 8.*id 7"):
                decode(key)

    def test_trailing_bytes(self) -> None:
        """Bytes after the last column are a DecodingError for decode, not decode_prefix."""
        keycodec = codec(pa.int64())
        key = keycodec.encode((1,)) + b"\x00\x03"
        assert keycodec.decode_prefix(key) == ((1,), len(key) - 2)
        with pytest.raises(DecodingError, match="after its last column"):
            keycodec.decode(key)
        with pytest.raises(DecodingError, match="after its last column"):
            keycodec.decode_batch([key])

    @pytest.mark.parametrize(
        ("dtype", "body"),
        [
            (pa.int64(), "05" + "00" * 8),  # no such marker
            (pa.int64(), "00" + "00" * 7 + "01"),  # a null with padding
            (pa.bool_(), "0102"),  # a bool byte of 2
            (pa.string(), "01" + "6100" + "41" + "0001"),  # 0x00 not escaped
            (pa.string(), "01" + "ff" + "0001"),  # not UTF-8
            (pa.binary(), "01" + "61"),  # no terminator
            (pa.null(), "01"),  # the null type holds only nulls
        ],
    )
    def test_corrupt(self, dtype: pa.DataType, body: str) -> None:
        """Bytes encode never writes are a DecodingError, one by one and in a batch."""
        keycodec = codec(dtype)
        key = keycodec.prefix + bytes.fromhex(body)
        with pytest.raises(DecodingError):
            keycodec.decode(key)
        with pytest.raises(DecodingError):
            keycodec.decode_batch([key])

    def test_null_in_non_nullable_column(self) -> None:
        """A null marker in a column that is not nullable is a DecodingError."""
        key = codec(pa.int64()).encode((None,))
        with pytest.raises(DecodingError):
            codec(pa.int64(), nullable=False).decode(key)
        with pytest.raises(DecodingError):
            codec(pa.int64(), nullable=False).decode_batch([key])


class TestEncodeBatch:
    """KeyCodec.encode_batch: the bytes of encode for every row, without per-row Python."""

    @PROPERTY
    @given(st.data())
    def test_same_as_encode_per_row(self, data: st.DataObject) -> None:
        """Batch bytes equal per-row bytes, for whole, sliced and chunked batches."""
        schema = data.draw(table_schemas())
        rows = data.draw(st.lists(rows_for(schema), max_size=12))
        keycodec = KeyCodec(schema)
        expected = [keycodec.encode(schema.key_of(row)) for row in rows]
        records = [dict(zip(schema.columns.names, row, strict=True)) for row in rows]
        batch = pa.RecordBatch.from_pylist(records, schema=schema.columns)
        assert keycodec.encode_batch(batch) == expected
        assert keycodec.encode_batch(batch.slice(1)) == expected[1:]
        table = pa.Table.from_batches([batch.slice(0, 2), batch.slice(2)], schema=schema.columns)
        assert keycodec.encode_batch(table) == expected
        # The same as one Arrow array, whatever the input's chunks, sorting
        # as the keys do.
        arrow = keycodec.encode_arrow(table)
        assert isinstance(arrow, pa.Array) and arrow.to_pylist() == expected
        ordered = arrow.take(pc.sort_indices(arrow)).to_pylist()
        assert ordered == sorted(expected)

    @PROPERTY
    @given(schema_and_keys())
    def test_same_as_encode_for_every_key_type(self, drawn: tuple[TableSchema, list[Any]]) -> None:
        """Batch bytes equal per-row bytes for the large, ns and decimal types too."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        batch = key_batch(schema, keys)
        assert keycodec.encode_batch(batch) == [keycodec.encode(k) for k in keys]
        assert keycodec.encode_batch(batch.slice(1)) == [keycodec.encode(k) for k in keys[1:]]

    def test_columns_found_by_name(self) -> None:
        """Key columns are looked up by name; other columns and column order do not matter."""
        keycodec = codec(pa.int64(), pa.string())
        batch = pa.RecordBatch.from_pydict(
            {"other": [1.0], "k1": ["x"], "k0": [5]},
            schema=pa.schema([("other", pa.float64()), ("k1", pa.string()), ("k0", pa.int64())]),
        )
        assert keycodec.encode_batch(batch) == [keycodec.encode((5, "x"))]

    def test_empty(self) -> None:
        """An empty batch has no keys."""
        batch = pa.RecordBatch.from_pydict({"k0": pa.array([], pa.string())})
        assert codec(pa.string()).encode_batch(batch) == []

    def test_missing_column(self) -> None:
        """A batch without a key column is an EncodingError naming it and the batch's columns."""
        with pytest.raises(EncodingError, match=r"'k0'.*missing.*\['x'\]"):
            codec(pa.int64()).encode_batch(pa.RecordBatch.from_pydict({"x": [1]}))

    def test_other_type(self) -> None:
        """A key column of another (even castable) type is an EncodingError naming both."""
        batch = pa.RecordBatch.from_pydict({"k0": pa.array([1], pa.int32())})
        with pytest.raises(EncodingError, match=r"has type int32 .*cast it to int64"):
            codec(pa.int64()).encode_batch(batch)

    def test_nulls_in_non_nullable_column(self) -> None:
        """Nulls in a batch column whose key field is not nullable are an EncodingError."""
        for dtype in (pa.int64(), pa.string()):
            batch = pa.RecordBatch.from_pydict({"k0": pa.array([None], dtype)})
            with pytest.raises(EncodingError, match="not nullable"):
                codec(dtype, nullable=False).encode_batch(batch)

    def test_out_of_range_dates(self) -> None:
        """A date32 or timestamp that decode could not return is rejected, as by encode."""
        for dtype, storage, number in [
            (pa.date32(), pa.int32(), 2**31 - 1),
            (pa.timestamp("s"), pa.int64(), 2**62),
        ]:
            batch = pa.RecordBatch.from_arrays([pa.array([number], storage).view(dtype)], ["k0"])
            with pytest.raises(EncodingError, match="'k0'"):
                codec(dtype).encode_batch(batch)


class TestDecodeBatch:
    """KeyCodec.decode_batch: key columns of many keys as Arrow arrays."""

    @PROPERTY
    @given(schema_and_keys())
    def test_inverts_encode(self, drawn: tuple[TableSchema, list[Any]]) -> None:
        """Each column equals the column of the keys, typed as the schema, and decode's values."""
        schema, keys = drawn
        keycodec = KeyCodec(schema)
        encoded = [keycodec.encode(k) for k in keys]
        columns = keycodec.decode_batch(encoded)
        assert [c.type for c in columns] == list(schema.key_types)
        rows = list(zip(*(c.to_pylist() for c in columns), strict=True))
        assert all(same_keys(row, key) for row, key in zip(rows, keys, strict=True))
        decoded = [keycodec.decode(e) for e in encoded]
        assert all(same_keys(row, key) for row, key in zip(rows, decoded, strict=True))

    def test_empty(self) -> None:
        """No keys give empty columns of the schema's types."""
        columns = codec(pa.int64(), pa.string()).decode_batch([])
        assert [(len(c), c.type) for c in columns] == [(0, pa.int64()), (0, pa.string())]
