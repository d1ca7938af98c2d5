"""The changelog join's batch path (operators/join/_batch.py) against the
record-at-a-time path: the same output, row for row and in order."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import Operator, OperatorContext, RowKind
from operators._api.dirty import InputPolicy
from operators.errors import InputError
from operators.join import HELD_ROWS, JoinType, StreamingJoin, _batch
from operators.testing import OperatorHarness
from tests.operators.join.test_join_differential import run

SIDE = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.int64())])


class RowAtATime(StreamingJoin):
    """The same join, fed record at a time (the operator default)."""

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        Operator.process_batch(self, ctx, batch, side)


def changes(seed: int, n: int) -> list[tuple[int, list[tuple[Any, ...]], list[RowKind]]]:
    """Runs of one side's inserts and retractions of live rows, few keys."""
    rnd = random.Random(seed)
    live: list[list[tuple[Any, ...]]] = [[], []]
    runs = []
    for i in range(n):
        side = rnd.randrange(2)
        rows, kinds = [], []
        for j in range(rnd.randint(1, 12)):
            if live[side] and rnd.random() < 0.3:
                row = live[side].pop(rnd.randrange(len(live[side])))
                rows.append(row)
                kinds.append(rnd.choice([RowKind.DELETE, RowKind.UPDATE_BEFORE]))
            else:
                row = (i * 100 + j, rnd.randrange(4), rnd.randrange(3))
                live[side].append(row)
                rows.append(row)
                kinds.append(rnd.choice([RowKind.INSERT, RowKind.UPDATE_AFTER]))
        runs.append((side, rows, kinds))
    return runs


def outputs(join: StreamingJoin, seed: int, path: Path) -> list[Any]:
    """Every emitted row and the final state of both sides, in order."""
    with OperatorHarness(join, backend="rocksdb", path=path) as h:
        for b, (side, rows, kinds) in enumerate(changes(seed, 30)):
            h.process_rows(rows, kinds, side)
            if b % 7 == 6:
                h.commit()
        h.commit()
        return [h.output, list(h.table("left").scan()), list(h.table("right").scan())]


def make(
    cls: type[StreamingJoin],
    join_type: JoinType,
    unique: bool,
    held_rows: int = HELD_ROWS,
) -> StreamingJoin:
    key = ["id"] if unique else None
    return cls(
        join_type,
        SIDE,
        SIDE,
        ["k"],
        ["k"],
        key,
        key,
        right_prefix="r_",
        name="j",
        held_rows=held_rows,
    )


