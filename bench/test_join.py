"""StreamingJoin (changelog mode) through the harness on one partition: 50,000
changelog rows per side in 5 micro-batches, commits included. Rows per second
per partition is 100,000 over the mean time; compare within a group."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from bench.join_workload import MicroBatch, changelog, make_join, run_dict, run_harness
from operators.join import JoinType

ROWS = 50_000
JOIN_TYPES = [JoinType.INNER, JoinType.FULL]


@pytest.fixture(scope="module")
def micro() -> list[MicroBatch]:
    """The workload's micro-batches, made once."""
    return changelog(ROWS, batches=5, seed=1)


@pytest.mark.benchmark(group="changelog join")
@pytest.mark.parametrize("join_type", JOIN_TYPES, ids=[t.value for t in JOIN_TYPES])
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
@pytest.mark.parametrize("unique_key", [True, False], ids=["unique-key", "no-unique-key"])
def test_streaming_join(
    benchmark: BenchmarkFixture,
    micro: list[MicroBatch],
    tmp_path: Path,
    join_type: JoinType,
    backend: str,
    unique_key: bool,
) -> None:
    """The whole workload through StreamingJoin on one harness partition."""
    rounds = iter(range(1_000))

    def once() -> None:
        run_harness(make_join(join_type, unique_key), micro, backend, tmp_path / str(next(rounds)))

    benchmark.pedantic(once, rounds=3)  # type: ignore[no-untyped-call]
    benchmark.extra_info["rows"] = 2 * ROWS


@pytest.mark.benchmark(group="changelog join")
@pytest.mark.parametrize("join_type", JOIN_TYPES, ids=[t.value for t in JOIN_TYPES])
def test_dict_baseline(
    benchmark: BenchmarkFixture, micro: list[MicroBatch], join_type: JoinType
) -> None:
    """The same join on plain dicts: the baseline of the group."""
    benchmark.pedantic(lambda: run_dict(join_type, micro), rounds=3)  # type: ignore[no-untyped-call]
    benchmark.extra_info["rows"] = 2 * ROWS
