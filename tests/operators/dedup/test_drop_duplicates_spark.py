"""relstate's DropDuplicates and DropDuplicatesWithinWatermark against Spark's
own dropDuplicates and dropDuplicatesWithinWatermark, on the same files.

Random append-only batches, one Parquet file each with its own modification
time, read with ``maxFilesPerTrigger=1`` so that batch ``i`` is file ``i`` on
both sides; event times that fall behind the watermark make late rows. Two
seeds per operator, all queries of an operator at once in the shared session;
in one of them some keys have rows at several event times in a batch, where
Spark's choice of row depends on order: for those only keys and counts are
compared.

No-data batches: Spark runs an extra batch without input when the watermark
has moved and a stateful operator could evict (``shouldRunAnotherBatch``).
relstate's runner is a ``foreachBatch`` with no stateful operator in Spark's
plan, so Spark never plans such a batch for it; relstate evicts at the next
batch that has data instead, which changes no output row (eviction emits
nothing in either operator, and the late-row bound is the watermark of the
batch before, which a no-data batch would only have raised to the value the
next data batch computes anyway). With every file present from the start no
no-data batch falls between data batches, only one after the last; Spark's
queries here run with ``spark.sql.streaming.noDataMicroBatches.enabled=false``
so that both sides run exactly the same batches, and batch ids line up.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import Watermark
from operators._spark.runner import run_operator
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches
from operators.dedup import DropDuplicates, DropDuplicatesWithinWatermark

pytestmark = pytest.mark.spark


def events_schema(tz: str) -> pa.Schema:
    """The input: Spark's watermark needs a TIMESTAMP (with time zone), which
    reaches Python workers as microseconds in the session's time zone."""
    return pa.schema(
        [
            pa.field("k", pa.int64()),
            pa.field("ts", pa.timestamp("us", tz=tz), nullable=False),
            pa.field("v", pa.int64()),
        ]
    )


SCHEMA = events_schema("UTC")
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DELAY_MS = 150

Batches = list[Counter[tuple[Any, ...]]]
Collected = dict[int, Counter[tuple[Any, ...]]]


def random_batches(seed: int, n: int = 5, spread: bool = False) -> list[pa.Table]:
    """``n`` batches of up to 20 keys. Within a batch a key has one event time
    (its duplicates there are equal rows, so no output depends on the order of
    rows inside a batch); across batches times repeat on a 50 ms grid and fall
    up to 700 ms behind, which makes duplicates, evictions and late rows.

    ``spread``: each batch also has two keys of their own (never seen in
    another batch) with rows at two or three event times, so that which of
    them is kept depends on the order of the rows, as it does in Spark; the
    keys and counts out do not.

    Every batch has a null key too: a null key is one key like any other
    value, on both sides."""
    rng = random.Random(seed)
    batches = []
    for b in range(n):
        clock = 200 * (b + 1)
        rows = []
        for k in [*rng.sample(range(19), 11), None]:
            t = clock + rng.choice([-700, -500, -300, -150, -100, -50, 0, 50])
            ts = EPOCH + dt.timedelta(milliseconds=max(t, 0))
            for _ in range(rng.choice([1, 1, 2, 3])):
                rows.append({"k": k, "ts": ts, "v": (99 if k is None else k) * 1000 + t})
        for k in (100 + 2 * b, 101 + 2 * b) if spread else ():
            for t in rng.sample([clock - 100, clock - 50, clock, clock + 50], rng.choice([2, 3])):
                rows.append({"k": k, "ts": EPOCH + dt.timedelta(milliseconds=t), "v": t})
        rng.shuffle(rows)
        batches.append(pa.Table.from_pylist(rows, SCHEMA))
    return batches


def _stream(spark: Any, source: Path) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return (
        spark.readStream.schema(from_arrow_schema(SCHEMA))
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )


def _row(r: Any) -> tuple[Any, ...]:
    return (r["k"], r["ts"], r["v"])


#: The operators compared: Spark's call, by a name for the test ids.
MODES = {
    "dropDuplicates(k, ts)": ("dropDuplicates", ["k", "ts"]),
    "dropDuplicates(k)": ("dropDuplicates", ["k"]),
    "dropDuplicatesWithinWatermark(k)": ("dropDuplicatesWithinWatermark", ["k"]),
}


def start_spark(spark: Any, source: Path, checkpoint: Path, mode: str) -> tuple[Any, Collected]:
    """Start Spark's native operator; the query, and each batch's rows as
    they come."""
    method, keys = MODES[mode]
    frame = _stream(spark, source).withWatermark("ts", f"{DELAY_MS} milliseconds")
    frame = getattr(frame, method)(keys)
    collected: Collected = {}

    def collect(batch: Any, batch_id: int) -> None:
        collected[batch_id] = Counter(_row(r) for r in batch.collect())

    key = "spark.sql.streaming.noDataMicroBatches.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        query = (
            frame.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    finally:
        # The query keeps the configuration it started with.
        spark.conf.set(key, before)
    return query, collected


def start_relstate(spark: Any, source: Path, root: Path, mode: str) -> tuple[Any, ParquetSink]:
    """Start relstate's operator through the runner; the query and its sink."""
    schema = events_schema(spark.conf.get("spark.sql.session.timeZone"))
    method, keys = MODES[mode]
    operator = (
        DropDuplicatesWithinWatermark(schema, keys, event_time="ts", delay_ms=DELAY_MS)
        if method == "dropDuplicatesWithinWatermark"
        else DropDuplicates(schema, keys, event_time="ts")
    )
    sink = ParquetSink(str(root / "output"))
    query = run_operator(
        _stream(spark, source),
        operator,
        keys=["k"],
        partitions=2,
        checkpoint=str(root / "checkpoint"),
        sink=sink,
        watermarks={0: Watermark("ts", DELAY_MS)},
        trigger={"availableNow": True},
    )
    return query, sink


