"""Reading state as DataFrames (relstate-state, its change feed,
relstate-metadata), `relstate inspect`, and `relstate repartition`, on the
checkpoint of a real query."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators import cli
from operators._checkpoint.location import StateLocation, table_schema
from operators._checkpoint.read import metadata, read_changes, read_rows
from operators._engine.spark_hash import spark_partition
from operators._spark.runner import run_operator
from operators._spark.sinks import ParquetSink
from operators._tools.demo import write_batches
from operators._tools.repartition import repartition
from operators.errors import InputError
from operators.examples import RunningAggregate
from statestore import StateStore
from tests._s3 import BUCKET, MotoS3
from tests.operators._harness_state import (
    LatestRow,
    append_feed,
    append_join,
    dedup_feed,
    drop_duplicates,
    harness_state,
    join_feed,
    streaming_join,
    typed_feed,
)
from tests.operators._orders_changelog import ORDERS, generate, reference

pytestmark = pytest.mark.spark

OPERATOR = "running_aggregate"


def run_query(spark: Any, root: Path, partitions: int, batches: int) -> ParquetSink:
    """Run RunningAggregate over the first ``batches`` files of ``root/source``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    stream = spark.readStream.schema(from_arrow_schema(ORDERS)).option("maxFilesPerTrigger", 1)
    sink = ParquetSink(str(root / "output"))
    query = run_operator(
        stream.parquet(str(root / "source")),
        RunningAggregate(),
        keys=["key"],
        partitions=partitions,
        checkpoint=str(root / "checkpoint"),
        sink=sink,
        sequence_column="seq",
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    return sink


def per_batch(spark: Any, sink: ParquetSink) -> list[Counter[tuple[Any, ...]]]:
    out: dict[int, Counter[tuple[Any, ...]]] = {}
    for r in sink.read(spark).collect():
        out.setdefault(r["batch"], Counter())[
            (r["row_kind"], r["key"], r["count"], r["total"])
        ] += 1
    return [out.get(i, Counter()) for i in range(max(out) + 1)] if out else []


def live_after(orders: list[pa.Table], batch: int) -> dict[str, tuple[int, int]]:
    """The aggregates (count, total per key) after ``batch``, from the orders."""
    current: dict[int, tuple[str, int]] = {}
    for table in orders[: batch + 1]:
        for r in table.to_pylist():
            if r["row_kind"] in ("+I", "+U"):
                current[r["order_id"]] = (r["key"], r["value"])
            else:
                del current[r["order_id"]]
    live: dict[str, tuple[int, int]] = {}
    for key, amount in current.values():
        count, total = live.get(key, (0, 0))
        live[key] = (count + 1, total + amount)
    return live


def net_changes(orders: list[pa.Table], batch: int) -> Counter[tuple[Any, ...]]:
    """What ``batch`` changed in the aggregates, key by key."""
    before, after = live_after(orders, batch - 1), live_after(orders, batch)
    out: Counter[tuple[Any, ...]] = Counter()
    for key, row in after.items():
        if key not in before:
            out[("insert", key, *row)] += 1
        elif before[key] != row:
            out[("update_preimage", key, *before[key])] += 1
            out[("update_postimage", key, *row)] += 1
    for key, row in before.items():
        if key not in after:
            out[("delete", key, *row)] += 1
    return out


@pytest.fixture(scope="module")
def orders() -> list[pa.Table]:
    """Four batches of a small orders changelog."""
    return generate(batches=4, orders_per_batch=200, customers=30, seed=5)


@pytest.fixture(scope="module")
def query(spark: Any, tmp_path_factory: pytest.TempPathFactory, orders: list[pa.Table]) -> Path:
    """A checkpoint of RunningAggregate on 2 partitions after batches 0..3."""
    root = tmp_path_factory.mktemp("state-source")
    write_batches(root / "source", orders)
    run_query(spark, root, partitions=2, batches=len(orders))
    return root / "checkpoint"


class TestStateSource:
    def test_latest_rows_with_types_one_spark_partition_each(
        self, spark: Any, query: Path, orders: list[pa.Table]
    ) -> None:
        """The default read is the latest committed batch: every live aggregate
        once, with the table's column types, one Spark partition per state
        partition."""
        df = spark.read.format("relstate-state").option("path", str(query)).load()
        assert df.rdd.getNumPartitions() == 2
        assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
            ("key", "string"),
            ("count", "bigint"),
            ("total", "bigint"),
        ]
        got = {r["key"]: (r["count"], r["total"]) for r in df.collect()}
        assert got == live_after(orders, 3)

    def test_time_travel_and_one_partition(
        self, spark: Any, query: Path, orders: list[pa.Table]
    ) -> None:
        """batch_id reads an older kept batch; partition reads one partition,
        whose keys are exactly the ones Spark hashes there."""
        from pyspark.sql import functions as F

        reader = spark.read.format("relstate-state").option("path", str(query))
        old = reader.option("table", "aggregates").option("batch_id", 1).load()
        got = {r["key"]: (r["count"], r["total"]) for r in old.collect()}
        assert got == live_after(orders, 1)
        one = reader.option("partition", 1).load()
        assert one.rdd.getNumPartitions() == 1
        hashed = one.select(F.expr("pmod(hash(key), 2)").alias("p")).distinct().collect()
        assert [r["p"] for r in hashed] == [1]

    def test_change_feed_is_each_batch_net_change(
        self, spark: Any, query: Path, orders: list[pa.Table]
    ) -> None:
        """The change feed of batches 1..3 gives, per batch, each key's net
        change: insert, update pre/post images, or delete."""
        df = (
            spark.read.format("relstate-state")
            .option("path", str(query))
            .option("readChangeFeed", "true")
            .option("startBatchId", 1)
            .option("endBatchId", 3)
            .load()
        )
        got: dict[int, Counter[tuple[Any, ...]]] = {}
        for r in df.collect():
            got.setdefault(r["batch_id"], Counter())[
                (r["change_type"], r["key"], r["count"], r["total"])
            ] += 1
        assert [got.get(b, Counter()) for b in (1, 2, 3)] == [
            net_changes(orders, b) for b in (1, 2, 3)
        ]

    def test_metadata_view(self, spark: Any, query: Path, orders: list[pa.Table]) -> None:
        """relstate-metadata lists each partition's tables with schema, the
        partition count, the latest batch, the kept versions and the table's
        own rows."""
        rows = (
            spark.read.format("relstate-metadata")
            .option("path", str(query))
            .load()
            .where("table = 'aggregates'")
            .orderBy("partition")
            .collect()
        )
        assert [r["partition"] for r in rows] == [0, 1]
        for r in rows:
            assert r["operator"] == OPERATOR
            assert r["columns"] == "key string, count int64, total int64"
            assert r["key_columns"] == "key asc"
            assert r["partition_count"] == 2
            assert r["batch_id"] == 3
            assert r["kept_versions"] == [0, 1, 2, 3]
            assert r["state_bytes"] > 0
            assert r["status"] == "ok"
        assert sum(r["table_rows"] for r in rows) == len(live_after(orders, 3))

    def test_an_unrecorded_batch_is_not_read(self, query: Path) -> None:
        """A batch after the runner's last record is refused, never read."""
        location = StateLocation(str(query))
        meta = location.table(OPERATOR, "aggregates")
        with pytest.raises(InputError, match="not committed"):
            read_rows(location, OPERATOR, meta, 0, batch_id=4)

    def test_a_failed_attempt_is_not_a_kept_batch(self, query: Path, tmp_path: Path) -> None:
        """A version an attempt published after the runner's last record (a
        batch that failed before it was recorded) is not listed as kept, and
        the latest state read is still the recorded batch's."""
        copy = tmp_path / "checkpoint"
        shutil.copytree(query, copy)
        location = StateLocation(str(copy))
        meta = location.table(OPERATOR, "aggregates")
        latest = read_rows(location, OPERATOR, meta, 0)
        schemas = [table_schema(m) for m in location.tables(OPERATOR)]
        with StateStore(location.root, OPERATOR, 0, schemas) as store:
            store.load(3)
            store.table("aggregates").insert(("not-committed", 1, 1))
            store.commit(4)
        assert location.checkpoint(OPERATOR, 0).versions()[-1] == 4
        assert location.kept_batches(OPERATOR, 0) == [0, 1, 2, 3]
        kept = {m["partition"]: m["kept_versions"] for m in metadata(location).to_pylist()}
        assert kept == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}
        assert read_rows(location, OPERATOR, meta, 0) == latest


