"""Two inputs through the Spark runner, and a second attempt of a partition on
the same host (what a speculative copy is)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from encoding import TableSchema
from operators import (
    Operator,
    OperatorContext,
    ParquetSink,
    Pipeline,
    RowKind,
    run_operator,
)
from operators._spark.task import StagePlan, open_store
from operators._tools.demo import write_batches
from operators.testing import OperatorHarness
from statestore import StateStore, StoreConfig


def _pickle_by_value() -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# Spark's Python workers cannot import this test module: ship its classes by
# value (what a user does for an operator defined outside an installed package).
_pickle_by_value()

LEFT = pa.schema([("id", pa.int64()), ("name", pa.string())])
RIGHT = pa.schema([("ref", pa.int64()), ("amount", pa.int64())])


def _side_streams(
    spark: Any, root: Path, sides: list[tuple[pa.Schema, list[tuple[Any, ...]]]]
) -> list[Any]:
    """Each side's rows written as one Parquet file under ``root``, and read
    back as a stream: one micro-batch of every side."""
    from pyspark.sql.pandas.types import from_arrow_schema

    streams = []
    for side, (schema, rows) in enumerate(sides):
        table = pa.Table.from_pylist(
            [dict(zip(schema.names, r, strict=True)) for r in rows], schema
        )
        write_batches(root / f"side{side}", [table], prefix="part")
        streams.append(
            spark.readStream.schema(from_arrow_schema(schema)).parquet(str(root / f"side{side}"))
        )
    return streams


def _upsert(
    ctx: OperatorContext, table: Any, old: tuple[Any, ...] | None, new: tuple[Any, ...]
) -> None:
    """Write ``new`` over ``old`` (``None``: no row yet) and emit the change
    as an upsert changelog does."""
    if old is None:
        table.insert(new)
        ctx.emit(new, RowKind.INSERT)
    else:
        table.update(old, new)
        ctx.emit(old, RowKind.UPDATE_BEFORE)
        ctx.emit(new, RowKind.UPDATE_AFTER)


class SideCounts(Operator):
    """Per key: how many rows each side has sent; an upsert changelog."""

    name = "side_counts"
    inputs = (LEFT, RIGHT)
    output = pa.schema([("key", pa.int64()), ("left", pa.int64()), ("right", pa.int64())])
    tables = (
        TableSchema(
            1,
            pa.schema([("key", pa.int64()), ("left", pa.int64()), ("right", pa.int64())]),
            ["key"],
            name="counts",
        ),
    )

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        table = ctx.table("counts")
        old = table.get_row((row[0],))
        left, right = (0, 0) if old is None else (old[1], old[2])
        _upsert(ctx, table, old, (row[0], left + (side == 0), right + (side == 1)))


class Relay(Operator):
    """Emits every row as it came; keeps nothing."""

    def __init__(self, schema: pa.Schema = LEFT, name: str = "relay") -> None:
        self.name = name
        self.inputs = (schema,)
        self.output = schema

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        ctx.emit(row, kind)


TALLY = pa.schema([("side", pa.int64()), ("key", pa.int64()), ("rows", pa.int64())])
GROUPED = pa.schema([("id", pa.int64()), ("grp", pa.int64())])


class Tally(Operator):
    """Per side and key (column ``at[side]`` of the side's rows): how many
    rows came, of any kind; an upsert changelog."""

    def __init__(self, name: str, inputs: tuple[pa.Schema, ...], at: tuple[int, ...]) -> None:
        self.name = name
        self.inputs = inputs
        self.at = at
        self.output = TALLY
        self.tables = (TableSchema(1, TALLY, ["side", "key"], name="tally"),)

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        table = ctx.table("tally")
        old = table.get_row((side, row[self.at[side]]))
        _upsert(ctx, table, old, (side, row[self.at[side]], 1 if old is None else old[2] + 1))


@pytest.mark.spark
class TestPassingOn:
    def test_a_fused_stage_passes_its_readers_source_rows_on(
        self, spark: Any, tmp_path: Path
    ) -> None:
        """A stage of two sources, run in the job of a stage that reads its
        rows and one of those sources, passes that source's rows on: each
        stage takes the rows its own null-key condition keeps (a row with no
        group only passed on, a row with no id only the first stage's), the
        job's middle Spark stage runs one task per partition (no second read
        of the batch), and both stages count what they would otherwise."""
        lefts = [(k, k % 3) for k in range(9)] + [(20, None), (21, None), (None, 1), (None, 2)]
        rights = [(k % 4, k) for k in range(6)]
        streams = _side_streams(spark, tmp_path, [(GROUPED, lefts), (RIGHT, rights)])
        pipeline = Pipeline()
        left = pipeline.source(streams[0], "left")
        right = pipeline.source(streams[1], "right")
        groups = pipeline.stage(
            Tally("groups", (GROUPED, RIGHT), (1, 0)),
            left,
            right,
            keys=[["grp"], ["ref"]],
            drop_null_keys=[True, False],
        )
        tally = pipeline.stage(
            Tally("tally", (TALLY, GROUPED), (1, 0)),
            groups,
            left,
            keys=[["key"], ["id"]],
            drop_null_keys=[False, True],
        )
        sink = ParquetSink(str(tmp_path / "out"))
        query = pipeline.start(
            tally, sink, str(tmp_path / "ck"), 3, trigger={"availableNow": True}, query_name="pass"
        )
        query.awaitTermination()
        tracker = spark.sparkContext.statusTracker()
        (job,) = tracker.getJobIdsForGroup("relstate:pass:tally")
        stages = sorted(tracker.getJobInfo(job).stageIds)
        assert [tracker.getStageInfo(s).numTasks for s in stages] == [2, 3, 3]

        net: Counter[tuple[int, int, int]] = Counter()
        for r in sink.read(spark).collect():
            net[(r["side"], r["key"], r["rows"])] += (
                1 if RowKind(r["row_kind"]).is_accumulate else -1
            )
        got = {row for row, n in net.items() if n > 0}
        # The first stage's rows per (side, key) r emit 2r - 1 rows (an
        # insert, then an update pair each); the second counts them by key.
        first = Counter([(0, g) for _, g in lefts if g is not None] + [(1, r) for r, _ in rights])
        emitted: Counter[int] = Counter()
        for (_, key), rows in first.items():
            emitted[key] += 2 * rows - 1
        ids = Counter(i for i, _ in lefts if i is not None)
        expected = {(0, k, n) for k, n in emitted.items()} | {(1, i, n) for i, n in ids.items()}
        assert got == expected


@pytest.mark.spark
class TestTwoInputs:
    def test_both_sides_of_a_key_meet_in_one_task(self, spark: Any, tmp_path: Path) -> None:
        """Rows of both inputs with equal keys reach one task, each with its
        own side and columns; the final counts equal the harness's."""
        from pyspark.sql.pandas.types import from_arrow_schema

        lefts = [[(k, f"n{k}") for k in range(20)], [(k, "again") for k in range(0, 20, 3)]]
        rights = [[(k % 7, k) for k in range(30)], [(k, -k) for k in range(5)]]
        for side, (schema, batches) in enumerate(((LEFT, lefts), (RIGHT, rights))):
            tables = [
                pa.Table.from_pylist(
                    [dict(zip(schema.names, r, strict=True)) for r in rows], schema
                )
                for rows in batches
            ]
            write_batches(tmp_path / f"side{side}", tables, prefix="part")
        streams = [
            spark.readStream.schema(from_arrow_schema(s))
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / f"side{i}"))
            for i, s in enumerate((LEFT, RIGHT))
        ]
        sink = ParquetSink(str(tmp_path / "out"))
        query = run_operator(
            streams,
            SideCounts(),
            keys=[["id"], ["ref"]],
            partitions=3,
            checkpoint=str(tmp_path / "ck"),
            sink=sink,
            trigger={"availableNow": True},
        )
        query.awaitTermination()

        net: Counter[tuple[int, int, int]] = Counter()
        for r in sink.read(spark).collect():
            row = (r["key"], r["left"], r["right"])
            net[row] += 1 if RowKind(r["row_kind"]).is_accumulate else -1
        got = {row for row, n in net.items() if n > 0}
        assert all(n in (0, 1) for n in net.values())

        with OperatorHarness(SideCounts()) as harness:
            for rows in lefts:
                harness.process_rows(rows, side=0)
            for rows in rights:
                harness.process_rows(rows, side=1)
            harness.commit()
            expected = set(harness.table("counts").scan())
        assert got == expected

    @pytest.mark.parametrize(
        ("shape", "jobs"),
        [
            # left → relay → side_counts ← right: the relay runs in the
            # counts' job, its side dropping rows with a null key.
            ("relayed", {"relay": 0, "side_counts": 1}),
            # left → relay → relay2 → side_counts ← right: both relays run in
            # the counts' job, the first one's metadata rows handed on twice.
            ("chain", {"relay": 0, "relay2": 0, "side_counts": 1}),
            # left → relay, right → relay_right, both → side_counts: the relay
            # is not read by the stage right after it, so it runs a job of its
            # own; relay_right runs in the counts' job.
            ("apart", {"relay": 1, "relay_right": 0, "side_counts": 1}),
        ],
    )
    def test_a_stage_run_in_its_readers_job_hands_on_its_metadata(
        self, spark: Any, tmp_path: Path, shape: str, jobs: dict[str, int]
    ) -> None:
        """A stage read by one side of the stage right after it alone runs in
        that stage's Spark job; its tasks' metadata rows reach the driver
        through the later stage's tasks (through two, in a chain), even where
        that side drops rows with a null key (metadata rows hold no key). A
        stage read by a later one further on runs a job of its own. The
        output equals the harness's on the rows with a key, and the batch is
        recorded."""
        lefts = [(k, f"n{k}") for k in range(8)] + [(None, "keyless"), (None, "again")]
        rights = [(k % 3, k) for k in range(6)]
        streams = _side_streams(spark, tmp_path, [(LEFT, lefts), (RIGHT, rights)])
        pipeline = Pipeline()
        left = pipeline.source(streams[0], "left")
        right = pipeline.source(streams[1], "right")
        relayed = pipeline.stage(Relay(), left, keys=[["name"]])
        if shape == "chain":
            relayed = pipeline.stage(Relay(name="relay2"), relayed, keys=[["name"]])
        if shape == "apart":
            right = pipeline.stage(Relay(RIGHT, "relay_right"), right, keys=[["ref"]])
        counts = pipeline.stage(
            SideCounts(), relayed, right, keys=[["id"], ["ref"]], drop_null_keys=[True, False]
        )
        sink = ParquetSink(str(tmp_path / "out"))
        query = pipeline.start(
            counts, sink, str(tmp_path / "ck"), 3, trigger={"availableNow": True}, query_name=shape
        )
        query.awaitTermination()
        tracker = spark.sparkContext.statusTracker()
        ran = {s: len(tracker.getJobIdsForGroup(f"relstate:{shape}:{s}")) for s in jobs}
        assert ran == jobs
        assert [h["batch_id"] for h in query.history] == [0]

        net: Counter[tuple[int, int, int]] = Counter()
        for r in sink.read(spark).collect():
            row = (r["key"], r["left"], r["right"])
            net[row] += 1 if RowKind(r["row_kind"]).is_accumulate else -1
        got = {row for row, n in net.items() if n > 0}
        with OperatorHarness(SideCounts()) as harness:
            harness.process_rows([r for r in lefts if r[0] is not None], side=0)
            harness.process_rows(rights, side=1)
            harness.commit()
            expected = set(harness.table("counts").scan())
        assert got == expected and len(got) == 8


