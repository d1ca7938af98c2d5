"""GroupAggregate and TopN against Spark batch SQL. Through Spark's runner:
a random changelog in several batches, two partitions, rows shuffled; after
every batch the materialised output equals ``GROUP BY`` and ``ROW_NUMBER()``
over the materialised input, run by Spark itself. And many seeds at once:
each seed's changelog led by a ``seed`` column, all run through partitioned
harnesses keyed by ``(seed, g)``, and after every batch one Spark query
(``GROUP BY seed, g``, ``PARTITION BY seed, ...``) checks every seed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from encoding import Direction, KeyColumn, NullOrder
from operators import RowKind
from operators._spark.runner import run_operator
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches
from operators.aggregate import Aggregate, GroupAggregate
from operators.topn import TopN
from tests.operators._relational_model import (
    CHANGELOG,
    FLOAT_SCHEMA,
    SCHEMA,
    Change,
    Partitioned,
    Row,
    apply_input,
    apply_top,
    built_in_aggregates,
    changelog,
    rounded,
)
from tests.operators.test_relational_differential import (
    AGGREGATE_SQL as SQLITE_AGGREGATE_SQL,
)
from tests.operators.test_relational_differential import (
    AGGREGATES,
    FLOAT_AGGREGATES,
    _order_sql,
    _plain,
    materialise_upserts,
)

pytestmark = pytest.mark.spark

AGGREGATE_SQL = (
    "SELECT g, COUNT(*), COUNT(v), SUM(v), AVG(v), MIN(v), MAX(v), COUNT(DISTINCT v), "
    "MIN(w), MAX(w) FROM t GROUP BY g"
)
TOPN_SQL = (
    "SELECT g, v, w, id FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY g ORDER BY "
    "v DESC NULLS LAST, w ASC NULLS FIRST, id ASC NULLS FIRST) AS rn FROM t) WHERE rn <= 2"
)


def _tables(batches: list[list[Change]]) -> list[pa.Table]:
    return [
        pa.Table.from_pylist(
            [dict(zip(CHANGELOG.names, (*r, k.value), strict=True)) for k, r in batch],
            CHANGELOG,
        )
        for batch in batches
    ]


def _run(spark: Any, tmp_path: Path, operator: Any, batches: list[list[Change]]) -> list[Any]:
    """Run ``operator`` over the batches (one file each) and return the
    output rows, each with its batch and row kind."""
    from pyspark.sql.pandas.types import from_arrow_schema

    write_batches(tmp_path / "source", _tables(batches), prefix="changes")
    stream = (
        spark.readStream.schema(from_arrow_schema(CHANGELOG))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "source"))
    )
    sink = ParquetSink(str(tmp_path / "output"))
    query = run_operator(
        stream,
        operator,
        keys=list(operator.key_columns),
        partitions=2,
        checkpoint=str(tmp_path / "checkpoint"),
        sink=sink,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    rows: list[Any] = sink.read(spark).collect()
    return rows


def _expected(spark: Any, inputs: Counter[Row], sql: str) -> list[Row]:
    """What Spark batch SQL gives over the materialised input."""
    frame = spark.createDataFrame(list(inputs.elements()), "g string, v long, w string, id long")
    frame.createOrReplaceTempView("t")
    return [tuple(r) for r in spark.sql(sql).collect()]


def test_group_aggregate_equals_spark_group_by(spark: Any, tmp_path: Path) -> None:
    """The aggregate's upserts, materialised after each batch, equal Spark's GROUP BY."""
    batches = changelog(seed=11, batches=4, changes=40)
    aggregates = [*built_in_aggregates("v"), Aggregate.min("w"), Aggregate.max("w")]
    out = _run(spark, tmp_path, GroupAggregate(SCHEMA, ["g"], aggregates), batches)
    names = ["g", *(a.name for a in aggregates)]
    inputs: Counter[Row] = Counter()
    table: dict[Row, Row] = {}
    for b, batch in enumerate(batches):
        mine = [r for r in out if r["batch"] == b]
        # Retractions first: a group's -U and +U may be in either order on disk.
        mine.sort(key=lambda r: RowKind(r["row_kind"]).is_accumulate)
        for r in mine:
            row = tuple(r[n] for n in names)
            if RowKind(r["row_kind"]).is_retract:
                assert table.pop(row[:1]) == row
            else:
                table[row[:1]] = row
        apply_input(inputs, batch)
        expected = {rounded(r) for r in _expected(spark, inputs, AGGREGATE_SQL)}
        assert {rounded(r) for r in table.values()} == expected


def test_top_n_equals_spark_row_number(spark: Any, tmp_path: Path) -> None:
    """The top-N changelog, materialised after each batch, equals Spark's
    ROW_NUMBER() <= 2 per group."""
    batches = changelog(seed=12, batches=4, changes=40)
    order = [KeyColumn("v", Direction.DESC), KeyColumn("w")]
    out = _run(spark, tmp_path, TopN(SCHEMA, order, 2, ["g"]), batches)
    inputs: Counter[Row] = Counter()
    top: Counter[Row] = Counter()
    for b, batch in enumerate(batches):
        for r in (r for r in out if r["batch"] == b):
            top[(r["g"], r["v"], r["w"], r["id"])] += 1 if r["row_kind"] == "+I" else -1
        top = +top
        apply_input(inputs, batch)
        assert top == Counter(_expected(spark, inputs, TOPN_SQL))


#: Seeds checked at once; with identical rows (few ids) in one seed in four.
MANY_SEEDS = range(300)
BATCHES = 5


def _seeded(schema: pa.Schema) -> pa.Schema:
    return pa.schema([("seed", pa.int64()), *schema])


@cache
def _many_seeds(floats: bool) -> list[list[Change]]:
    """Every seed's changelog (five batches of 25 changes), batch by batch,
    each row led by its seed: one batch holds that batch of every seed."""
    per_seed = [
        changelog(seed, BATCHES, ids=2 if seed % 4 == 0 else 1000, floats=floats)
        for seed in MANY_SEEDS
    ]
    return [
        [(kind, (seed, *row)) for seed in MANY_SEEDS for kind, row in per_seed[seed][b]]
        for b in range(BATCHES)
    ]


def _spark_sql(spark: Any, rows: Counter[Row], schema: pa.Schema, sql: str) -> list[Row]:
    """``sql`` run by Spark over a view ``t`` of the rows of every seed."""
    table = pa.Table.from_pylist(
        [dict(zip(schema.names, r, strict=True)) for r in rows.elements()], schema
    )
    spark.createDataFrame(table).createOrReplaceTempView("t")
    return [tuple(r) for r in spark.sql(sql).collect()]


def _seeds_differing(got: Counter[Row], want: Counter[Row]) -> list[Any]:
    """The seeds (first column) whose rows differ between ``got`` and ``want``."""
    return sorted({r[0] for r in (got - want) + (want - got)})


def _check_many_aggregate(
    spark: Any, make: Callable[[], GroupAggregate], sql: str, floats: bool
) -> None:
    """All seeds through harnesses keyed by (seed, g) on three partitions;
    after every batch the materialised upserts equal ``sql`` run by Spark
    over every seed's materialised input."""
    schema = _seeded(FLOAT_SCHEMA if floats else SCHEMA)
    norm: Callable[[Row], Row] = (lambda r: tuple(map(_plain, r))) if floats else rounded
    runner = Partitioned(make, ["seed", "g"], partitions=3, schema=schema)
    inputs: Counter[Row] = Counter()
    output: dict[Row, Row] = {}
    try:
        for b, batch in enumerate(_many_seeds(floats)):
            # Normalised first: a NaN must retract the NaN it replaced.
            materialise_upserts(output, [(k, norm(r)) for k, r in runner.run(batch)], 2)
            apply_input(inputs, batch)
            got = set(output.values())
            want = {norm(r) for r in _spark_sql(spark, inputs, schema, sql)}
            wrong = _seeds_differing(Counter(got), Counter(want))
            assert got == want, f"batch {b}, seeds {wrong[:5]}"
    finally:
        runner.close()


