"""Spark's own ``transformWithState`` / ``transformWithStateInPandas`` as the
reference for relstate's: the same input, micro-batch by micro-batch, through
Spark, each batch's output collected, and each batch's processing time and
watermark read back from Spark's checkpoint so that relstate can run with the
same ones.

The input of a case is written as one Parquet file per micro-batch and read
with ``maxFilesPerTrigger=1``, so batch ``i`` is file ``i`` on both sides.
Spark runs on its RocksDB state store provider (``transformWithState``
requires it) and without no-data batches: in ProcessingTime mode Spark would
otherwise run one after every batch, for ever (its operator always asks for
another), and relstate's runner, whose Spark plan holds no stateful operator,
never runs one. A case may pause after a batch (the ``foreachBatch`` function
sleeps) so that the next batch's processing time is at least that much later:
that is how a TTL or a timer comes to expire between two batches.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from operators._tools.demo import write_batches
from tests.operators.stateful.processors import INPUT_DDL, Processor

__all__ = [
    "FLAVOURS",
    "INPUT_SCHEMA",
    "Case",
    "SparkRun",
    "batch_times",
    "finish_spark",
    "first_batch_done",
    "initial_state",
    "input_stream",
    "replayed_clock",
    "row_of",
    "start_spark",
    "start_spark_started",
    "write_input",
]

#: The input of every case, as Arrow writes it (:data:`INPUT_DDL` in Spark).
INPUT_SCHEMA = pa.schema(
    [
        pa.field("k", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("op", pa.string()),
        pa.field("u", pa.string()),
        pa.field("v", pa.int64()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
    ]
)

#: The two flavours: Spark's method for each.
FLAVOURS = {"rows": "transformWithState", "pandas": "transformWithStateInPandas"}

_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_NO_DATA = "spark.sql.streaming.noDataMicroBatches.enabled"

#: One input row: (k, seq, op, u, v, ts in ms since the epoch).
InputRow = tuple[str, int, str, str, int, int]
#: One output row, as a tuple of the output columns.
OutputRow = tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    """One processor's input stream, and how it runs."""

    name: str
    processor: type[Processor]
    batches: Sequence[Sequence[InputRow]]
    #: Seconds Spark pauses after each batch (missing: none).
    pauses: Sequence[float] = ()
    #: Rows of the initial state, in the processor's ``INITIAL_DDL``.
    initial: Sequence[tuple[Any, ...]] | None = None
    #: The watermark delay on ``ts`` (EventTime cases).
    delay_ms: int | None = None
    event_time_column: str = ""


@dataclass
class SparkRun:
    """What Spark did with a case: each batch's output rows (a multiset),
    and each batch's processing time and watermark from its offset log."""

    outputs: list[Counter[OutputRow]]
    #: Spark's checkpoint of the query.
    checkpoint: Path
    times: list[int] = field(default_factory=list)
    watermarks: list[int] = field(default_factory=list)


def write_input(case: Case, directory: Path) -> None:
    """The case's batches as Parquet files, one per batch, in order."""
    tables = [
        pa.Table.from_pylist(
            [dict(zip(INPUT_SCHEMA.names, (*r[:5], r[5] * 1000), strict=True)) for r in rows],
            INPUT_SCHEMA,
        )
        for rows in case.batches
    ]
    write_batches(directory, tables, prefix="input")


def input_stream(spark: Any, directory: Path, case: Case) -> Any:
    """The streaming DataFrame of a case's files, one file per batch, with
    the case's watermark."""
    frame = (
        spark.readStream.schema(INPUT_DDL).option("maxFilesPerTrigger", 1).parquet(str(directory))
    )
    if case.delay_ms is not None:
        frame = frame.withWatermark("ts", f"{case.delay_ms} milliseconds")
    return frame


def initial_state(spark: Any, case: Case) -> Any:
    """The case's initial state as Spark takes it (grouped by ``k``), or None."""
    if case.initial is None:
        return None
    ddl: str = case.processor.INITIAL_DDL  # type: ignore[attr-defined]
    return spark.createDataFrame(list(case.initial), ddl).groupBy("k")