class TestInspect:
    def test_metadata_on_the_terminal(
        self, query: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`relstate inspect` prints the query, the tables and one line per
        partition."""
        assert cli.main(["inspect", str(query)]) == 0
        out = capsys.readouterr().out
        assert f"query: 2 partitions; stages {OPERATOR} (key ['string'])" in out
        assert "batches recorded: 0..3 (latest committed 3" in out
        assert "table aggregates (id 0x1, row layout): key string, count int64" in out
        lines = [line.split() for line in out.splitlines() if line.startswith("  0 ")]
        assert lines and lines[0][1] == "3" and lines[0][3] == "0..3"

    def test_rows_on_the_terminal(
        self, query: Path, orders: list[pa.Table], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--table/--batch/--limit prints that many rows of the batch."""
        code = cli.main(
            ["inspect", str(query), "--table", "aggregates", "--batch", "2", "--limit", "5"]
        )
        assert code == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"operator {OPERATOR}, table aggregates, batch 2: 5 row(s) shown"
        assert out[1].split() == ["key", "count", "total"]
        live = live_after(orders, 2)
        for line in out[3:]:
            key, count, total = line.split()
            assert live[key] == (int(count), int(total))

    def test_operator_option_picks_the_operator(
        self, query: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--operator without --table shows that operator; an operator the
        state does not hold exits 2 naming the ones it does."""
        assert cli.main(["inspect", str(query), "--operator", OPERATOR]) == 0
        assert f"operator {OPERATOR}" in capsys.readouterr().out
        assert cli.main(["inspect", str(query), "--operator", "nope"]) == 2
        assert f"holds operators ['{OPERATOR}'], not 'nope'" in capsys.readouterr().err

    def test_unknown_table_is_a_clear_error(
        self, query: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A table the operator does not have exits 2 naming the tables it has."""
        assert cli.main(["inspect", str(query), "--table", "nope"]) == 2
        assert "has tables ['aggregates', '__timers'], not 'nope'" in capsys.readouterr().err


class TestRepartition:
    def test_resumes_on_three_partitions_with_the_same_results(
        self, spark: Any, tmp_path: Path, orders: list[pa.Table], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Two batches on 2 partitions, `relstate repartition --partitions 3`,
        then the rest on 3 partitions: the output equals an unrepartitioned
        run, and every row sits in the partition Spark hashes it to."""
        from pyspark.sql import functions as F

        write_batches(tmp_path / "source", orders[:2])
        run_query(spark, tmp_path, partitions=2, batches=2)
        checkpoint = str(tmp_path / "checkpoint")
        assert cli.main(["repartition", checkpoint, "--partitions", "3"]) == 0
        assert "repartitioned from 2 to 3 partitions" in capsys.readouterr().out
        state = spark.read.format("relstate-state").option("path", checkpoint).load()
        assert state.rdd.getNumPartitions() == 3
        wrong = state.where(F.expr("pmod(hash(key), 3)") != F.spark_partition_id()).count()
        assert wrong == 0
        now = time.time()
        for i in (2, 3):
            path = tmp_path / "source" / f"orders-{i:04d}.parquet"
            pq.write_table(orders[i], path)
            os.utime(path, (now + i, now + i))  # taken in order, as write_batches does
        sink = run_query(spark, tmp_path, partitions=3, batches=4)
        assert per_batch(spark, sink) == reference(orders)

    def test_same_count_and_missing_state_are_refused(self, query: Path, tmp_path: Path) -> None:
        """Repartitioning to the current count, or a directory without a
        query's state, is a clear error that changes nothing."""
        copy = tmp_path / "copy"
        shutil.copytree(query, copy)
        with pytest.raises(InputError, match="has 2 partitions already"):
            repartition(str(copy), 2)
        with pytest.raises(InputError, match="no relstate state"):
            repartition(str(tmp_path / "nothing"), 3)


class TestOnS3:
    def test_data_source_and_inspect_configured_without_the_uri(
        self,
        spark: Any,
        query: Path,
        s3: MotoS3,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A plain s3://bucket/path checkpoint: relstate-state reads it through
        Spark with the endpoint and credentials as options, and `relstate
        inspect` reads it with them in the environment."""
        prefix = f"plain-{uuid.uuid4().hex}"
        s3.upload(query, s3.uri(prefix))
        plain = f"s3://{BUCKET}/{prefix}"
        options = {
            "endpoint": s3.endpoint,
            "region": "us-east-1",
            "access_key": "test",
            "secret_key": "test",
        }
        rows = (
            spark.read.format("relstate-state")
            .option("path", plain)
            .options(**options)
            .load()
            .collect()
        )
        local = StateLocation(str(query))
        meta = local.table(OPERATOR, "aggregates")
        expected = [r for p in (0, 1) for r in read_rows(local, OPERATOR, meta, p).to_pylist()]
        key = lambda r: r["key"]  # noqa: E731
        assert sorted((r.asDict() for r in rows), key=key) == sorted(expected, key=key)
        for name, value in {
            "AWS_ENDPOINT_URL": s3.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
        }.items():
            monkeypatch.setenv(name, value)
        assert cli.main(["inspect", plain]) == 0
        assert "batches recorded: 0..3 (latest committed 3" in capsys.readouterr().out

    def test_read_and_repartition_a_copy_on_s3(self, query: Path, s3: MotoS3) -> None:
        """The query's state copied to S3 reads the same rows there, and
        repartitions there (its directories moved by copy and delete): every
        row lands in the partition Spark's hash gives its key."""
        uri = s3.uri()
        s3.upload(query / "state", uri)
        local, remote = StateLocation(str(query)), StateLocation(uri)
        meta = local.table(OPERATOR, "aggregates")
        for p in (0, 1):
            assert read_rows(remote, OPERATOR, meta, p) == read_rows(local, OPERATOR, meta, p)
        result = repartition(uri, 3)
        assert (result.old_partitions, result.new_partitions, result.batch_id) == (2, 3, 3)
        moved = StateLocation(uri)
        assert moved.partitions(OPERATOR) == [0, 1, 2]
        before = local.query()
        assert before is not None and moved.query() == replace(before, partitions=3)
        keys: list[str] = []
        for p in (0, 1, 2):
            rows = read_rows(moved, OPERATOR, meta, p).column("key").to_pylist()
            assert all(spark_partition([k], [pa.string()], 3) == p for k in rows)
            keys += rows
        before = [
            k for p in (0, 1) for k in read_rows(local, OPERATOR, meta, p).column("key").to_pylist()
        ]
        assert sorted(keys) == sorted(before)


def _arrow(df: Any) -> list[dict[str, Any]]:
    """A DataFrame's rows as Python values, through Arrow (no session time
    zone applied to timestamps)."""
    rows: list[dict[str, Any]] = df.toArrow().to_pylist()
    return rows


def _offline(location: StateLocation, table: str) -> list[dict[str, Any]]:
    name = location.operator(None)
    meta = location.table(name, table)
    return [
        r for p in location.partitions(name) for r in read_rows(location, name, meta, p).to_pylist()
    ]


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=repr)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, StateLocation]:
    """State of a StreamingJoin, an AppendJoin, DropDuplicates and a table of
    every column type, each on 2 partitions after 3 batches, built by the
    harness (no Spark time)."""
    makers = {
        "join": (streaming_join, join_feed),
        "append_join": (append_join, append_feed),
        "dedup": (drop_duplicates, dedup_feed),
        "typed": (LatestRow, typed_feed),
    }
    return {
        name: StateLocation(str(harness_state(tmp_path_factory.mktemp(name), make, feed)))
        for name, (make, feed) in makers.items()
    }


class TestOperatorsState:
    @pytest.mark.parametrize(
        ("state", "side", "table"),
        [
            ("join", "left", "left"),
            ("join", "right", "right"),
            ("append_join", "left", "left_rows"),
        ],
    )
    def test_a_join_side(
        self, spark: Any, built: dict[str, StateLocation], state: str, side: str, table: str
    ) -> None:
        """joinSide reads a StreamingJoin's side table and an AppendJoin's
        rows table, every partition, with the rows the checkpoint holds."""
        location = built[state]
        df = spark.read.format("relstate-state").option("path", location.path)
        got = _arrow(df.option("joinSide", side).load())
        assert got and _sorted(got) == _sorted(_offline(location, table))

    def test_dedup_state(self, spark: Any, built: dict[str, StateLocation]) -> None:
        """DropDuplicates' seen table reads every key seen so far."""
        location = built["dedup"]
        got = _arrow(spark.read.format("relstate-state").option("path", location.path).load())
        assert sorted(r["k"] for r in got) == list(range(20))

    def test_column_types(self, spark: Any, built: dict[str, StateLocation]) -> None:
        """Timestamp, date, decimal, binary, boolean, double and int columns
        keep their Spark types and their values, nulls included."""
        location = built["typed"]
        df = spark.read.format("relstate-state").option("path", location.path).load()
        assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
            ("k", "bigint"),
            ("name", "string"),
            ("at", "timestamp_ntz"),
            ("day", "date"),
            ("amount", "decimal(12,3)"),
            ("blob", "binary"),
            ("flag", "boolean"),
            ("ratio", "double"),
            ("small", "int"),
        ]
        got = _arrow(df)
        assert _sorted(got) == _sorted(_offline(location, "rows"))
        assert any(r["blob"] is None for r in got) and any(r["flag"] is None for r in got)

    def test_change_feed_from_batch_zero_of_one_partition(
        self, spark: Any, built: dict[str, StateLocation]
    ) -> None:
        """A change feed from startBatchId 0 with option partition gives that
        partition's rows only, batch 0 as inserts, each batch as the offline
        feed computes it."""
        location = built["typed"]
        df = (
            spark.read.format("relstate-state")
            .option("path", location.path)
            .option("readChangeFeed", "true")
            .option("changeStartBatchId", 0)
            .option("partition", 1)
            .load()
        )
        got = _arrow(df)
        meta = location.table("latest", "rows")
        assert {r["partition"] for r in got} == {1}
        assert {r["change_type"] for r in got if r["batch_id"] == 0} == {"insert"}
        assert {r["batch_id"] for r in got} == {0, 1, 2}
        assert _sorted(got) == _sorted(read_changes(location, "latest", meta, 1, 0).to_pylist())

    def test_refusals_reach_the_caller(
        self, spark: Any, built: dict[str, StateLocation], tmp_path: Path
    ) -> None:
        """An unknown option fails the read on the driver, and a change feed
        whose batch before the start is no longer kept fails naming the
        earliest start."""
        location = built["dedup"]
        reader = spark.read.format("relstate-state").option("path", location.path)
        with pytest.raises(Exception, match="has no option 'bogus'"):
            reader.option("bogus", 1).load()
        copy = tmp_path / "dedup"
        shutil.copytree(location.root, copy)
        for manifest in (copy / "drop_duplicates" / "1" / "manifests").glob(f"{0:020d}-*.json"):
            manifest.unlink()
        feed = (
            spark.read.format("relstate-state")
            .option("path", str(copy))
            .option("readChangeFeed", "true")
            .option("changeStartBatchId", 1)
            .load()
        )
        with pytest.raises(
            Exception, match=r"no longer kept \(partition 1 keeps 1..2\); start at 2"
        ):
            feed.collect()
