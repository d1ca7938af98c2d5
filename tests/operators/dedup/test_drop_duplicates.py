"""Spark's dropDuplicates and dropDuplicatesWithinWatermark through the
harness: exact cases of Spark's rules, and random inputs against a model that
follows Spark's operators step by step (full scans included)."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import InputError, ParquetSink, RowKind, Watermark, run_operator
from operators.dedup import DropDuplicates, DropDuplicatesWithinWatermark
from operators.testing import OperatorHarness

EPOCH = dt.datetime(2026, 1, 1)
BASE_MS = int(EPOCH.replace(tzinfo=dt.UTC).timestamp() * 1000)
EVENTS = pa.schema(
    [
        pa.field("k", pa.int64()),
        pa.field("ts", pa.timestamp("us"), nullable=False),
        pa.field("v", pa.int64()),
    ]
)


def at(ms: int) -> dt.datetime:
    """The event time ``ms`` milliseconds after the test epoch."""
    return EPOCH + dt.timedelta(milliseconds=ms)


def row(k: int, ms: int, v: int = 0) -> tuple[Any, ...]:
    return (k, at(ms), v)


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each test runs on the in-memory backend and on RocksDB."""
    return str(request.param)


def run_batch(
    h: OperatorHarness, rows: list[tuple[Any, ...]], watermark_ms: int | None
) -> list[tuple[Any, ...]]:
    """One batch as the runner runs it: the rows (late against the previous
    watermark), then the batch's watermark (eviction); returns the rows out."""
    out = h.process_rows(rows)
    if watermark_ms is not None:
        h.advance_watermark(BASE_MS + watermark_ms)
    h.commit()
    assert all(kind is RowKind.INSERT for kind, _ in out)
    return [r for _, r in out]


def counts(h: OperatorHarness) -> dict[str, int]:
    """The last batch's output, state-write, duplicate and state-row counts."""
    m = h.last_metrics
    return {
        "out": m["numOutputRows"],
        "written": m["numUpdatedStateRows"],
        "duplicates": m["numDroppedDuplicateRows"],
        "total": m["numTotalStateRows"],
    }