class TestSecondAttempt:
    def test_concurrent_attempt_gets_its_own_local_cache(self, tmp_path: Path) -> None:
        """While one attempt of a partition holds the local cache, a second
        attempt on the same host opens a cache of its own; both commit, and
        loading by the recorded winner gives the winner's state."""
        config = StoreConfig(local_dir=str(tmp_path / "local"), partition_count=1)
        plan = StagePlan(SideCounts(), str(tmp_path / "state"), 1, [], {}, config, index=0)
        first = open_store(plan, 0, attempt=0)
        second = open_store(plan, 0, attempt=1)
        try:
            assert first.local_dir != second.local_dir
            for store, left in ((first, 1), (second, 2)):
                store.load(None)
                store.table("counts").insert((7, left, 0))
            first_info = first.commit(0)
            second_info = second.commit(0)
            assert first_info.commit_id != second_info.commit_id
        finally:
            first.close()
            second.close()
        tables = list(SideCounts.tables)
        from operators._engine.task import TIMERS

        with StateStore(
            str(tmp_path / "state"), "side_counts", 0, [*tables, TIMERS], config
        ) as store:
            store.load(0, second_info.commit_id)
            assert list(store.table("counts").scan()) == [(7, 2, 0)]
            store.load(0, first_info.commit_id)
            assert list(store.table("counts").scan()) == [(7, 1, 0)]


