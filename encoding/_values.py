"""Row values: the ``row`` layout (the whole row in one value) and the ``cell``
layout (one value per non-key column).

Every value begins with :data:`FORMAT_VERSION`. The byte formats, the rule for
schema evolution and the trade-off between the two layouts are described in
``docs/encoding.md``.

``StateTable.get_row`` decodes one value per read, so :class:`RowCodec` compiles
an encoder and a decoder for each schema, the way :mod:`dataclasses` and
``attrs`` generate methods: straight-line code with one :class:`struct.Struct`
for the header and every fixed-width field, no loop over columns, and a
converter call only for dates, timestamps and decimals. Anything unusual (a
null, a value from an older schema, a corrupt value, a bad row) leaves the fast
path for a checked one that explains itself.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import reprlib
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from encoding._schema import TableSchema
from encoding.errors import DecodingError, EncodingError

__all__ = ["FORMAT_VERSION", "CellCodec", "RowCodec"]

#: The first byte of every value; bump it when a format changes.
FORMAT_VERSION = 1

_VERSION = bytes([FORMAT_VERSION])
_MARKER_SUFFIX = b"\xff\xff"
_NULL_CELL = _VERSION + b"\x00"
_VALUE_CELL = _VERSION + b"\x01"
_MAX_VAR_LEN = 0xFFFF_FFFF
_NAN = float("nan")
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_DAY_BOUNDS = (
    dt.date.min.toordinal() - _EPOCH_ORDINAL,
    dt.date.max.toordinal() - _EPOCH_ORDINAL,
)
_UNITS = {
    "s": dt.timedelta(seconds=1),
    "ms": dt.timedelta(milliseconds=1),
    "us": dt.timedelta(microseconds=1),
}
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
_VAR_KINDS = ("str", "bin")
_EMPTY_LARGE = pa.scalar(b"", pa.large_binary())

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60

Row = tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class _Column:
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


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _column(index: int, field: pa.Field) -> _Column:
    """The plan for column ``index``."""
    t = field.type
    name = field.name

    def fail(expected: str, value: Any) -> EncodingError:
        return EncodingError(
            f"column {name!r} ({t}): expected {expected}, got "
            f"{_repr.repr(value)} ({type(value).__name__})"
        )

    def plan(kind: str, code: str, zero: Any, check: Callable[[Any], Any], **kw: Any) -> _Column:
        return _Column(index, name, t, field.nullable, kind, code, zero, check, **kw)

    if pa.types.is_integer(t):
        signed = pa.types.is_signed_integer(t)
        bits = t.bit_width
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        want = f"an integer in {lo}..{hi}"

        def check_int(v: Any) -> int:
            if v.__class__ is not int:
                if not _is_int(v):
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
            if not (_is_int(v) or isinstance(v, (float, np.floating))):
                raise fail("a float", v)
            v = float(v)
            if v != v:
                return _NAN
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
            if len(data) > _MAX_VAR_LEN:
                raise fail(f"at most {_MAX_VAR_LEN} bytes of UTF-8", v)
            return data

        return plan("str", "", b"", check_str, load=bytes.decode)

    if pa.types.is_binary(t) or pa.types.is_large_binary(t):

        def check_bin(v: Any) -> bytes:
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise fail("bytes", v)
            if len(v) > _MAX_VAR_LEN:
                raise fail(f"at most {_MAX_VAR_LEN} bytes", v)
            return bytes(v)

        return plan("bin", "", b"", check_bin, load=None)

    if pa.types.is_date32(t):
        lo, hi = _DAY_BOUNDS

        def check_date(v: Any) -> int:
            if v.__class__ is dt.date or (
                isinstance(v, dt.date) and not isinstance(v, dt.datetime)
            ):
                return v.toordinal() - _EPOCH_ORDINAL
            if _is_int(v) and lo <= v <= hi:
                return int(v)
            raise fail(f"a datetime.date or a day count in {lo}..{hi}", v)

        def load_date(days: int) -> dt.date:
            return dt.date.fromordinal(days + _EPOCH_ORDINAL)

        return plan("date", "i", 0, check_date, load=load_date, np_type="<i4", bounds=(lo, hi))

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
    plan: Callable[..., _Column], fail: Callable[[str, Any], EncodingError], t: pa.DataType
) -> _Column:
    unit: str = t.unit
    load: Callable[[int], Any]
    if unit == "ns":
        # Only pyarrow knows the Python form of nanoseconds (pandas.Timestamp when
        # pandas is installed); ns state need not be fast.
        lo, hi = -(1 << 63), (1 << 63) - 1
        step = _UNITS["us"]

        def load_ns(count: int) -> Any:
            return pa.scalar(count, t).as_py()

        load = load_ns
    else:
        step = _UNITS[unit]
        lo = (dt.datetime.min - _EPOCH) // step
        hi = (dt.datetime.max - _EPOCH) // step
        tz = None if t.tz is None else pa.scalar(0, t).as_py().tzinfo  # as to_pylist gives it
        if tz is None:
            load = _epoch_plus(_EPOCH, unit)
        elif isinstance(tz, dt.timezone) or str(tz) in _UTC_NAMES:
            # A fixed offset: wall-clock arithmetic from the epoch in that zone is exact.
            load = _epoch_plus(_EPOCH_UTC.astimezone(tz), unit)
        else:
            naive = _epoch_plus(_EPOCH, unit)
            fromutc = tz.fromutc

            def load_zoned(count: int) -> dt.datetime:
                return fromutc(naive(count).replace(tzinfo=tz))  # type: ignore[no-any-return]

            load = load_zoned
    want = f"a datetime.datetime or a count of {unit} in {lo}..{hi}"
    fraction = f"a datetime.datetime with no fraction of a {unit}"

    def check_ts(v: Any) -> int:
        if not isinstance(v, dt.datetime):
            if _is_int(v) and lo <= v <= hi:
                return int(v)
            raise fail(want, v)
        if v.tzinfo is None:
            delta = v - _EPOCH
        elif v.utcoffset() is None:
            delta = v.replace(tzinfo=None) - _EPOCH
        else:
            delta = v - _EPOCH_UTC
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
    plan: Callable[..., _Column], fail: Callable[[str, Any], EncodingError], t: pa.DataType
) -> _Column:
    precision: int = t.precision
    scale: int = t.scale
    limit = 10**precision
    # Up to 18 digits the unscaled value fits an int64 (Spark's compact decimals
    # are the same); wider ones take Arrow's 16 bytes.
    narrow = precision <= 18
    # Under this context scaleb() raises rather than drop a nonzero digit.
    exact = decimal.Context(prec=precision, traps=[decimal.Inexact, decimal.Overflow])
    want = f"a decimal.Decimal or int with at most {precision} digits, {scale} after the point"

    def check_dec(v: Any) -> int | bytes:
        if v.__class__ is not decimal.Decimal:
            if _is_int(v):
                v = decimal.Decimal(int(v))
            elif not isinstance(v, decimal.Decimal):
                raise fail(want, v)
        try:
            scaled = v.scaleb(scale, exact)
            unscaled = int(scaled)
        except (decimal.DecimalException, ValueError, OverflowError):  # also NaN, Infinity
            raise fail(want, v) from None
        if scaled != unscaled or not -limit < unscaled < limit:
            raise fail(want, v)
        return unscaled if narrow else unscaled.to_bytes(16, "little", signed=True)

    def load_dec(unscaled: int) -> decimal.Decimal:
        if not -limit < unscaled < limit:
            raise ValueError(f"unscaled value {unscaled} exceeds precision {precision}")
        return decimal.Decimal(unscaled).scaleb(-scale, exact)

    if narrow:
        return plan("dec", "q", 0, check_dec, load=load_dec, np_type="<i8")

    def load_wide(raw: bytes) -> decimal.Decimal:
        return load_dec(int.from_bytes(raw, "little", signed=True))

    return plan("dec", "16s", bytes(16), check_dec, load=load_wide, np_type="V16")


def _validate(table: str, columns: Sequence[_Column], row: Sequence[Any]) -> None:
    if len(row) != len(columns):
        raise _arity_error(table, columns, row)
    for col, value in zip(columns, row, strict=True):
        if value is None:
            if not col.nullable:
                raise _not_null_error(col)
        else:
            col.check(value)


def _arity_error(table: str, columns: Sequence[_Column], row: Sequence[Any]) -> EncodingError:
    names = ", ".join(c.name for c in columns)
    return EncodingError(
        f"a row of table {table!r} has {len(columns)} values ({names}); got {len(row)}: "
        f"{_repr.repr(row)}"
    )


def _not_null_error(col: _Column) -> EncodingError:
    return EncodingError(f"{col.describe()} is not nullable; got None")


def _namespace(
    table: str, columns: Sequence[_Column], diagnose: Callable[[Sequence[Any]], EncodingError]
) -> dict[str, Any]:
    """Globals for a compiled encoder of rows of ``columns``."""
    ns: dict[str, Any] = {
        "struct": struct,
        "NAN": _NAN,
        "arity": lambda row: _arity_error(table, columns, row),
        "diagnose": diagnose,
    }
    for col in columns:
        ns[f"ck{col.index}"] = col.check
        ns[f"nn{col.index}"] = functools.partial(_not_null_error, col)
    return ns


def _normalise(col: _Column, ns: dict[str, Any]) -> list[str]:
    """Source lines that turn a non-None value ``c{i}`` into its stored form, or
    call the column's check (which raises) when it is not the common type.

    Integer ranges are left to struct.pack, which raises struct.error; bools pass
    struct's integer codes, so they are caught here.
    """
    c, ck = f"c{col.index}", f"ck{col.index}"
    if col.kind == "int":
        return [f"if {c} is True or {c} is False: {c} = {ck}({c})"]
    if col.kind == "float":
        return [f"if {c}.__class__ is not float: {c} = {ck}({c})", f"elif {c} != {c}: {c} = NAN"]
    if col.kind == "bool":
        return [f"if {c} is not True and {c} is not False: {c} = {ck}({c})"]
    if col.kind == "str":
        return [f"if {c}.__class__ is str: {c} = {c}.encode()", f"else: {c} = {ck}({c})"]
    if col.kind == "bin":
        return [f"if {c}.__class__ is not bytes: {c} = {ck}({c})"]
    return [f"{c} = {ck}({c})"]


def _bitmap_chunks(nbytes: int) -> list[tuple[str, int]]:
    """The struct codes, with their bit shifts, that hold an ``nbytes`` bitmap."""
    if nbytes > 8:
        return [(f"{nbytes}s", 0)]
    chunks = []
    shift = 0
    for size, code in ((8, "Q"), (4, "I"), (2, "H"), (1, "B")):
        while nbytes >= size:
            chunks.append((code, shift))
            shift += 8 * size
            nbytes -= size
    return chunks


class _RowLayout:
    """The compiled row format for ``columns``, a prefix of a table's columns;
    decoded rows are padded with None to ``width`` values."""

    def __init__(self, table: str, columns: Sequence[_Column], width: int) -> None:
        self.table = table
        self.columns = tuple(columns)
        self.width = width
        n = len(self.columns)
        self.fixed = [c for c in self.columns if c.code]
        self.var = [c for c in self.columns if c.kind in _VAR_KINDS]
        self.null_mask = sum(1 << c.index for c in self.columns if c.kind == "null")
        self.bitmap_len = (n + 7) // 8
        self.wide_bitmap = self.bitmap_len > 8  # one bytes field, not integers
        self.chunks = _bitmap_chunks(self.bitmap_len)
        self.struct = struct.Struct(
            "<BH"
            + "".join(code for code, _ in self.chunks)
            + "".join(c.code for c in self.fixed)
            + "I" * len(self.var)
        )
        self._prefixes: dict[int, _RowLayout] = {}
        self.encode: Callable[[Sequence[Any]], bytes] = self._compile_encode()
        self.decode: Callable[[bytes], Row] = self._compile_decode()

    def validate(self, row: Sequence[Any]) -> None:
        _validate(self.table, self.columns, row)

    def _diagnose(self, row: Sequence[Any]) -> EncodingError:
        try:
            self.validate(row)
        except EncodingError as exc:
            return exc
        return EncodingError(f"a row of table {self.table!r} does not fit: {_repr.repr(row)}")

    def _compile_encode(self) -> Callable[[Sequence[Any]], bytes]:
        ns = _namespace(self.table, self.columns, self._diagnose)
        ns["pack"] = self.struct.pack
        n = len(self.columns)
        names = [f"c{c.index}" for c in self.columns]
        lines = [
            "def encode(row):",
            f"    if len(row) != {n}:",
            "        raise arity(row)",
            f"    {', '.join(names)}, = row",
            f"    bm = {self.null_mask}",
            "    try:",
        ]
        for col in self.columns:
            i = col.index
            if col.kind == "null":
                lines.append(f"        if c{i} is not None: ck{i}(c{i})")
                continue
            on_none = f"bm |= {1 << i}; c{i} = {col.zero!r}" if col.nullable else f"raise nn{i}()"
            lines.append(f"        if c{i} is None: {on_none}")
            lines.append("        else:")
            lines += ["            " + line for line in _normalise(col, ns)]
        if self.wide_bitmap:
            bitmap = [f"bm.to_bytes({self.bitmap_len}, 'little')"]
        elif len(self.chunks) == 1:
            bitmap = ["bm"]
        else:
            bitmap = [
                f"bm >> {shift} & {(1 << 8 * struct.calcsize(code)) - 1}"
                for code, shift in self.chunks
            ]
        args = [str(FORMAT_VERSION), str(n), *bitmap]
        args += [f"c{c.index}" for c in self.fixed]
        args += [f"len(c{c.index})" for c in self.var]
        packed = f"pack({', '.join(args)})"
        tail = [f"c{c.index}" for c in self.var]
        if not tail:
            lines.append(f"        return {packed}")
        elif len(tail) == 1:
            lines.append(f"        return {packed} + {tail[0]}")
        else:
            lines.append(f"        return b''.join(({packed}, {', '.join(tail)}))")
        lines += [
            "    except (struct.error, OverflowError, UnicodeError):",
            "        pass",
            "    raise diagnose(row)",
        ]
        return _compile("encode", lines, ns)  # type: ignore[no-any-return]

    def _compile_decode(self) -> Callable[[bytes], Row]:
        ns: dict[str, Any] = {"struct": struct, "unpack_from": self.struct.unpack_from}
        ns["slow"] = self._slow
        n = len(self.columns)
        chunk_names = [f"b{k}" for k in range(len(self.chunks))]
        targets = ["v", "n", *chunk_names]
        targets += [f"c{c.index}" for c in self.fixed]
        targets += [f"l{c.index}" for c in self.var]
        lines = [
            "def decode(data):",
            "    try:",
            f"        {', '.join(targets)}, = unpack_from(data)",
            "    except struct.error:",
            "        return slow(data)",
        ]
        end = str(self.struct.size)
        plain: dict[int, str] = {}
        for col in self.var:
            i = col.index
            lines.append(f"    e{i} = {end} + l{i}")
            plain[i] = f"data[{end}:e{i}]" + (".decode()" if col.kind == "str" else "")
            end = f"e{i}"
        lines += [
            f"    if v != {FORMAT_VERSION} or n != {n} or len(data) != {end}:",
            "        return slow(data)",
        ]
        for col in self.fixed:
            i = col.index
            if col.load is None:
                plain[i] = f"c{i}"
            else:
                ns[f"cv{i}"] = col.load
                plain[i] = f"cv{i}(c{i})"
        no_nulls = []
        with_nulls = []
        for col in self.columns:
            i = col.index
            if col.kind == "null":
                no_nulls.append("None")
                with_nulls.append("None")
            else:
                no_nulls.append(plain[i])
                with_nulls.append(f"None if bm & {1 << i} else {plain[i]}")
        pad = ["None"] * (self.width - n)
        if self.wide_bitmap:
            ns["K0"] = self.null_mask.to_bytes(self.bitmap_len, "little")
            expected = "b0 == K0"
            combined = "int.from_bytes(b0, 'little')"
        else:
            expected = " and ".join(
                f"b{k} == {self.null_mask >> shift & (1 << 8 * struct.calcsize(code)) - 1}"
                for k, (code, shift) in enumerate(self.chunks)
            )
            combined = " | ".join(
                f"b{k} << {shift}" if shift else f"b{k}" for k, (_, shift) in enumerate(self.chunks)
            )
        lines += [
            "    try:",
            f"        if {expected}:",
            f"            return ({', '.join(no_nulls + pad)},)",
            f"        bm = {combined}",
            f"        return ({', '.join(with_nulls + pad)},)",
            # A corrupt field: bad UTF-8, a date or timestamp out of range.
            "    except (ValueError, OverflowError):",
            "        return slow(data)",
        ]
        return _compile("decode", lines, ns)  # type: ignore[no-any-return]

    def _slow(self, data: bytes) -> Row:
        """Decode what the compiled decoder would not: a value from an older
        schema, or one that is not right (which raises)."""
        what = f"row value of table {self.table!r}"
        if len(data) < 3:
            raise DecodingError(f"{what} is truncated: {len(data)} bytes, the header alone is 3")
        if data[0] != FORMAT_VERSION:
            raise DecodingError(
                f"{what} has format version {data[0]}; this relstate reads version "
                f"{FORMAT_VERSION} only"
            )
        ncols = int.from_bytes(data[1:3], "little")
        n = len(self.columns)
        if ncols == n:
            return self._decode_checked(data)
        if 0 < ncols < n:
            prefix = self._prefixes.get(ncols)
            if prefix is None:
                prefix = _RowLayout(self.table, self.columns[:ncols], self.width)
                self._prefixes[ncols] = prefix
            return prefix.decode(data)
        raise DecodingError(
            f"{what} holds {ncols} columns, the table has {n}; a value written under a "
            "newer schema cannot be read under an older one"
        )

    def _decode_checked(self, data: bytes) -> Row:
        what = f"row value of table {self.table!r}"
        size = self.struct.size
        if len(data) < size:
            raise DecodingError(
                f"{what} is truncated: {len(data)} bytes, the fixed part of its "
                f"{len(self.columns)} columns is {size}"
            )
        fields = self.struct.unpack_from(data)
        nchunks = len(self.chunks)
        if self.wide_bitmap:
            bitmap = int.from_bytes(fields[2], "little")
        else:
            bitmap = sum(
                b << shift
                for b, (_, shift) in zip(fields[2 : 2 + nchunks], self.chunks, strict=True)
            )
        stored = dict(zip((c.index for c in self.fixed), fields[2 + nchunks :], strict=False))
        pos = size
        for col, length in zip(self.var, fields[2 + nchunks + len(self.fixed) :], strict=True):
            if pos + length > len(data):
                raise DecodingError(
                    f"{what} is truncated: {col.describe()} needs {length} bytes at "
                    f"offset {pos}, the value has {len(data)}"
                )
            stored[col.index] = data[pos : pos + length]
            pos += length
        if pos != len(data):
            raise DecodingError(f"{what} has {len(data) - pos} trailing bytes after offset {pos}")
        row: list[Any] = []
        for col in self.columns:
            if col.kind == "null" or bitmap >> col.index & 1:
                row.append(None)
                continue
            raw = stored[col.index]
            try:
                row.append(raw if col.load is None else col.load(raw))
            except (ValueError, OverflowError) as exc:
                raise DecodingError(
                    f"{what} is corrupt: {col.describe()} holds {_repr.repr(raw)}: {exc}"
                ) from None
        row += [None] * (self.width - len(row))
        return tuple(row)

    def numpy_dtype(self) -> np.dtype[Any]:
        """A numpy structured type with the fixed part's layout."""
        names = ["v", "n", "bm"]
        formats: list[Any] = ["u1", "<u2", ("u1", (self.bitmap_len,))]
        names += [f"f{c.index}" for c in self.fixed] + [f"l{c.index}" for c in self.var]
        formats += [c.np_type for c in self.fixed] + ["<u4"] * len(self.var)
        offsets = [0, 1, 3]
        for fmt in formats[2:-1]:
            offsets.append(offsets[-1] + np.dtype(fmt).itemsize)
        dtype = np.dtype(
            {"names": names, "formats": formats, "offsets": offsets, "itemsize": self.struct.size}
        )
        assert dtype.itemsize == self.struct.size
        return dtype


