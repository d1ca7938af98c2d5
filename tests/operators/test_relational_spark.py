"""GroupAggregate and TopN through Spark's runner against Spark batch SQL:
a random changelog in several batches, two partitions, rows shuffled; after
every batch the materialised output equals ``GROUP BY`` and ``ROW_NUMBER()``
over the materialised input, run by Spark itself."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from encoding import Direction, KeyColumn
from operators import RowKind
from operators._runner import run_operator
from operators._sinks import ParquetSink
from operators.aggregate import Aggregate, GroupAggregate
from operators.demo import write_batches
from operators.topn import TopN
from tests.operators._relational_model import (
    CHANGELOG,
    SCHEMA,
    Change,
    Row,
    apply_input,
    changelog,
    rounded,
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
    aggregates = [
        Aggregate.count(),
        Aggregate.count("v"),
        Aggregate.sum("v"),
        Aggregate.avg("v"),
        Aggregate.min("v"),
        Aggregate.max("v"),
        Aggregate.count_distinct("v"),
        Aggregate.min("w"),
        Aggregate.max("w"),
    ]
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
