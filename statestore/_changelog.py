"""The changelog file: one commit's write operations in a framed binary format.

::

    header   magic "RSCL" | format u16 | flags u16 | version i64 |
             commit id (16 bytes) | range deletes u32 | operations u32
    body     range delete: start length u32 | start | end length u32 | end
             operations (format 2, column by column):
                 kinds        one u8 per operation (0 put, 1 delete)
                 key lengths  one u32 per operation
                 value lengths one u32 per put
                 keys         the keys, back to back
                 values       the puts' values, back to back
    trailer  CRC-32 of header and body u32 | magic "LCSR"

All integers are big-endian. Range deletes come first because a backend batch
applies them before its point operations; replaying the file is one
:meth:`~statestore.KVBackend.write` of exactly the batch the commit wrote.
Format 2 lays the operations out column by column so that a commit encodes
them with a few passes in C rather than a loop of small writes per operation;
format 1 (a record per operation: kind u8 | key length u32 | key | value
length u32 | value) is still read.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statestore._typing import WriteOp
from statestore._writes import Writes

__all__ = [
    "FORMAT_VERSION",
    "Changelog",
    "ChangelogFormatError",
    "decode",
    "encode",
    "encode_parts",
]

FORMAT_VERSION = 2
_MAGIC = b"RSCL"
_END = b"LCSR"
_HEADER = struct.Struct(">4sHHq16sII")
_TRAILER = struct.Struct(">I4s")
_U32 = struct.Struct(">I")
_OP = struct.Struct(">BI")
_PUT, _DELETE = 0, 1
_LENGTHS = np.dtype(">u4")
_MAX_LENGTH = 2**32 - 1


class ChangelogFormatError(ValueError):
    """The bytes are not a well-formed changelog file (the caller knows which
    file and turns this into a ``CheckpointCorruptError``)."""


@dataclass(frozen=True)
class Changelog:
    """The decoded contents of one changelog file."""

    version: int
    commit_id: str
    writes: Writes
    range_deletes: list[tuple[bytes, bytes]]


def encode(
    version: int,
    commit_id: str,
    ops: Sequence[WriteOp],
    range_deletes: Sequence[tuple[bytes, bytes]],
) -> bytes:
    """The changelog file of one commit (format 2)."""
    return b"".join(encode_parts(version, commit_id, ops, range_deletes)[0])


def encode_parts(
    version: int,
    commit_id: str,
    ops: Sequence[WriteOp],
    range_deletes: Sequence[tuple[bytes, bytes]],
) -> tuple[list[bytes | memoryview], int]:
    """The changelog file of one commit as its parts, in order (views of the
    writes' buffers among them, so a writer need not join them), and the
    CRC-32 of the whole file, trailer included."""
    parts: list[bytes | memoryview] = [
        _HEADER.pack(
            _MAGIC,
            FORMAT_VERSION,
            0,
            version,
            bytes.fromhex(commit_id),
            len(range_deletes),
            len(ops),
        )
    ]
    u32 = _U32.pack
    for start, end in range_deletes:
        parts += (u32(len(start)), start, u32(len(end)), end)
    writes = Writes.of(ops)
    deleted = writes.values.is_null().to_numpy(zero_copy_only=False)
    values = writes.values.drop_null()
    parts += (
        deleted.astype(np.uint8).tobytes(),
        _lengths(writes.keys),
        _lengths(values),
        _data(writes.keys),
        _data(values),
    )
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    trailer = _TRAILER.pack(crc, _END)
    parts.append(trailer)
    return parts, zlib.crc32(trailer, crc)


def _offsets(items: pa.Array) -> np.ndarray:
    """The ``len(items) + 1`` offsets of a ``large_binary`` array."""
    offsets = np.frombuffer(items.buffers()[1], dtype=np.int64)
    return offsets[items.offset : items.offset + len(items) + 1]


def _lengths(items: pa.Array) -> bytes:
    """The lengths of ``items`` as big-endian u32s."""
    lengths = np.diff(_offsets(items))
    if lengths.size and int(lengths.max()) > _MAX_LENGTH:
        raise ValueError("a key or value of 4 GiB or more does not fit a changelog")
    return lengths.astype(_LENGTHS).tobytes()


def _data(items: pa.Array) -> memoryview:
    """The bytes of ``items`` back to back (a view of the array's data)."""
    offsets = _offsets(items)
    data = items.buffers()[2]
    if data is None:
        return memoryview(b"")
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]


def decode(data: bytes) -> Changelog:
    """Parse and verify a changelog file; :class:`ChangelogFormatError` if it
    is truncated, altered or of an unknown format."""
    if len(data) < _HEADER.size + _TRAILER.size:
        raise ChangelogFormatError(f"{len(data)} bytes is shorter than an empty changelog")
    crc, end = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    body = memoryview(data)[: len(data) - _TRAILER.size]
    if end != _END:
        raise ChangelogFormatError("the trailer magic is missing: the file is truncated")
    if zlib.crc32(body) != crc:
        raise ChangelogFormatError("the CRC-32 of the contents does not match the trailer")
    magic, fmt, _flags, version, cid, n_ranges, n_ops = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC:
        raise ChangelogFormatError(f"magic {magic!r} is not {_MAGIC!r}")
    if fmt not in (1, FORMAT_VERSION):
        raise ChangelogFormatError(
            f"format version {fmt}; this relstate reads versions 1 to {FORMAT_VERSION}"
        )
    try:
        pos, ranges = _ranges(data, _HEADER.size, n_ranges)
        read_ops = _records if fmt == 1 else _columns
        pos, ops = read_ops(data, pos, n_ops)
    except (struct.error, IndexError) as exc:
        raise ChangelogFormatError(f"a record runs past the end: {exc}") from exc
    if pos != len(body):
        raise ChangelogFormatError(f"{len(body) - pos} bytes follow the last record")
    return Changelog(version, cid.hex(), ops, ranges)


def _ranges(data: bytes, pos: int, count: int) -> tuple[int, list[tuple[bytes, bytes]]]:
    u32 = _U32.unpack_from
    out = []
    for _ in range(count):
        (n,) = u32(data, pos)
        start = data[pos + 4 : pos + 4 + n]
        pos += 4 + n
        (n,) = u32(data, pos)
        end = data[pos + 4 : pos + 4 + n]
        pos += 4 + n
        out.append((start, end))
    if pos > len(data) - _TRAILER.size:
        raise ChangelogFormatError("a range delete runs past the end of the file")
    return pos, out


def _records(data: bytes, pos: int, count: int) -> tuple[int, Writes]:
    u32 = _U32.unpack_from
    op = _OP.unpack_from
    keys: list[bytes] = []
    values: list[bytes | None] = []
    limit = len(data) - _TRAILER.size
    for _ in range(count):
        kind, n = op(data, pos)
        pos += 5
        key = data[pos : pos + n]
        pos += n
        if kind == _PUT:
            (n,) = u32(data, pos)
            pos += 4
            keys.append(key)
            values.append(data[pos : pos + n])
            pos += n
        elif kind == _DELETE:
            keys.append(key)
            values.append(None)
        else:
            raise ChangelogFormatError(f"unknown operation kind {kind} at byte {pos - 5 - n}")
        if pos > limit:
            raise ChangelogFormatError("a record runs past the end of the file")
    return pos, Writes.columns(keys, values)


def _columns(data: bytes, pos: int, count: int) -> tuple[int, Writes]:
    """Format 2's operations, laid out column by column: the Arrow arrays
    are built on the file's own bytes, without a Python step per operation."""
    limit = len(data) - _TRAILER.size

    def take(size: int) -> memoryview:
        nonlocal pos
        if pos + size > limit:
            raise ChangelogFormatError("the operations run past the end of the file")
        view = memoryview(data)[pos : pos + size]
        pos += size
        return view

    kinds = np.frombuffer(take(count), dtype=np.uint8)
    if kinds.size and int(kinds.max()) > _DELETE:
        bad = int(np.flatnonzero(kinds > _DELETE)[0])
        raise ChangelogFormatError(f"unknown operation kind {int(kinds[bad])} at operation {bad}")
    put = kinds == _PUT
    key_lengths = np.frombuffer(take(4 * count), dtype=_LENGTHS).astype(np.int64)
    value_lengths = np.zeros(count, dtype=np.int64)
    value_lengths[put] = np.frombuffer(take(4 * int(put.sum())), dtype=_LENGTHS)
    keys = take(int(key_lengths.sum()))
    values = take(int(value_lengths.sum()))
    validity = None if put.all() else pa.py_buffer(np.packbits(put, bitorder="little"))
    return pos, Writes.from_arrays(
        _binary(count, None, key_lengths, keys), _binary(count, validity, value_lengths, values)
    )


def _binary(
    count: int, validity: pa.Buffer | None, lengths: np.ndarray, data: memoryview
) -> pa.Array:
    """A ``large_binary`` array of ``count`` items of ``lengths`` over ``data``."""
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.large_binary(), count, [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
