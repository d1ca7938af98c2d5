"""AppendJoin's rules, case by case, through the record-at-a-time harness."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from operators import InputError, RowKind
from operators.join import AppendJoin, TimeRange, TimeWindows
from operators.testing import OperatorHarness

LEFT = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("v", pa.int64())])
RIGHT = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("w", pa.int64())])
#: right.ts BETWEEN left.ts - 1 s AND left.ts + 2 s: lopsided, so that a
#: swapped bound shows.
RANGE = TimeRange(before_ms=1_000, after_ms=2_000)
INS = RowKind.INSERT


def join(join_type: str = "inner", time: Any = RANGE, **kw: Any) -> AppendJoin:
    return AppendJoin(
        LEFT,
        RIGHT,
        ["k"],
        ["k"],
        "ts",
        "ts",
        time,
        join_type,
        left_prefix="l_",
        right_prefix="r_",
        **kw,
    )


def rows(emitted: list[tuple[RowKind, tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    assert all(kind is INS for kind, _ in emitted)
    return [row for _, row in emitted]


def batch(h: OperatorHarness, wm: int | None, left=(), right=()) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    """One micro-batch as the runner runs it: the batch's watermark, the left
    rows, the right rows, the commit (where eviction happens)."""
    start = len(h.output)
    if wm is not None:
        h.advance_watermark(wm)
    if left:
        h.process_rows(list(left), side=0)
    if right:
        h.process_rows(list(right), side=1)
    h.commit()
    return rows(h.output[start:])


class TestAppendJoinMatching:
    def test_match_within_range_bounds_included(self) -> None:
        """A right row matches a left one at exactly left.ts - before and at
        exactly left.ts + after."""
        with OperatorHarness(join()) as h:
            h.process_element(("a", 10_000, 1), side=0)
            assert rows(h.process_element(("a", 9_000, 7), side=1)) == [
                ("a", 10_000, 1, "a", 9_000, 7)
            ]
            assert rows(h.process_element(("a", 12_000, 8), side=1)) == [
                ("a", 10_000, 1, "a", 12_000, 8)
            ]

    def test_no_match_outside_range(self) -> None:
        """A right row a millisecond outside the range, or of another key,
        matches nothing."""
        with OperatorHarness(join()) as h:
            h.process_element(("a", 10_000, 1), side=0)
            assert h.process_element(("a", 8_999, 7), side=1) == []
            assert h.process_element(("a", 12_001, 8), side=1) == []
            assert h.process_element(("b", 10_000, 9), side=1) == []

    def test_either_side_may_come_first(self) -> None:
        """A left row that arrives after a right one finds it in state."""
        with OperatorHarness(join()) as h:
            assert h.process_element(("a", 12_000, 8), side=1) == []
            assert rows(h.process_element(("a", 10_000, 1), side=0)) == [
                ("a", 10_000, 1, "a", 12_000, 8)
            ]

    def test_multiple_matches_and_duplicates(self) -> None:
        """A row meets every stored row in range, identical duplicates
        included, one output row each."""
        with OperatorHarness(join()) as h:
            h.process_rows([("a", 9_500, 7), ("a", 11_000, 8), ("a", 11_000, 8)], side=1)
            assert rows(h.process_element(("a", 10_000, 1), side=0)) == [
                ("a", 10_000, 1, "a", 9_500, 7),
                ("a", 10_000, 1, "a", 11_000, 8),
                ("a", 10_000, 1, "a", 11_000, 8),
            ]

    def test_extra_condition(self) -> None:
        """The extra condition filters pairs after the key and time match."""
        with OperatorHarness(join(condition=lambda left, right: left[2] < right[2])) as h:
            h.process_rows([("a", 10_000, 5)], side=0)
            assert h.process_element(("a", 10_000, 4), side=1) == []
            assert rows(h.process_element(("a", 10_000, 6), side=1)) == [
                ("a", 10_000, 5, "a", 10_000, 6)
            ]

    def test_null_keys_never_match(self) -> None:
        """A null join key meets nothing, not even another null (SQL)."""
        with OperatorHarness(join()) as h:
            h.process_element((None, 10_000, 1), side=0)
            assert h.process_element((None, 10_000, 7), side=1) == []

    def test_timestamp_event_times(self) -> None:
        """Timestamp columns work as event times; the range is in ms."""
        ts = pa.timestamp("us", tz="UTC")
        left = pa.schema([("k", pa.string()), ("t", ts)])
        right = pa.schema([("k2", pa.string()), ("t2", ts)])
        op = AppendJoin(left, right, ["k"], ["k2"], "t", "t2", TimeRange(0, 1))
        t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        with OperatorHarness(op) as h:
            h.process_element(("a", t0), side=0)
            near = t0 + dt.timedelta(microseconds=1_000)
            far = t0 + dt.timedelta(microseconds=1_001)
            assert h.process_element(("a", far), side=1) == []
            assert rows(h.process_element(("a", near), side=1)) == [("a", t0, "a", near)]


class TestAppendJoinEviction:
    def test_left_row_evicted_when_no_right_row_can_reach_it(self) -> None:
        """A left row at t stays while the watermark is at most t + after and
        is gone at t + after + 1 ms (Spark's state watermark wm - after - 1 ms:
        one millisecond later than needed, as Spark)."""
        with OperatorHarness(join()) as h:
            batch(h, None, left=[("a", 10_000, 1)])
            counts = [
                h.table("left_rows").row_count
                for wm in (11_000, 12_000, 12_001)
                if batch(h, wm) == []
            ]
            assert counts == [1, 1, 0]
            assert h.last_metrics["left.numRowsEvictedByWatermark"] == 1

    def test_right_row_evicted_by_the_other_bound(self) -> None:
        """A right row at t is evicted once wm - before - 1 ms reaches t."""
        with OperatorHarness(join()) as h:
            batch(h, None, right=[("a", 10_000, 7)])
            counts = [
                h.table("right_rows").row_count for wm in (11_000, 11_001) if batch(h, wm) == []
            ]
            assert counts == [1, 0]

    def test_late_rows_dropped_by_previous_watermark(self) -> None:
        """Late is at or below the previous batch's watermark: such a row is
        dropped (even on an outer side); a row above it but below this batch's
        watermark still joins (Spark's watermark for late events)."""
        with OperatorHarness(join("left")) as h:
            batch(h, None, right=[("a", 20_000, 7)])
            batch(h, 19_000)
            out = batch(h, 30_000, left=[("a", 19_000, 1), ("a", 19_001, 2)])
            assert out == [("a", 19_001, 2, "a", 20_000, 7)]
            assert h.last_metrics["left.numRowsDroppedByWatermark"] == 1

    @pytest.mark.parametrize(("join_type", "read"), [("inner", 0), ("left", 4)])
    def test_eviction_reads_only_what_it_evicts(self, join_type: str, read: int) -> None:
        """Eviction reads no row of an inner side (a range delete below the
        state watermark) and only the evicted rows of an outer side (to pad
        the unmatched), never the rest of the state."""
        with OperatorHarness(join(join_type)) as h:
            batch(h, None, left=[("a", t, 1) for t in range(10_000, 60_000, 1_000)])
            rows = h.table("left_rows")
            seen: list[int] = []
            scan_batch = rows.scan_batch

            def counting(*args: Any, **kw: Any) -> Any:
                found = scan_batch(*args, **kw)
                seen.append(found.num_rows)
                return found

            rows.scan_batch = counting  # type: ignore[method-assign]
            batch(h, 15_002)
            assert sum(seen) == read
            assert h.last_metrics["left.numRowsEvictedByWatermark"] == 4
            assert rows.row_count == 46

    def test_windows_match_and_evict_per_window(self) -> None:
        """With equal windows, rows of one window match, rows of the next do
        not, and a window is evicted once the watermark reaches its end."""
        with OperatorHarness(join(time=TimeWindows(10_000))) as h:
            out = batch(
                h, None, left=[("a", 10_500, 1)], right=[("a", 19_999, 7), ("a", 20_000, 8)]
            )
            assert out == [("a", 10_500, 1, "a", 19_999, 7)]
            batch(h, 19_999)
            assert h.table("left_rows").row_count == 1
            batch(h, 20_000)
            assert h.table("left_rows").row_count == 0
            assert h.table("right_rows").row_count == 1

    def test_windows_late_by_window_end(self) -> None:
        """With windows a row is late only once its window ends at or below the
        previous watermark (Spark's window join, whose event-time column is
        the window): a row below the watermark in an open window still joins."""
        with OperatorHarness(join(time=TimeWindows(10_000))) as h:
            batch(h, None, right=[("a", 25_000, 7)])
            batch(h, 22_000)
            out = batch(h, 22_000, left=[("a", 21_000, 1), ("a", 9_000, 2)])
            assert out == [("a", 21_000, 1, "a", 25_000, 7)]
            assert h.last_metrics["left.numRowsDroppedByWatermark"] == 1


class TestAppendJoinOuter:
    def test_unmatched_left_row_padded_once_at_eviction(self) -> None:
        """Left join: an unmatched left row comes out null-padded in the batch
        that evicts it, and never again."""
        with OperatorHarness(join("left")) as h:
            assert batch(h, None, left=[("a", 10_000, 1)]) == []
            assert batch(h, 12_000) == []
            assert batch(h, 12_001) == [("a", 10_000, 1, None, None, None)]
            assert batch(h, 50_000) == []
            assert h.last_metrics["left.numTotalStateRows"] == 0

    def test_matched_row_never_padded(self) -> None:
        """A row that matched, in its own batch or later, is evicted silently."""
        with OperatorHarness(join("left")) as h:
            out = batch(
                h, None, left=[("a", 10_000, 1), ("a", 30_000, 2)], right=[("a", 10_500, 7)]
            )
            assert out == [("a", 10_000, 1, "a", 10_500, 7)]
            assert batch(h, 25_000, right=[("a", 31_000, 8)]) == [("a", 30_000, 2, "a", 31_000, 8)]
            assert batch(h, 90_000) == []

    def test_right_and_full_outer(self) -> None:
        """Right join pads right rows, full join pads both, each at eviction."""
        left, right = [("a", 10_000, 1), ("b", 10_000, 2)], [("a", 10_000, 7), ("c", 10_000, 9)]
        with OperatorHarness(join("right")) as h:
            batch(h, None, left=left, right=right)
            assert batch(h, 20_000) == [(None, None, None, "c", 10_000, 9)]
        with OperatorHarness(join("full")) as h:
            batch(h, None, left=left, right=right)
            assert sorted(batch(h, 20_000), key=str) == sorted(
                [("b", 10_000, 2, None, None, None), (None, None, None, "c", 10_000, 9)], key=str
            )

    def test_condition_decides_the_matched_flag(self) -> None:
        """A pair that fails the extra condition is no match: the row is padded."""
        with OperatorHarness(join("left", condition=lambda left, right: left[2] < right[2])) as h:
            assert batch(h, None, left=[("a", 10_000, 5)], right=[("a", 10_000, 4)]) == []
            assert batch(h, 20_000) == [("a", 10_000, 5, None, None, None)]

    def test_null_key_row_padded_on_outer_side(self) -> None:
        """An outer row with a null key is kept, unmatched, and padded at eviction."""
        with OperatorHarness(join("left")) as h:
            batch(h, None, left=[(None, 10_000, 1)], right=[(None, 10_000, 7)])
            assert h.table("right_rows").row_count == 0
            assert batch(h, 20_000) == [(None, 10_000, 1, None, None, None)]

    def test_full_join_pads_null_keys_spark_would_match(self) -> None:
        """docs/operators/join.md, "Where it differs from Spark": in a full
        join a null-key row on each side meets nothing and each is padded at
        eviction; Spark's state matches the two (null equals null there) and
        emits one joined row at once."""
        with OperatorHarness(join("full")) as h:
            assert batch(h, None, left=[(None, 10_000, 1)], right=[(None, 10_500, 7)]) == []
            assert batch(h, 20_000) == [
                (None, 10_000, 1, None, None, None),
                (None, None, None, None, 10_500, 7),
            ]


class TestAppendJoinFloatKeys:
    @pytest.mark.parametrize("seek_rows", [0, 10**9], ids=["scan-per-run", "one-scan"])
    def test_zero_and_nan_keys_meet_as_the_key_encoding_has_them(
        self, monkeypatch: pytest.MonkeyPatch, seek_rows: int
    ) -> None:
        """0.0 meets -0.0 and NaN meets NaN (one key in state, and in Spark's
        join), on both ways of reading the other side, each pair once."""
        from operators.join import _append

        monkeypatch.setattr(_append, "_SEEK_ROWS", seek_rows)
        schema = pa.schema([("k", pa.float64()), ("ts", pa.int64()), ("v", pa.int64())])
        op = AppendJoin(schema, schema, ["k"], ["k"], "ts", "ts", RANGE, left_prefix="l_")
        nan = float("nan")
        with OperatorHarness(op) as h:
            h.process_rows([(0.0, 10_000, 1), (-0.0, 10_000, 2), (nan, 10_000, 5)], side=0)
            out = rows(
                h.process_rows([(0.0, 10_000, 3), (-0.0, 10_000, 4), (nan, 10_000, 6)], side=1)
            )
        pairs = sorted((r[2], r[5]) for r in out)
        assert pairs == [(1, 3), (1, 4), (2, 3), (2, 4), (5, 6)]


class TestAppendJoinWatermarkRows:
    def test_null_keys_count_only_on_outer_sides(self) -> None:
        """A null-key row does not count towards an inner side's watermark
        (Spark filters it out before), but does on an outer side, which
        keeps it to pad."""
        batch = pa.record_batch(
            {"k": ["a", None, "b"], "ts": [1, 2, 3], "v": [1, 2, 3]}, schema=LEFT
        )
        assert join().watermark_rows(batch, 0).to_pylist() == [True, False, True]
        assert join("left").watermark_rows(batch, 0) is None
        right = batch.rename_columns(RIGHT.names)
        assert join("left").watermark_rows(right, 1).to_pylist() == [True, False, True]
        assert join().watermark_rows(batch.slice(0, 1), 0) is None


class TestAppendJoinShape:
    def test_output_columns_and_nullability(self) -> None:
        """Output is left columns then right, prefixed; a padded side is nullable."""
        left_nn = pa.schema([pa.field("k", pa.string(), nullable=False), ("ts", pa.int64())])
        op = AppendJoin(
            left_nn,
            RIGHT,
            ["k"],
            ["k"],
            "ts",
            "ts",
            RANGE,
            "right",
            left_prefix="l_",
            right_prefix="r_",
        )
        assert op.output.names == ["l_k", "l_ts", "r_k", "r_ts", "r_w"]
        assert op.output.field("l_k").nullable
        inner = AppendJoin(left_nn, RIGHT, ["k"], ["k"], "ts", "ts", RANGE, left_prefix="l_")
        assert not inner.output.field("l_k").nullable

    def test_clash_after_prefixing_raises(self) -> None:
        """Two output columns with one name are an InputError."""
        with pytest.raises(InputError, match="left_prefix or right_prefix"):
            AppendJoin(LEFT, RIGHT, ["k"], ["k"], "ts", "ts", RANGE)
        with pytest.raises(InputError, match="'x_k'"):
            AppendJoin(
                LEFT, RIGHT, ["k"], ["k"], "ts", "ts", RANGE, left_prefix="x_", right_prefix="x_"
            )

    def test_bad_arguments_raise(self) -> None:
        """Unknown join types, missing or mistyped keys, empty ranges are refused."""
        with pytest.raises(InputError, match="join type"):
            join("semi")
        with pytest.raises(InputError, match="not a column"):
            AppendJoin(LEFT, RIGHT, ["x"], ["k"], "ts", "ts", RANGE, left_prefix="l_")
        other = pa.schema([("k", pa.int64()), ("ts", pa.int64())])
        with pytest.raises(InputError, match="different types"):
            AppendJoin(LEFT, other, ["k"], ["k"], "ts", "ts", RANGE, left_prefix="l_")
        with pytest.raises(InputError, match="empty"):
            TimeRange(before_ms=-2, after_ms=1)

    def test_join_type_spellings(self) -> None:
        """Spark's spellings of the join types are understood."""
        assert join("left_outer").join_type == "left"
        assert join("fullOuter").join_type == "full"
        assert join("outer").join_type == "full"

    def test_retractions_rejected(self) -> None:
        """A changelog row other than +I is an InputError."""
        with OperatorHarness(join()) as h, pytest.raises(InputError, match="append-only"):
            h.process_rows([("a", 1, 1)], kinds=["-D"], side=0)

    def test_null_event_time_rejected(self) -> None:
        """A row without an event time is an InputError."""
        with OperatorHarness(join()) as h, pytest.raises(InputError, match="holds nulls"):
            h.process_rows([("a", None, 1)], side=0)

    def test_restore_and_rerun_same_output(self) -> None:
        """On RocksDB, a batch run again from the committed state gives the
        same output and state."""
        with OperatorHarness(join("full"), backend="rocksdb") as h:
            batch(h, None, left=[("a", 10_000, 1), ("b", 10_000, 2)])
            first = batch(h, 15_000, right=[("a", 10_500, 7), ("c", 16_000, 9)])
            h.restore(0)
            again = batch(h, 15_000, right=[("a", 10_500, 7), ("c", 16_000, 9)])
            assert sorted(again, key=str) == sorted(first, key=str)
            assert h.last_metrics["left.numTotalStateRows"] == 0
            assert h.last_metrics["right.numTotalStateRows"] == 1


class TestAppendJoinDocExample:
    def test_timeline_of_the_docs(self) -> None:
        """The left-join timeline of docs/operators/join.md, "Append mode", batch by batch."""
        with OperatorHarness(join("left")) as h:
            out = batch(
                h, None, left=[("a", 10_000, 1), ("b", 10_000, 2)], right=[("a", 11_000, 7)]
            )
            assert out == [("a", 10_000, 1, "a", 11_000, 7)]
            assert batch(h, 11_000, left=[("c", 11_500, 3)], right=[("b", 12_500, 8)]) == []
            out = batch(h, 12_001, right=[("b", 10_500, 9), ("c", 12_000, 10)])
            assert out == [("c", 11_500, 3, "c", 12_000, 10), ("b", 10_000, 2, None, None, None)]
            assert h.last_metrics["right.numRowsDroppedByWatermark"] == 1
            assert h.last_metrics["left.numRowsEvictedByWatermark"] == 2
            assert h.last_metrics["right.numRowsEvictedByWatermark"] == 1
            assert h.last_metrics["evictionTimeMs"] >= 0
            assert h.last_metrics["left.numTotalStateRows"] == 1
            assert h.last_metrics["right.numTotalStateRows"] == 2


class TestAppendJoinMetrics:
    def test_every_counter(self) -> None:
        """docs/operators/join.md, append mode's "Metrics": every counter of a
        batch that drops late rows, matches, evicts and pads, per side as
        ``<side>.<Spark's name>`` (the changelog join's scheme), and nothing
        else; the floors table is in no state-row count."""
        with OperatorHarness(join("full")) as h:
            batch(h, None, left=[("a", 10_000, 1), ("b", 10_000, 2)], right=[("a", 11_000, 7)])
            m = h.last_metrics
            assert (m["left.numUpdatedStateRows"], m["right.numUpdatedStateRows"]) == (3, 1)
            batch(h, 11_000, left=[("c", 11_500, 3)], right=[("b", 12_500, 8)])
            out = batch(
                h, 12_001, left=[("d", 11_000, 4)], right=[("b", 10_500, 9), ("c", 12_000, 10)]
            )
            assert out == [("c", 11_500, 3, "c", 12_000, 10), ("b", 10_000, 2, None, None, None)]
            m = h.last_metrics
            assert m["evictionTimeMs"] >= 0
            assert {k: v for k, v in m.items() if v and not k.endswith("TimeMs")} == {
                "numOutputRows": 2,
                "numMatchedRows": 1,
                "numNullPaddedRows": 1,  # (b, 10 s) never matched; (a, 11 s) did
                "numTotalStateRows": 3,
                "numUpdatedStateRows": 2,
                "numRemovedStateRows": 3,
                "left.numRowsDroppedByWatermark": 1,
                "left.numUpdatedStateRows": 1,  # (c, 11.5 s) flagged as matched
                "left.numRowsEvictedByWatermark": 2,
                "left.numRemovedStateRows": 2,
                "left.numTotalStateRows": 1,
                "right.numRowsDroppedByWatermark": 1,
                "right.numUpdatedStateRows": 1,  # (c, 12 s) stored
                "right.numRowsEvictedByWatermark": 1,
                "right.numRemovedStateRows": 1,
                "right.numTotalStateRows": 2,
            }
