"""The compiled ``row`` format of one schema: encoder and decoder.

``StateTable.get_row`` decodes one value per read, so the row layout compiles
an encoder and a decoder for each schema: straight-line code with one
:class:`struct.Struct` for the header and every fixed-width field, no loop over
columns, and a converter call only for dates, timestamps and decimals. Anything
unusual (a null, a value from an older schema, a corrupt value, a bad row)
leaves the fast path for a checked one that explains itself.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from encoding._codegen import compile_encoder, compile_function, namespace, normalise, validate
from encoding._value_columns import FORMAT_VERSION, ColumnPlan, Row, value_repr
from encoding.errors import DecodingError

__all__ = ["RowLayout"]

_VAR_KINDS = ("str", "bin")


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


class RowLayout:
    """The compiled row format for ``columns``, a prefix of a table's columns;
    decoded rows are padded with None to ``width`` values."""

    def __init__(self, table: str, columns: Sequence[ColumnPlan], width: int) -> None:
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
        self._prefixes: dict[int, RowLayout] = {}
        self.encode: Callable[[Sequence[Any]], bytes] = self._compile_encode()
        self.decode: Callable[[bytes], Row] = self._compile_decode()

    def validate(self, row: Sequence[Any]) -> None:
        validate(self.table, self.columns, row)

    def _compile_encode(self) -> Callable[[Sequence[Any]], bytes]:
        ns = namespace(self.table, self.columns)
        ns["pack"] = self.struct.pack
        n = len(self.columns)
        lines = [f"        bm = {self.null_mask}"]
        for col in self.columns:
            i = col.index
            if col.kind == "null":
                lines.append(f"        if c{i} is not None: ck{i}(c{i})")
                continue
            on_none = f"bm |= {1 << i}; c{i} = {col.zero!r}" if col.nullable else f"raise nn{i}()"
            lines.append(f"        if c{i} is None: {on_none}")
            lines.append("        else:")
            lines += ["            " + line for line in normalise(col, ns)]
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
        return compile_encoder(self.columns, lines, ns)  # type: ignore[no-any-return]

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
        return compile_function("decode", lines, ns)  # type: ignore[no-any-return]

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
                prefix = RowLayout(self.table, self.columns[:ncols], self.width)
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
                    f"{what} is corrupt: {col.describe()} holds {value_repr.repr(raw)}: {exc}"
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