def relstate_batches(spark: Any, sink: ParquetSink, batches: int) -> Batches:
    """Each batch's rows that relstate wrote to its sink."""
    got: Collected = {}
    for r in sink.read(spark).collect():
        assert r["row_kind"] == "+I"
        got.setdefault(r["batch"], Counter())[_row(r)] += 1
    return [got.get(i, Counter()) for i in range(batches)]


def spark_counters(query: Any) -> tuple[int, int]:
    """Rows Spark dropped as late and as duplicates, over all batches."""
    late = duplicates = 0
    for progress in query.recentProgress:
        for op in json.loads(progress.json)["stateOperators"]:
            late += op["numRowsDroppedByWatermark"]
            duplicates += op["customMetrics"].get("numDroppedDuplicateRows", 0)
    return late, duplicates


def relstate_counters(query: Any) -> tuple[int, int]:
    """Rows relstate dropped as late and as duplicates, over all batches."""
    ours = [b["metrics"] for b in query.history]
    late = sum(m.get("numRowsDroppedByWatermark", 0) for m in ours)
    return late, sum(m.get("numDroppedDuplicateRows", 0) for m in ours)


@dataclass
class Compared:
    """One input through both sides: each side's rows per batch and its
    (late, duplicate) counts."""

    expected: Batches
    got: Batches
    spark_counts: tuple[int, int]
    counts: tuple[int, int]


#: The runs: (mode, seed, spread), two seeds per mode: one with one event
#: time per key in a batch, one where some keys have several (whose other
#: keys are compared row for row all the same). Each run costs some 7 s.
RUNS = [
    *((m, 7 + 4 * i, False) for i, m in enumerate(MODES)),
    *((m, 50 + i, True) for i, m in enumerate(MODES)),
]


@pytest.fixture(scope="module")
def compared(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Compared]:
    """Every run of :data:`RUNS`, both sides, in one Spark session. The
    queries of one mode run at once (a streaming query mostly waits), which
    keeps the module short."""
    out = {}
    for mode in MODES:
        started = {}
        for run in (r for r in RUNS if r[0] == mode):
            _, seed, spread = run
            root = tmp_path_factory.mktemp("dedup-spark")
            batches = random_batches(seed, spread=spread)
            write_batches(root / "source", batches, prefix="events")
            started[run] = (
                len(batches),
                start_spark(spark, root / "source", root / "spark", mode),
                start_relstate(spark, root / "source", root / "relstate", mode),
            )
        for run, (n, (spark_query, collected), (query, sink)) in started.items():
            spark_query.awaitTermination()
            query.awaitTermination()
            assert len(collected) == n == len(query.history), "one batch per file on both sides"
            out[run] = Compared(
                [collected.get(i, Counter()) for i in range(n)],
                relstate_batches(spark, sink, n),
                spark_counters(spark_query),
                relstate_counters(query),
            )
    return out


def keys_of(batches: Batches) -> list[Counter[Any]]:
    """Each batch's keys, counted."""
    out: list[Counter[Any]] = []
    for rows in batches:
        keys: Counter[Any] = Counter()
        for row, n in rows.items():
            keys[row[0]] += n
        out.append(keys)
    return out


def split(batches: Batches) -> tuple[Batches, Batches]:
    """Each batch's rows of the keys with one event time in it (below 100,
    or null), and of the keys with several."""
    plain = [Counter({r: n for r, n in rows.items() if not _spread(r)}) for rows in batches]
    spread = [Counter({r: n for r, n in rows.items() if _spread(r)}) for rows in batches]
    return plain, spread


def _spread(row: tuple[Any, ...]) -> bool:
    return row[0] is not None and row[0] >= 100


class TestAgainstSpark:
    @pytest.mark.parametrize(("mode", "seed", "spread"), RUNS)
    def test_same_rows_per_batch_as_spark(
        self, compared: dict[Any, Compared], mode: str, seed: int, spread: bool
    ) -> None:
        """Every batch outputs the same rows as Spark's native operator, and the
        rows dropped as late and as duplicates add up to Spark's counts; for
        dropDuplicates with and without the event time in the key, and for
        dropDuplicatesWithinWatermark; a null key is a key as in Spark. Keys
        with rows at several event times in one batch are left to the next
        test."""
        run = compared[(mode, seed, spread)]
        assert split(run.got)[0] == split(run.expected)[0]
        assert any(None in keys for keys in keys_of(run.got)), "the null key must come out"
        assert run.counts == run.spark_counts
        late, duplicates = run.counts
        assert late > 0 and duplicates > 0, "the input must have late rows and duplicates"

    @pytest.mark.parametrize(("mode", "seed", "spread"), [r for r in RUNS if r[2]])
    def test_several_times_per_key_in_a_batch(
        self, compared: dict[Any, Compared], mode: str, seed: int, spread: bool
    ) -> None:
        """With rows of one key at several event times in a batch, which row
        is kept depends on their order (in Spark too); the keys out per batch
        are Spark's (the counts are, by the test above)."""
        run = compared[(mode, seed, spread)]
        got, expected = split(run.got)[1], split(run.expected)[1]
        assert keys_of(got) == keys_of(expected)
        assert len({k for batch in keys_of(got) for k in batch}) == 10, "each batch's 2 keys"