def row_of(row: Any) -> OutputRow:
    """An output row (Spark's ``Row``) as a plain tuple."""
    return tuple(row)


def start_spark(
    spark: Any, case: Case, flavour: str, source: Path, checkpoint: Path
) -> tuple[Any, SparkRun]:
    """Start the case through Spark's own operator in ``flavour``; the
    query, and the run its batches fill in as they come."""
    cls = case.processor
    processor = cls.pandas() if flavour == "pandas" else cls.rows()
    grouped = input_stream(spark, source, case).groupBy("k")
    frame = getattr(grouped, FLAVOURS[flavour])(
        statefulProcessor=processor,
        outputStructType=cls.OUTPUT,
        outputMode=cls.OUTPUT_MODE,
        timeMode=cls.TIME_MODE,
        initialState=initial_state(spark, case),
        eventTimeColumnName=case.event_time_column,
    )
    run = SparkRun([Counter() for _ in case.batches], checkpoint)

    def collect(batch: Any, batch_id: int) -> None:
        run.outputs[batch_id] = Counter(row_of(r) for r in batch.collect())
        if batch_id < len(case.pauses):
            time.sleep(case.pauses[batch_id])

    conf = {_PROVIDER: _ROCKSDB, _NO_DATA: "false"}
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        query = (
            frame.writeStream.foreachBatch(collect)
            .outputMode(cls.OUTPUT_MODE.lower())
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    finally:
        # A query keeps the configuration it started with.
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    return query, run


def first_batch_done(query: Any, timeout_s: float = 300.0) -> None:
    """Wait until ``query`` has run its first batch (or stopped). Queries are
    started one after the other's first batch: the first batch of Spark's
    operator starts a Python worker on the driver that must connect back
    within a fixed time (ten seconds), which several starting at once on a
    loaded machine miss."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.1)


#: How Spark says that a Python worker missed its time to connect back.
_NO_WORKER = "Python worker failed to connect back"


def start_spark_started(
    spark: Any, case: Case, flavour: str, source: Path, checkpoint: Path, attempts: int = 3
) -> tuple[Any, SparkRun]:
    """:func:`start_spark`, returned once the query has run its first batch.
    A query whose Python worker missed its time to connect back before any
    batch ran (the machine too loaded to start Python within Spark's fixed
    ten seconds) is started again on a fresh checkpoint: nothing of it ran."""
    for attempt in range(attempts):
        where = checkpoint.with_name(f"{checkpoint.name}-{attempt}") if attempt else checkpoint
        query, run = start_spark(spark, case, flavour, source, where)
        first_batch_done(query)
        failed = query.exception()
        if failed is None or _NO_WORKER not in str(failed) or query.lastProgress is not None:
            return query, run
    return query, run


def batch_times(checkpoint: Path) -> list[tuple[int, int]]:
    """Each batch's (processing time, watermark) in ms, as Spark's offset log
    under ``checkpoint`` recorded them before the batch ran."""
    out = []
    offsets = checkpoint / "offsets"
    for path in sorted(offsets.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if not path.name.isdigit():
            continue
        metadata = json.loads(path.read_text(encoding="utf-8").splitlines()[1])
        out.append((int(metadata["batchTimestampMs"]), int(metadata["batchWatermarkMs"])))
    return out


def finish_spark(query: Any, run: SparkRun) -> SparkRun:
    """Wait for Spark's query, then read its batches' times into ``run``."""
    try:
        query.awaitTermination()
    except Exception as exc:
        raise AssertionError(f"Spark's query failed: {exc}") from exc
    times = batch_times(run.checkpoint)
    run.times = [t for t, _ in times]
    run.watermarks = [w for _, w in times]
    return run


def replayed_clock(times: Sequence[int]) -> Callable[[int], int]:
    """The clock that gives relstate's batch ``i`` Spark's processing time of
    its batch ``i``."""
    fixed = list(times)

    def clock(batch_id: int) -> int:
        return fixed[batch_id]

    return clock