class TestDropDuplicates:
    def test_first_row_per_key_without_watermark(self, backend: str) -> None:
        """Without an event time the first row of each key is emitted (and
        stored: one state row written per output row), later ones counted as
        duplicates, and no key is ever evicted."""
        with OperatorHarness(DropDuplicates(EVENTS, ["k"]), backend=backend) as h:
            out = run_batch(h, [row(1, 0, 1), row(2, 0, 2), row(1, 5, 3)], None)
            assert out == [row(1, 0, 1), row(2, 0, 2)]
            assert counts(h) == {"out": 2, "written": 2, "duplicates": 1, "total": 2}
            assert run_batch(h, [row(2, 9, 4), row(3, 9, 5)], None) == [row(3, 9, 5)]
            assert counts(h) == {"out": 1, "written": 1, "duplicates": 1, "total": 3}

    def test_late_rows_are_at_or_below_previous_watermark(self, backend: str) -> None:
        """A row is late when its event time is <= the previous batch's
        watermark; one just above it is not, even below the current one."""
        op = DropDuplicates(EVENTS, ["k"], event_time="ts")
        with OperatorHarness(op, backend=backend) as h:
            run_batch(h, [row(1, 100)], 100)
            out = run_batch(h, [row(2, 100), row(3, 101), row(4, 150)], 200)
            assert out == [row(3, 101), row(4, 150)]
            assert h.last_metrics["numRowsDroppedByWatermark"] == 1

    def test_event_time_in_key_evicts_at_or_below_watermark(self, backend: str) -> None:
        """With the event time in the key, a key leaves state once its time is
        <= the watermark; without it in the key, state keeps every key."""
        evicting = DropDuplicates(EVENTS, ["k", "ts"], event_time="ts")
        with OperatorHarness(evicting, backend=backend) as h:
            run_batch(h, [row(1, 100), row(1, 100), row(2, 101), row(3, 300)], None)
            assert h.last_metrics["numTotalStateRows"] == 3
            run_batch(h, [], 101)
            assert h.last_metrics["numTotalStateRows"] == 1
            assert h.last_metrics["numRemovedStateRows"] == 2
            assert [r[1:] for r in h.table("seen").scan()] == [(3,)]
        keeping = DropDuplicates(EVENTS, ["k"], event_time="ts")
        with OperatorHarness(keeping, backend=backend) as h:
            run_batch(h, [row(1, 100), row(2, 101), row(3, 300)], 101)
            assert h.last_metrics["numTotalStateRows"] == 3

    def test_same_key_other_time_is_another_key(self, backend: str) -> None:
        """With the event time in the key, equal columns at another time are
        another key."""
        op = DropDuplicates(EVENTS, ["k", "ts"], event_time="ts")
        with OperatorHarness(op, backend=backend) as h:
            out = run_batch(h, [row(1, 10, 1), row(1, 10, 2), row(1, 11, 3)], None)
            assert out == [row(1, 10, 1), row(1, 11, 3)]

    def test_worked_example_of_the_docs(self, backend: str) -> None:
        """docs/operators/dedup.md's DropDuplicates table: duplicates, a
        duplicate of a key evicted at the end of its batch, a late row."""
        op = DropDuplicates(EVENTS, ["k", "ts"], event_time="ts")
        with OperatorHarness(op, backend=backend) as h:
            assert run_batch(h, [row(1, 100), row(1, 100), row(2, 101)], None) == [
                row(1, 100),
                row(2, 101),
            ]
            assert run_batch(h, [row(3, 100), row(1, 100)], 100) == [row(3, 100)]
            assert h.last_metrics["numTotalStateRows"] == 1
            assert run_batch(h, [row(4, 100), row(5, 150)], 200) == [row(5, 150)]
            assert h.last_metrics["numRowsDroppedByWatermark"] == 1

    @pytest.mark.parametrize("watermark", [True, False])
    def test_worked_example_without_time_in_key(self, backend: str, watermark: bool) -> None:
        """docs/operators/dedup.md's dropDuplicates(k) table: with a
        watermark late rows are dropped and no key is evicted; without one
        nothing is late, and every key stays too."""
        op = DropDuplicates(EVENTS, ["k"], event_time="ts" if watermark else None)
        marks: list[int | None] = [None, 50, 200] if watermark else [None, None, None]
        with OperatorHarness(op, backend=backend) as h:
            b0 = run_batch(h, [row(1, 100), row(2, 150), row(1, 120)], marks[0])
            assert b0 == [row(1, 100), row(2, 150)]
            assert run_batch(h, [row(3, 40), row(1, 300)], marks[1]) == [row(3, 40)]
            out = run_batch(h, [row(4, 50), row(5, 60), row(1, 400)], marks[2])
            assert out == ([row(5, 60)] if watermark else [row(4, 50), row(5, 60)])
            m = h.last_metrics
            assert m.get("numRowsDroppedByWatermark", 0) == (1 if watermark else 0)
            assert m["numDroppedDuplicateRows"] == 1
            assert m["numRemovedStateRows"] == 0
            keys = [r[0] for r in h.table("seen").scan()]
            assert keys == ([1, 2, 3, 5] if watermark else [1, 2, 3, 4, 5])

    def test_changelog_and_null_event_time_are_refused(self) -> None:
        """A retraction, or a row without an event time, is an InputError."""
        with (
            OperatorHarness(DropDuplicates(EVENTS, ["k"], event_time="ts")) as h,
            pytest.raises(InputError, match="insert-only"),
        ):
            h.process_rows([row(1, 0)], [RowKind.DELETE])
        nullable = pa.schema([pa.field("k", pa.int64()), pa.field("ts", pa.timestamp("us"))])
        with (
            OperatorHarness(DropDuplicates(nullable, ["k"], event_time="ts")) as h,
            pytest.raises(InputError, match="nulls"),
        ):
            h.process_rows([(1, None)])
        with pytest.raises(ValueError, match="timestamp"):
            DropDuplicates(EVENTS, ["k"], event_time="v")


