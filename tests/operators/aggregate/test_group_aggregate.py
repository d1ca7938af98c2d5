"""GroupAggregate on hand-written changelogs: each aggregate's retraction
edges, the fold within a batch, HAVING, SQL nulls, custom aggregates, and
state across commits and restores on both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import RowKind
from operators.aggregate import Aggregate, GroupAggregate
from operators.errors import InputError
from operators.examples import Variance
from operators.testing import Emitted, OperatorHarness

INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
SCHEMA = pa.schema([("g", pa.string()), ("v", pa.int64()), ("id", pa.int64())])


@pytest.fixture(params=["memory", "rocksdb"])
def make(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., OperatorHarness]]:
    """Opens harnesses of a GroupAggregate on the backend; all closed at the end."""
    opened: list[OperatorHarness] = []

    def build(aggregates: list[Aggregate], **kw: Any) -> OperatorHarness:
        operator = GroupAggregate(SCHEMA, ["g"], aggregates, **kw)
        harness = OperatorHarness(
            operator, backend=request.param, path=tmp_path / f"h{len(opened)}"
        )
        opened.append(harness)
        return harness

    yield build
    for harness in opened:
        harness.close()


def step(h: OperatorHarness, rows: list[tuple[Any, ...]], kinds: Any = None) -> list[Emitted]:
    """Run rows as one micro-batch (the operator folds a whole batch, and
    emits at its end) and return what it emitted."""
    n = len(h.output)
    h.process_rows(rows, kinds)
    h.commit()
    return h.output[n:]


class TestRetractionEdges:
    def test_last_row_retracted_deletes_group(self, make: Callable[..., OperatorHarness]) -> None:
        """Retracting a group's last row emits -D of its result and drops its state."""
        h = make([Aggregate.count(), Aggregate.sum("v")])
        assert step(h, [("a", 5, 1)]) == [(INS, ("a", 1, 5))]
        assert step(h, [("a", 5, 1)], kinds=[DEL]) == [(DEL, ("a", 1, 5))]
        assert list(h.table("results").scan()) == []
        assert step(h, [("a", 2, 2)]) == [(INS, ("a", 1, 2))]

    def test_min_retracted_while_equal_value_remains(
        self, make: Callable[..., OperatorHarness]
    ) -> None:
        """Retracting one row holding the min leaves the min where another row
        holds the same value: the result does not change, nothing is emitted."""
        h = make([Aggregate.min("v"), Aggregate.max("v")])
        step(h, [("a", 1, 1), ("a", 1, 2), ("a", 4, 3)])
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == []
        assert step(h, [("a", 1, 2)], kinds=[DEL]) == [
            (UB, ("a", 1, 4)),
            (UA, ("a", 4, 4)),
        ]

    def test_max_retracted_brings_next(self, make: Callable[..., OperatorHarness]) -> None:
        """Retracting the max makes the next largest value the max (one scan)."""
        h = make([Aggregate.max("v")])
        step(h, [("a", 3, 1), ("a", 9, 2), ("a", 7, 3)])
        assert step(h, [("a", 9, 2)], kinds=[DEL]) == [(UB, ("a", 9)), (UA, ("a", 7))]

    def test_identical_rows_count_in_materialized_input(
        self, make: Callable[..., OperatorHarness]
    ) -> None:
        """Two identical rows are two copies: retracting one keeps the min."""
        h = make([Aggregate.min("v")])
        step(h, [("a", 1, 1), ("a", 1, 1), ("a", 2, 2)])
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == []
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == [(UB, ("a", 1)), (UA, ("a", 2))]

    def test_distinct_count_back_to_zero(self, make: Callable[..., OperatorHarness]) -> None:
        """A distinct count follows values in and out, back to zero while the
        group keeps rows with null values."""
        h = make([Aggregate.count(), Aggregate.count_distinct("v")])
        step(h, [("a", 1, 1), ("a", 1, 2), ("a", None, 3)])
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == [
            (UB, ("a", 3, 1)),
            (UA, ("a", 2, 1)),
        ]
        assert step(h, [("a", 1, 2)], kinds=[DEL]) == [
            (UB, ("a", 2, 1)),
            (UA, ("a", 1, 0)),
        ]
        assert list(h.table("values_v").scan()) == []

    def test_update_moves_row_between_groups(self, make: Callable[..., OperatorHarness]) -> None:
        """An update whose new row has another group key retracts from one
        group and accumulates into the other."""
        h = make([Aggregate.count(), Aggregate.min("v")])
        step(h, [("a", 1, 1), ("a", 2, 2)])
        out = step(h, [("a", 1, 1), ("b", 1, 1)], kinds=[UB, UA])
        assert sorted(out, key=lambda e: (e[0].value, e[1])) == [
            (INS, ("b", 1, 1)),
            (UA, ("a", 1, 2)),
            (UB, ("a", 2, 1)),
        ]

    @pytest.mark.parametrize("backend", ["memory", "rocksdb"])
    def test_min_max_of_booleans_and_zoned_timestamps(self, backend: str, tmp_path: Path) -> None:
        """min / max over a changelog of a boolean and a zoned timestamp
        column (types Arrow's element-wise min / max do not take) gain and
        lose their extremes as any other type, the zone kept."""
        utc = pa.timestamp("us", tz="UTC")
        schema = pa.schema([("g", pa.string()), ("b", pa.bool_()), ("t", utc), ("id", pa.int64())])
        aggregates = [Aggregate.min("b", "min_b"), Aggregate.max("b", "max_b")]
        aggregates += [Aggregate.min("t", "min_t"), Aggregate.max("t", "max_t")]
        operator = GroupAggregate(schema, ["g"], aggregates)
        assert operator.output.field("max_t").type == utc
        h = OperatorHarness(operator, backend=backend, path=tmp_path / "h")
        try:
            t = [pa.scalar(s, utc).as_py() for s in (1_000, 2_000, 3_000)]
            assert step(h, [("a", True, t[1], 1)]) == [(INS, ("a", True, True, t[1], t[1]))]
            out = step(h, [("a", False, t[0], 2), ("a", True, t[2], 3)])
            assert out == [
                (UB, ("a", True, True, t[1], t[1])),
                (UA, ("a", False, True, t[0], t[2])),
            ]
            # The rows holding min_b, min_t and max_t go: the next ones come.
            out = step(h, [("a", False, t[0], 2), ("a", True, t[2], 3)], kinds=[DEL, DEL])
            assert out == [
                (UB, ("a", False, True, t[0], t[2])),
                (UA, ("a", True, True, t[1], t[1])),
            ]
        finally:
            h.close()


