"""The foreign-key join through Spark's runner (two stages per micro-batch):
its output after every batch equals the batch join of the tables, also when
a task dies after its commit and the driver fails between the two stages."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pytest
from fk_driver import FkDriver

from operators import FkJoin, ParquetSink, RowKind, run_fk_join
from operators._spark.pipeline import prepared
from operators._spark.runner import job_group
from operators._tools.repartition import repartition
from statestore._faults import arm, inject
from tests.operators.test_repartition_spark import _append


def _pickle_by_value() -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# Spark's Python workers cannot import this test module: ship its functions by
# value (the FK function below).
_pickle_by_value()

LEFT = pa.schema([("id", pa.int64()), ("fk", pa.int64()), ("payload", pa.string())])
RIGHT = pa.schema([("rid", pa.int64()), ("rval", pa.string())])
#: The left table holding its changelog's sequence numbers as a column.
LEFT_SEQ = pa.schema([*LEFT, ("seq", pa.int64())])


def _fk_unless_z(row: tuple[Any, ...]) -> int | None:
    """The FK column, except that a 'z' payload joins nothing."""
    return None if row[2] == "z" else row[1]


class _Workload(NamedTuple):
    """Random changes of both tables and what the join must make of them."""

    #: Each batch's two changelogs (never empty: one file per side per batch).
    changes: list[list[pa.Table]]
    #: The batch join of the tables as they stand after each batch, by K.
    joins: list[dict[Any, tuple[Any, ...]]]
    #: Left rows with an FK at the end: the subscriptions.
    subscriptions: int
    #: Responses each batch must drop as stale (exact unless ``shared``).
    stale: list[int]


def _changes(join: FkJoin, seed: int, batches: int, shared: bool = True) -> _Workload:
    """Random changes of both tables, ``batches`` times; right updates are
    -U/+U pairs, some of which move a row to another key. With ``shared``,
    sequence numbers are shared between the tables and within update pairs.
    Each changelog's rows are shuffled: only the numbers order them."""
    rng = random.Random(seed)
    d = FkDriver(join, shared_sequences=shared, shuffle=rng, right_before_images=True)
    changes, joins, stale = [], [], []
    for _ in range(batches):
        for _ in range(rng.randint(5, 25)):
            if rng.random() < 0.5:
                fk = rng.choice([None, 0, *range(8)])
                d.upsert_left((rng.randrange(40), fk, rng.choice("xyz")))
            elif rng.random() < 0.2 and d.left:
                d.delete_left(rng.choice(sorted(d.left)))
            elif rng.random() < 0.7:
                fk = rng.randrange(8)
                d.upsert_right((fk, f"r{fk}.{rng.randrange(4)}"))
            elif rng.random() < 0.5 and 0 < len(d.right) < 8:
                fk = rng.choice(sorted(d.right))
                free = rng.choice([f for f in range(8) if f not in d.right])
                d.update_right(fk, (free, f"r{fk}.moved"))
            elif d.right:
                d.delete_right(rng.choice(sorted(d.right)))
        d.upsert_left((rng.randrange(40), 0, "x"))
        d.upsert_right((0, f"hot.{rng.randrange(100)}"))
        left, right = d.take_changes()
        assert left is not None and right is not None
        changes.append([left, right])
        joins.append({k[0]: v for k, v in d.batch_join().items()})
        stale.append(d.expected_stale)
    subscriptions = sum(join.foreign_key_of(row) is not None for row in d.left.values())
    return _Workload(changes, joins, subscriptions, stale)


def _write(root: Path, batches: list[list[pa.Table]], first: int = 0) -> None:
    """Write batches ``first``.. of each table as files newer than any there."""
    for side in (0, 1):
        (root / f"in{side}").mkdir(parents=True, exist_ok=True)
        _append(root / f"in{side}", [b[side] for b in batches], first, prefix="part")


