"""Tests for the row and cell value layouts (RowCodec, CellCodec)."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from encoding import (
    FORMAT_VERSION,
    CellCodec,
    DecodingError,
    EncodingError,
    RowCodec,
    TableSchema,
)
from tests.strategies import (
    SUPPORTED_TYPES,
    bad_values_of,
    rows_for,
    table_schemas,
)

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

UTC = dt.UTC


def same(a: Any, b: Any) -> bool:
    """Equal values of the same type; NaN equals NaN, and 0.0 is not -0.0."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return struct.pack("<d", a) == struct.pack("<d", b)
    return type(a) is type(b) and bool(a == b)


def same_rows(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


def schema_of(*fields: pa.Field, key: tuple[str, ...] = ("k",), layout: str = "row") -> TableSchema:
    return TableSchema(7, list(fields), list(key), layout, name="t")


def batch_of(schema: TableSchema, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    arrays = [
        pa.array([row[i] for row in rows], type=field.type)
        for i, field in enumerate(schema.columns)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema.columns)


@st.composite
def schema_and_row(draw: st.DrawFn) -> tuple[TableSchema, tuple[Any, ...]]:
    schema = draw(table_schemas())
    return schema, draw(rows_for(schema))


@st.composite
def schema_and_rows(draw: st.DrawFn) -> tuple[TableSchema, list[tuple[Any, ...]]]:
    schema = draw(table_schemas())
    return schema, draw(st.lists(rows_for(schema), max_size=12))


@st.composite
def schema_and_bad_row(draw: st.DrawFn) -> tuple[TableSchema, tuple[Any, ...], int]:
    """A row with one value that does not fit its column, and that column."""
    schema, row = draw(schema_and_row())
    index = draw(st.integers(0, len(row) - 1))
    field = schema.columns.field(index)
    bad = draw(
        bad_values_of(field.type) if field.nullable else st.none() | bad_values_of(field.type)
    )
    return schema, (*row[:index], bad, *row[index + 1 :]), index


@st.composite
def evolved(draw: st.DrawFn) -> tuple[TableSchema, TableSchema, tuple[Any, ...]]:
    """A schema, the same with nullable columns added at the end, and a row of the first."""
    old, row = draw(schema_and_row())
    added = draw(st.lists(st.sampled_from(SUPPORTED_TYPES), min_size=1, max_size=3))
    fields = list(old.columns) + [pa.field(f"new{i}", t) for i, t in enumerate(added)]
    return old, old.with_columns(pa.schema(fields)), row


FOUR = schema_of(
    pa.field("k", pa.int64(), nullable=False),
    pa.field("qty", pa.int64()),
    pa.field("price", pa.float64()),
    pa.field("name", pa.string()),
)


class TestRowCodec:
    """RowCodec.encode / decode / validate: the whole row in one value."""

    @PROPERTY
    @given(schema_and_row())
    def test_round_trip(self, case: tuple[TableSchema, tuple[Any, ...]]) -> None:
        """decode(encode(row)) gives the row back, for every type and nullability."""
        schema, row = case
        codec = RowCodec(schema)
        assert same_rows(codec.decode(codec.encode(row)), row)

    @PROPERTY
    @given(schema_and_row())
    def test_decodes_to_the_to_pylist_form(self, case: tuple[TableSchema, tuple[Any, ...]]) -> None:
        """Each decoded value is what pyarrow's to_pylist gives for it, to the repr."""
        schema, row = case
        decoded = RowCodec(schema).decode(RowCodec(schema).encode(row))
        for value, got, field in zip(row, decoded, schema.columns, strict=True):
            want = pa.array([value], type=field.type).to_pylist()[0]
            if isinstance(want, float):
                assert same(got, want)
            else:
                assert repr(got) == repr(want)

    @PROPERTY
    @given(schema_and_row())
    def test_value_begins_with_the_format_version(
        self, case: tuple[TableSchema, tuple[Any, ...]]
    ) -> None:
        """Every value begins with FORMAT_VERSION and then the column count."""
        schema, row = case
        value = RowCodec(schema).encode(row)
        assert value[0] == FORMAT_VERSION == 1
        assert int.from_bytes(value[1:3], "little") == len(row)

    def test_byte_layout(self) -> None:
        """The documented bytes of a concrete row (docs/encoding.md)."""
        codec = RowCodec(FOUR)
        assert codec.encode((7, None, 2.5, "hé")).hex(" ") == (
            "01 04 00 02 07 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
            " 00 00 00 00 00 00 04 40 03 00 00 00 68 c3 a9"
        )

    def test_byte_layout_of_converted_types(self) -> None:
        """The documented bytes of a row with a date, timestamp, decimals, bool and binary."""
        schema = schema_of(
            pa.field("k", pa.int64(), nullable=False),
            pa.field("placed", pa.date32()),
            pa.field("at", pa.timestamp("us", tz="UTC")),
            pa.field("amount", pa.decimal128(10, 2)),
            pa.field("big", pa.decimal128(38, 6)),
            pa.field("paid", pa.bool_()),
            pa.field("note", pa.string()),
            pa.field("tag", pa.binary()),
        )
        row = (
            42,
            dt.date(2024, 5, 17),
            dt.datetime(2024, 5, 17, 12, 30, tzinfo=UTC),
            decimal.Decimal("19.99"),
            decimal.Decimal("-1.5"),
            True,
            None,
            b"\x00\xff",
        )
        assert RowCodec(schema).encode(row).hex(" ") == (
            "01 08 00 40 2a 00 00 00 00 00 00 00 94 4d 00 00 00 02 99 82 a5 18 06 00"
            " cf 07 00 00 00 00 00 00 a0 1c e9 ff ff ff ff ff ff ff ff ff ff ff ff ff"
            " 01 00 00 00 00 02 00 00 00 00 ff"
        )

    def test_nulls_are_zeros_under_the_bitmap(self) -> None:
        """A null fixed field is written as zeros and a null var field as length 0."""
        value = RowCodec(FOUR).encode((1, None, None, None))
        assert value[3] == 0b1110
        assert value[12:] == bytes(20)

    def test_accepts_ints_for_dates_timestamps_and_decimals(self) -> None:
        """An int is a day count, a count of the unit, or a decimal's value."""
        schema = schema_of(
            pa.field("k", pa.int8()),
            pa.field("d", pa.date32()),
            pa.field("t", pa.timestamp("ms", tz="UTC")),
            pa.field("m", pa.decimal128(10, 2)),
            pa.field("f", pa.float64()),
        )
        codec = RowCodec(schema)
        row = codec.decode(codec.encode((1, 1, 1500, 12, 3)))
        assert row[1] == dt.date(1970, 1, 2)
        assert row[2] == dt.datetime(1970, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)
        assert repr(row[3]) == "Decimal('12.00')"
        assert same(row[4], 3.0)

    def test_aware_and_naive_datetimes_are_the_same_instant(self) -> None:
        """A naive datetime means UTC; an aware one is converted to UTC."""
        codec = RowCodec(schema_of(pa.field("k", pa.timestamp("us"))))
        naive = codec.encode((dt.datetime(2024, 1, 1, 12),))
        paris = dt.datetime(2024, 1, 1, 13, tzinfo=dt.timezone(dt.timedelta(hours=1)))
        assert codec.encode((paris,)) == naive

    def test_nan_is_canonical_and_negative_zero_kept(self) -> None:
        """Every NaN is stored as the one quiet NaN; -0.0 stays -0.0."""
        codec = RowCodec(schema_of(pa.field("k", pa.float64()), pa.field("g", pa.float32())))
        other_nan = struct.unpack("<d", bytes.fromhex("0100000000f8ffff"))[0]
        assert codec.encode((other_nan, other_nan)) == codec.encode((math.nan, math.nan))
        assert str(codec.decode(codec.encode((-0.0, -0.0)))) == "(-0.0, -0.0)"

    def test_large_bitmaps(self) -> None:
        """Tables of 9 to 200 columns keep their nulls apart."""
        for n in (9, 16, 17, 24, 40, 64, 65, 200):
            schema = schema_of(
                *[pa.field("k" if i == 0 else f"c{i}", pa.int16()) for i in range(n)]
            )
            codec = RowCodec(schema)
            row = tuple(None if i % 3 == 1 else i for i in range(n))
            assert codec.decode(codec.encode(row)) == row
            full = tuple(range(n))
            assert codec.decode(codec.encode(full)) == full

    @pytest.mark.parametrize(
        ("field", "value", "expected"),
        [
            (pa.int8(), 300, "expected an integer in -128..127, got 300 (int)"),
            (pa.int64(), "x", "got 'x' (str)"),
            (pa.int64(), 1.5, "got 1.5 (float)"),
            (pa.int64(), 2.0, "got 2.0 (float)"),
            (pa.int32(), True, "got True (bool)"),
            (pa.uint8(), -1, "expected an integer in 0..255, got -1 (int)"),
            (pa.float64(), "1.0", "expected a float, got '1.0' (str)"),
            (pa.float32(), 1e300, "float32 range"),
            (pa.bool_(), 1, "expected a bool, got 1 (int)"),
            (pa.string(), b"x", "expected a str, got b'x' (bytes)"),
            (pa.string(), "\ud800", "UTF-8"),
            (pa.binary(), "x", "expected bytes, got 'x' (str)"),
            (pa.date32(), dt.datetime(2020, 1, 1), "(datetime)"),
            (pa.timestamp("s"), dt.datetime(2020, 1, 1, 0, 0, 0, 5), "fraction of a s"),
            (pa.timestamp("us"), dt.date(2020, 1, 1), "(date)"),
            (pa.decimal128(5, 2), decimal.Decimal("1.234"), "2 after the point"),
            (pa.decimal128(5, 2), decimal.Decimal("1234"), "at most 5 digits"),
            (pa.decimal128(5, 2), 1.5, "got 1.5 (float)"),
            (pa.null(), 0, "expected None"),
        ],
    )
    def test_bad_value_message(self, field: pa.DataType, value: Any, expected: str) -> None:
        """A value of the wrong type or range names the column, what was expected, what came."""
        codec = RowCodec(schema_of(pa.field("k", pa.int64()), pa.field("col", field)))
        with pytest.raises(EncodingError, match="column 'col'") as info:
            codec.encode((1, value))
        assert expected in str(info.value)
        assert "expected" in str(info.value)
        with pytest.raises(EncodingError, match="column 'col'"):
            codec.validate((1, value))

    def test_none_in_non_nullable_column(self) -> None:
        """None in a column with nullable=False raises, naming the column."""
        with pytest.raises(EncodingError, match=r"column 'k' \(int64\) is not nullable; got None"):
            RowCodec(FOUR).encode((None, 1, 1.0, "x"))

    @PROPERTY
    @given(schema_and_row(), st.integers(-3, 3).filter(bool))
    def test_wrong_length(self, case: tuple[TableSchema, tuple[Any, ...]], change: int) -> None:
        """A row with too few or too many values raises EncodingError naming the counts."""
        schema, row = case
        wrong = row[:change] if change < 0 else row + (None,) * change
        with pytest.raises(EncodingError, match=f"has {len(row)} values"):
            RowCodec(schema).encode(wrong)
        with pytest.raises(EncodingError, match=f"has {len(row)} values"):
            RowCodec(schema).validate(wrong)

    @PROPERTY
    @given(schema_and_bad_row())
    def test_bad_value(self, case: tuple[TableSchema, tuple[Any, ...], int]) -> None:
        """Any value that does not fit its column raises EncodingError naming the column."""
        schema, row, index = case
        name = schema.columns.field(index).name
        codec = RowCodec(schema)
        with pytest.raises(EncodingError, match=f"column '{name}'"):
            codec.encode(row)
        with pytest.raises(EncodingError, match=f"column '{name}'"):
            codec.validate(row)

    @PROPERTY
    @given(schema_and_row())
    def test_validate_accepts_what_encode_accepts(
        self, case: tuple[TableSchema, tuple[Any, ...]]
    ) -> None:
        """validate() passes every row that encode() takes."""
        schema, row = case
        RowCodec(schema).validate(row)

    @PROPERTY
    @given(schema_and_row())
    def test_truncated_value(self, case: tuple[TableSchema, tuple[Any, ...]]) -> None:
        """Every proper prefix of a value raises DecodingError."""
        schema, row = case
        codec = RowCodec(schema)
        value = codec.encode(row)
        for end in range(len(value)):
            with pytest.raises(DecodingError):
                codec.decode(value[:end])

    @PROPERTY
    @given(schema_and_row(), st.binary(min_size=1, max_size=4))
    def test_trailing_bytes(self, case: tuple[TableSchema, tuple[Any, ...]], extra: bytes) -> None:
        """A value with bytes after its end raises DecodingError."""
        schema, row = case
        codec = RowCodec(schema)
        with pytest.raises(DecodingError, match="trailing bytes"):
            codec.decode(codec.encode(row) + extra)

    @PROPERTY
    @given(schema_and_row(), st.integers(0, 255).filter(lambda v: v != FORMAT_VERSION))
    def test_unknown_version(self, case: tuple[TableSchema, tuple[Any, ...]], version: int) -> None:
        """A value whose first byte is not FORMAT_VERSION raises DecodingError."""
        schema, row = case
        codec = RowCodec(schema)
        value = codec.encode(row)
        with pytest.raises(DecodingError, match=f"format version {version}"):
            codec.decode(bytes([version]) + value[1:])

    def test_corrupt_utf8(self) -> None:
        """A string field that is not UTF-8 raises DecodingError naming the column."""
        value = bytearray(RowCodec(FOUR).encode((1, 2, 3.0, "ab")))
        value[-1] = 0xFF
        with pytest.raises(DecodingError, match="column 'name'"):
            RowCodec(FOUR).decode(bytes(value))

    def test_corrupt_date_and_decimal(self) -> None:
        """A stored date outside Python's range, or a decimal past its precision, raises."""
        schema = schema_of(pa.field("k", pa.date32()), pa.field("m", pa.decimal128(3, 1)))
        codec = RowCodec(schema)
        header = codec.encode((dt.date(2000, 1, 1), decimal.Decimal("1.5")))[:4]
        with pytest.raises(DecodingError, match="column 'k'"):
            codec.decode(header + struct.pack("<iq", 2**31 - 1, 15))
        with pytest.raises(DecodingError, match="column 'm'"):
            codec.decode(header + struct.pack("<iq", 0, 1000))

    def test_value_of_a_newer_schema(self) -> None:
        """A value holding more columns than the schema raises DecodingError."""
        wider = FOUR.with_columns(pa.schema([*FOUR.columns, pa.field("extra", pa.int8())]))
        value = RowCodec(wider).encode((1, 2, 3.0, "x", 4))
        with pytest.raises(DecodingError, match="holds 5 columns, the table has 4"):
            RowCodec(FOUR).decode(value)

    def test_nanosecond_timestamps(self) -> None:
        """ns timestamps keep their nanoseconds and decode as to_pylist does."""
        t = pa.timestamp("ns", tz="UTC")
        codec = RowCodec(schema_of(pa.field("k", t)))
        stamp = pa.scalar(1_700_000_000_123_456_789, t).as_py()
        assert codec.decode(codec.encode((stamp,))) == (stamp,)
        assert codec.encode((stamp,)) == codec.encode((1_700_000_000_123_456_789,))


class TestSchemaEvolution:
    """Values written under a schema decode under that schema with columns added."""

    @PROPERTY
    @given(evolved())
    def test_row_value_of_an_older_schema(
        self, case: tuple[TableSchema, TableSchema, tuple[Any, ...]]
    ) -> None:
        """An older row value decodes with None for the added columns."""
        old, new, row = case
        added = len(new.columns) - len(old.columns)
        value = RowCodec(old).encode(row)
        assert same_rows(RowCodec(new).decode(value), row + (None,) * added)

    @PROPERTY
    @given(evolved())
    def test_batch_of_older_and_newer_values(
        self, case: tuple[TableSchema, TableSchema, tuple[Any, ...]]
    ) -> None:
        """decode_batch takes older and current values side by side."""
        old, new, row = case
        added = len(new.columns) - len(old.columns)
        codec = RowCodec(new)
        values = [RowCodec(old).encode(row), codec.encode(row + (None,) * added)]
        got = [tuple(r.values()) for r in codec.decode_batch(values).to_pylist()]
        assert all(same_rows(g, row + (None,) * added) for g in got)

    @PROPERTY
    @given(evolved())
    def test_cells_of_an_older_schema(
        self, case: tuple[TableSchema, TableSchema, tuple[Any, ...]]
    ) -> None:
        """Older cells (or an older marker cell) decode with None for the added columns."""
        old, new, row = case
        added = len(new.columns) - len(old.columns)
        cells = CellCodec(old).encode(row)
        got = CellCodec(new).decode(old.key_of(row), cells)
        assert same_rows(got, row + (None,) * added)


class TestRowCodecBatch:
    """RowCodec.encode_batch / decode_batch: many rows through Arrow."""

    @PROPERTY
    @given(schema_and_rows())
    def test_encode_batch_is_encode_per_row(
        self, case: tuple[TableSchema, list[tuple[Any, ...]]]
    ) -> None:
        """encode_batch gives the same bytes as encode() row by row."""
        schema, rows = case
        codec = RowCodec(schema)
        batch = batch_of(schema, rows)
        per_row = [codec.encode(tuple(r.values())) for r in batch.to_pylist()]
        assert codec.encode_batch(batch) == per_row

    @PROPERTY
    @given(schema_and_rows())
    def test_decode_batch_is_decode_per_row(
        self, case: tuple[TableSchema, list[tuple[Any, ...]]]
    ) -> None:
        """decode_batch gives the rows decode() gives, with the table's Arrow schema."""
        schema, rows = case
        codec = RowCodec(schema)
        values = [codec.encode(row) for row in rows]
        batch = codec.decode_batch(values)
        assert batch.schema == schema.columns
        got = [tuple(r.values()) for r in batch.to_pylist()]
        assert len(got) == len(rows)
        assert all(same_rows(g, codec.decode(v)) for g, v in zip(got, values, strict=True))

    @PROPERTY
    @given(schema_and_rows())
    def test_batch_round_trip(self, case: tuple[TableSchema, list[tuple[Any, ...]]]) -> None:
        """decode_batch(encode_batch(batch)) equals the batch."""
        schema, rows = case
        codec = RowCodec(schema)
        batch = batch_of(schema, rows)
        back = codec.decode_batch(codec.encode_batch(batch))
        want = [tuple(r.values()) for r in batch.to_pylist()]
        got = [tuple(r.values()) for r in back.to_pylist()]
        assert all(same_rows(g, w) for g, w in zip(got, want, strict=True))

    def test_table_with_chunks(self) -> None:
        """A chunked Table encodes like the rows it holds."""
        rows = [(i, i * 2, i / 2, f"n{i}") for i in range(5)]
        table = pa.Table.from_batches([batch_of(FOUR, rows[:2]), batch_of(FOUR, rows[2:])])
        codec = RowCodec(FOUR)
        assert codec.encode_batch(table) == [codec.encode(r) for r in rows]

    def test_columns_found_by_name(self) -> None:
        """Columns are looked up by name; order and extra columns do not matter."""
        batch = pa.RecordBatch.from_pydict(
            {"name": ["a"], "other": [0], "price": [1.5], "qty": [2], "k": [1]}
        )
        codec = RowCodec(FOUR)
        assert codec.encode_batch(batch) == [codec.encode((1, 2, 1.5, "a"))]

    def test_compatible_types_are_cast(self) -> None:
        """Narrower ints, large strings and other time zones are cast to the column type."""
        schema = schema_of(
            pa.field("k", pa.int64()),
            pa.field("s", pa.string()),
            pa.field("t", pa.timestamp("us", tz="UTC")),
            pa.field("f", pa.float64()),
        )
        stamp = dt.datetime(2024, 1, 1, tzinfo=UTC)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([5], pa.int8()),
                pa.array(["x"], pa.large_string()),
                pa.array([stamp], pa.timestamp("us", tz="Asia/Tokyo")),
                pa.array([3], pa.int32()),
            ],
            names=["k", "s", "t", "f"],
        )
        codec = RowCodec(schema)
        assert codec.encode_batch(batch) == [codec.encode((5, "x", stamp, 3.0))]

    @pytest.mark.parametrize(
        ("array", "message"),
        [
            (pa.array([1.0]), "expected int64 values, the batch has double"),
            (pa.array([True]), "expected int64 values, the batch has bool"),
            (pa.array(["1"]), "expected int64 values, the batch has string"),
            (pa.array([2**63], pa.uint64()), "does not fit"),
        ],
    )
    def test_incompatible_type(self, array: pa.Array, message: str) -> None:
        """A column that encode() would refuse raises EncodingError naming it."""
        batch = pa.RecordBatch.from_arrays(
            [array, pa.array([1]), pa.array([1.0]), pa.array(["x"])],
            names=["k", "qty", "price", "name"],
        )
        with pytest.raises(EncodingError, match=f"column 'k' .*{message}"):
            RowCodec(FOUR).encode_batch(batch)

    def test_missing_column(self) -> None:
        """A batch without one of the table's columns raises EncodingError naming it."""
        batch = pa.RecordBatch.from_pydict({"k": [1], "qty": [1], "price": [1.0]})
        with pytest.raises(EncodingError, match="no column 'name'"):
            RowCodec(FOUR).encode_batch(batch)

    def test_null_in_non_nullable_column(self) -> None:
        """A null in a non-nullable column raises EncodingError naming it."""
        batch = pa.RecordBatch.from_pydict(
            {"k": [1, None], "qty": [1, 2], "price": [1.0, 2.0], "name": ["a", "b"]}
        )
        with pytest.raises(EncodingError, match=r"column 'k' .* not nullable"):
            RowCodec(FOUR).encode_batch(batch)

    def test_date_out_of_python_range(self) -> None:
        """Dates and timestamps that Python cannot hold are refused, as encode() does."""
        schema = schema_of(pa.field("k", pa.date32()))
        batch = pa.RecordBatch.from_arrays([pa.array([2**31 - 1], pa.date32())], names=["k"])
        with pytest.raises(EncodingError, match="column 'k'"):
            RowCodec(schema).encode_batch(batch)

    @pytest.mark.parametrize(
        "damage",
        [
            lambda v: v[:-1],
            lambda v: v + b"\x00",
            lambda v: b"\x02" + v[1:],
            lambda v: v[:2],
            lambda v: v[:-2] + b"\xff\xfe",
        ],
    )
    def test_corrupt_value_in_batch(self, damage: Any) -> None:
        """One damaged value among good ones makes decode_batch raise DecodingError."""
        codec = RowCodec(FOUR)
        values = [codec.encode((i, i, 1.0, "abc")) for i in range(3)]
        values[1] = damage(values[1])
        with pytest.raises(DecodingError):
            codec.decode_batch(values)

    def test_empty(self) -> None:
        """No rows in, no values out, and an empty batch back."""
        codec = RowCodec(FOUR)
        assert codec.encode_batch(batch_of(FOUR, [])) == []
        empty = codec.decode_batch([])
        assert empty.num_rows == 0 and empty.schema == FOUR.columns


