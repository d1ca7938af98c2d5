"""The foreign-key join's cost per micro-batch as the tables grow, without
Spark: one change batch (1,000 left rows moved to another FK, 200 right rows
updated) through both stages (a PipelineHarness, RocksDB, 4 partitions per stage),
against recomputing the join of the full tables with pyarrow. The Spark
comparison is ``relstate bench --suite fkjoin``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from bench.suite_fkjoin import LEFT, RIGHT, _changelogs, _Plan
from operators import FkJoin, Pipeline
from operators.testing import PipelineHarness

ROUNDS = 5
SIZES = (10_000, 100_000)


def _join() -> FkJoin:
    return FkJoin(LEFT, ["id"], RIGHT, "rid", "fk", how="left")


def _prepared(join: FkJoin, table: pa.Table) -> pa.Table:
    return pa.Table.from_batches([join.keyed_left(table.combine_chunks().to_batches()[0])])


@pytest.fixture(params=SIZES, ids=lambda n: f"{n // 1000}k")
def loaded(request: pytest.FixtureRequest) -> Iterator[tuple[PipelineHarness, Iterator[Any]]]:
    """A join with N left and N/10 right rows loaded, and its change batches."""
    join = _join()
    lefts, rights = _changelogs(request.param, _Plan((request.param,), 1_000, 200, ROUNDS), 1)
    pipeline = Pipeline()
    left = pipeline.source(
        join.keyed_schema(lefts[0].schema), "left", sequence=join.sequence_column
    )
    right = pipeline.source(rights[0].schema, "right", sequence=join.sequence_column)
    join.add_to(pipeline, left, right)
    harness = PipelineHarness(pipeline, 4, backend="rocksdb")
    harness.run_batch([_prepared(join, lefts[0]), rights[0]])
    pairs = zip(lefts[1:], rights[1:], strict=True)
    batches = iter([[_prepared(join, lt), rt] for lt, rt in pairs])
    with harness:
        yield harness, batches


def test_change_batch_through_both_stages(
    benchmark: BenchmarkFixture, loaded: tuple[PipelineHarness, Iterator[Any]]
) -> None:
    """One change batch through the subscriptions and results stages: the
    time should not grow with the tables."""
    harness, batches = loaded
    benchmark.pedantic(  # type: ignore[no-untyped-call]
        harness.run_batch, setup=lambda: ((next(batches),), {}), rounds=ROUNDS, iterations=1
    )


@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"{n // 1000}k")
def test_recompute_full_join_with_pyarrow(benchmark: BenchmarkFixture, n: int) -> None:
    """The naive alternative: the left join of the full tables, recomputed
    (pyarrow's hash join), whose time grows with the tables."""
    lefts, rights = _changelogs(n, _Plan((n,), 1_000, 200, 0), 1)
    left = lefts[0].select(LEFT.names)
    right = rights[0].select(RIGHT.names)
    benchmark(lambda: left.join(right, keys="fk", right_keys="rid", join_type="left outer"))