def _compile(name: str, lines: list[str], namespace: dict[str, Any]) -> Any:
    exec(compile("\n".join(lines), f"<relstate {name}>", "exec"), namespace)
    return namespace[name]


def _kind_of(t: pa.DataType) -> str:
    return _column(0, pa.field("x", t)).kind


class RowCodec:
    """The ``row`` layout: the whole row (all columns, key columns included) in
    one value."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self._columns = [_column(i, f) for i, f in enumerate(schema.columns)]
        self._layout = _RowLayout(schema.name, self._columns, len(self._columns))
        self._encode = self._layout.encode
        self._decode = self._layout.decode
        self._dtype = self._layout.numpy_dtype()

    def encode(self, row: Sequence[Any]) -> bytes:
        """The value of ``row``, a tuple in column order; EncodingError if it does
        not fit the schema."""
        return self._encode(row)

    def decode(self, data: bytes) -> Row:
        """The row in ``data``, in column order; DecodingError if ``data`` is not
        a row value of this table."""
        return self._decode(data)

    def validate(self, row: Sequence[Any]) -> None:
        """Raise EncodingError if ``row`` does not fit, without encoding it."""
        self._layout.validate(row)

    # -- batches ------------------------------------------------------------

    def encode_batch(self, batch: pa.RecordBatch | pa.Table) -> list[bytes]:
        """The value of each row of ``batch``, whose columns are found by name;
        the same bytes as :meth:`encode` gives row by row."""
        arrays = self._arrays_of(batch)
        n = batch.num_rows
        if n == 0:
            return []
        layout = self._layout
        rec = np.zeros(n, self._dtype)
        rec["v"] = FORMAT_VERSION
        rec["n"] = len(self._columns)
        bits = np.zeros((n, layout.bitmap_len), np.uint8)
        tails: list[pa.Array] = []
        for col, arr in zip(self._columns, arrays, strict=True):
            i = col.index
            nulls = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
            if col.kind == "null":
                bits[:, i >> 3] |= 1 << (i & 7)
                continue
            if nulls is not None:
                bits[:, i >> 3] |= nulls.view(np.uint8) << (i & 7)
            if col.code:
                rec[f"f{i}"] = self._stored_array(col, arr, nulls)
                continue
            lengths = pc.binary_length(arr)
            if nulls is not None:
                lengths = pc.fill_null(lengths, 0)
            length_values = lengths.to_numpy(zero_copy_only=False)
            if length_values.max() > _MAX_VAR_LEN:
                raise EncodingError(f"{col.describe()} has a value over {_MAX_VAR_LEN} bytes")
            rec[f"l{i}"] = length_values
            tail = arr.cast(pa.large_binary())
            tails.append(pc.fill_null(tail, _EMPTY_LARGE) if nulls is not None else tail)
        rec["bm"] = bits
        size = layout.struct.size
        heads = pa.Array.from_buffers(pa.binary(size), n, [None, pa.py_buffer(rec)])
        heads = heads.cast(pa.large_binary())
        if tails:
            heads = pc.binary_join_element_wise(heads, *tails, _EMPTY_LARGE)
        # Arrow makes the bytes objects faster than slicing in a Python loop.
        values: list[bytes] = heads.to_pylist()
        return values

    def _arrays_of(self, batch: pa.RecordBatch | pa.Table) -> list[pa.Array]:
        out = []
        for col in self._columns:
            index = batch.schema.get_field_index(col.name)
            if index < 0:
                raise EncodingError(
                    f"the batch has no column {col.name!r}, or more than one; table "
                    f"{self.schema.name!r} needs {self.schema.columns.names}"
                )
            arr = batch.column(index)
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            if arr.type != col.type:
                arr = self._cast(col, arr)
            if not col.nullable and arr.null_count:
                raise EncodingError(
                    f"{col.describe()} is not nullable; the batch has {arr.null_count} nulls in it"
                )
            out.append(arr)
        return out

    @staticmethod
    def _cast(col: _Column, arr: pa.Array) -> pa.Array:
        try:
            kind = _kind_of(arr.type)
        except EncodingError:
            kind = "unsupported"
        # Cast only where encode() would take the values: never bool to int, or
        # float to int, even when Arrow could.
        if kind == col.kind or kind == "null" or (kind, col.kind) == ("int", "float"):
            try:
                return arr.cast(col.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise EncodingError(
                    f"{col.describe()}: the batch column of type {arr.type} does not fit: {exc}"
                ) from None
        raise EncodingError(
            f"{col.describe()}: expected {col.type} values, the batch has {arr.type}"
        )

    @staticmethod
    def _stored_array(
        col: _Column, arr: pa.Array, nulls: npt.NDArray[np.bool_] | None
    ) -> npt.NDArray[Any]:
        """The stored form of a fixed-width column, nulls as zeros."""
        n = len(arr)
        if col.kind == "dec":
            raw = np.frombuffer(arr.buffers()[1], np.uint8, 16 * (arr.offset + n))
            raw = raw[16 * arr.offset :].reshape(n, 16)
            if nulls is not None:
                raw = raw.copy()
                raw[nulls] = 0
            if col.code == "q":
                return raw.view("<i8")[:, 0]  # the low half: the value fits 64 bits
            return raw.view("V16")[:, 0]
        if col.kind == "date":
            arr = arr.view(pa.int32())
        elif col.kind == "ts":
            arr = arr.view(pa.int64())
        if nulls is not None:
            arr = pc.fill_null(arr, False if col.kind == "bool" else 0)
        values: npt.NDArray[Any] = arr.to_numpy(zero_copy_only=False)
        if col.kind == "float":
            nan = np.isnan(values)
            if nan.any():
                values = np.where(nan, np.array(np.nan, values.dtype), values)
        elif col.bounds is not None and len(values):
            lo, hi = col.bounds
            if values.min() < lo or values.max() > hi:
                raise EncodingError(
                    f"{col.describe()}: expected values in {lo}..{hi} (the range of Python's "
                    f"datetime), the batch has {values.min()}..{values.max()}"
                )
        return values

    def decode_batch(self, values: Sequence[bytes]) -> pa.RecordBatch:
        """The rows in ``values`` as one record batch with the table's columns."""
        n = len(values)
        if n == 0:
            return pa.RecordBatch.from_pylist([], schema=self.schema.columns)
        layout = self._layout
        size = layout.struct.size
        blobs = pa.array(values, pa.large_binary())
        lengths = pc.binary_length(blobs).to_numpy()
        if lengths.min() < size:
            return self._decode_rows(values)
        head_data = pc.binary_slice(blobs, 0, size).buffers()[2]
        rec = np.frombuffer(head_data, self._dtype, n)
        pieces = np.empty((n, 1 + len(layout.var)), np.int64)
        pieces[:, 0] = size
        for k, col in enumerate(layout.var, 1):
            pieces[:, k] = rec[f"l{col.index}"]
        if (
            (rec["v"] != FORMAT_VERSION).any()
            or (rec["n"] != len(self._columns)).any()
            or (pieces.sum(axis=1) != lengths).any()
        ):
            # Values from an older schema, or a bad value to report.
            return self._decode_rows(values)
        bits: npt.NDArray[np.uint8] = rec["bm"]
        arrays = []
        for col in self._columns:
            i = col.index
            nulls = (bits[:, i >> 3] >> (i & 7) & 1).astype(np.bool_)
            validity = pa.array(~nulls).buffers()[1] if nulls.any() else None
            if col.kind == "null":
                arrays.append(pa.nulls(n))
            elif col.kind == "bool":
                arrays.append(
                    pa.array(rec[f"f{i}"] != 0, mask=nulls if validity is not None else None)
                )
            elif col.code:
                stored = np.ascontiguousarray(rec[f"f{i}"])
                if col.bounds is not None:
                    present = stored[~nulls]
                    lo, hi = col.bounds
                    if len(present) and (present.min() < lo or present.max() > hi):
                        return self._decode_rows(values)
                if col.kind == "dec" and col.code == "q":
                    stored = np.stack([stored, stored >> 63], axis=1)  # sign-extend to 128 bits
                arr = pa.Array.from_buffers(col.type, n, [validity, pa.py_buffer(stored)])
                arrays.append(self._checked(col, arr))
            else:
                arrays.append(self._var_column(col, blobs, pieces, validity))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema.columns)

    def _var_column(
        self,
        col: _Column,
        blobs: pa.Array,
        pieces: npt.NDArray[np.int64],
        validity: pa.Buffer | None,
    ) -> pa.Array:
        """Column ``col`` cut out of the values in ``blobs``; row r, piece k of
        ``pieces`` is the length of the fixed part (k = 0) or of var field k."""
        n, per_row = pieces.shape
        offsets = np.zeros(n * per_row + 1, np.int64)
        np.cumsum(pieces.ravel(), out=offsets[1:])
        # Every fixed part and var field as one array over the values' own bytes.
        every = pa.Array.from_buffers(
            pa.large_binary(), n * per_row, [None, pa.py_buffer(offsets), blobs.buffers()[2]]
        )
        k = 1 + self._layout.var.index(col)
        mine = pc.take(every, pa.array(np.arange(k, n * per_row, per_row)))
        large = pa.large_string() if col.kind == "str" else pa.large_binary()
        arr = pa.Array.from_buffers(large, n, [validity, *mine.buffers()[1:]])
        return self._checked(col, arr).cast(col.type)

    def _checked(self, col: _Column, arr: pa.Array) -> pa.Array:
        if col.kind in ("str", "dec"):
            try:
                arr.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise DecodingError(
                    f"row value of table {self.schema.name!r} is corrupt: {col.describe()}: {exc}"
                ) from None
        return arr

    def _decode_rows(self, values: Sequence[bytes]) -> pa.RecordBatch:
        rows = [self._decode(v) for v in values]
        arrays = [
            pa.array([row[col.index] for row in rows], type=col.type) for col in self._columns
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema.columns)