def _run(
    spark: Any, root: Path, join: FkJoin, batches: list[list[pa.Table]], partitions: int = 3
) -> tuple[ParquetSink, Any]:
    """Run the join over ``batches`` (written unless ``root`` has input already)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if not (root / "in0").exists():
        _write(root, batches)
    streams = []
    for side in (0, 1):
        schema = from_arrow_schema(batches[0][side].schema)
        streams.append(
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(root / f"in{side}"))
        )
    sink = ParquetSink(str(root / "out"))
    query = run_fk_join(
        streams[0],
        streams[1],
        join,
        partitions=partitions,
        checkpoint=str(root / "ck"),
        sink=sink,
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    return sink, query


def _materialised(spark: Any, sink: ParquetSink, join: FkJoin) -> list[dict[Any, tuple[Any, ...]]]:
    """The output table after each batch, applying the upsert changelog."""
    rows = sink.read(spark).collect()
    table: dict[Any, tuple[Any, ...]] = {}
    after = []
    for batch in sorted({r["batch"] for r in rows}):
        for r in (r for r in rows if r["batch"] == batch):
            value = tuple(r[n] for n in join.output.names)
            if r["row_kind"] == RowKind.DELETE.value:
                del table[value[0]]
            else:
                table[value[0]] = value
        after.append(dict(table))
    return after


@pytest.mark.spark
class TestFkJoinThroughSpark:
    def test_output_after_each_batch_equals_batch_join(self, spark: Any, tmp_path: Path) -> None:
        """Three batches of random changes to both tables (FK changes, null
        FKs, a hot FK, left and right deletes; the left rows hold their own
        sequence numbers), three partitions per stage: after each batch the
        materialised output equals the batch join, each batch drops as stale
        every response computed for another left row than K's, and the
        subscriptions are the left rows with an FK."""
        join = FkJoin(LEFT_SEQ, ["id"], RIGHT, "rid", _fk_unless_z, how="left")
        work = _changes(join, seed=7, batches=3, shared=False)
        assert sum(work.stale) > 0
        sink, query = _run(spark, tmp_path, join, work.changes)
        assert _materialised(spark, sink, join) == work.joins
        stale = [b["metrics"].get("numResultsDroppedAsStale", 0) for b in query.history]
        assert stale == work.stale
        metrics = query.last_metrics
        assert metrics["numSubscriptionRows"] == work.subscriptions
        assert metrics["numOutputRows"] == metrics["fkjoin-results.numOutputRows"]

    def test_a_batch_is_one_job_that_reads_the_batch_once(self, spark: Any, tmp_path: Path) -> None:
        """A batch of the join is one Spark job, which reads the batch once:
        the subscription stage's tasks pass the left rows on (null FKs among
        them, which that stage does not take) to the result stage's shuffle,
        so the job's second Spark stage runs one task per partition, with no
        second read of the batch's files beside them; the output is still
        the batch join."""
        join = FkJoin(LEFT_SEQ, ["id"], RIGHT, "rid", _fk_unless_z, how="left")
        work = _changes(join, seed=11, batches=2, shared=False)
        tracker = spark.sparkContext.statusTracker()
        group = job_group("relstate", join.name + "-results")
        # The session is shared: earlier tests' jobs may be in the group.
        before = set(tracker.getJobIdsForGroup(group))
        sink, query = _run(spark, tmp_path, join, work.changes, partitions=3)
        assert _materialised(spark, sink, join) == work.joins
        jobs = set(tracker.getJobIdsForGroup(group)) - before
        assert len(jobs) == len(query.history) == 2
        for job in jobs:
            stages = sorted(tracker.getJobInfo(job).stageIds)
            tasks = [tracker.getStageInfo(s).numTasks for s in stages]
            # The batch's files (one a side), each stage's three partitions.
            assert tasks == [2, 3, 3], tasks

    def test_a_column_fk_is_read_without_a_python_pass(self, spark: Any) -> None:
        """A column FK reaches the subscription stage's shuffle as a copy of
        the column, in a plan with no Python in it; a function FK takes one
        Python pass, which computes each row's FK (null where it joins
        nothing). Neither adds the row's hash: each stage computes it."""
        rows = [(1, 10, "a", 0, "+I"), (2, 20, "z", 1, "+I")]
        left = spark.createDataFrame(
            rows, "id long, fk long, payload string, seq long, row_kind string"
        )

        def plan_of(frame: Any) -> str:
            return str(frame._jdf.queryExecution().analyzed())

        by_column = prepared(left, FkJoin(LEFT, ["id"], RIGHT, "rid", "fk"))
        assert "MapInArrow" not in plan_of(by_column) and "Python" not in plan_of(by_column)
        assert [tuple(r) for r in by_column.select("id", "__fk").collect()] == [(1, 10), (2, 20)]
        by_function = prepared(left, FkJoin(LEFT, ["id"], RIGHT, "rid", _fk_unless_z))
        assert "MapInArrow" in plan_of(by_function)
        assert [tuple(r) for r in by_function.select("id", "__fk").collect()] == [
            (1, 10),
            (2, None),
        ]
        for frame in (by_column, by_function):
            assert "__hash" not in frame.columns

    def test_crash_before_the_record_and_after_a_commit(
        self, spark: Any, tmp_path: Path, fault_dir: Path
    ) -> None:
        """A task dies after committing its partition (retried), and the
        driver fails after batch 1's output is written and before the batch
        is recorded; run again, the query's output after each batch equals
        an undisturbed run's."""
        join = FkJoin(LEFT, ["id"], RIGHT, "rid", "fk", how="inner")
        changes, joins, _, _ = _changes(join, seed=11, batches=3)
        arm(str(fault_dir), "runner.task_after_commit")
        with (
            inject("runner.driver_after_sink", nth=2),
            pytest.raises(Exception, match="driver_after_sink"),
        ):
            _run(spark, tmp_path, join, changes)
        assert not (fault_dir / "runner.task_after_commit").exists()
        sink, _ = _run(spark, tmp_path, join, changes)
        assert _materialised(spark, sink, join) == joins

    def test_state_reads_and_repartitions(self, spark: Any, tmp_path: Path) -> None:
        """Both stages' state reads as DataFrames (the subscriptions: one row
        per left row with an FK). After two batches on 2 partitions the
        stopped query is repartitioned to 3, each stage by its own key; the
        resumed query's output after every batch still equals the batch join,
        and its state reads from 3 partitions."""
        join = FkJoin(LEFT, ["id"], RIGHT, "rid", _fk_unless_z, how="left")
        changes, joins, subscriptions, _ = _changes(join, seed=23, batches=4)
        subscribed_at_two = _changes(join, seed=23, batches=2).subscriptions
        checkpoint = str(tmp_path / "ck")

        def state(table: str) -> Any:
            return (
                spark.read.format("relstate-state")
                .option("path", checkpoint)
                .option("operator", f"{join.name}-subscriptions")
                .option("table", table)
                .load()
            )

        _write(tmp_path, changes[:2])
        _run(spark, tmp_path, join, changes, partitions=2)
        assert state("subscriptions").count() == subscribed_at_two
        result = repartition(checkpoint, 3)
        assert (result.old_partitions, result.new_partitions) == (2, 3)
        assert result.rows[f"{join.name}-subscriptions.subscriptions"] == subscribed_at_two
        _write(tmp_path, changes, first=2)
        sink, query = _run(spark, tmp_path, join, changes, partitions=3)
        assert _materialised(spark, sink, join) == joins
        assert query.last_metrics["numSubscriptionRows"] == subscriptions
        assert state("subscriptions").count() == subscriptions
        left_rows = (
            spark.read.format("relstate-state")
            .option("path", checkpoint)
            .option("operator", f"{join.name}-results")
            .option("table", "left")
            .load()
        )
        # A left join has one output row per left row.
        assert sorted(r["id"] for r in left_rows.collect()) == sorted(joins[-1])
        metadata = spark.read.format("relstate-metadata").option("path", checkpoint).load()
        partitions = {(r["operator"], r["partition"]) for r in metadata.collect()}
        assert partitions == {
            (f"{join.name}-{stage}", p) for stage in ("subscriptions", "results") for p in range(3)
        }

    def test_tombstones_of_keys_not_held(self, spark: Any, tmp_path: Path) -> None:
        """A left key deleted twice in one batch, again in the next batch, and
        a key never seen: no output, no error, each counted in
        numRetractionsOfUnknownRows; the output after each batch equals the
        batch join."""
        join = FkJoin(LEFT, ["id"], RIGHT, "rid", "fk", how="left")
        d = FkDriver(join)
        d.upsert_right((0, "r0"))
        d.upsert_left((1, 0, "x"))
        d.upsert_left((2, 0, "y"))
        plan: list[list[tuple[int, int, str]]] = [[], [(1, 0, "x"), (1, 0, "x"), (9, 0, "z")]]
        plan.append([(1, 0, "x")])
        changes, joins = [], []
        for batch, tombstones in enumerate(plan):
            for row in tombstones:
                d.retract_left(row)
            d.upsert_right((5 + batch, "unreferenced"))  # one right file per batch
            left, right = d.take_changes()
            assert left is not None and right is not None
            changes.append([left, right])
            joins.append({k[0]: v for k, v in d.batch_join().items()})
        sink, query = _run(spark, tmp_path, join, changes, partitions=2)
        # Batch 2 holds a tombstone alone: it emits nothing, the table stays.
        assert _materialised(spark, sink, join) == joins[:2] and joins[2] == joins[1]
        unknown = [b["metrics"].get("numRetractionsOfUnknownRows", 0) for b in query.history]
        assert unknown == [0, 2, 1]
