"""``relstate bench --suite tws``: a user's ``StatefulProcessor`` on relstate.

Two comparisons, at two sizes, on the same Parquet files read one per batch
(``maxFilesPerTrigger=1``), in one Spark session, each query timed from its
start to its end (``availableNow``), output written to Parquet:

- the processor (a running count per key in a value state, pandas flavour)
  on Spark's ``transformWithStateInPandas`` on its RocksDB state store
  provider, against the same processor on relstate
  (``transform_with_state_in_pandas``);
- the processor on relstate, in each flavour, against a native relstate
  operator that does the same work (:class:`RunningCount`): the cost of the
  compatible layer itself.

Rounds alternate the sides, each round in the reverse order of the one
before; the tables compare medians, and every round's times are shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from bench.suite_dedup import _batch_ms, _spark_query, _timed
from bench.versus import Comparison, SuiteResult, runs
from encoding import TableSchema
from operators import Operator, OperatorContext
from operators._spark.runner import run_operator
from operators._spark.session import local_spark
from operators._spark.sinks import ParquetSink
from operators._tools.demo import read_batches, write_batches
from operators.stateful import transform_with_state, transform_with_state_in_pandas
from statestore import ConsistencyMode

__all__ = ["RunningCount", "RunningCountProcessor", "events", "processor_alone", "run"]

_PARTITIONS = 4
_BATCHES = 5
#: The sizes measured: (rows, distinct keys, rounds). Spark's operator pays
#: per key and batch (a call into Python and back for each), so the keys
#: are few enough that its runs take minutes, not hours.
_SIZES = ((200_000, 20_000, 3), (2_000_000, 20_000, 2))
_QUICK = ((4_000, 400, 1),)
#: The goals: relstate's speed-up over Spark's operator, and the processor's
#: time at most 1.5 times the native operator's (a speed-up of at least 1/1.5).
SPARK_GOAL = 20.0
LAYER_GOAL = 1 / 1.5
_NO_DATA = "spark.sql.streaming.noDataMicroBatches.enabled"
_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_OUTPUT_DDL = "k long, count long"


def schema() -> pa.Schema:
    """The input: a key and a value."""
    return pa.schema([pa.field("k", pa.int64()), pa.field("v", pa.int64())])


def events(rows: int, keys: int, batches: int, seed: int = 0) -> list[pa.Table]:
    """``rows`` rows over ``keys`` keys, drawn at random, in ``batches``
    batches of equal size."""
    rng = np.random.default_rng(seed)
    per_batch = rows // batches
    return [
        pa.table(
            {
                "k": pa.array(rng.integers(0, keys, per_batch), pa.int64()),
                "v": pa.array(rng.integers(0, 1_000_000, per_batch), pa.int64()),
            }
        )
        for _ in range(batches)
    ]


class RunningCountProcessor(StatefulProcessor):
    """A running count of rows per key in one value state, emitted for each
    key a batch touches: as a ``transformWithStateInPandas`` processor
    (``pandas=True``) or a ``transformWithState`` one."""

    def __init__(self, pandas: bool = True) -> None:
        self.is_pandas = pandas

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        n = sum(len(chunk) for chunk in rows) if self.is_pandas else sum(1 for _ in rows)
        got = self.count.get()
        total = n if got is None else got[0] + n
        self.count.update((total,))
        if self.is_pandas:
            import pandas as pd

            yield pd.DataFrame({"k": [key[0]], "count": [total]})
        else:
            from pyspark.sql import Row

            yield Row(k=key[0], count=total)

    def close(self) -> None:
        """Nothing to release."""


class RunningCount(Operator):
    """The running count as a native relstate operator: each batch counts
    its rows per key (Arrow), reads those keys' counts in one multi-get,
    writes them back and emits them."""

    consistency = ConsistencyMode.UNCHECKED

    def __init__(self, input_schema: pa.Schema, name: str = "running_count") -> None:
        self.name = name
        self.inputs = [input_schema]
        key = input_schema.field("k")
        self.output = pa.schema([key, pa.field("count", pa.int64())])
        self.tables = [TableSchema(1, list(self.output), ["k"], name="counts")]

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Add the batch's rows per key to the stored counts, and emit them."""
        per_key = pa.table({"k": batch.column("k")}).group_by("k").aggregate([([], "count_all")])
        keys = per_key.column("k")
        table = ctx.table("counts")
        stored = table.get_rows([(k,) for k in keys.to_pylist()])
        before = pa.array([0 if row is None else row[1] for row in stored], pa.int64())
        counts = pc.add(before, per_key.column("count_all").combine_chunks())
        out = pa.record_batch([keys.combine_chunks(), counts], schema=self.output)
        inserts = pc.equal(before, 0)
        table.insert_batch(out.filter(inserts))
        table.update_batch(out.filter(pc.invert(inserts)))
        ctx.emit_batch(out.columns)