class TestCellCodec:
    """CellCodec.encode / decode: one value per non-key column."""

    @PROPERTY
    @given(schema_and_row())
    def test_round_trip(self, case: tuple[TableSchema, tuple[Any, ...]]) -> None:
        """decode(key, encode(row)) gives the row back."""
        schema, row = case
        codec = CellCodec(schema)
        assert same_rows(codec.decode(schema.key_of(row), codec.encode(row)), row)

    @PROPERTY
    @given(schema_and_row())
    def test_one_cell_per_non_key_column(self, case: tuple[TableSchema, tuple[Any, ...]]) -> None:
        """Cells are keyed by the non-key columns' 2-byte big-endian indices, in order."""
        schema, row = case
        cells = CellCodec(schema).encode(row)
        if schema.value_indices:
            assert [s for s, _ in cells] == [i.to_bytes(2, "big") for i in schema.value_indices]
        else:
            assert cells == [(b"\xff\xff", bytes([FORMAT_VERSION]))]
        assert all(value[0] == FORMAT_VERSION for _, value in cells)
        assert CellCodec.suffix_len == 2

    def test_cell_bytes(self) -> None:
        """The documented bytes of a concrete row's cells (docs/encoding.md)."""
        cells = CellCodec(FOUR).encode((7, None, 2.5, "hé"))
        assert [(s.hex(), v.hex(" ")) for s, v in cells] == [
            ("0001", "01 00"),
            ("0002", "01 01 00 00 00 00 00 00 04 40"),
            ("0003", "01 01 68 c3 a9"),
        ]

    @PROPERTY
    @given(schema_and_row(), st.data())
    def test_missing_cells_are_none(
        self, case: tuple[TableSchema, tuple[Any, ...]], data: st.DataObject
    ) -> None:
        """Any subset of a row's cells decodes, with None for the columns left out."""
        schema, row = case
        codec = CellCodec(schema)
        cells = codec.encode(row)
        kept = data.draw(st.lists(st.sampled_from(range(len(cells))), unique=True))
        got = codec.decode(schema.key_of(row), [cells[k] for k in kept])
        kept_columns = {int.from_bytes(cells[k][0], "big") for k in kept}
        want = tuple(
            v if i in schema.key_indices or i in kept_columns else None for i, v in enumerate(row)
        )
        assert same_rows(got, want)

    @PROPERTY
    @given(schema_and_bad_row())
    def test_bad_value(self, case: tuple[TableSchema, tuple[Any, ...], int]) -> None:
        """A value that does not fit its column, key or not, raises EncodingError naming it."""
        schema, row, index = case
        name = schema.columns.field(index).name
        with pytest.raises(EncodingError, match=f"column '{name}'"):
            CellCodec(schema).encode(row)
        with pytest.raises(EncodingError, match=f"column '{name}'"):
            CellCodec(schema).validate(row)

    def test_wrong_length(self) -> None:
        """A row of the wrong length raises EncodingError."""
        with pytest.raises(EncodingError, match="has 4 values"):
            CellCodec(FOUR).encode((1, 2, 3.0))

    def test_wrong_key_length(self) -> None:
        """A key with the wrong number of values raises DecodingError."""
        with pytest.raises(DecodingError, match="1 key columns"):
            CellCodec(FOUR).decode((1, 2), [])

    def test_unknown_suffix(self) -> None:
        """A suffix naming a key column or no column raises DecodingError."""
        codec = CellCodec(FOUR)
        for suffix in (b"\x00\x00", b"\x00\x09"):
            with pytest.raises(DecodingError, match="names no non-key column"):
                codec.decode((1,), [(suffix, b"\x01\x00")])

    @pytest.mark.parametrize(
        ("suffix", "value", "message"),
        [
            (b"\x00\x01", b"", "empty"),
            (b"\x00\x01", b"\x02\x01" + bytes(8), "format version 2"),
            (b"\x00\x01", b"\x01\x01" + bytes(7), "has 9 bytes, expected 10"),
            (b"\x00\x01", b"\x01\x01" + bytes(9), "has 11 bytes, expected 10"),
            (b"\x00\x01", b"\x01", "corrupt"),
            (b"\x00\x01", b"\x01\x07" + bytes(8), "corrupt"),
            (b"\x00\x01", b"\x01\x00\x00", "corrupt"),
            (b"\x00\x03", b"\x01\x01\xff", "corrupt"),
            (b"\x00\x03", b"\x09\x01ab", "format version 9"),
            (b"\xff\xff", b"\x01\x00", "marker cell"),
        ],
    )
    def test_corrupt_cell(self, suffix: bytes, value: bytes, message: str) -> None:
        """Truncated, trailing, unknown-version or corrupt cells raise DecodingError."""
        with pytest.raises(DecodingError, match=message):
            CellCodec(FOUR).decode((1,), [(suffix, value)])


class TestHugeDecimals:
    def test_huge_exponent_is_refused_at_once(self) -> None:
        """A decimal far beyond the column's precision is refused without
        materialising its digits (it once took tens of seconds)."""
        import decimal
        import time

        import pyarrow as pa

        from encoding import CellCodec, EncodingError, RowCodec, TableSchema

        schema = TableSchema(
            1, pa.schema([("k", pa.int64()), ("d", pa.decimal128(4, -2))]), ["k"], layout="cell"
        )
        for codec in (RowCodec(schema), CellCodec(schema)):
            started = time.perf_counter()
            with pytest.raises(EncodingError, match="decimal"):
                codec.encode((1, decimal.Decimal("1E+1000000")))
            assert time.perf_counter() - started < 1.0
