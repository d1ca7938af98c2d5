"""A commit's write batch, held column by column in Arrow."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, pairwise
from operator import itemgetter
from typing import Any, overload

import numpy as np
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

    ``distinct`` says that no key appears twice (as in a commit's batch),
    so that a backend may apply the deletes and the puts in either order;
    ``ordered`` that the keys also ascend, so that a backend may write them
    straight into a sorted file. ``runs`` (ordered batches only) are the
    positions where one of the parts it was made of begins (a table's
    writes, in a commit): a backend may write each part as a sorted file of
    its own, which then spans that part's keys only, not the whole batch's.
    """

    __slots__ = ("distinct", "keys", "ordered", "runs", "values")

    def __init__(
        self,
        keys: pa.Array,
        values: pa.Array,
        distinct: bool = False,
        ordered: bool = False,
        runs: tuple[int, ...] = (),
    ) -> None:
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
        self.distinct = distinct or ordered
        self.ordered = ordered
        self.runs = runs if ordered else ()

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
    def from_arrays(cls, keys: pa.Array, values: pa.Array) -> Writes:
        """``keys[i]`` gets ``values[i]``, in this order; ordered (and so
        distinct) when the keys ascend strictly, which one comparison in C
        finds out (a changelog written from a commit's batch, say)."""
        ordered = len(keys) < 2 or bool(pc.all(pc.less(keys[:-1], keys[1:])).as_py())
        return cls(keys, values, ordered=ordered)

    @classmethod
    def in_key_order(cls, keys: list[bytes], values: list[bytes | None]) -> Writes:
        """``keys[i]`` gets ``values[i]``, sorted by key (keys compare as
        unsigned bytes; they must be distinct)."""
        writes = cls.columns(keys, values)
        flat = _fixed_width(writes.keys)
        if flat is not None:
            # Keys of one width (those of one table, mostly) are sorted as
            # rows of big-endian words, which Arrow sorts in about half the
            # time it takes for the same keys as binary.
            order = _word_order(flat)
            ordered = pa.Array.from_buffers(
                _BINARY, len(flat), [None, writes.keys.buffers()[1], pa.py_buffer(flat[order])]
            )
            return cls(ordered, writes.values.take(pa.array(order)), ordered=True)
        at = pc.sort_indices(writes.keys)
        return cls(writes.keys.take(at), writes.values.take(at), ordered=True)

    @classmethod
    def concat(cls, parts: Sequence[Writes], distinct: bool = False) -> Writes:
        """``parts`` one after another; ``distinct`` says that no key is in
        two of them (the batches of different tables, say). Ordered when
        every part is and each part's keys come after the last part's."""
        if not parts:
            return cls(pa.array([], _BINARY), pa.array([], _BINARY), distinct, ordered=True)
        keys = pa.concat_arrays([p.keys for p in parts])
        values = pa.concat_arrays([p.values for p in parts])
        filled = [p for p in parts if len(p)]
        ordered = all(p.ordered for p in parts) and all(
            a.keys[-1].as_py() < b.keys[0].as_py() for a, b in pairwise(filled)
        )
        runs = tuple(accumulate((len(p) for p in filled[:-1]), initial=0)) if filled else ()
        return cls(keys, values, distinct and all(p.distinct for p in parts), ordered, runs)

    def run_slices(self) -> list[Writes]:
        """The batch cut at :attr:`runs` (one part if it has none); each part
        ordered."""
        cuts = [*(self.runs or (0,)), len(self)]
        return [
            Writes(self.keys[a:b], self.values[a:b], ordered=self.ordered)
            for a, b in pairwise(cuts)
            if b > a
        ]

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
            forward = index.step is None or index.step > 0
            return Writes(
                self.keys[index], self.values[index], self.distinct, self.ordered and forward
            )
        return (self.keys[index].as_py(), self.values[index].as_py())

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Writes):
            return NotImplemented
        return bool(self.keys.equals(other.keys) and self.values.equals(other.values))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Writes({len(self)} writes)"


def _data_buffer(items: pa.Array) -> pa.Buffer:
    data = items.buffers()[2]
    return pa.py_buffer(b"") if data is None else data


def _fixed_width(keys: pa.Array) -> np.ndarray | None:
    """``keys`` (a fresh ``large_binary`` array, offset 0) as a numpy array of
    byte strings when they all have one width of at least a byte, else
    ``None``. Numpy orders byte strings of one width as ``memcmp`` does (it
    pads with zero bytes, which strings of one width never need)."""
    n = len(keys)
    if n < 2 or keys.offset:
        return None
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64, count=n + 1)
    width = int(offsets[1])
    if not width or int(offsets[-1]) != n * width or not (np.diff(offsets) == width).all():
        return None
    return np.frombuffer(_data_buffer(keys), dtype=f"S{width}", count=n)


def _word_order(flat: np.ndarray) -> np.ndarray:
    """The sorting permutation of byte strings of one width: each cut into
    big-endian 8-byte words (the last padded with zero bytes, which keeps
    the order), sorted by the words that are not the same in every string
    (a table's id, say), first to last."""
    n, width = len(flat), flat.dtype.itemsize
    padded = np.zeros((n, -(-width // 8) * 8), dtype=np.uint8)
    padded[:, :width] = np.frombuffer(flat.tobytes(), dtype=np.uint8).reshape(n, width)
    words = padded.view(">u8")
    columns = {
        str(i): words[:, i].astype(np.uint64)
        for i in range(words.shape[1])
        if (words[:, i] != words[0, i]).any()
    }
    if not columns:  # one key, or the same key n times
        return np.arange(n)
    order = pc.sort_indices(pa.table(columns), sort_keys=[(c, "ascending") for c in columns])
    return np.asarray(order)