class TestFoldAndNulls:
    def test_no_output_when_batch_leaves_result(self, make: Callable[..., OperatorHarness]) -> None:
        """A batch that adds a row and retracts it again emits nothing."""
        h = make([Aggregate.count(), Aggregate.sum("v")])
        step(h, [("a", 1, 1)])
        assert step(h, [("a", 5, 2), ("a", 5, 2)], kinds=[INS, DEL]) == []

    def test_one_change_per_group_per_batch(self, make: Callable[..., OperatorHarness]) -> None:
        """Many rows of a group in one batch give one -U/+U pair."""
        h = make([Aggregate.count()])
        step(h, [("a", 1, 1)])
        out = step(h, [("a", 1, 2), ("a", 1, 3), ("a", 1, 4)])
        assert out == [(UB, ("a", 1)), (UA, ("a", 4))]

    def test_chunks_of_one_batch_fold_together(self, make: Callable[..., OperatorHarness]) -> None:
        """The runner hands a micro-batch over in chunks: a group touched by
        two chunks changes once, at the end of the batch."""
        h = make([Aggregate.count()])
        step(h, [("a", 1, 1)])
        assert h.process_rows([("a", 1, 2)]) == []
        assert h.process_rows([("a", 1, 3)]) == []
        h.commit()
        assert h.output[-2:] == [(UB, ("a", 1)), (UA, ("a", 3))]

    def test_sql_nulls(self, make: Callable[..., OperatorHarness]) -> None:
        """Null keys form one group; null values count in count(*) only, and
        sum, avg, min, max of no non-null value are null."""
        h = make(
            [
                Aggregate.count(),
                Aggregate.count("v"),
                Aggregate.sum("v"),
                Aggregate.avg("v"),
                Aggregate.min("v"),
                Aggregate.count_distinct("v"),
            ]
        )
        out = step(h, [(None, None, 1), (None, None, 2), ("a", 2, 3), ("a", None, 4)])
        assert sorted(out, key=repr) == sorted(
            [(INS, (None, 2, 0, None, None, None, 0)), (INS, ("a", 2, 1, 2, 2.0, 2, 1))], key=repr
        )

    def test_sum_goes_null_when_values_leave(self, make: Callable[..., OperatorHarness]) -> None:
        """The sum of a group whose non-null values were all retracted is null
        again, not zero."""
        h = make([Aggregate.sum("v")])
        step(h, [("a", 4, 1), ("a", None, 2)])
        assert step(h, [("a", 4, 1)], kinds=[DEL]) == [(UB, ("a", 4)), (UA, ("a", None))]

    def test_unknown_retraction_counted(self, make: Callable[..., OperatorHarness]) -> None:
        """Retracting from a group that has no rows emits nothing and counts it."""
        h = make([Aggregate.count(), Aggregate.min("v")])
        assert step(h, [("z", 1, 1)], kinds=[DEL]) == []
        assert h.last_metrics["numRetractionsOfUnknownRows"] == 2

    def test_retraction_matched_by_value(self, make: Callable[..., OperatorHarness]) -> None:
        """min, max and count(distinct) keep a count per (group, value), as
        Flink's retracting min / max keep theirs: a retracted row the group
        never held, of a value it holds, takes that value back like the held
        row; one of a value it does not hold is counted once, however many
        aggregates read the column, and changes no value."""
        aggregates = [Aggregate.min("v"), Aggregate.max("v"), Aggregate.count_distinct("v")]
        h = make([Aggregate.count(), *aggregates])
        step(h, [("a", 5, 1), ("a", 7, 2), ("a", 9, 3)])
        assert step(h, [("a", 5, 99)], kinds=[DEL]) == [
            (UB, ("a", 3, 5, 9, 3)),
            (UA, ("a", 2, 7, 9, 2)),
        ]
        assert "numRetractionsOfUnknownRows" not in h.last_metrics
        assert step(h, [("a", 4, 98)], kinds=[DEL]) == [
            (UB, ("a", 2, 7, 9, 2)),
            (UA, ("a", 1, 7, 9, 2)),
        ]
        assert h.last_metrics["numRetractionsOfUnknownRows"] == 1
        assert sorted(h.table("values_v").scan()) == [("a", 7, 1), ("a", 9, 1)]

    def test_emptied_group_keeps_no_values(self, make: Callable[..., OperatorHarness]) -> None:
        """A group whose row count a dirty retraction takes to zero keeps no
        value counts (Flink clears the group's accumulators): the group's
        next rows alone make its min, max and distinct count, whether the
        group was held before or first came in the same batch."""
        aggregates = [Aggregate.min("v"), Aggregate.max("v"), Aggregate.count_distinct("v")]
        h = make([Aggregate.count(), *aggregates])
        step(h, [("a", 5, 1)])
        assert step(h, [("a", 7, 2)], kinds=[DEL]) == [(DEL, ("a", 1, 5, 5, 1))]
        assert step(h, [("b", 3, 3), ("b", 4, 4), ("b", 8, 5)], kinds=[INS, DEL, DEL]) == []
        assert list(h.table("values_v").scan()) == []
        assert step(h, [("a", 9, 6), ("a", 10, 7), ("b", 6, 8)]) == [
            (INS, ("a", 2, 9, 10, 2)),
            (INS, ("b", 1, 6, 6, 1)),
        ]
        out = step(h, [("a", 9, 6), ("b", 6, 8)], kinds=[DEL, DEL])
        expected = [(UB, ("a", 2, 9, 10, 2)), (UA, ("a", 1, 10, 10, 1)), (DEL, ("b", 1, 6, 6, 1))]
        assert sorted(out, key=repr) == sorted(expected, key=repr)


