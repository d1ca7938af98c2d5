"""GroupAggregate on float columns with NaN, +-inf and -0.0, on the three
paths (changelog, append-only, and group by group with a custom aggregate):
min / max follow Spark's order (NaN above every value, -0.0 equal to 0.0),
and sum / avg are exact under retraction of NaN and infinities."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from encoding import TableSchema
from operators import RowKind
from operators.aggregate import Aggregate, GroupAggregate
from operators.examples import Variance
from operators.testing import OperatorHarness
from statestore import ConsistencyMode, StateStore, StoreConfig

INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
SCHEMA = pa.schema([("g", pa.string()), ("x", pa.float64()), ("id", pa.int64())])
NAN, INF = math.nan, math.inf


@pytest.fixture(params=["arrow", "per_group"])
def make(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., OperatorHarness]]:
    """Harnesses of a GroupAggregate on RocksDB; ``per_group`` adds a custom
    aggregate (last column), which sends the batch down the Python path."""
    opened: list[OperatorHarness] = []

    def build(aggregates: list[Aggregate], **kw: Any) -> OperatorHarness:
        if request.param == "per_group":
            aggregates = [*aggregates, Aggregate.custom(Variance(), "id", "var_id")]
        operator = GroupAggregate(SCHEMA, ["g"], aggregates, **kw)
        harness = OperatorHarness(operator, backend="rocksdb", path=tmp_path / f"h{len(opened)}")
        opened.append(harness)
        return harness

    yield build
    for harness in opened:
        harness.close()


def _plain(value: Any) -> Any:
    """NaN as the string ``"NaN"`` (NaN equals nothing), -0.0 as 0.0."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value + 0.0
    return value


def last(h: OperatorHarness, rows: list[tuple[Any, ...]], kinds: Any = None) -> Any:
    """Run rows as one micro-batch; the result of their group after it
    (``None`` if it has none), NaN made comparable and the custom
    aggregate's column (if any) left out."""
    h.process_rows(rows, kinds)
    h.commit()
    held: dict[Any, tuple[Any, ...]] = {}
    for kind, row in h.output:
        if kind.is_retract:
            held.pop(row[0], None)
        else:
            held[row[0]] = row
    width = len(h.operator.output.names) - (h.operator.output.names[-1] == "var_id")
    row = held.get(rows[0][0])
    return None if row is None else tuple(_plain(v) for v in row[:width])


class TestMinMaxOrder:
    @pytest.mark.parametrize("changelog", [True, False])
    def test_nan_is_the_greatest_value(
        self, make: Callable[..., OperatorHarness], changelog: bool
    ) -> None:
        """1.0, NaN, 3.0: max is NaN, min 1.0 (Spark orders NaN above every value)."""
        h = make([Aggregate.min("x"), Aggregate.max("x")], changelog=changelog)
        assert last(h, [("a", 1.0, 1), ("a", NAN, 2), ("a", 3.0, 3)]) == ("a", 1.0, "NaN")

    @pytest.mark.parametrize("changelog", [True, False])
    def test_nan_across_batches(
        self, make: Callable[..., OperatorHarness], changelog: bool
    ) -> None:
        """A NaN in a later batch makes the max NaN; a number after a NaN
        leaves it; min is NaN only while every value is NaN."""
        h = make([Aggregate.min("x"), Aggregate.max("x")], changelog=changelog)
        assert last(h, [("a", NAN, 1)]) == ("a", "NaN", "NaN")
        assert last(h, [("a", 3.0, 2)]) == ("a", 3.0, "NaN")
        assert last(h, [("a", INF, 3)]) == ("a", 3.0, "NaN")
        assert last(h, [("a", -INF, 4)]) == ("a", -INF, "NaN")
        assert last(h, [("b", 2.0, 5)]) == ("b", 2.0, 2.0)
        assert last(h, [("b", NAN, 6), ("b", NAN, 7)]) == ("b", 2.0, "NaN")

    def test_result_does_not_depend_on_history(self, make: Callable[..., OperatorHarness]) -> None:
        """Retracting 3.0 leaves the max NaN, inserting 2.0 keeps it NaN,
        retracting the NaN brings 2.0: the max of the rows held, each time."""
        h = make([Aggregate.min("x"), Aggregate.max("x")])
        assert last(h, [("a", 1.0, 1), ("a", NAN, 2), ("a", 3.0, 3)]) == ("a", 1.0, "NaN")
        assert last(h, [("a", 3.0, 3)], [DEL]) == ("a", 1.0, "NaN")
        assert last(h, [("a", 2.0, 4)]) == ("a", 1.0, "NaN")
        assert last(h, [("a", NAN, 2)], [DEL]) == ("a", 1.0, 2.0)
        assert last(h, [("a", 1.0, 1), ("a", 2.0, 4), ("a", NAN, 5)], [DEL, DEL, INS]) == (
            "a",
            "NaN",
            "NaN",
        )
        assert last(h, [("a", -INF, 6)]) == ("a", -INF, "NaN")
        assert last(h, [("a", NAN, 5)], [DEL]) == ("a", -INF, -INF)

    @pytest.mark.parametrize("changelog", [True, False])
    def test_negative_zero_equals_zero(
        self, make: Callable[..., OperatorHarness], changelog: bool
    ) -> None:
        """-0.0 and 0.0 are one value: min and max compare them equal, and
        count(distinct) counts them once (with every NaN one value too)."""
        h = make(
            [Aggregate.min("x"), Aggregate.max("x"), Aggregate.count_distinct("x")],
            changelog=changelog,
        )
        rows = [("a", -0.0, 1), ("a", 0.0, 2), ("a", NAN, 3), ("a", NAN, 4)]
        assert last(h, rows) == ("a", 0.0, "NaN", 2)