ODD_LEFT = pa.schema([("k`e y", pa.int64()), ("na me.x", pa.string()), ("séq", pa.int64())])
ODD_RIGHT = pa.schema([("ключ", pa.int64()), ("a`.mount`", pa.int64())])


@pytest.mark.spark
class TestOddColumnNames:
    def test_backticks_spaces_dots_and_unicode_in_keys_and_sequence(
        self, spark: Any, tmp_path: Path
    ) -> None:
        """Column names with backticks, spaces, dots and non-ASCII letters
        serve as keys and sequence column through the runner (two sources,
        null keys dropped): the join's output equals the harness's."""
        from operators.join import StreamingJoin

        lefts = [(k, f"n{k}", 10 - k) for k in range(6)] + [(None, "null", 0)]
        rights = [(k % 3, k) for k in range(6)] + [(None, 99)]
        streams = _side_streams(spark, tmp_path, [(ODD_LEFT, lefts), (ODD_RIGHT, rights)])

        def join() -> StreamingJoin:
            return StreamingJoin("inner", ODD_LEFT, ODD_RIGHT, ["k`e y"], ["ключ"])

        pipeline = Pipeline()
        left = pipeline.source(streams[0], "left", sequence="séq")
        right = pipeline.source(streams[1], "right")
        joined = pipeline.stage(
            join(), left, right, keys=[["k`e y"], ["ключ"]], drop_null_keys=True
        )
        sink = ParquetSink(str(tmp_path / "out"))
        query = pipeline.start(
            joined, sink, str(tmp_path / "ck"), 2, trigger={"availableNow": True}
        )
        query.awaitTermination()
        names = join().output.names
        got = Counter(tuple(r[n] for n in names) for r in sink.read(spark).collect())

        with OperatorHarness(join()) as harness:
            harness.process_rows(lefts, side=0)
            harness.process_rows(rights, side=1)
            expected = Counter(row for _, row in harness.output)
        assert got == expected and sum(got.values()) == 6