class TestRetractionToNull:
    def test_avg_back_to_null(self, make: Callable[..., OperatorHarness]) -> None:
        """avg follows retractions (a double of the values held) and is null
        again once only rows with a null value remain."""
        h = make([Aggregate.avg("v")])
        assert step(h, [("a", 1, 1), ("a", 4, 2), ("a", None, 3)]) == [(INS, ("a", 2.5))]
        assert step(h, [("a", 4, 2)], kinds=[DEL]) == [(UB, ("a", 2.5)), (UA, ("a", 1.0))]
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == [(UB, ("a", 1.0)), (UA, ("a", None))]
        assert step(h, [("a", 6, 4)]) == [(UB, ("a", None)), (UA, ("a", 6.0))]

    def test_count_column_under_retraction(self, make: Callable[..., OperatorHarness]) -> None:
        """count(v) counts the rows held whose v is not null: retracting a
        null-valued row leaves it, retracting a valued one lowers it, to 0."""
        h = make([Aggregate.count(), Aggregate.count("v")])
        step(h, [("a", 1, 1), ("a", None, 2), ("a", 1, 3)])
        assert step(h, [("a", None, 2)], kinds=[DEL]) == [(UB, ("a", 3, 2)), (UA, ("a", 2, 2))]
        assert step(h, [("a", 1, 1), ("a", None, 4)], kinds=[DEL, INS]) == [
            (UB, ("a", 2, 2)),
            (UA, ("a", 2, 1)),
        ]
        assert step(h, [("a", 1, 3)], kinds=[DEL]) == [(UB, ("a", 2, 1)), (UA, ("a", 1, 0))]

    def test_min_max_back_to_null(self, make: Callable[..., OperatorHarness]) -> None:
        """Once only rows with a null value remain, min and max are null (the
        group stays), and its value counts are empty."""
        h = make([Aggregate.count(), Aggregate.min("v"), Aggregate.max("v")])
        step(h, [("a", 2, 1), ("a", None, 2), ("a", 5, 3)])
        assert step(h, [("a", 2, 1), ("a", 5, 3)], kinds=[DEL, DEL]) == [
            (UB, ("a", 3, 2, 5)),
            (UA, ("a", 1, None, None)),
        ]
        assert list(h.table("values_v").scan()) == []
        assert step(h, [("a", 7, 4)]) == [(UB, ("a", 1, None, None)), (UA, ("a", 2, 7, 7))]

    def test_last_row_of_min_max_and_distinct(self, make: Callable[..., OperatorHarness]) -> None:
        """Retracting a group's last row emits -D of its last min, max and
        count(distinct) and leaves no state in any of its tables."""
        h = make([Aggregate.min("v"), Aggregate.max("v"), Aggregate.count_distinct("v")])
        step(h, [("a", 3, 1), ("a", 8, 2)])
        assert step(h, [("a", 3, 1)], kinds=[DEL]) == [(UB, ("a", 3, 8, 2)), (UA, ("a", 8, 8, 1))]
        assert step(h, [("a", 8, 2)], kinds=[DEL]) == [(DEL, ("a", 8, 8, 1))]
        for table in ("results", "values_v"):
            assert list(h.table(table).scan()) == [], table
        assert step(h, [("a", 1, 3)]) == [(INS, ("a", 1, 1, 1))]

    def test_append_only_min_max(self, make: Callable[..., OperatorHarness]) -> None:
        """Append-only, min and max are kept in the group's row (no value
        counts): a batch's extreme merges with the stored one,
        nulls left out."""
        h = make([Aggregate.min("v"), Aggregate.max("v")], changelog=False)
        assert [t.name for t in h.operator.tables] == ["results"]
        assert step(h, [("a", None, 1)]) == [(INS, ("a", None, None))]
        assert step(h, [("a", 4, 2), ("a", 2, 3)]) == [(UB, ("a", None, None)), (UA, ("a", 2, 4))]
        assert step(h, [("a", 3, 4), ("a", None, 5)]) == []
        assert step(h, [("a", 9, 6), ("a", -1, 7)]) == [(UB, ("a", 2, 4)), (UA, ("a", -1, 9))]


