"""``Writes``: a commit's write batch held as Arrow columns."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from statestore import MemoryBackend, RocksDBBackend, Writes, _changelog

keys = st.binary(min_size=0, max_size=24)
values = st.none() | st.binary(max_size=40)
distinct_ops = st.dictionaries(keys, values, max_size=40).map(lambda d: list(d.items()))


class TestWrites:
    @given(ops=distinct_ops)
    def test_in_key_order_sorts_as_unsigned_bytes(
        self, ops: list[tuple[bytes, bytes | None]]
    ) -> None:
        """in_key_order sorts the pairs by key as unsigned bytes, values kept with their keys."""
        writes = Writes.in_key_order([k for k, _ in ops], [v for _, v in ops])
        assert list(writes) == sorted(ops, key=lambda op: op[0])

    @given(ops=st.lists(st.tuples(keys, values), max_size=30))
    def test_of_keeps_order_and_repeats(self, ops: list[tuple[bytes, bytes | None]]) -> None:
        """Writes.of keeps pairs in order, repeats included: length, items, slices, equality."""
        writes = Writes.of(ops)
        assert list(writes) == ops and len(writes) == len(ops)
        assert [writes[i] for i in range(len(ops))] == ops
        assert list(writes[1:3]) == ops[1:3]
        assert Writes.of(writes) is writes
        assert writes == Writes.of(list(ops)) and writes != Writes.of([*ops, (b"x", None)])

    @given(ops=st.lists(st.tuples(keys, values), max_size=30))
    def test_changelog_bytes_are_those_of_the_pairs(
        self, ops: list[tuple[bytes, bytes | None]]
    ) -> None:
        """A Writes (or a slice of one) encodes to the bytes of its pairs as a list, and back."""
        as_list = _changelog.encode(7, "ab" * 16, ops, [(b"a", b"b")])
        as_writes = _changelog.encode(7, "ab" * 16, Writes.of(ops), [(b"a", b"b")])
        assert as_list == as_writes
        assert _changelog.decode(as_writes).writes == Writes.of(ops)
        part = _changelog.encode(7, "ab" * 16, Writes.of(ops)[2:5], [])
        assert part == _changelog.encode(7, "ab" * 16, ops[2:5], [])

    def test_bad_columns_are_refused(self) -> None:
        """Columns of unequal length, of another type, or with a null key are refused."""
        with pytest.raises(ValueError, match="2 keys for 1 values"):
            Writes.columns([b"a", b"b"], [b"x"])
        with pytest.raises(TypeError, match="large_binary"):
            Writes(pa.array([b"a"]), pa.array([b"x"]))
        with pytest.raises(TypeError, match="large_binary"):
            Writes(
                pa.chunked_array([[b"a"]], pa.large_binary()), pa.array([b"x"], pa.large_binary())
            )  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="null key"):
            Writes.columns([None], [b"x"])  # type: ignore[list-item]

    @pytest.mark.parametrize("kind", ["memory", "rocksdb"])
    def test_backends_take_writes_as_they_take_pairs(self, kind: str, tmp_path: Path) -> None:
        """A backend holds after a Writes what it holds after the same pairs as a list."""
        ops = [(b"\x01a", b"1"), (b"\x01b", None), (b"\x01c", b"3"), (b"\x02", b"")]

        def backend(name: str) -> MemoryBackend | RocksDBBackend:
            return MemoryBackend() if kind == "memory" else RocksDBBackend(tmp_path / name)

        by_list, by_writes = backend("list"), backend("writes")
        for db in (by_list, by_writes):
            db.write([(b"\x01b", b"old"), (b"\x01z", b"gone")])
        by_list.write(ops, [(b"\x01y", b"\x02")])
        by_writes.write(Writes.of(ops), [(b"\x01y", b"\x02")])
        assert list(by_writes.items()) == list(by_list.items())
        assert list(by_list.items()) == [(b"\x01a", b"1"), (b"\x01c", b"3"), (b"\x02", b"")]
        by_list.close()
        by_writes.close()

    @given(
        ops=st.integers(1, 20)
        .flatmap(
            lambda width: st.dictionaries(
                st.binary(min_size=width, max_size=width).map(
                    lambda k: b"\x00\x07" + k.replace(b"\x01", b"\x00")
                ),
                values,
                max_size=60,
            )
        )
        .map(lambda d: list(d.items()))
    )
    def test_keys_of_one_width_sort_as_unsigned_bytes(
        self, ops: list[tuple[bytes, bytes | None]]
    ) -> None:
        """Keys of one width (zero bytes inside and at the end) sort as unsigned bytes, distinct."""
        writes = Writes.in_key_order([k for k, _ in ops], [v for _, v in ops])
        assert list(writes) == sorted(ops, key=lambda op: op[0])
        assert writes.distinct and writes[1:].distinct
        assert not Writes.of(ops).distinct

    def test_concat_lays_parts_one_after_another(self) -> None:
        """concat joins batches in order: distinct when said and every part is,
        or when every part is ordered and each comes after the last (ordered)."""
        first = Writes.in_key_order([b"\x01b", b"\x01a"], [b"2", None])
        second = Writes.in_key_order([b"\x02a"], [b"3"])
        joined = Writes.concat([first, second], distinct=True)
        assert list(joined) == [(b"\x01a", None), (b"\x01b", b"2"), (b"\x02a", b"3")]
        assert joined.distinct and joined.ordered
        assert not Writes.concat([first, Writes.of([(b"\x03", b"")])], distinct=True).distinct
        assert Writes.concat([first, second]).ordered
        backwards = Writes.concat([second, first])
        assert not backwards.distinct and not backwards.ordered
        assert not Writes.concat([second, first], distinct=True).ordered
        assert not joined[::-1].ordered and joined[1:].ordered
        assert len(Writes.concat([])) == 0

    def test_concat_keeps_where_each_part_begins(self) -> None:
        """An ordered concat records where each non-empty part begins, and
        run_slices gives the parts back; an unordered one records none."""
        first = Writes.in_key_order([b"\x01b", b"\x01a"], [b"2", None])
        second = Writes.in_key_order([b"\x02a"], [b"3"])
        empty = Writes.in_key_order([], [])
        joined = Writes.concat([first, empty, second], distinct=True)
        assert joined.runs == (0, 2)
        assert joined.run_slices() == [first, second]
        assert all(part.ordered for part in joined.run_slices())
        assert Writes.concat([second, first]).runs == ()
        assert first.run_slices() == [first]

    @pytest.mark.parametrize("kind", ["memory", "rocksdb"])
    def test_backends_take_distinct_writes_as_pairs(self, kind: str, tmp_path: Path) -> None:
        """A backend holds after a distinct Writes (deletes and puts mixed) what the pairs give."""
        ops = [(bytes([1, i]), None if i % 3 == 0 else bytes([i])) for i in range(30)]
        writes = Writes.in_key_order([k for k, _ in ops], [v for _, v in ops])
        db = MemoryBackend() if kind == "memory" else RocksDBBackend(tmp_path / "db")
        db.write([(k, b"old") for k, _ in ops] + [(b"\x01\xff", b"kept")])
        db.write(writes, [(b"\x00", b"\x01")])
        expected = [(k, v) for k, v in ops if v is not None] + [(b"\x01\xff", b"kept")]
        assert list(db.items()) == expected
        db.close()

    @given(ops=st.lists(st.tuples(keys, values), max_size=30))
    def test_changelog_parts_are_the_file_and_its_crc(
        self, ops: list[tuple[bytes, bytes | None]]
    ) -> None:
        """encode_parts gives the file's bytes in parts and the CRC-32 of the whole file."""
        import zlib

        parts, crc = _changelog.encode_parts(3, "cd" * 16, Writes.of(ops), [(b"a", b"b")])
        data = b"".join(parts)
        assert data == _changelog.encode(3, "cd" * 16, ops, [(b"a", b"b")])
        assert crc == zlib.crc32(data)
