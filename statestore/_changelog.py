"""The changelog file: one commit's write operations in a framed binary format.

::

    header   magic "RSCL" | format u16 | flags u16 | version i64 |
             commit id (16 bytes) | range deletes u32 | operations u32
    body     range delete: start length u32 | start | end length u32 | end
             operation:    kind u8 (0 put, 1 delete) | key length u32 | key |
                           (put only) value length u32 | value
    trailer  CRC-32 of header and body u32 | magic "LCSR"

All integers are big-endian. Range deletes come first because a backend batch
applies them before its point operations; replaying the file is one
:meth:`~statestore.KVBackend.write` of exactly the batch the commit wrote.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from statestore._typing import WriteOp

__all__ = ["FORMAT_VERSION", "Changelog", "ChangelogFormatError", "decode", "encode"]

FORMAT_VERSION = 1
_MAGIC = b"RSCL"
_END = b"LCSR"
_HEADER = struct.Struct(">4sHHq16sII")
_TRAILER = struct.Struct(">I4s")
_U32 = struct.Struct(">I")
_OP = struct.Struct(">BI")
_PUT, _DELETE = 0, 1


class ChangelogFormatError(ValueError):
    """The bytes are not a well-formed changelog file (the caller knows which
    file and turns this into a ``CheckpointCorruptError``)."""


@dataclass(frozen=True)
class Changelog:
    """The decoded contents of one changelog file."""

    version: int
    commit_id: str
    ops: list[WriteOp]
    range_deletes: list[tuple[bytes, bytes]]


def encode(
    version: int,
    commit_id: str,
    ops: Sequence[WriteOp],
    range_deletes: Sequence[tuple[bytes, bytes]],
) -> bytes:
    """The changelog file of one commit."""
    parts: list[bytes] = [
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
    append = parts.append
    u32 = _U32.pack
    for start, end in range_deletes:
        append(u32(len(start)))
        append(start)
        append(u32(len(end)))
        append(end)
    op = _OP.pack
    for key, value in ops:
        if value is None:
            append(op(_DELETE, len(key)))
            append(key)
        else:
            append(op(_PUT, len(key)))
            append(key)
            append(u32(len(value)))
            append(value)
    body = b"".join(parts)
    return body + _TRAILER.pack(zlib.crc32(body), _END)


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
    if fmt != FORMAT_VERSION:
        raise ChangelogFormatError(
            f"format version {fmt}; this relstate reads version {FORMAT_VERSION}"
        )
    try:
        pos, ranges = _ranges(data, _HEADER.size, n_ranges)
        pos, ops = _ops(data, pos, n_ops)
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


def _ops(data: bytes, pos: int, count: int) -> tuple[int, list[WriteOp]]:
    u32 = _U32.unpack_from
    op = _OP.unpack_from
    out: list[WriteOp] = []
    append = out.append
    limit = len(data) - _TRAILER.size
    for _ in range(count):
        kind, n = op(data, pos)
        pos += 5
        key = data[pos : pos + n]
        pos += n
        if kind == _PUT:
            (n,) = u32(data, pos)
            pos += 4
            append((key, data[pos : pos + n]))
            pos += n
        elif kind == _DELETE:
            append((key, None))
        else:
            raise ChangelogFormatError(f"unknown operation kind {kind} at byte {pos - 5 - n}")
        if pos > limit:
            raise ChangelogFormatError("a record runs past the end of the file")
    return pos, out