#: One timed query: seconds from start to end, its query, its output rows.
_Timed = tuple[float, Any, int]


class _Sides:
    """Starts each side's query on one source and counts what it wrote."""

    def __init__(self, spark: Any, workdir: Path) -> None:
        self.spark = spark
        self.workdir = workdir
        self.source = workdir
        self.runs = 0

    def _work(self, label: str) -> Path:
        self.runs += 1
        return self.workdir / f"{self.runs:02d}-{label}"

    def _stream(self) -> Any:
        return read_batches(self.spark, self.source, schema())

    def spark_tws(self) -> _Timed:
        """Spark's ``transformWithStateInPandas`` on its RocksDB provider."""
        work = self._work("spark")
        frame = (
            self._stream()
            .groupBy("k")
            .transformWithStateInPandas(
                statefulProcessor=RunningCountProcessor(pandas=True),
                outputStructType=_OUTPUT_DDL,
                outputMode="Update",
                timeMode="None",
            )
        )
        conf = {_NO_DATA: "false", _PROVIDER: _ROCKSDB}
        seconds, query = _timed(lambda: _spark_query(self.spark, frame, work, conf))
        return seconds, query, int(self.spark.read.parquet(str(work / "output")).count())

    def processor(self, pandas: bool) -> _Timed:
        """The processor on relstate, in the pandas or the rows flavour."""
        work = self._work("processor")
        call = transform_with_state_in_pandas if pandas else transform_with_state
        seconds, query = _timed(
            lambda: call(
                self._stream().groupBy("k"),
                RunningCountProcessor(pandas=pandas),
                _OUTPUT_DDL,
                "Update",
                "None",
                sink=ParquetSink(str(work / "output")),
                checkpoint=str(work / "checkpoint"),
                partitions=_PARTITIONS,
                trigger={"availableNow": True},
            )
        )
        return seconds, query, _output_rows(query)

    def native(self) -> _Timed:
        """The native operator on relstate."""
        work = self._work("native")
        seconds, query = _timed(
            lambda: run_operator(
                self._stream(),
                RunningCount(schema()),
                keys=["k"],
                partitions=_PARTITIONS,
                checkpoint=str(work / "checkpoint"),
                sink=ParquetSink(str(work / "output")),
                trigger={"availableNow": True},
            )
        )
        return seconds, query, _output_rows(query)


def _output_rows(query: Any) -> int:
    return sum(int(h["metrics"]["numOutputRows"]) for h in query.history)


def processor_alone(table: pa.Table, pandas: bool) -> tuple[float, int]:
    """The processor's own work on one batch, outside any engine: seconds
    for its calls through PySpark's ``TwsTester`` (state in a Python dict),
    each key's input made before the clock starts; and how many calls."""
    from pyspark.sql import Row
    from pyspark.sql.streaming.tws_tester import TwsTester

    tester = TwsTester(RunningCountProcessor(pandas=pandas))
    groups = list(table.to_pandas().groupby("k"))
    if pandas:
        call, parts = tester.testInPandas, groups
    else:
        call = tester.test
        parts = [(k, [Row(k=k, v=v) for v in part["v"].tolist()]) for k, part in groups]
    began = time.perf_counter()
    for key, part in parts:
        call(key, part)
    return time.perf_counter() - began, len(parts)


#: The sides of a round, in the order of the first round.
_SIDE_NAMES = ("spark", "pandas", "rows", "native")


def _round(
    sides: _Sides, order: tuple[str, ...], progress: Callable[[str], None]
) -> dict[str, _Timed]:
    done = {}
    for name in order:
        progress(f"  {name}")
        if name == "spark":
            done[name] = sides.spark_tws()
        elif name == "native":
            done[name] = sides.native()
        else:
            done[name] = sides.processor(pandas=name == "pandas")
    return done


