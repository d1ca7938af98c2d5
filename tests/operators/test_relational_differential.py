"""GroupAggregate and TopN against SQL: on random changelogs over several
partitions and batches, the materialised output after every batch equals
SQLite's ``GROUP BY`` / ``ROW_NUMBER()`` (``RANK()`` with ties) over the
materialised input. SQLite has no NaN (it stores NULL for one), so the float
column with NaN, +-inf and -0.0 is checked against ``spark_group_by``, a
Python model of Spark's rules, instead."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from encoding import Direction, KeyColumn, NullOrder
from operators import RowKind
from operators.aggregate import Aggregate, GroupAggregate
from operators.examples import Variance
from operators.testing import Emitted
from operators.topn import TopN
from tests.operators._relational_model import (
    FLOAT_SCHEMA,
    SCHEMA,
    Partitioned,
    Row,
    apply_input,
    apply_top,
    built_in_aggregates,
    changelog,
    rounded,
    spark_key,
    sqlite_of,
)

SEEDS = range(150)

AGGREGATES = [
    *built_in_aggregates("v"),
    Aggregate.min("w"),
    Aggregate.max("w"),
    Aggregate.count_distinct("w"),
]
AGGREGATE_SQL = (
    "SELECT g, COUNT(*), COUNT(v), SUM(v), AVG(v), MIN(v), MAX(v), COUNT(DISTINCT v), "
    "MIN(w), MAX(w), COUNT(DISTINCT w) FROM t GROUP BY g"
)


def materialise_upserts(table: dict[Row, Row], emitted: list[Emitted], keys: int) -> None:
    """Apply an upsert changelog keyed by the first ``keys`` columns; a
    retraction must retract the row the table holds."""
    for kind, row in emitted:
        key = row[:keys]
        if kind.is_retract:
            assert table.pop(key) == row, f"{kind} of {row} retracts what is not held"
        else:
            if kind is RowKind.INSERT:
                assert key not in table, f"+I of a key already held: {row}"
            table[key] = row


def check_aggregate(seed: int, make: Callable[[], GroupAggregate], sql: str, **kw: Any) -> None:
    """Run a random changelog through partitioned harnesses; compare with SQL."""
    runner = Partitioned(make, ["g"], partitions=3)
    inputs: Counter[Row] = Counter()
    output: dict[Row, Row] = {}
    try:
        for batch in changelog(seed, **kw):
            emitted = runner.run(batch)
            apply_input(inputs, batch)
            materialise_upserts(output, emitted, 1)
            expected = {rounded(r) for r in sqlite_of(inputs).execute(sql)}
            assert {rounded(r) for r in output.values()} == expected
    finally:
        runner.close()


class TestGroupAggregateDifferential:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_changelog_equals_group_by(self, seed: int) -> None:
        """Every aggregate over a changelog (null keys and values, updates
        across groups, min/max retracted) materialises to SQL's GROUP BY."""
        check_aggregate(seed, lambda: GroupAggregate(SCHEMA, ["g"], AGGREGATES), AGGREGATE_SQL)

    @pytest.mark.parametrize("seed", SEEDS[:40])
    def test_identical_rows_equal_group_by(self, seed: int) -> None:
        """With few ids, identical rows come and go one copy at a time: the
        materialised min/max input counts them, and the result is SQL's."""
        check_aggregate(
            seed, lambda: GroupAggregate(SCHEMA, ["g"], AGGREGATES), AGGREGATE_SQL, ids=2
        )

    @pytest.mark.parametrize("seed", SEEDS[:40])
    def test_having_equals_group_by_having(self, seed: int) -> None:
        """A having filter makes groups enter and leave the output as SQL's HAVING."""
        check_aggregate(
            seed,
            lambda: GroupAggregate(SCHEMA, ["g"], AGGREGATES, having=lambda r: r["count"] >= 3),
            AGGREGATE_SQL + " HAVING COUNT(*) >= 3",
        )

    @pytest.mark.parametrize("seed", SEEDS[:40])
    def test_with_custom_aggregate_equals_group_by(self, seed: int) -> None:
        """With a custom aggregate (worked group by group in Python rather
        than in Arrow), every result is SQL's, the variance too."""
        check_aggregate(
            seed,
            lambda: GroupAggregate(
                SCHEMA, ["g"], [*AGGREGATES, Aggregate.custom(Variance(), "v", "var_v")]
            ),
            AGGREGATE_SQL.replace(" FROM t", ", AVG(v * v) - AVG(v) * AVG(v) FROM t"),
        )

    @pytest.mark.parametrize("seed", SEEDS[:40])
    def test_append_only_equals_group_by(self, seed: int) -> None:
        """Built for an append stream (no materialised input), the result is SQL's."""
        check_aggregate(
            seed,
            lambda: GroupAggregate(SCHEMA, ["g"], AGGREGATES, changelog=False),
            AGGREGATE_SQL,
            append=True,
        )