class TestStageInputFrame:
    def test_sides_from_distinct_sources_are_one_projection_of_the_batch(self, spark: Any) -> None:
        """A stage whose sides are each another source of the batch reads them
        as one filtered projection, with no union: the same rows, sides,
        sequences and row kinds as a union of each side's own selection,
        including a side read in another order than the sources', a null-key
        condition, and a source the stage does not read."""
        from operators._spark.plan import InputPlan, SideRows, one_per_side, selections
        from operators._spark.runner import _StageInput

        batch = spark.createDataFrame(
            [
                (1, "x", None, None, 10, "+I", 0),
                (None, "y", None, None, 11, "+I", 0),
                (None, None, 7, None, 12, "-U", 1),
                (None, None, 8, None, 13, "+U", 1),
                (None, None, None, 99, 14, "+I", 2),
            ],
            "q0__a long, q0__b string, q1__c long, q2__d long, seq long, row_kind string, "
            "__source int",
        )
        sides = [
            SideRows(1, [], ["q1__c AS s0__0"], "seq"),
            SideRows(0, ["q0__a IS NOT NULL"], ["q0__a AS s1__0", "q0__b AS s1__1"], "NULL"),
        ]
        parts = selections(sides, kinds=True, ordered=True, sources=3)
        assert len(parts) == 1
        projected = _StageInput(InputPlan(parts, []), 1).rows([batch, batch])
        unioned = _StageInput(InputPlan(one_per_side(sides, True, True, 3), []), 1).rows(
            [batch, batch]
        )
        assert "Union" not in projected._jdf.queryExecution().analyzed().toString()
        columns = ["s0__0", "s1__0", "s1__1", "row_kind", "__side", "__seq"]
        got = sorted(projected.select(*columns).collect(), key=str)
        assert got == sorted(unioned.select(*columns).collect(), key=str)
        assert {tuple(r) for r in got} == {
            (None, 1, "x", "+I", 1, None),
            (7, None, None, "-U", 0, 12),
            (8, None, None, "+U", 0, 13),
        }
