"""A user's ``StatefulProcessor`` on relstate against Spark's own
``transformWithState`` / ``transformWithStateInPandas``: every processor of
:mod:`processors`, in both flavours, over the same micro-batches
(:mod:`cases`), gives the same output batch by batch (as multisets within a
batch).

Spark runs first, on its RocksDB state store provider and without no-data
batches (see :mod:`_spark_reference`); relstate then runs through
``transform_with_state(_in_pandas)`` on the same files with Spark's batch
processing times replayed (the ``clock`` query option), so that TTL and
processing-time timers expire in the same batches on both sides. The
watermark is not replayed: relstate computes its own by the one watermark
rule, and the event-time processor emits it, so it is compared too.

A few queries run at once (each mostly waits, some on purpose); all of
Spark's finish before relstate's start, since relstate needs Spark's times.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from operators.stateful import transform_with_state, transform_with_state_in_pandas
from tests.operators.stateful import processors as p
from tests.operators.stateful._spark_reference import (
    FLAVOURS,
    Case,
    SparkRun,
    finish_spark,
    first_batch_done,
    initial_state,
    input_stream,
    replayed_clock,
    start_spark_started,
    write_input,
)
from tests.operators.stateful.cases import CASES

pytestmark = pytest.mark.spark

#: One case in one flavour.
Run = tuple[str, str]
#: Every (case, flavour) compared.
RUNS: list[Run] = [(name, flavour) for name in CASES for flavour in FLAVOURS]
#: Queries active at once on one side, each started after the one before
#: has run its first batch (see ``first_batch_done``).
LIMIT = 4

Batches = list[Counter[tuple[Any, ...]]]


@dataclass
class Compared:
    """One case in one flavour through both sides."""

    spark: SparkRun
    relstate: Batches
    #: Batches relstate's query ran.
    relstate_batches: int


def start_relstate(
    spark: Any, case: Case, flavour: str, root: Path, times: list[int]
) -> tuple[Any, Batches]:
    """Start the case through relstate's ``transform_with_state(_in_pandas)``
    with Spark's processing times; the query, and each batch's output rows
    as the sink receives them."""
    cls = case.processor
    got: Batches = [Counter() for _ in case.batches]
    columns = cls.columns()

    def sink(output: Any, batch_id: int) -> None:
        rows = output.collect()
        if any(r["row_kind"] != "+I" for r in rows):
            raise AssertionError(f"batch {batch_id}: a row kind other than +I")
        got[batch_id] = Counter(tuple(r[c] for c in columns) for r in rows)

    call = transform_with_state_in_pandas if flavour == "pandas" else transform_with_state
    query = call(
        input_stream(spark, root / "source", case).groupBy("k"),
        cls.pandas() if flavour == "pandas" else cls.rows(),
        cls.OUTPUT,
        cls.OUTPUT_MODE,
        cls.TIME_MODE,
        initialState=initial_state(spark, case),
        eventTimeColumnName=case.event_time_column,
        sink=sink,
        checkpoint=str(root / "relstate"),
        partitions=2,
        trigger={"availableNow": True},
        clock=replayed_clock(times),
    )
    return query, got


def _windowed(runs: list[Run], start: Callable[[Run], Any]) -> dict[Run, Any]:
    """Start ``start(run)`` for every run, at most :data:`LIMIT` queries
    active at once, each after the one before has run its first batch;
    what each start returned (its query first)."""
    started: dict[Run, Any] = {}
    for run in runs:
        while sum(1 for s in started.values() if s[0].isActive) >= LIMIT:
            time.sleep(0.1)
        started[run] = start(run)
        first_batch_done(started[run][0])
    return started


@pytest.fixture(scope="module")
def compared(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[Run, Compared]:
    """Every run of :data:`RUNS` through Spark, then through relstate."""
    roots = {run: tmp_path_factory.mktemp(f"tws-{run[0]}-{run[1]}") for run in RUNS}

    def spark_side(run: Run) -> tuple[Any, SparkRun]:
        root = roots[run]
        write_input(CASES[run[0]], root / "source")
        return start_spark_started(spark, CASES[run[0]], run[1], root / "source", root / "spark")

    spark_runs = {
        run: finish_spark(query, spark_run)
        for run, (query, spark_run) in _windowed(RUNS, spark_side).items()
    }

    def relstate_side(run: Run) -> tuple[Any, Batches]:
        return start_relstate(spark, CASES[run[0]], run[1], roots[run], spark_runs[run].times)

    out = {}
    for run, (query, got) in _windowed(RUNS, relstate_side).items():
        query.awaitTermination()
        out[run] = Compared(spark_runs[run], got, len(query.history))
    return out


@pytest.mark.parametrize(("name", "flavour"), RUNS)
def test_same_output_as_spark(compared: dict[Any, Compared], name: str, flavour: str) -> None:
    """The processor emits on relstate what it emits on Spark, batch by
    batch, in the same batches."""
    run = compared[name, flavour]
    n = len(CASES[name].batches)
    assert len(run.spark.times) == n, "Spark ran one batch per file"
    assert run.relstate_batches == n, "relstate ran one batch per file"
    for batch in range(n):
        expected, got = run.spark.outputs[batch], run.relstate[batch]
        assert got == expected, (
            f"batch {batch}: missing {sorted(expected - got, key=repr)}, "
            f"extra {sorted(got - expected, key=repr)}"
        )


def _spark_rows(compared: dict[Any, Compared], name: str) -> list[tuple[Any, ...]]:
    return [row for out in compared[name, "rows"].spark.outputs for row in out]


def test_cases_reach_what_they_are_for(compared: dict[Any, Compared]) -> None:
    """The inputs take Spark where each case means to go, so that equal
    outputs prove something: TTL expires an entry and leaves a refreshed one,
    timers fire (one in the batch that set it), late rows are dropped and
    the watermark moves."""
    ttl = _spark_rows(compared, "ValueTtl")
    assert any(found == -1 and k != "w" and count == -1 for k, found, count, _ in ttl)
    assert any(found >= 1 for _, found, _, _ in ttl)
    lists = _spark_rows(compared, "ListTtl")
    assert ("b", False) in {(k, present) for k, present, _, _ in lists}
    maps = _spark_rows(compared, "MapTtl")
    assert any(not has for _, _, _, has, _, _ in maps) and any(has for *_, has, _, _ in maps)
    timers = _spark_rows(compared, "ProcessingTimers")
    fired = [(k, pt, expiry) for k, kind, _, pt, expiry, _ in timers if kind == "expired"]
    assert any(expiry == pt - 1 for _, pt, expiry in fired), "a timer fired in its own batch"
    assert any(expiry < pt - 1 for _, pt, expiry in fired), "a timer fired in a later batch"
    events = _spark_rows(compared, "EventTimeTimers")
    seen = Counter(k for k, kind, *_ in events if kind == "data")
    assert seen["b"] == 2, "b's row behind the watermark in the last batch was dropped"
    assert {wm for _, _, _, wm, _, _ in events} >= {0, 1_767_225_607_000}


def test_initial_state_without_input_is_taken(compared: dict[Any, Compared]) -> None:
    """A key with initial state and no input in the first batch keeps its
    initial state for the next (checked on Spark, and so on relstate)."""
    rows = _spark_rows(compared, "InitialState")
    assert ("z", 53, "50") in rows


def test_processors_cover_the_api() -> None:
    """The processors together are at least ten and each has an input."""
    assert len(p.PROCESSORS) >= 10
    assert {case.processor for case in CASES.values()} == set(p.PROCESSORS.values())