class TestHaving:
    def test_groups_enter_and_leave(self, make: Callable[..., OperatorHarness]) -> None:
        """A group passing the filter appears as +I, changes as -U/+U, and
        leaves as -D when it stops passing it."""
        h = make([Aggregate.count()], having=lambda r: r["count"] >= 2)
        assert step(h, [("a", 1, 1)]) == []
        assert step(h, [("a", 1, 2)]) == [(INS, ("a", 2))]
        assert step(h, [("a", 1, 3)]) == [(UB, ("a", 2)), (UA, ("a", 3))]
        assert step(h, [("a", 1, 3), ("a", 1, 2)], kinds=[DEL, DEL]) == [(DEL, ("a", 3))]
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == []


class TestWithoutUpdateBefore:
    def test_append_stream_upserts(self, make: Callable[..., OperatorHarness]) -> None:
        """update_before=False: +I for a new group, +U alone for a changed
        one (Spark's update mode rows), nothing for an unchanged one."""
        h = make([Aggregate.count(), Aggregate.max("v")], changelog=False, update_before=False)
        assert h.operator.output_upsert_key == ("g",)
        assert step(h, [("a", 1, 1), ("b", 2, 2)]) == [(INS, ("a", 1, 1)), (INS, ("b", 1, 2))]
        assert step(h, [("a", 5, 3)]) == [(UA, ("a", 2, 5))]
        assert step(h, [("c", 7, 4), ("b", 1, 5)]) == [(UA, ("b", 2, 2)), (INS, ("c", 1, 7))]

    def test_changelog_deletes_and_having(self, make: Callable[..., OperatorHarness]) -> None:
        """Over a changelog the last row retracted still emits -D of the
        group's result, and a having filter still gives +I / -D as a group
        enters and leaves; only the -U rows are left out."""
        h = make([Aggregate.count(), Aggregate.min("v")], update_before=False)
        assert step(h, [("a", 3, 1), ("a", 1, 2)]) == [(INS, ("a", 2, 1))]
        assert step(h, [("a", 1, 2)], kinds=[DEL]) == [(UA, ("a", 1, 3))]
        assert step(h, [("a", 3, 1)], kinds=[DEL]) == [(DEL, ("a", 1, 3))]
        g = make([Aggregate.count()], having=lambda r: r["count"] >= 2, update_before=False)
        assert step(g, [("a", 1, 1), ("a", 1, 2)]) == [(INS, ("a", 2))]
        assert step(g, [("a", 1, 3)]) == [(UA, ("a", 3))]
        assert step(g, [("a", 1, 3), ("a", 1, 2)], kinds=[DEL, DEL]) == [(DEL, ("a", 3))]

    def test_custom_aggregate_path(self, make: Callable[..., OperatorHarness]) -> None:
        """The per-group path of a custom aggregate leaves out -U the same way."""
        h = make([Aggregate.custom(Variance(), "v", "var_v")], update_before=False)
        assert step(h, [("a", 1, 1), ("a", 3, 2)]) == [(INS, ("a", 1.0))]
        assert step(h, [("a", 3, 2)], kinds=[DEL]) == [(UA, ("a", 0.0))]
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == [(DEL, ("a", 0.0))]

    def test_retract_mode_declares_no_upsert_key(self) -> None:
        """By default the output carries -U rows and names no upsert key."""
        op = GroupAggregate(SCHEMA, ["g"], [Aggregate.count()])
        assert op.update_before and op.output_upsert_key is None