class TestFloatKeys:
    def test_zero_and_nan_are_one_key_each(self, backend: str) -> None:
        """-0.0 is a duplicate of 0.0 and every NaN of the first NaN, as the
        key encoding (and Spark's grouping) has them: one row each comes out."""
        schema = pa.schema([("k", pa.float64()), ("v", pa.int64())])
        nan = float("nan")
        with OperatorHarness(DropDuplicates(schema, ["k"]), backend=backend) as h:
            out = h.process_rows([(0.0, 1), (-0.0, 2), (nan, 3), (nan, 4), (1.5, 5)])
            h.commit()
            assert [r[1] for _, r in out] == [1, 3, 5]
            assert h.last_metrics["numDroppedDuplicateRows"] == 2
            assert h.last_metrics["numTotalStateRows"] == 3


class TestDropDuplicatesWithinWatermark:
    def test_key_expires_at_event_time_plus_delay(self, backend: str) -> None:
        """A key's entry lives until the watermark reaches its first row's
        event time + delay (inclusive); then the key is emitted again."""
        op = DropDuplicatesWithinWatermark(EVENTS, ["k"], event_time="ts", delay_ms=50)
        with OperatorHarness(op, backend=backend) as h:
            assert run_batch(h, [row(1, 100, 1), row(1, 120, 2)], 149) == [row(1, 100, 1)]
            # One row per key, as Spark counts: the expiry index is auxiliary.
            assert h.last_metrics["numTotalStateRows"] == 1
            assert h.last_metrics["numUpdatedStateRows"] == 1
            assert run_batch(h, [row(1, 160, 3)], 150) == []
            assert h.last_metrics["numRemovedStateRows"] == 1
            assert h.last_metrics["numTotalStateRows"] == 0
            assert run_batch(h, [row(1, 170, 4)], 150) == [row(1, 170, 4)]
            assert [r[0] for r in h.table("seen").scan()] == [1]

    def test_late_rows_dropped_and_counted(self, backend: str) -> None:
        """Rows at or below the previous watermark are dropped as late, before
        deduplication."""
        op = DropDuplicatesWithinWatermark(EVENTS, ["k"], event_time="ts", delay_ms=10)
        with OperatorHarness(op, backend=backend) as h:
            run_batch(h, [row(1, 100)], 100)
            assert run_batch(h, [row(2, 100), row(2, 101)], 100) == [row(2, 101)]
            assert h.last_metrics["numRowsDroppedByWatermark"] == 1


class TestWatermarkCheck:
    """check_watermarks: the runner's watermark must agree with the operator's
    event time and delay, as Spark takes both from one withWatermark."""

    def test_within_watermark_delay_must_match(self) -> None:
        """DropDuplicatesWithinWatermark refuses a watermark of another delay
        or column, or none; the same column and delay pass."""
        op = DropDuplicatesWithinWatermark(EVENTS, ["k"], event_time="ts", delay_ms=50)
        op.check_watermarks({0: Watermark("ts", 50)})
        with pytest.raises(InputError, match="delay_ms=80"):
            op.check_watermarks({0: Watermark("ts", 80)})
        with pytest.raises(InputError, match="same column"):
            op.check_watermarks({0: Watermark("v", 50)})
        with pytest.raises(InputError, match="no watermark"):
            op.check_watermarks({})

    def test_drop_duplicates_event_time_needs_the_watermark(self) -> None:
        """DropDuplicates with an event time refuses to run without a
        watermark on it (it would never drop late rows nor evict); one
        without an event time refuses a watermark (Spark would drop late
        rows); any delay will do."""
        with_time = DropDuplicates(EVENTS, ["k"], event_time="ts")
        with_time.check_watermarks({0: Watermark("ts", 1)})
        with pytest.raises(InputError, match="no watermark"):
            with_time.check_watermarks({})
        without = DropDuplicates(EVENTS, ["k"])
        without.check_watermarks({})
        with pytest.raises(InputError, match="event_time='ts'"):
            without.check_watermarks({0: Watermark("ts", 100)})

    def test_runner_checks_before_it_reads_the_input(self, tmp_path: Path) -> None:
        """run_operator calls the check first: a mismatch is an InputError
        before the input or the checkpoint is touched."""
        op = DropDuplicatesWithinWatermark(EVENTS, ["k"], event_time="ts", delay_ms=50)
        with pytest.raises(InputError, match="delay_ms=150"):
            run_operator(
                object(),  # type: ignore[arg-type]
                op,
                keys=["k"],
                partitions=2,
                checkpoint=str(tmp_path / "checkpoint"),
                sink=ParquetSink(str(tmp_path / "out")),
                watermarks={0: Watermark("ts", 150)},
            )
        assert not (tmp_path / "checkpoint").exists()