def check_upsert_equals_retract(seed: int, **kw: Any) -> None:
    """Run a random changelog through an aggregate with and without
    update_before; after every batch the upsert output, materialised by the
    group key, is the retract-mode output materialised, and has no -U."""
    make = partial(GroupAggregate, SCHEMA, ["g"], AGGREGATES, changelog=not kw.get("append"))
    having = kw.pop("having", None)
    retracting = Partitioned(partial(make, having=having), ["g"], partitions=3)
    upserting = Partitioned(partial(make, having=having, update_before=False), ["g"], 3)
    retracted: dict[Row, Row] = {}
    upserted: dict[Row, Row] = {}
    try:
        for batch in changelog(seed, **kw):
            materialise_upserts(retracted, retracting.run(batch), 1)
            emitted = upserting.run(batch)
            for kind, row in emitted:
                assert kind is not RowKind.UPDATE_BEFORE, f"-U emitted: {row}"
                if kind is RowKind.UPDATE_AFTER:
                    assert row[:1] in upserted, f"+U of a group not held: {row}"
            materialise_upserts(upserted, emitted, 1)
            assert upserted == retracted
    finally:
        retracting.close()
        upserting.close()


class TestUpsertDifferential:
    @pytest.mark.parametrize("seed", SEEDS[:40])
    def test_changelog_upserts_equal_retractions(self, seed: int) -> None:
        """Over a changelog, +U without -U materialised by group is the
        retract-mode result (and so SQL's GROUP BY)."""
        check_upsert_equals_retract(seed)

    @pytest.mark.parametrize("seed", SEEDS[:40])
    def test_append_upserts_equal_retractions(self, seed: int) -> None:
        """Over an append stream (the bench's case, Spark's update mode), the
        upsert output materialised by group is the retract-mode result."""
        check_upsert_equals_retract(seed, append=True)

    @pytest.mark.parametrize("seed", SEEDS[:20])
    def test_having_upserts_equal_retractions(self, seed: int) -> None:
        """With a having filter, groups enter (+I) and leave (-D) alike."""
        check_upsert_equals_retract(seed, having=lambda r: r["count"] >= 3)


FLOAT_AGGREGATES = built_in_aggregates("v")


def _plain(value: Any) -> Any:
    """A value that compares as Spark's: NaN as ``"NaN"`` (NaN equals NaN),
    -0.0 as 0.0, a float rounded so that sums in another order compare."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else round(value + 0.0, 9)
    return value


def _spark_sum(values: list[float]) -> float | None:
    """Spark's ``sum`` of a double column's non-null values: NaN with a NaN
    or both infinities, else the infinity there is, else the sum."""
    if not values:
        return None
    if any(math.isnan(x) for x in values) or {math.inf, -math.inf} <= set(values):
        return math.nan
    return sum(values)  # +-inf if there is one (the others are finite)


def spark_group_by(rows: Counter[Row]) -> set[Row]:
    """The rows of ``FLOAT_AGGREGATES`` by ``g`` over ``rows`` in Spark's
    rules: nulls left out; sum / avg as ``_spark_sum``; min / max in Spark's
    order (NaN above +inf, -0.0 equal to 0.0); count(distinct) with every NaN
    one value and -0.0 the value 0.0."""
    groups: dict[Any, list[Any]] = defaultdict(list)
    for row in rows.elements():
        groups[row[0]].append(row[1])
    out = set()
    for g, all_values in groups.items():
        values = [v for v in all_values if v is not None]
        total = _spark_sum(values)
        out.add(
            tuple(
                _plain(x)
                for x in (
                    g,
                    len(all_values),
                    len(values),
                    total,
                    None if total is None else total / len(values),
                    min(values, key=spark_key, default=None),
                    max(values, key=spark_key, default=None),
                    len({_plain(v) for v in values}),
                )
            )
        )
    return out


def check_float_aggregate(seed: int, make: Callable[[], GroupAggregate], **kw: Any) -> None:
    """Run a random changelog of float values through partitioned harnesses;
    compare with ``spark_group_by`` (a custom aggregate's last column is left
    out: it is there to take the per-group path)."""
    runner = Partitioned(make, ["g"], partitions=3, schema=FLOAT_SCHEMA)
    inputs: Counter[Row] = Counter()
    output: dict[Row, Row] = {}
    width = 1 + len(FLOAT_AGGREGATES)
    try:
        for batch in changelog(seed, floats=True, **kw):
            emitted = [(k, tuple(_plain(v) for v in r[:width])) for k, r in runner.run(batch)]
            apply_input(inputs, batch)
            materialise_upserts(output, emitted, 1)
            assert set(output.values()) == spark_group_by(inputs)
    finally:
        runner.close()


class TestFloatAggregateDifferential:
    @pytest.mark.parametrize("seed", SEEDS[:60])
    def test_changelog_equals_reference(self, seed: int) -> None:
        """Over a changelog of NaN, +-inf, -0.0 and numbers, every aggregate
        materialises to Spark's result over the rows held, whatever came and
        went before."""
        check_float_aggregate(seed, lambda: GroupAggregate(FLOAT_SCHEMA, ["g"], FLOAT_AGGREGATES))

    @pytest.mark.parametrize("seed", SEEDS[:30])
    def test_per_group_path_equals_reference(self, seed: int) -> None:
        """With a custom aggregate (the per-group Python path), the built-in
        float aggregates are Spark's too, identical rows included."""
        check_float_aggregate(
            seed,
            lambda: GroupAggregate(
                FLOAT_SCHEMA, ["g"], [*FLOAT_AGGREGATES, Aggregate.custom(Variance(), "id", "var")]
            ),
            ids=2 if seed % 2 else 1000,
        )

    @pytest.mark.parametrize("seed", SEEDS[:30])
    def test_append_only_equals_reference(self, seed: int) -> None:
        """Append-only (no materialised input; min / max kept per group), the
        float aggregates are Spark's."""
        check_float_aggregate(
            seed,
            lambda: GroupAggregate(FLOAT_SCHEMA, ["g"], FLOAT_AGGREGATES, changelog=False),
            append=True,
        )


