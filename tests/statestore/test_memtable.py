"""The MemTable merge rules (RisingWave's table, in statestore/_memtable.py)."""

from __future__ import annotations

import pytest

from statestore import KeyOp, MemTable, OpKind

K = b"k"


def _after(*ops: tuple[str, bytes | None, bytes | None]) -> tuple[KeyOp | None, list[bool]]:
    mem = MemTable()
    results = []
    for name, a, b in ops:
        if name == "insert":
            assert b is not None
            results.append(mem.insert(K, b))
        elif name == "delete":
            assert a is not None
            results.append(mem.delete(K, a))
        else:
            assert a is not None and b is not None
            results.append(mem.update(K, a, b))
    return mem.get(K), results


class TestMemTable:
    @pytest.mark.parametrize(
        ("ops", "expected"),
        [
            ([("insert", None, b"v")], KeyOp(OpKind.INSERT, None, b"v")),
            ([("delete", b"o", None)], KeyOp(OpKind.DELETE, b"o", None)),
            ([("update", b"o", b"n")], KeyOp(OpKind.UPDATE, b"o", b"n")),
            ([("insert", None, b"a"), ("delete", b"a", None)], None),
            ([("insert", None, b"a"), ("update", b"a", b"n")], KeyOp(OpKind.INSERT, None, b"n")),
            ([("delete", b"a", None), ("insert", None, b"v")], KeyOp(OpKind.UPDATE, b"a", b"v")),
            ([("update", b"a", b"b"), ("delete", b"b", None)], KeyOp(OpKind.DELETE, b"a", None)),
            (
                [("update", b"a", b"b"), ("update", b"b", b"n")],
                KeyOp(OpKind.UPDATE, b"a", b"n"),
            ),
        ],
    )
    def test_consistent_merges(
        self, ops: list[tuple[str, bytes | None, bytes | None]], expected: KeyOp | None
    ) -> None:
        """Each consistent cell of the merge table gives the documented net op."""
        op, results = _after(*ops)
        assert op == expected
        assert all(results)

    @pytest.mark.parametrize(
        ("ops", "expected"),
        [
            ([("insert", None, b"a"), ("insert", None, b"v")], KeyOp(OpKind.INSERT, None, b"v")),
            ([("delete", b"a", None), ("delete", b"a", None)], KeyOp(OpKind.DELETE, b"a", None)),
            (
                [("delete", b"a", None), ("update", b"a", b"n")],
                KeyOp(OpKind.UPDATE, b"a", b"n"),
            ),
            (
                [("update", b"a", b"b"), ("insert", None, b"v")],
                KeyOp(OpKind.UPDATE, b"a", b"v"),
            ),
        ],
    )
    def test_conflicts_report_and_newest_wins(
        self, ops: list[tuple[str, bytes | None, bytes | None]], expected: KeyOp
    ) -> None:
        """Each error cell of the merge table returns False and keeps the newest row."""
        op, results = _after(*ops)
        assert op == expected
        assert results[-1] is False

    def test_range_is_ordered_and_bounded(self) -> None:
        """range() yields keys in [lower, upper) in order, reversed on request."""
        mem = MemTable()
        for k in (b"c", b"a", b"e", b"b"):
            mem.insert(k, k)
        assert [k for k, _ in mem.range(b"b", b"e")] == [b"b", b"c"]
        assert [k for k, _ in mem.range(b"", None, reverse=True)] == [b"e", b"c", b"b", b"a"]
        mem.insert(b"d", b"d")
        mem.delete(b"c", b"c")
        assert [k for k, _ in mem.range(b"", None)] == [b"a", b"b", b"d", b"e"]

    def test_under_prefixes_is_each_prefix_range_in_order(self) -> None:
        """under_prefixes() gives the operations under any of the (ascending,
        disjoint) prefixes in key order, deletes as ``None``: what one range
        per prefix gives, concatenated."""
        mem = MemTable()
        for k in (b"ba", b"a1", b"c", b"b", b"a2", b"bz", b"d"):
            mem.insert(k, k)
        mem.insert(b"aa", b"x")
        mem.delete(b"aa", b"x")  # an insert then a delete is nothing
        mem.delete(b"e", b"old")  # a delete of a stored row
        prefixes = [b"a", b"b", b"e", b"f"]
        expected = [op for p in prefixes for op in mem.range(p, p + b"\xff")]
        got = mem.under_prefixes(prefixes)
        assert got == expected
        assert [k for k, _ in got] == [b"a1", b"a2", b"b", b"ba", b"bz", b"e"]
        assert dict(got)[b"e"] is None
        assert mem.under_prefixes([]) == [] and MemTable().under_prefixes([b"a"]) == []
        # Few prefixes of many keys take a range read each: the same answer.
        for i in range(200):
            mem.insert(b"c%03d" % i, b"v")
        few = [b"a", b"c01"]
        assert mem.under_prefixes(few) == [op for p in few for op in mem.range(p, p + b"\xff")]
        assert len(mem.under_prefixes(few)) == 2 + 10

    def test_drop_range(self) -> None:
        """drop_range removes and returns the operations in [lower, upper)."""
        mem = MemTable()
        for k in (b"a", b"b", b"c"):
            mem.insert(k, k)
        dropped = mem.drop_range(b"a", b"c")
        assert [k for k, _ in dropped] == [b"a", b"b"]
        assert len(mem) == 1 and b"c" in mem

    @pytest.mark.parametrize("blind", [False, True])
    def test_insert_many_merges_as_inserts_one_at_a_time(self, blind: bool) -> None:
        """insert_many of new keys, a key twice, or touched keys equals inserts one by one."""
        batches = [
            ([b"b", b"a"], [b"1", b"2"]),
            ([b"c", b"d", b"c"], [b"3", b"4", b"5"]),
            ([b"e", b"a"], [b"6", b"7"]),
        ]
        mem, one_by_one = MemTable(blind), MemTable(blind)
        mem.range(b"", None)  # an ordered read first: later keys wait to be sorted
        one_by_one.range(b"", None)
        for keys, values in batches:
            conflicts = mem.insert_many(keys, values)
            expected = [k for k, v in zip(keys, values, strict=True) if not one_by_one.insert(k, v)]
            assert conflicts == expected
        assert mem.range(b"", None) == one_by_one.range(b"", None)
        assert (mem.inserts, mem.deletes) == (one_by_one.inserts, one_by_one.deletes) == (5, 0)