class TestBatchPath:
    @pytest.mark.parametrize("join_type", list(JoinType))
    @pytest.mark.parametrize("unique", [True, False])
    @pytest.mark.parametrize("whole", [True, False])
    def test_same_rows_in_the_same_order(
        self, join_type: JoinType, unique: bool, whole: bool, tmp_path: Path
    ) -> None:
        """Batch path and record at a time emit the same rows in the same
        order and leave the same state, whether the batch path reads whole
        tables or, with ``held_rows=0``, reads per key."""
        held_rows = HELD_ROWS if whole else 0
        for seed in range(5):
            join = make(StreamingJoin, join_type, unique, held_rows)
            batched = outputs(join, seed, tmp_path / f"b{seed}")
            single = outputs(make(RowAtATime, join_type, unique), seed, tmp_path / f"r{seed}")
            assert batched == single, f"seed {seed}"

    def test_held_rows_bounds_the_tables_read_whole(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A side's table is read whole only while it holds at most
        ``held_rows`` rows: with ``held_rows=0`` only while it is empty, with
        the default also once it has rows."""
        read_at: list[int] = []
        load_all = _batch.HeldSide.load_all

        def counted(side: _batch.HeldSide, ctx: OperatorContext) -> None:
            read_at.append(side.table.row_count)
            load_all(side, ctx)

        monkeypatch.setattr(_batch.HeldSide, "load_all", counted)
        outputs(make(StreamingJoin, JoinType.FULL, True, held_rows=0), 1, tmp_path / "none")
        assert read_at and set(read_at) == {0}
        read_at.clear()
        outputs(make(StreamingJoin, JoinType.FULL, True), 1, tmp_path / "default")
        assert max(read_at) > 0

    @pytest.mark.parametrize("held_rows", [-1, True, 2.5, "1000"])
    def test_held_rows_must_be_a_count(self, held_rows: Any) -> None:
        """``held_rows`` that is not a whole number >= 0 is refused when the
        join is made."""
        with pytest.raises(InputError, match="held_rows"):
            make(StreamingJoin, JoinType.INNER, True, held_rows=held_rows)

    @pytest.mark.parametrize("seed", range(4))
    def test_differential_reading_per_key(
        self, seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With whole-table reads off, the differential runs (random joins,
        restores) still equal SQLite's join after every batch."""
        monkeypatch.setattr(_batch, "SEEK_ROWS", 0)
        for s in range(seed * 25, (seed + 1) * 25):
            run(s, "memory", tmp_path / str(s), None)


def dirty_changes(seed: int) -> list[tuple[int, list[tuple[Any, ...]], list[RowKind]]]:
    """Runs whose rows the steps over a whole batch cannot all take:
    retractions of rows never stored, inserts of a stored id with new values
    (an upsert with a unique key, a second row without), the same row
    twice, a row inserted and retracted within one run."""
    rnd = random.Random(seed)
    live: list[list[tuple[Any, ...]]] = [[], []]
    runs = []
    for i in range(40):
        side = rnd.randrange(2)
        rows, kinds = [], []
        for j in range(rnd.randint(1, 10)):
            pick = rnd.random()
            if live[side] and pick < 0.25:
                rows.append(live[side].pop(rnd.randrange(len(live[side]))))
                kinds.append(RowKind.DELETE)
            elif pick < 0.35:  # never stored
                rows.append((-1 - i, rnd.randrange(3), rnd.randrange(3)))
                kinds.append(RowKind.DELETE)
            else:
                if live[side] and pick < 0.5:  # a stored id again, or the very row
                    old = rnd.choice(live[side])
                    row = old if rnd.random() < 0.5 else (old[0], old[1], rnd.randrange(3))
                else:
                    row = (i * 100 + j, rnd.randrange(3), rnd.randrange(3))
                live[side].append(row)
                rows.append(row)
                kinds.append(RowKind.INSERT)
        runs.append((side, rows, kinds))
    return runs


class TestWholeBatchSteps:
    """operators/join/_bulk.py: an input batch's rules as steps over it."""

    @pytest.mark.parametrize("join_type", list(JoinType))
    @pytest.mark.parametrize("unique", [True, False])
    def test_dirty_runs_as_record_at_a_time(
        self, join_type: JoinType, unique: bool, tmp_path: Path
    ) -> None:
        """Under unknown_retractions='apply', runs that mix clean rows with
        retractions of unknown rows, upserts, repeated rows and identities
        twice in a run emit what record at a time emits, in order, and leave
        the same state and state metrics (associations driven below zero by
        applied unknown retractions included)."""
        for seed in range(6):
            got = []
            for cls in (StreamingJoin, RowAtATime):
                with OperatorHarness(
                    make(cls, join_type, unique), backend="memory", path=tmp_path / f"{cls}{seed}"
                ) as h:
                    h.policy = InputPolicy.of("apply", None, "j")
                    metrics = []
                    for b, (side, rows, kinds) in enumerate(dirty_changes(seed)):
                        h.process_rows(rows, kinds, side)
                        if b % 5 == 4:
                            h.commit()
                            metrics.append(h.last_metrics)
                    h.commit()
                    metrics.append(h.last_metrics)
                    state = [list(h.table(t).scan()) for t in ("left", "right")]
                    got.append([h.output, state, _state_metrics(metrics)])
            assert got[0] == got[1], f"seed {seed}"

    @pytest.mark.parametrize("join_type", [JoinType.INNER, JoinType.FULL])
    def test_clean_runs_take_the_steps_and_the_rest_goes_by_rule(
        self, join_type: JoinType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run of new rows and retractions of stored ones takes no row
        through the rules one by one; in a run with one upsert, that row
        alone does; a run that repeats an identity takes none either (it is
        cut into spans)."""
        by_rule: list[tuple[Any, ...]] = []
        rules = StreamingJoin._rows

        def counted(self: StreamingJoin, ctx: Any, states: Any, rows: Any, *rest: Any) -> None:
            by_rule.extend(rows)
            rules(self, ctx, states, rows, *rest)

        monkeypatch.setattr(StreamingJoin, "_rows", counted)
        join = make(StreamingJoin, join_type, True)
        with OperatorHarness(join, backend="memory", path=tmp_path) as h:
            h.process_rows([(i, i % 3, 0) for i in range(10)], side=0)
            h.process_rows([(100 + i, i % 4, 0) for i in range(10)], side=1)
            h.process_rows([(2, 2, 0), (20, 1, 0)], [RowKind.DELETE, RowKind.INSERT], side=0)
            assert by_rule == []
            h.process_rows([(21, 1, 0), (3, 0, 5), (22, 2, 0)], side=0)  # (3, ...) upserts
            assert by_rule == [(3, 0, 5)]
            h.process_rows([(30, 1, 0), (30, 1, 0)], [RowKind.INSERT, RowKind.DELETE], side=1)
            assert by_rule == [(3, 0, 5)]


def _state_metrics(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state rows' counters of each commit's metrics."""
    return [{k: v for k, v in m.items() if "State" in k or "Unknown" in k} for m in history]


NULLABLE = pa.schema([("id", pa.string()), ("k", pa.int64()), ("v", pa.int64())])


def nullable_changes(seed: int) -> list[tuple[int, list[tuple[Any, ...]], list[RowKind]]]:
    """Inserts and deletes of rows whose string ids, keys and values may be
    null (the held rows sort a join key's rows by their values where the key
    bytes allow, else by the bytes)."""
    rnd = random.Random(seed)
    live: list[list[tuple[Any, ...]]] = [[], []]
    runs = []
    for i in range(30):
        side = rnd.randrange(2)
        rows, kinds = [], []
        for j in range(rnd.randint(1, 12)):
            if live[side] and rnd.random() < 0.3:
                rows.append(live[side].pop(rnd.randrange(len(live[side]))))
                kinds.append(RowKind.DELETE)
            else:
                ids = [None, "é", "z", "a", "ab", str(i * 100 + j)]
                row = (rnd.choice(ids), rnd.choice([None, 0, 1, 2]), rnd.choice([None, 1, 2]))
                live[side].append(row)
                rows.append(row)
                kinds.append(RowKind.INSERT)
        runs.append((side, rows, kinds))
    return runs


class TestBatchPathOrder:
    @pytest.mark.parametrize("join_type", [JoinType.INNER, JoinType.FULL])
    @pytest.mark.parametrize("null_safe", [True, False])
    def test_nulls_and_strings_in_the_same_order(
        self, join_type: JoinType, null_safe: bool, tmp_path: Path
    ) -> None:
        """With string ids and null keys and values (no unique key), the batch
        path emits the rows record at a time emits, in the same order."""
        for seed in range(4):
            got = []
            for cls in (StreamingJoin, RowAtATime):
                join = cls(
                    join_type,
                    NULLABLE,
                    NULLABLE,
                    ["k"],
                    ["k"],
                    null_safe=null_safe,
                    right_prefix="r_",
                    name="j",
                )
                with OperatorHarness(join, backend="memory", path=tmp_path / f"{cls}{seed}") as h:
                    for b, (side, rows, kinds) in enumerate(nullable_changes(seed)):
                        h.process_rows(rows, kinds, side)
                        if b % 7 == 6:
                            h.commit()
                    h.commit()
                    got.append([h.output, list(h.table("left").scan())])
            assert got[0] == got[1], f"seed {seed}"


class TestHeldAcrossInputBatches:
    @pytest.mark.parametrize("join_type", list(JoinType))
    @pytest.mark.parametrize("unique", [True, False])
    def test_reading_turns_whole_within_a_micro_batch(
        self, join_type: JoinType, unique: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """When a micro-batch's input batches first read by key, then, having
        asked for many keys, read a table whole, the batch path emits what
        record at a time emits and leaves the same state."""
        monkeypatch.setattr(_batch, "SEEK_ROWS", 1)
        for seed in range(5):
            batched = outputs(make(StreamingJoin, join_type, unique), seed, tmp_path / f"b{seed}")
            single = outputs(make(RowAtATime, join_type, unique), seed, tmp_path / f"r{seed}")
            assert batched == single, f"seed {seed}"

    @pytest.mark.parametrize("join_type", [JoinType.INNER, JoinType.FULL])
    @pytest.mark.parametrize("unique", [True, False])
    def test_whole_read_keeps_rows_added_before_it(
        self, join_type: JoinType, unique: bool, tmp_path: Path
    ) -> None:
        """A whole-table read late in a micro-batch keeps the rows its earlier
        input batches added and have not written yet: a later row matches
        them as record at a time."""
        got = []
        for cls in (StreamingJoin, RowAtATime):
            with OperatorHarness(
                make(cls, join_type, unique), backend="memory", path=tmp_path / cls.__name__
            ) as h:
                h.process_rows([(i, i % 50, 0) for i in range(1000)], side=0)
                h.commit()
                h.process_rows([(5000, 7, 1)], side=1)  # reads left's key 7
                h.process_rows([(5001, 7, 1)], side=0)  # adds to it, held
                h.process_rows(
                    [(6000 + i, 100 + i, 2) for i in range(20)], side=0
                )  # reads left whole
                h.process_rows([(5002, 7, 1)], side=1)  # matches both
                h.commit()
                got.append([h.output, list(h.table("left").scan())])
        assert got[0] == got[1]


class ForwardsAllButFlush(Operator):
    """A wrapper written before the flush hook: it forwards every other hook."""

    def __init__(self, inner: StreamingJoin) -> None:
        self.inner = inner
        self.name, self.tables = inner.name, inner.tables
        self.inputs, self.output = inner.inputs, inner.output
        self.consistency = inner.consistency

    def open(self, ctx: OperatorContext) -> None:
        self.inner.open(ctx)

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        self.inner.process_batch(ctx, batch, side)

    def on_watermark(self, ctx: OperatorContext, watermark: int) -> None:
        self.inner.on_watermark(ctx, watermark)

    def close(self, ctx: OperatorContext) -> None:
        self.inner.close(ctx)


class TestWrappedJoin:
    def test_a_wrapper_that_does_not_forward_flush_loses_nothing(self, tmp_path: Path) -> None:
        """The join's close writes what is still held, so a wrapper that
        forwards close but not flush commits the same state and emits the
        same rows as the join itself, batch after batch."""
        got = []
        for wrap in (False, True):
            join = make(StreamingJoin, JoinType.FULL, True)
            op: Operator = ForwardsAllButFlush(join) if wrap else join
            with OperatorHarness(op, backend="rocksdb", path=tmp_path / str(wrap)) as h:
                states = []
                for b, (side, rows, kinds) in enumerate(changes(3, 20)):
                    h.process_rows(rows, kinds, side)
                    if b % 4 == 3:
                        h.commit()
                        states.append(sorted(h.table("left").scan()))
                got.append([h.output, states])
        assert got[0] == got[1]
        assert any(got[0][1])