# -- random inputs against a model of Spark's operators ----------------------------------


def spark_model(
    batches: list[list[tuple[Any, ...]]],
    watermarks: list[int | None],
    columns: list[int],
    evict: str,
    delay_us: int,
) -> list[list[tuple[Any, ...]]]:
    """Spark's StreamingDeduplicate(WithinWatermark)Exec literally: filter rows
    <= the previous watermark, keep first rows of unseen keys, then scan all of
    state and remove what the current watermark evicts."""
    state: dict[tuple[Any, ...], int] = {}
    out = []
    previous: int | None = None
    for rows, mark in zip(batches, watermarks, strict=True):
        emitted = []
        for r in rows:
            t = (r[1] - EPOCH) // dt.timedelta(microseconds=1) + BASE_MS * 1000
            if previous is not None and t <= previous * 1000:
                continue
            key = tuple(r[i] for i in columns)
            if key not in state:
                state[key] = t + delay_us if evict == "expiry" else t
                emitted.append(r)
        if mark is not None and evict != "none":
            state = {k: v for k, v in state.items() if not v <= mark * 1000}
        out.append(emitted)
        previous = mark
    return out


def spark_watermarks(batches: list[list[tuple[Any, ...]]], delay: int) -> list[int | None]:
    """Spark's watermark per batch: max event time of earlier batches - delay."""
    marks: list[int | None] = [None]
    seen: int | None = None
    for rows in batches[:-1]:
        if rows:
            latest = max(BASE_MS + (r[1] - EPOCH) // dt.timedelta(milliseconds=1) for r in rows)
            seen = latest if seen is None else max(seen, latest)
        previous = marks[-1]
        mark = None if seen is None else seen - delay
        marks.append(mark if previous is None or mark is None else max(previous, mark))
    return marks


class TestAgainstSparkModel:
    @pytest.mark.parametrize("seed", range(150))
    def test_random_inputs_match_spark_model(self, seed: int) -> None:
        """On random batches with duplicates and late rows, each batch's output of
        all three configurations equals the model of Spark's operators."""
        rng = random.Random(seed)
        delay = rng.choice([0, 20, 50])
        batches, clock = [], 0
        for _ in range(rng.randint(1, 6)):
            clock += rng.randint(0, 60)
            batches.append(
                [
                    row(rng.randint(0, 5), max(0, clock + rng.randint(-80, 30)), rng.randint(0, 9))
                    for _ in range(rng.randint(0, 10))
                ]
            )
        marks = spark_watermarks(batches, delay)
        configs: list[tuple[Any, list[int], str, int]] = [
            (DropDuplicates(EVENTS, ["k"], event_time="ts"), [0], "none", 0),
            (DropDuplicates(EVENTS, ["k", "ts"], event_time="ts"), [0, 1], "time", 0),
            (
                DropDuplicatesWithinWatermark(EVENTS, ["k"], event_time="ts", delay_ms=delay),
                [0],
                "expiry",
                delay * 1000,
            ),
        ]
        for op, columns, evict, delay_us in configs:
            expected = spark_model(batches, marks, columns, evict, delay_us)
            with OperatorHarness(op, consistency="strict") as h:
                got = [
                    run_batch(h, rows, None if m is None else m - BASE_MS)
                    for rows, m in zip(batches, marks, strict=True)
                ]
            assert got == expected, op.name
