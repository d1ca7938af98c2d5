"""StateTable against a dict model over random operations, commits, scans and
reopens, on every backend and layout."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from encoding import Direction, KeyCodec, KeyColumn, NullOrder, TableSchema
from statestore import InconsistencyError, KVBackend, StateTable
from tests.conftest import BackendFactory, reopen

COLUMNS = pa.schema(
    [
        ("a", pa.int8()),
        ("b", pa.string()),
        ("v", pa.int64()),
        ("w", pa.string()),
    ]
)
A = st.one_of(st.none(), st.integers(-3, 3))
B = st.sampled_from(["", "x", "x\x00", "xy", "y"])
V = st.one_of(st.none(), st.integers(-5, 5))
W = st.one_of(st.none(), st.sampled_from(["p", "q"]))
ROWS = st.tuples(A, B, V, W)

OPS = st.one_of(
    st.tuples(st.just("insert"), ROWS),
    st.tuples(st.just("delete"), ROWS),
    st.tuples(st.just("update"), ROWS),
    st.tuples(st.just("upsert"), ROWS),
    st.tuples(st.just("delete_key"), ROWS),
    st.tuples(st.just("get"), ROWS),
    st.tuples(st.just("get_rows"), st.lists(ROWS, max_size=4)),
    st.tuples(
        st.just("scan"),
        st.tuples(st.integers(0, 2), A, B, st.booleans(), st.booleans(), st.booleans()),
    ),
    st.tuples(st.just("scan_ranges"), st.lists(st.tuples(A, B), max_size=3)),
    st.tuples(
        st.just("scan_ranges_plain"), st.lists(st.tuples(st.integers(0, 2), A, B), max_size=4)
    ),
    st.tuples(st.just("scan_prefixes"), st.lists(st.tuples(st.integers(0, 2), A, B), max_size=4)),
    st.tuples(st.just("get_batch"), st.lists(ROWS, max_size=4)),
    st.tuples(st.just("delete_keys"), st.lists(ROWS, max_size=4, unique_by=lambda r: r[:2])),
    st.tuples(st.just("update_batch"), st.lists(ROWS, max_size=4, unique_by=lambda r: r[:2])),
    st.tuples(st.just("clean"), A),
    st.tuples(st.just("clean_from"), st.tuples(A, A)),
    st.just(("commit", None)),
    st.just(("abort", None)),
    st.just(("reopen", None)),
)

SCHEMAS = st.builds(
    lambda da, na, db, layout: TableSchema(
        3, COLUMNS, (KeyColumn("a", da, na), KeyColumn("b", db)), layout=layout
    ),
    st.sampled_from(list(Direction)),
    st.sampled_from(list(NullOrder)),
    st.sampled_from(list(Direction)),
    st.sampled_from(["row", "cell"]),
)


class Model:
    """What the table should hold: committed rows and the epoch's view."""

    def __init__(self) -> None:
        self.committed: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.current: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return row[:2]


