"""A commit's write batch, held column by column in Arrow."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any, overload

import pyarrow as pa
import pyarrow.compute as pc

from statestore._typing import WriteOp

__all__ = ["Writes"]

_first, _second = itemgetter(0), itemgetter(1)
_BINARY = pa.large_binary()


class Writes(Sequence[WriteOp]):
    """A batch of :data:`WriteOp` as two Arrow ``large_binary`` arrays:
    ``keys``, and ``values`` with a null for each delete.

    This is how a commit carries its writes: sorted in C, written to the
    changelog from the arrays' buffers, and handed to RocksDB as new bytes
    objects laid out in key order. A list of tuples holds the same writes,
    but a commit's keys lie scattered over the heap, and each pass over them
    in key order (sorting, encoding, writing) costs a cache miss per key.
    Two batches are equal when they hold the same writes in the same order.
    """

    __slots__ = ("keys", "values")

    def __init__(self, keys: pa.Array, values: pa.Array) -> None:
        for name, column in (("keys", keys), ("values", values)):
            if not isinstance(column, pa.Array) or column.type != _BINARY:
                kind = getattr(column, "type", type(column).__name__)
                raise TypeError(f"Writes {name} must be a large_binary Array, not {kind}")
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        if keys.null_count:
            raise ValueError(f"{keys.null_count} null key(s): a key is never null")
        self.keys = keys
        self.values = values

    @classmethod
    def of(cls, ops: Iterable[WriteOp]) -> Writes:
        """``ops`` in their order."""
        if isinstance(ops, Writes):
            return ops
        ops = ops if isinstance(ops, Sequence) else list(ops)
        return cls.columns(list(map(_first, ops)), list(map(_second, ops)))

    @classmethod
    def columns(cls, keys: list[bytes], values: list[bytes | None]) -> Writes:
        """``keys[i]`` gets ``values[i]``, in this order."""
        return cls(pa.array(keys, _BINARY), pa.array(values, _BINARY))

    @classmethod
    def in_key_order(cls, keys: list[bytes], values: list[bytes | None]) -> Writes:
        """``keys[i]`` gets ``values[i]``, sorted by key (keys compare as
        unsigned bytes; they must be distinct)."""
        writes = cls.columns(keys, values)
        order = pc.sort_indices(writes.keys)
        return cls(writes.keys.take(order), writes.values.take(order))

    def __iter__(self) -> Iterator[WriteOp]:
        return zip(self.keys.to_pylist(), self.values.to_pylist(), strict=True)

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, index: int) -> WriteOp: ...

    @overload
    def __getitem__(self, index: slice) -> Writes: ...

    def __getitem__(self, index: int | slice) -> WriteOp | Writes:
        if isinstance(index, slice):
            return Writes(self.keys[index], self.values[index])
        return (self.keys[index].as_py(), self.values[index].as_py())

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Writes):
            return NotImplemented
        return bool(self.keys.equals(other.keys) and self.values.equals(other.values))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Writes({len(self)} writes)"
