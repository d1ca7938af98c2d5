"""The key-value backend protocol that state tables are written against."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

__all__ = ["KVBackend", "WriteOp"]

#: One write of an atomic batch: ``(key, value)`` puts, ``(key, None)`` deletes.
WriteOp = tuple[bytes, bytes | None]


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

    def read_keys(self, lower: bytes = b"", upper: bytes | None = None) -> list[bytes]:
        """What :meth:`keys` yields, read at once into a list."""
        ...

    def close(self) -> None:
        """Release the backend; later calls raise ``BackendClosedError``."""
        ...