class TestStateTableModel:
    @pytest.mark.parametrize("consistency", ["strict", "relaxed", "unchecked"])
    @given(schema=SCHEMAS, ops=st.lists(OPS, max_size=60))
    def test_matches_dict_model(
        self,
        backend_factory: BackendFactory,
        consistency: str,
        schema: TableSchema,
        ops: list[tuple[str, Any]],
    ) -> None:
        """Every read equals the model's; strict inconsistencies raise and change
        nothing; commits, aborts, cleans and reopens keep the model's state."""
        backend: KVBackend = backend_factory()
        table = StateTable(schema, backend, consistency=consistency)
        keys = KeyCodec(schema)
        model = Model()
        epoch = 0
        strict = consistency == "strict"
        # Unchecked mode counts operations as issued: exact while they agree
        # with the table.
        all_consistent = True

        def ordered(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
            return sorted(rows, key=lambda r: keys.encode(_key(r)))

        for name, arg in ops:
            cur = model.current
            if name in ("insert", "delete", "update"):
                row = arg
                k = _key(row)
                stored = cur.get(k)
                ok = {
                    "insert": stored is None,
                    "delete": stored == row,
                    "update": stored is not None,
                }[name]
                if name == "update" and stored is not None:
                    old, new = stored, row
                elif name == "update":
                    old, new = row, row
                all_consistent = all_consistent and ok
                if strict and not ok:
                    with pytest.raises(InconsistencyError):
                        _apply(table, name, row, old if name == "update" else None)
                else:
                    _apply(table, name, row, old if name == "update" else None)
                    if name == "delete":
                        cur.pop(k, None)
                    else:
                        cur[k] = new if name == "update" else row
            elif name == "upsert":
                table.upsert(arg)
                cur[_key(arg)] = arg
            elif name == "delete_key":
                assert table.delete_key(_key(arg)) == cur.pop(_key(arg), None)
            elif name == "get":
                assert table.get_row(_key(arg)) == cur.get(_key(arg))
            elif name == "get_rows":
                assert table.get_rows([_key(r) for r in arg]) == [cur.get(_key(r)) for r in arg]
            elif name == "scan_ranges":
                # Each range: the rows of one value of a, from b on.
                ranges = [((a,), (b,), None) for a, b in arg]
                lowers = [keys.encode((a, b)) for a, b in arg]
                expected = []
                for (a, _), lower in zip(arg, lowers, strict=True):
                    hits = [r for r in cur.values() if r[0] == a and keys.encode(_key(r)) >= lower]
                    expected += ordered(hits)
                assert _tuples(table.scan_ranges(ranges)) == expected
            elif name == "scan_prefixes":
                # Every row under any prefix, once, in key order.
                prefixes = [(a, b)[:depth] for depth, a, b in arg]
                under = [r for r in cur.values() if any(_key(r)[: len(p)] == p for p in prefixes)]
                assert _tuples(table.scan_prefixes(prefixes)) == ordered(under)
            elif name == "scan_ranges_plain":
                # Plain prefixes (no start or end), of any depth, in any order.
                prefixes = [(a, b)[:depth] for depth, a, b in arg]
                expected = []
                for prefix in prefixes:
                    under = [r for r in cur.values() if _key(r)[: len(prefix)] == prefix]
                    expected += ordered(under)
                got = table.scan_ranges([(prefix, None, None) for prefix in prefixes])
                assert _tuples(got) == expected
            elif name == "get_batch":
                found, mask = table.get_batch(_keys_batch(arg))
                assert mask.to_pylist() == [_key(r) in cur for r in arg]
                assert _tuples(found) == [cur[_key(r)] for r in arg if _key(r) in cur]
                assert table.contains(_keys_batch(arg)) == mask.to_pylist()
            elif name == "delete_keys":
                present = [_key(r) for r in arg if _key(r) in cur]
                deleted = table.delete_keys(_keys_batch(arg))
                if consistency == "unchecked":
                    assert deleted == len(arg)
                    all_consistent = all_consistent and len(present) == len(arg)
                else:
                    assert deleted == len(present)
                for k in present:
                    del cur[k]
            elif name == "update_batch":
                ok = all(_key(r) in cur for r in arg)
                all_consistent = all_consistent and ok
                if strict and not ok:
                    with pytest.raises(InconsistencyError):
                        table.update_batch(pa.Table.from_pylist([_named(r) for r in arg], COLUMNS))
                else:
                    table.update_batch(pa.Table.from_pylist([_named(r) for r in arg], COLUMNS))
                    cur.update((_key(r), r) for r in arg)
            elif name == "scan":
                depth, a, b, reverse, ranged, as_batch = arg
                prefix = (a, b)[:depth]
                expected = [r for r in cur.values() if _key(r)[:depth] == prefix]
                expected = ordered(expected)
                start = None
                if ranged and depth < 2:
                    start = ((a, b)[depth],)
                    lower = keys.encode((*prefix, *start))
                    expected = [r for r in expected if keys.encode(_key(r)) >= lower]
                if reverse:
                    expected.reverse()
                if as_batch:
                    found = _tuples(table.scan_batch(prefix, start=start, reverse=reverse))
                else:
                    found = list(table.scan(prefix, start=start, reverse=reverse))
                assert found == expected
            elif name == "clean":
                bound = keys.encode((arg,))
                gone = [k for k in cur if keys.encode(k) < bound]
                assert table.clean_below(arg) == len(gone)
                for k in gone:
                    del cur[k]
            elif name == "clean_from":
                start, watermark = arg
                lower, upper = keys.encode((start,)), keys.encode((watermark,))
                gone = [k for k in cur if lower <= keys.encode(k) < upper]
                assert table.clean_below(watermark, start=start) == len(gone)
                for k in gone:
                    del cur[k]
            elif name == "commit":
                epoch += 1
                table.commit(epoch)
                model.committed = dict(cur)
            elif name == "abort":
                table.abort()
                model.current = dict(model.committed)
            elif name == "reopen":
                backend = reopen(backend)
                table = StateTable(schema, backend, consistency=consistency)
                model.current = dict(model.committed)
            assert table.row_count == len(model.current) or not strict
        epoch += 1
        table.commit(epoch)
        assert list(table.scan()) == ordered(list(model.current.values()))
        if consistency != "unchecked" or all_consistent:
            assert table.row_count == len(model.current)


def _apply(table: StateTable, name: str, row: tuple[Any, ...], old: tuple[Any, ...] | None) -> None:
    if name == "insert":
        table.insert(row)
    elif name == "delete":
        table.delete(row)
    else:
        assert old is not None
        table.update(old, row)


def _named(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(COLUMNS.names, row, strict=True))


def _keys_batch(rows: list[tuple[Any, ...]]) -> pa.Table:
    """The primary keys of ``rows`` as a table of the key columns."""
    return pa.Table.from_pylist(
        [{"a": r[0], "b": r[1]} for r in rows],
        pa.schema([COLUMNS.field("a"), COLUMNS.field("b")]),
    )


def _tuples(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in batch.to_pylist()]