def run(quick: bool, workdir: Path, progress: Callable[[str], None], scale: int = 1) -> SuiteResult:
    """Time every side at each size, in alternating rounds, in one session."""
    sizes = [(r * scale, k * scale, n) for r, k, n in (_QUICK if quick else _SIZES)]
    progress("starting Spark")
    spark = local_spark("relstate-bench-tws", {"spark.sql.shuffle.partitions": str(_PARTITIONS)})
    comparisons: list[Comparison] = []
    readings: list[tuple[str, str]] = []
    try:
        sides = _Sides(spark, workdir)
        sides.source = workdir / "warm"
        write_batches(sides.source, events(400, 40, 2, seed=1), prefix="events")
        progress("warming up every side")
        _round(sides, _SIDE_NAMES, progress)
        for rows, keys, rounds in sizes:
            sides.source = workdir / f"source-{rows}"
            tables = events(rows, keys, _BATCHES)
            write_batches(sides.source, tables, prefix="events")
            key_batches = sum(len(pc.unique(t.column("k"))) for t in tables)
            times: dict[str, list[float]] = {name: [] for name in _SIDE_NAMES}
            last: dict[str, _Timed] = {}
            for i in range(rounds):
                order = _SIDE_NAMES if i % 2 == 0 else tuple(reversed(_SIDE_NAMES))
                progress(f"{rows:,} rows: round {i + 1} of {rounds}")
                started = time.perf_counter()
                last = _round(sides, order, progress)
                counts = {name: t[2] for name, t in last.items()}
                if len(set(counts.values())) != 1:
                    raise RuntimeError(
                        f"{rows:,} rows: the sides emitted different row counts {counts}; "
                        "the comparison would not be of the same work"
                    )
                for name, timed in last.items():
                    times[name].append(timed[0])
                progress(f"  round took {time.perf_counter() - started:.0f} s")
            comparisons.append(
                Comparison.of_runs(
                    f"running count, processor (pandas) vs Spark, {keys:,} keys",
                    rows,
                    times["pandas"],
                    times["spark"],
                    "transformWithStateInPandas, RocksDB provider",
                    goal=SPARK_GOAL,
                )
            )
            for flavour in ("pandas", "rows"):
                comparisons.append(
                    Comparison.of_runs(
                        f"running count, processor ({flavour}) vs native operator",
                        rows,
                        times[flavour],
                        times["native"],
                        "native relstate operator",
                        goal=LAYER_GOAL,
                    )
                )
            labels = {
                "spark": "Spark transformWithStateInPandas",
                "pandas": "relstate processor, pandas",
                "rows": "relstate processor, rows",
                "native": "relstate native operator",
            }
            for name in _SIDE_NAMES:
                readings.append((f"{rows:,} rows, runs, {labels[name]}", runs(times[name])))
            for name in _SIDE_NAMES:
                readings.append(
                    (f"{rows:,} rows, batches, {labels[name]} (last run)", _batch_ms(last[name][1]))
                )
            readings.append((f"{rows:,} rows, output rows (every side)", f"{last['native'][2]:,}"))
            per_call = ", ".join(
                f"{labels[name]} {median(times[name]) / key_batches * 1e6:.0f}"
                for name in _SIDE_NAMES
            )
            readings.append(
                (f"{rows:,} rows, µs per key and batch ({key_batches:,}), median run", per_call)
            )
            for flavour in ("pandas", "rows"):
                progress(f"{rows:,} rows: the processor alone ({flavour})")
                seconds, calls = processor_alone(tables[0], pandas=flavour == "pandas")
                readings.append(
                    (
                        f"{rows:,} rows, the processor alone ({flavour}), first batch, "
                        "PySpark's TwsTester, state in memory",
                        f"{seconds * 1e6 / calls:.0f} µs a key ({calls:,} keys, {seconds:.2f} s)",
                    )
                )
    finally:
        spark.stop()
    description = (
        f"A running count per key (one value state; `count` emitted for each key a batch "
        f"touches, Update mode) over random keys, in {_BATCHES} batches (one Parquet file "
        "each, `maxFilesPerTrigger=1`), at each size below, "
        f"{_PARTITIONS} partitions on every side, Spark `local[2,3]` (two cores). Each side is "
        "one streaming query with an `availableNow` trigger, timed from start to end, writing "
        "its output to Parquet; every side runs once on a small input first (warm-up). The "
        "sides run in rounds, each round in the reverse order of the one before, and each "
        "round checks that every side emitted the same number of rows; the tables compare "
        "medians, and the readings show every round. Spark runs the pandas processor with "
        "`transformWithStateInPandas` on its RocksDB state store provider (it requires it), "
        "without no-data batches so both sides run the same batches; relstate runs the same "
        "processor class, unchanged, with `transform_with_state_in_pandas` (and its "
        "`transformWithState` flavour with `transform_with_state`). The native operator is the "
        "same running count written against relstate's operator API (Arrow group-by, one "
        "multi-get of the keys' counts, batch writes). For the processor against the native "
        f"operator the goal is the processor at most 1.5 times the native operator's time, a "
        f"speed-up of at least {LAYER_GOAL:.2f} (below 1: the processor is slower). The "
        "per-key readings divide each side's median time by the key-batches (the distinct "
        "keys of each batch, summed: the calls a processor gets); the processor-alone "
        "reading runs the processor's own calls for the first batch through PySpark's "
        "`TwsTester` (state in a Python dict, each key's input made before timing): what "
        "the user's Python costs on any engine."
    )
    return SuiteResult(
        suite="tws",
        title="Spark's StatefulProcessor on relstate",
        description=description,
        comparisons=comparisons,
        readings=readings,
        scale=scale,
    )