#: The differential's aggregates, per (seed, g).
SEEDED_AGGREGATE_SQL = SQLITE_AGGREGATE_SQL.replace("SELECT g,", "SELECT seed, g,").replace(
    "GROUP BY g", "GROUP BY seed, g"
)


class TestManySeeds:
    def test_group_aggregate_equals_spark_group_by(self, spark: Any) -> None:
        """count(*), count, sum, avg, min, max, count(distinct) over 300
        seeds' changelogs (null keys and values, updates across groups, the
        current min / max retracted, identical rows) materialise after every
        batch to Spark's GROUP BY seed, g."""
        _check_many_aggregate(
            spark,
            lambda: GroupAggregate(_seeded(SCHEMA), ["seed", "g"], AGGREGATES),
            SEEDED_AGGREGATE_SQL,
            floats=False,
        )

    def test_float_aggregate_equals_spark_group_by(self, spark: Any) -> None:
        """Over doubles with NaN, +-inf and -0.0, the aggregates of 300 seeds
        materialise after every batch to Spark's own GROUP BY seed, g (NaN
        equal to NaN and above +inf, -0.0 equal to 0.0)."""
        names = ", ".join(
            ["COUNT(*)", "COUNT(v)", "SUM(v)", "AVG(v)", "MIN(v)", "MAX(v)", "COUNT(DISTINCT v)"]
        )
        assert len(FLOAT_AGGREGATES) == 7
        _check_many_aggregate(
            spark,
            lambda: GroupAggregate(_seeded(FLOAT_SCHEMA), ["seed", "g"], FLOAT_AGGREGATES),
            f"SELECT seed, g, {names} FROM t GROUP BY seed, g",
            floats=True,
        )

    @pytest.mark.parametrize(
        ("order", "limit", "offset", "partition", "with_ties"),
        [
            ([KeyColumn("v", Direction.DESC)], 2, 0, ["g"], False),
            (
                [KeyColumn("v", Direction.ASC, NullOrder.LAST), KeyColumn("w", Direction.DESC)],
                3,
                0,
                ["g"],
                False,
            ),
            ([KeyColumn("v", Direction.DESC, NullOrder.FIRST)], 2, 1, ["g"], False),
            (
                [KeyColumn("w", Direction.ASC, NullOrder.LAST), KeyColumn("v", Direction.DESC)],
                4,
                2,
                [],
                False,
            ),
            ([KeyColumn("v", Direction.DESC)], 2, 0, ["g"], True),
            ([KeyColumn("w", Direction.DESC, NullOrder.FIRST)], 3, 0, [], True),
        ],
        ids=["desc", "asc-nulls-last-desc", "offset", "global-offset", "ties", "global-ties"],
    )
    def test_top_n_equals_spark_window(
        self,
        spark: Any,
        order: list[KeyColumn],
        limit: int,
        offset: int,
        partition: list[str],
        with_ties: bool,
    ) -> None:
        """The top-N set of 300 seeds (per g, or one per seed) materialises
        after every batch to Spark's ROW_NUMBER() between offset and offset +
        N, ordered by the order columns then the row identity, or with ties
        to RANK() <= N: ties at the N-th place, identical rows, nulls first
        and last."""
        schema = _seeded(SCHEMA)
        keys = ["seed", *partition]
        over = f"PARTITION BY {', '.join(keys)} ORDER BY {_order_sql(order)}"
        if with_ties:
            sql = f"SELECT * FROM (SELECT *, RANK() OVER ({over}) AS rk FROM t) WHERE rk <= {limit}"
        else:
            rest = [c for c in schema.names if c not in {*keys, *(o.name for o in order)}]
            over += "".join(f", {c} ASC NULLS FIRST" for c in rest)
            sql = (
                f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER ({over}) AS rn FROM t) "
                f"WHERE rn > {offset} AND rn <= {offset + limit}"
            )
        sql = sql.replace("SELECT * FROM (", "SELECT seed, g, v, w, id FROM (", 1)

        def make() -> TopN:
            return TopN(schema, order, limit, keys, offset=offset, with_ties=with_ties)

        runner = Partitioned(make, keys, 3 if partition else 2, schema=schema)
        inputs: Counter[Row] = Counter()
        output: Counter[Row] = Counter()
        try:
            for b, batch in enumerate(_many_seeds(False)):
                output = apply_top(output, runner.run(batch))
                apply_input(inputs, batch)
                want = Counter(_spark_sql(spark, inputs, schema, sql))
                assert output == want, f"batch {b}, seeds {_seeds_differing(output, want)[:5]}"
        finally:
            runner.close()
