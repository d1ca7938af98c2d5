"""The key-value backend protocol that state tables are written against."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Protocol, overload, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["KVBackend", "WriteOp", "Writes"]

#: One write of an atomic batch: ``(key, value)`` puts, ``(key, None)`` deletes.
WriteOp = tuple[bytes, bytes | None]

_first, _second = itemgetter(0), itemgetter(1)


class Writes(Sequence[WriteOp]):
    """A batch of :data:`WriteOp`, held column by column in Arrow: ``keys``,
    and ``values`` with a null for each delete (both ``large_binary``).

    This is how a commit carries its writes: sorted by Arrow in one C pass,
    written to the changelog from the arrays' buffers, and handed to RocksDB
    as fresh bytes objects laid out in key order. A list of tuples holds the
    same writes, but a commit's keys are scattered over the heap, and each
    pass over them in key order (sorting, encoding, writing) costs a cache
    miss per key (measured: about three times the same passes over
    contiguous objects).
    """

    __slots__ = ("keys", "values")

    def __init__(self, keys: pa.Array, values: pa.Array) -> None:
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
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
        return cls(pa.array(keys, pa.large_binary()), pa.array(values, pa.large_binary()))

    @classmethod
    def in_key_order(cls, keys: list[bytes], values: list[bytes | None]) -> Writes:
        """``keys[i]`` gets ``values[i]``, sorted by key (keys compare as
        unsigned bytes; they must be distinct)."""
        writes = cls.columns(keys, values)
        order = pc.sort_indices(writes.keys)
        return cls(writes.keys.take(order), writes.values.take(order))

    def pairs(self) -> Iterator[WriteOp]:
        """The writes in order, as new bytes objects."""
        return zip(self.keys.to_pylist(), self.values.to_pylist(), strict=True)

    def __iter__(self) -> Iterator[WriteOp]:
        return self.pairs()

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

    def __repr__(self) -> str:
        return f"Writes({len(self)} writes)"


@runtime_checkable
class KVBackend(Protocol):
    """An ordered map from bytes to bytes with atomic batch writes.

    Keys compare as unsigned bytes. Iteration bounds are half-open: ``lower`` is
    included, ``upper`` is excluded, ``None`` means unbounded.
    """

    def get(self, key: bytes) -> bytes | None:
        """The value at ``key``, or ``None``."""
        ...

    def multi_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The values at ``keys``, in order, ``None`` where absent."""
        ...

    def write(
        self,
        ops: Sequence[WriteOp],
        range_deletes: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """Apply puts, deletes and range deletes ``[start, end)`` atomically.

        Range deletes apply before the point operations of the same batch.
        """
        ...

    def items(
        self,
        lower: bytes = b"",
        upper: bytes | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Key-value pairs with ``lower <= key < upper``, ascending or descending."""
        ...

    def read_range(
        self, lower: bytes = b"", upper: bytes | None = None, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """What :meth:`items` yields, read at once into a list: for a caller
        that wants the whole range, without a Python step per pair."""
        ...

    def read_values(self, lower: bytes = b"", upper: bytes | None = None) -> list[bytes]:
        """The values of :meth:`items`, ascending, read at once into a list."""
        ...

    def keys(self, lower: bytes = b"", upper: bytes | None = None) -> Iterator[bytes]:
        """Keys with ``lower <= key < upper``, ascending."""
        ...

    def close(self) -> None:
        """Release the backend; later calls raise ``BackendClosedError``."""
        ...