class CellCodec:
    """The ``cell`` layout: one value per non-key column (``schema.value_indices``),
    under the row's key extended by a 2-byte column id."""

    #: Length of the column-id suffix that extends the row's key.
    suffix_len: int = 2

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self._columns = [_column(i, f) for i, f in enumerate(schema.columns)]
        self._encode = self._compile_encode()
        self._decoders = {
            i.to_bytes(2, "big"): (i, _cell_decoder(schema.name, self._columns[i]))
            for i in schema.value_indices
        }

    def encode(self, row: Sequence[Any]) -> list[tuple[bytes, bytes]]:
        """``(column-id suffix, cell value)`` for each non-key column of ``row``,
        in column order; a single marker cell if the table has none."""
        return self._encode(row)

    def validate(self, row: Sequence[Any]) -> None:
        """Raise EncodingError if ``row`` does not fit, without encoding it."""
        _validate(self.schema.name, self._columns, row)

    def _diagnose(self, row: Sequence[Any]) -> EncodingError:
        try:
            self.validate(row)
        except EncodingError as exc:
            return exc
        return EncodingError(f"a row of table {self.schema.name!r} does not fit: {_repr.repr(row)}")

    def _compile_encode(self) -> Callable[[Sequence[Any]], list[tuple[bytes, bytes]]]:
        columns = self._columns
        ns = _namespace(self.schema.name, columns, self._diagnose)
        ns.update(NULL=_NULL_CELL, VALUE=_VALUE_CELL, MARKER=(_MARKER_SUFFIX, _VERSION))
        lines = [
            "def encode(row):",
            f"    if len(row) != {len(columns)}:",
            "        raise arity(row)",
            f"    {', '.join(f'c{c.index}' for c in columns)}, = row",
            "    try:",
        ]
        # Key columns live in the key; check them all the same, as the row layout does.
        for i in self.schema.key_indices:
            on_none = "pass" if columns[i].nullable else f"raise nn{i}()"
            lines += [f"        if c{i} is None: {on_none}", f"        else: ck{i}(c{i})"]
        cells = []
        for i in self.schema.value_indices:
            col = columns[i]
            ns[f"s{i}"] = i.to_bytes(2, "big")
            cells.append(f"(s{i}, v{i})")
            on_none = f"v{i} = NULL" if col.nullable else f"raise nn{i}()"
            if col.kind == "null":
                lines += [f"        if c{i} is not None: ck{i}(c{i})", f"        v{i} = NULL"]
                continue
            lines += [f"        if c{i} is None: {on_none}", "        else:"]
            lines += ["            " + line for line in _normalise(col, ns)]
            if col.code:
                ns[f"p{i}"] = struct.Struct("<BB" + col.code).pack
                lines.append(f"            v{i} = p{i}({FORMAT_VERSION}, 1, c{i})")
            else:
                lines.append(f"            v{i} = VALUE + c{i}")
        lines.append(f"        return [{', '.join(cells) if cells else 'MARKER'}]")
        lines += [
            "    except (struct.error, OverflowError, UnicodeError):",
            "        pass",
            "    raise diagnose(row)",
        ]
        return _compile("encode", lines, ns)  # type: ignore[no-any-return]

    def decode(self, key: Sequence[Any], cells: Iterable[tuple[bytes, bytes]]) -> Row:
        """The full row from its primary-key values (in key order) and any subset
        of its cells; columns without a cell are None."""
        key_indices = self.schema.key_indices
        if len(key) != len(key_indices):
            raise DecodingError(
                f"table {self.schema.name!r} has {len(key_indices)} key columns "
                f"{self.schema.key_names}; got {len(key)} key values"
            )
        row: list[Any] = [None] * len(self._columns)
        for i, value in zip(key_indices, key, strict=True):
            row[i] = value
        decoders = self._decoders
        for suffix, value in cells:
            entry = decoders.get(suffix)
            if entry is not None:
                index, decode = entry
                row[index] = decode(value)
            elif suffix == _MARKER_SUFFIX:
                if value != _VERSION:
                    raise DecodingError(
                        f"marker cell of table {self.schema.name!r} holds {value!r}, "
                        f"expected {_VERSION!r} (format version {FORMAT_VERSION})"
                    )
            else:
                raise DecodingError(
                    f"cell suffix {suffix.hex()} of table {self.schema.name!r} names no "
                    f"non-key column; the non-key columns have ids {self.schema.value_indices}"
                )
        return tuple(row)