def _order_sql(order: list[KeyColumn]) -> str:
    return ", ".join(
        f"{o.name} {o.direction.value.upper()} NULLS {o.null_order.value.upper()}" for o in order
    )


def check_top_n(
    seed: int, operator: Callable[[], TopN], partitions: int, sql: str, **kw: Any
) -> None:
    """Run a random changelog through partitioned harnesses; compare with SQL."""
    probe = operator()
    key = list(probe.key_columns) or ["id"]
    runner = Partitioned(operator, key, partitions)
    inputs: Counter[Row] = Counter()
    output: Counter[Row] = Counter()
    try:
        for batch in changelog(seed, **kw):
            output = apply_top(output, runner.run(batch))
            apply_input(inputs, batch)
            assert output == Counter(sqlite_of(inputs).execute(sql))
    finally:
        runner.close()


TOPN_CASES = [
    # order, limit, offset, partitioned
    ([KeyColumn("v", Direction.DESC)], 2, 0, True),
    ([KeyColumn("v", Direction.ASC, NullOrder.LAST), KeyColumn("w", Direction.DESC)], 3, 0, True),
    ([KeyColumn("v", Direction.DESC, NullOrder.FIRST)], 2, 1, True),
    ([KeyColumn("w"), KeyColumn("v", Direction.DESC)], 4, 2, False),
]


class TestTopNDifferential:
    @pytest.mark.parametrize("case", range(len(TOPN_CASES)))
    @pytest.mark.parametrize("seed", SEEDS[:60])
    def test_row_number(self, seed: int, case: int) -> None:
        """The top-N set materialises to ``ROW_NUMBER() OVER (PARTITION BY g
        ORDER BY ..., then the row identity)`` between offset and offset + N."""
        order, limit, offset, partitioned = TOPN_CASES[case]
        partition = ["g"] if partitioned else []
        over = ("PARTITION BY g " if partitioned else "") + "ORDER BY " + _order_sql(order)
        rest = [
            c
            for c in SCHEMA.names
            if c not in {"g", *(o.name for o in order)} or (c == "g" and not partitioned)
        ]
        over += ", " + ", ".join(f"{c} ASC NULLS FIRST" for c in rest)
        sql = (
            f"SELECT g, v, w, id FROM (SELECT *, ROW_NUMBER() OVER ({over}) AS rn FROM t) "
            f"WHERE rn > {offset} AND rn <= {offset + limit}"
        )
        check_top_n(
            seed,
            lambda: TopN(SCHEMA, order, limit, partition, offset=offset),
            3 if partitioned else 1,
            sql,
            ids=3 if seed % 3 == 0 else 1000,
        )

    @pytest.mark.parametrize("seed", SEEDS[:60])
    def test_with_ties_is_rank(self, seed: int) -> None:
        """With ties, the top-N set materialises to ``RANK() <= N``: every row
        that ties with the N-th is in."""
        order = [KeyColumn("v", Direction.DESC)]
        sql = (
            "SELECT g, v, w, id FROM (SELECT *, RANK() OVER (PARTITION BY g ORDER BY "
            f"{_order_sql(order)}) AS rk FROM t) WHERE rk <= 2"
        )
        check_top_n(seed, lambda: TopN(SCHEMA, order, 2, ["g"], with_ties=True), 3, sql, ids=3)