class TestSumUnderRetraction:
    def test_nan_retracted_gives_the_finite_sum(self, make: Callable[..., OperatorHarness]) -> None:
        """sum and avg are NaN while a NaN row is held, and the sum of the
        other rows once it is retracted."""
        h = make([Aggregate.sum("x"), Aggregate.avg("x")])
        assert last(h, [("a", 1.0, 1), ("a", NAN, 2), ("a", 3.0, 3)]) == ("a", "NaN", "NaN")
        assert last(h, [("a", NAN, 2)], [DEL]) == ("a", 4.0, 2.0)

    def test_infinities_come_and_go(self, make: Callable[..., OperatorHarness]) -> None:
        """+inf gives +inf, +inf and -inf give NaN, and retracting each
        brings back the other infinity, then the finite sum."""
        h = make([Aggregate.sum("x"), Aggregate.avg("x")])
        assert last(h, [("a", 1.0, 1), ("a", INF, 2)]) == ("a", INF, INF)
        assert last(h, [("a", -INF, 3)]) == ("a", "NaN", "NaN")
        assert last(h, [("a", INF, 2)], [DEL]) == ("a", -INF, -INF)
        assert last(h, [("a", -INF, 3)], [DEL]) == ("a", 1.0, 1.0)
        assert last(h, [("a", 1.0, 1)], [DEL]) is None

    def test_append_only_sum_is_spark_addition(self, make: Callable[..., OperatorHarness]) -> None:
        """Append-only, a float sum adds as Spark does: NaN stays NaN, both
        infinities give NaN."""
        h = make([Aggregate.sum("x"), Aggregate.avg("x")], changelog=False)
        assert last(h, [("a", 1.0, 1), ("a", INF, 2)]) == ("a", INF, INF)
        assert last(h, [("a", -INF, 3)]) == ("a", "NaN", "NaN")
        assert last(h, [("b", 2.0, 4), ("b", NAN, 5)]) == ("b", "NaN", "NaN")


class TestOlderState:
    @pytest.mark.parametrize("custom", [False, True])
    def test_state_without_special_counts_loads(self, tmp_path: Path, custom: bool) -> None:
        """A checkpoint written before the NaN / infinity counts (results rows
        without them) loads: the counts read as zero and the sum goes on, on
        the Arrow path and the per-group one."""
        aggregates = [Aggregate.sum("x")]
        if custom:
            aggregates.append(Aggregate.custom(Variance(), "id", "var_id"))
        operator = GroupAggregate(SCHEMA, ["g"], aggregates)
        (results,) = operator.tables
        old = TableSchema(
            results.table_id,
            [f for f in results.columns if not f.name.endswith(("_nan", "_pinf", "_ninf"))],
            list(operator.key_columns),
            name=results.name,
        )
        assert len(old.columns) == len(results.columns) - 3
        root = tmp_path / "h"
        config = StoreConfig(local_dir=str(root / "local"), snapshot_interval=3)
        store = StateStore(
            str(root / "checkpoint"), operator.name, 0, [old], config, ConsistencyMode.UNCHECKED
        )
        store.load(None)
        variance = (2, 3.0, 5.0) if custom else ()
        store.tables["results"].insert(("a", 2, 4.0, 2, *variance))
        store.commit(0)
        store.close()
        harness = OperatorHarness(operator, backend="rocksdb", path=root)
        try:
            harness.restore(0)
            assert last(harness, [("a", NAN, 3)]) == ("a", "NaN")
            assert last(harness, [("a", 1.0, 4), ("a", NAN, 3)], [INS, DEL]) == ("a", 5.0)
        finally:
            harness.close()