def _cell_decoder(table: str, col: _Column) -> Callable[[bytes], Any]:
    """``cell value -> Python value`` for column ``col``."""
    what = f"cell of {col.describe()} in table {table!r}"
    fixed = struct.Struct("<BB" + col.code) if col.code else None
    load = col.load

    def checked(value: bytes) -> Any:
        if value[:1] != _VERSION:
            if not value:
                raise DecodingError(f"{what} is empty")
            raise DecodingError(
                f"{what} has format version {value[0]}; this relstate reads version "
                f"{FORMAT_VERSION} only"
            )
        if value == _NULL_CELL:
            return None
        if value[1:2] != b"\x01" or col.kind == "null":
            raise DecodingError(f"{what} is corrupt: {_repr.repr(value)}")
        if fixed is None:
            raw: Any = value[2:]
        elif len(value) != fixed.size:
            raise DecodingError(
                f"{what} has {len(value)} bytes, expected {fixed.size}: {_repr.repr(value)}"
            )
        else:
            raw = fixed.unpack(value)[2]
        try:
            return raw if load is None else load(raw)
        except (ValueError, OverflowError) as exc:
            raise DecodingError(f"{what} is corrupt: {_repr.repr(raw)}: {exc}") from None

    if fixed is not None:
        unpack = fixed.unpack

        def decode_fixed(value: bytes) -> Any:
            try:
                version, flag, raw = unpack(value)
                if version == FORMAT_VERSION and flag == 1:
                    return raw if load is None else load(raw)
            except (struct.error, ValueError, OverflowError):
                pass
            return checked(value)

        return decode_fixed
    if col.kind == "str":

        def decode_str(value: bytes) -> Any:
            if value[:2] == _VALUE_CELL:
                try:
                    return value[2:].decode()
                except UnicodeDecodeError:
                    pass
            return checked(value)

        return decode_str
    if col.kind == "bin":

        def decode_bin(value: bytes) -> Any:
            if value[:2] == _VALUE_CELL:
                return value[2:]
            return checked(value)

        return decode_bin
    return checked
