"""String and binary key columns: escaped bytes with a terminator."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from encoding._batch import (
    EMPTY_LARGE_BINARY,
    Bytes2D,
    Positions,
    gather,
    invert_values,
    validity_buffer,
)
from encoding._key_column import Column, Decoder, Encoder
from encoding._schema import KeyColumn

__all__ = ["BytesColumn"]

_INVERT = bytes(range(255, -1, -1))
_Z = b"\x00"
_ZE = b"\x00\xff"
_END = b"\x00\x01"


class BytesColumn(Column):
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
            escaped, pa.scalar(_END, pa.large_binary()), EMPTY_LARGE_BINARY
        )
        if self.desc:
            body = invert_values(body)
        piece = pc.binary_join_element_wise(
            pa.scalar(bytes([self.present]), pa.large_binary()), body, EMPTY_LARGE_BINARY
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
        valid = self.check_markers(data[pos])
        starts = pos[valid] + 1
        first, second = self.terminator
        candidates = np.flatnonzero((data[:-1] == first) & (data[1:] == second))
        found = np.searchsorted(candidates, starts)
        if (found >= len(candidates)).any():
            raise self.corrupt("key is truncated (no terminator)")
        stops = candidates[found]
        if (stops + 2 > ends[valid]).any():
            raise self.corrupt("key is truncated (no terminator)")
        content, lengths = gather(data, starts, stops - starts)
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
        validity, null_count = validity_buffer(valid)
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