class TestCustomAndState:
    def test_custom_variance(self, make: Callable[..., OperatorHarness]) -> None:
        """A custom aggregate accumulates and retracts through its interface."""
        h = make([Aggregate.custom(Variance(), "v", "var_v")])
        assert step(h, [("a", 1, 1), ("a", 3, 2)]) == [(INS, ("a", 1.0))]
        assert step(h, [("a", 3, 2)], kinds=[DEL]) == [(UB, ("a", 1.0)), (UA, ("a", 0.0))]
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == [(DEL, ("a", 0.0))]

    def test_restore_goes_back(self, make: Callable[..., OperatorHarness]) -> None:
        """After a restore to a committed version, the results continue from it."""
        h = make([Aggregate.count(), Aggregate.max("v")])
        step(h, [("a", 1, 1)])
        v = h.batch_id - 1
        step(h, [("a", 9, 2)])
        h.restore(v)
        assert step(h, [("a", 5, 3)]) == [(UB, ("a", 1, 1)), (UA, ("a", 2, 5))]

    def test_append_only_refuses_retraction(self, make: Callable[..., OperatorHarness]) -> None:
        """Built for an append stream, a retraction is an InputError before any state."""
        h = make([Aggregate.min("v")], changelog=False)
        with pytest.raises(InputError, match="changelog=True"):
            step(h, [("a", 1, 1)], kinds=[DEL])
        assert list(h.table("results").scan()) == []

    def test_unknown_row_kind(self, make: Callable[..., OperatorHarness]) -> None:
        """An unknown row kind is refused before the operator sees the batch."""
        h = make([Aggregate.count()])
        batch = pa.RecordBatch.from_pylist(
            [{"g": "a", "v": 1, "id": 1, "row_kind": "+X"}],
            pa.schema([*SCHEMA, ("row_kind", pa.string())]),
        )
        with pytest.raises(InputError, match="unknown row kind"):
            h.process_batch(batch)


