"""The relational operators' shared helpers: batched multiplicity writes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from encoding import TableSchema
from operators._api.relational import add_counts, ascending, net_changes, unheld
from statestore import ConsistencyMode, StateStore

COUNTS = TableSchema(
    1,
    pa.schema([("g", pa.string()), ("v", pa.int64()), ("__n", pa.int64(), False)]),
    ["g", "v"],
    name="counts",
)


class TestAddCounts:
    def test_inserts_updates_and_deletes_in_one_call(self) -> None:
        """Net changes go in as one batch: a new row is inserted, a held row's
        count updated, one brought to zero deleted, and one retracted past
        what was held deleted and reported by unheld; before/after per row."""
        store = StateStore.in_memory("op", 0, [COUNTS], ConsistencyMode.UNCHECKED)
        store.load(None)
        table = store.table("counts")
        table.insert(("a", 1, 2))
        table.insert(("a", 2, 1))
        table.insert(("b", 1, 1))
        store.commit(0)
        store.load(0)
        table = store.table("counts")
        rows = pa.table({"g": ["a", "a", "b", "c", "c"], "v": [1, 2, 1, 1, 2]})
        before, after = add_counts(table, rows, pa.array([3, -1, -3, 1, -2], pa.int64()))
        assert before.to_pylist() == [2, 1, 1, 0, 0]
        assert after.to_pylist() == [5, 0, -2, 1, -2]
        assert unheld(after) == 4
        assert sorted(table.scan()) == [("a", 1, 5), ("c", 1, 1)]

    def test_counts_already_read_are_not_looked_up(self) -> None:
        """Given the rows read under some prefixes (group ``a``'s), the rows
        under them take their counts from those rows, or zero where the read
        holds none, and only the others are looked up: the same counts and
        writes as without, and the looked-up rows are exactly the others."""
        store = StateStore.in_memory("op", 0, [COUNTS], ConsistencyMode.UNCHECKED)
        store.load(None)
        table = store.table("counts")
        for row in [("a", 1, 2), ("a", 2, 1), ("b", 1, 1)]:
            table.insert(row)
        store.commit(0)
        store.load(0)
        table = store.table("counts")
        read = table.scan_prefixes([("a",)])
        looked_up: list[list[tuple[object, ...]]] = []
        get_batch = table.get_batch

        def spy(rows: pa.Table) -> tuple[pa.RecordBatch, pa.BooleanArray]:
            looked_up.append([tuple(r.values()) for r in rows.to_pylist()])
            return get_batch(rows)

        table.get_batch = spy  # type: ignore[method-assign]
        rows = pa.table({"g": ["a", "a", "a", "b", "c"], "v": [1, 2, 3, 1, 1]})
        under = np.array([True, True, True, False, False])
        deltas = pa.array([1, -1, 1, -1, 1], pa.int64())
        before, after = add_counts(table, rows, deltas, (read, under))
        assert looked_up == [[("b", 1), ("c", 1)]]
        assert before.to_pylist() == [2, 1, 0, 1, 0]
        assert after.to_pylist() == [3, 0, 1, 0, 1]
        assert sorted(table.scan()) == [("a", 1, 3), ("a", 3, 1), ("c", 1, 1)]


class TestNetChanges:
    def test_ascending_is_the_order_of_the_encoded_keys(self) -> None:
        """``ascending`` sorts a batch's net changes by their key columns,
        nulls first, changes that cancel left out: the order of the keys a
        plain ascending state table encodes, so that the multi-get of their
        rows needs no sort."""
        sign = pa.array([1, 1, -1, 1, 1, 1, 1], pa.int64())
        groups = pa.array(["b", "a", "b", None, "a", "a", "ab"])
        net = ascending(net_changes([groups, pa.array([2, 9, 2, 1, 3, 9, 0])], sign))
        assert net.to_pylist() == [
            {"__k0": None, "__k1": 1, "__s_sum": 1},
            {"__k0": "a", "__k1": 3, "__s_sum": 1},
            {"__k0": "a", "__k1": 9, "__s_sum": 2},
            {"__k0": "ab", "__k1": 0, "__s_sum": 1},
        ]
        store = StateStore.in_memory("op", 0, [COUNTS], ConsistencyMode.UNCHECKED)
        store.load(None)
        rows = pa.table({"g": net.column(0), "v": net.column(1)})
        encoded = store.table("counts").keys.encode_batch(rows)
        assert encoded == sorted(encoded)
