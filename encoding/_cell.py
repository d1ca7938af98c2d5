"""The ``cell`` layout: one value per non-key column, under the row's key
extended by a 2-byte column id."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from encoding._codegen import compile_encoder, namespace, normalise, validate
from encoding._schema import TableSchema
from encoding._value_columns import (
    FORMAT_VERSION,
    VERSION,
    ColumnPlan,
    Row,
    column_plan,
    value_repr,
)
from encoding.errors import DecodingError

__all__ = ["CellCodec"]

#: The column-id suffix of the one cell of a row with no non-key column.
_MARKER_SUFFIX = b"\xff\xff"
_NULL_CELL = VERSION + b"\x00"
_VALUE_CELL = VERSION + b"\x01"


class CellCodec:
    """The ``cell`` layout: one value per non-key column (``schema.value_indices``),
    under the row's key extended by a 2-byte column id."""

    #: Length of the column-id suffix that extends the row's key.
    suffix_len: int = 2

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self._columns = [column_plan(i, f) for i, f in enumerate(schema.columns)]
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
        validate(self.schema.name, self._columns, row)

    def _compile_encode(self) -> Callable[[Sequence[Any]], list[tuple[bytes, bytes]]]:
        columns = self._columns
        ns = namespace(self.schema.name, columns)
        ns.update(NULL=_NULL_CELL, VALUE=_VALUE_CELL, MARKER=(_MARKER_SUFFIX, VERSION))
        lines = []
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
            lines += ["            " + line for line in normalise(col, ns)]
            if col.code:
                ns[f"p{i}"] = struct.Struct("<BB" + col.code).pack
                lines.append(f"            v{i} = p{i}({FORMAT_VERSION}, 1, c{i})")
            else:
                lines.append(f"            v{i} = VALUE + c{i}")
        lines.append(f"        return [{', '.join(cells) if cells else 'MARKER'}]")
        return compile_encoder(columns, lines, ns)  # type: ignore[no-any-return]

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
                if value != VERSION:
                    raise DecodingError(
                        f"marker cell of table {self.schema.name!r} holds {value!r}, "
                        f"expected {VERSION!r} (format version {FORMAT_VERSION})"
                    )
            else:
                raise DecodingError(
                    f"cell suffix {suffix.hex()} of table {self.schema.name!r} names no "
                    f"non-key column; the non-key columns have ids {self.schema.value_indices}"
                )
        return tuple(row)


def _cell_decoder(table: str, col: ColumnPlan) -> Callable[[bytes], Any]:
    """``cell value -> Python value`` for column ``col``."""
    what = f"cell of {col.describe()} in table {table!r}"
    fixed = struct.Struct("<BB" + col.code) if col.code else None
    load = col.load

    def checked(value: bytes) -> Any:
        if value[:1] != VERSION:
            if not value:
                raise DecodingError(f"{what} is empty")
            raise DecodingError(
                f"{what} has format version {value[0]}; this relstate reads version "
                f"{FORMAT_VERSION} only"
            )
        if value == _NULL_CELL:
            return None
        if value[1:2] != b"\x01" or col.kind == "null":
            raise DecodingError(f"{what} is corrupt: {value_repr.repr(value)}")
        if fixed is None:
            raw: Any = value[2:]
        elif len(value) != fixed.size:
            raise DecodingError(
                f"{what} has {len(value)} bytes, expected {fixed.size}: {value_repr.repr(value)}"
            )
        else:
            raw = fixed.unpack(value)[2]
        try:
            return raw if load is None else load(raw)
        except (ValueError, OverflowError) as exc:
            raise DecodingError(f"{what} is corrupt: {value_repr.repr(raw)}: {exc}") from None

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