class TestDeclaration:
    def test_key_columns_and_tables(self) -> None:
        """The group key is the key the query is partitioned by; a column
        that min / max and count(distinct) aggregate gets one table of value
        counts, keyed by the group first, then the value."""
        op = GroupAggregate(
            SCHEMA, ["g"], [Aggregate.min("v"), Aggregate.max("v"), Aggregate.count_distinct("v")]
        )
        assert op.key_columns == ("g",)
        assert [t.name for t in op.tables] == ["results", "values_v"]
        assert op.tables[1].key_names == ("g", "__value")
        assert op.output.names == ["g", "min_v", "max_v", "count_distinct_v"]

    def test_default_names(self) -> None:
        """A built-in aggregate without a name is called ``<kind>_<column>``; count(*) ``count``."""
        assert Aggregate.count().name == "count"
        for kind in ("count", "sum", "avg", "min", "max", "count_distinct"):
            assert getattr(Aggregate, kind)("v").name == f"{kind}_v"
        assert Aggregate.sum("v", "total").name == "total"

    def test_bad_declarations(self) -> None:
        """Unknown columns, duplicate outputs, sums of strings and a group
        key column of Arrow's null type are refused."""
        with pytest.raises(ValueError, match="not in the input"):
            GroupAggregate(SCHEMA, ["nope"], [Aggregate.count()])
        with pytest.raises(ValueError, match="twice"):
            GroupAggregate(SCHEMA, ["g"], [Aggregate.count(), Aggregate.count()])
        with pytest.raises(ValueError, match="integer or float"):
            GroupAggregate(SCHEMA, ["v"], [Aggregate.sum("g")])
        untyped = pa.schema([("g", pa.null()), ("v", pa.int64())])
        with pytest.raises(InputError, match="null type"):
            GroupAggregate(untyped, ["g"], [Aggregate.count()])
