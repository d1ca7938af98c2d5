"""An in-memory sorted backend: the reference model for tests and a fast
backend for state that need not survive the process."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice

from sortedcontainers import SortedDict

from statestore._typing import WriteOp
from statestore.errors import BackendClosedError

__all__ = ["MemoryBackend"]


class MemoryBackend:
    """A :class:`~statestore.KVBackend` over a sorted dict."""

    def __init__(self) -> None:
        self._data: SortedDict[bytes, bytes] | None = SortedDict()

    def _live(self) -> SortedDict[bytes, bytes]:
        if self._data is None:
            raise BackendClosedError("the memory backend is closed; open a new one")
        return self._data

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._live().get(key)
        return value

    def multi_get(self, keys: Sequence[bytes]) -> list[bytes | None]:
        data = self._live()
        return [data.get(k) for k in keys]

    def write(
        self,
        ops: Sequence[WriteOp],
        range_deletes: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        data = self._live()
        for start, end in range_deletes:
            for key in list(data.irange(start, end, inclusive=(True, False))):
                del data[key]
        for key, value in ops:
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value

    def items(
        self,
        lower: bytes = b"",
        upper: bytes | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        data = self._live()
        # Copied eagerly, so that writes during iteration are not seen: the same
        # snapshot semantics as a RocksDB iterator.
        keys = data.irange(lower, upper, inclusive=(True, False), reverse=reverse)
        return iter([(k, data[k]) for k in keys])

    def read_range(
        self, lower: bytes = b"", upper: bytes | None = None, reverse: bool = False
    ) -> list[tuple[bytes, bytes]]:
        return list(self.items(lower, upper, reverse))

    def read_values(self, lower: bytes = b"", upper: bytes | None = None) -> list[bytes]:
        data = self._live()
        return [data[k] for k in data.irange(lower, upper, inclusive=(True, False))]

    def read_short(self, lower: bytes, upper: bytes | None, limit: int) -> list[bytes] | None:
        """The values with ``lower <= key < upper``, ascending, if there are at
        most ``limit``; ``None`` if there are more."""
        data = self._live()
        keys = list(islice(data.irange(lower, upper, inclusive=(True, False)), limit + 1))
        if len(keys) > limit:
            return None
        return [data[k] for k in keys]

    def keys(self, lower: bytes = b"", upper: bytes | None = None) -> Iterator[bytes]:
        return iter(self.read_keys(lower, upper))

    def read_keys(self, lower: bytes = b"", upper: bytes | None = None) -> list[bytes]:
        return list(self._live().irange(lower, upper, inclusive=(True, False)))

    def copy(self) -> MemoryBackend:
        """A new backend holding the same data (a committed version, say)."""
        other = MemoryBackend()
        other._data = self._live().copy()
        return other

    def close(self) -> None:
        self._data = None

    def __len__(self) -> int:
        return len(self._live())
