"""AppendJoin through the record-at-a-time harness on one partition: rows
per second per partition (input rows of both sides over wall time, commits
included) on the workload of ``relstate bench --suite append_join`` at
40,000 rows per side."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from bench.append_join_workload import AppendWorkload, run_harness

WORKLOAD = AppendWorkload(rows=40_000)


@pytest.fixture(scope="module")
def sides() -> tuple[list[pa.Table], list[pa.Table]]:
    """The benchmark's two inputs, made once."""
    return WORKLOAD.sides()


@pytest.mark.benchmark(group="append join, harness")
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_append_join_harness(
    benchmark: BenchmarkFixture,
    sides: tuple[list[pa.Table], list[pa.Table]],
    backend: str,
    tmp_path: Path,
) -> None:
    """5 batches of an inner ±2 s join, 40,000 rows per side, one partition;
    the rows per second is in extra_info."""
    rounds = iter(range(1_000))

    def once() -> tuple[float, int]:
        return run_harness(WORKLOAD, sides, backend, tmp_path / f"r{next(rounds)}")

    seconds, out = benchmark.pedantic(once, rounds=3)  # type: ignore[no-untyped-call]
    benchmark.extra_info["rows_per_second"] = round(2 * WORKLOAD.rows / seconds)
    benchmark.extra_info["output_rows"] = out
