"""The state readers without Spark, on state built by the harness:
`relstate inspect` where PySpark cannot be imported, and locations printed
without their credentials."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import cli
from operators._checkpoint import read as _state_read
from operators._checkpoint.location import StateLocation, table_schema
from operators._checkpoint.read import metadata, read_changes, read_rows
from operators._engine.spark_hash import spark_partition
from operators._tools.repartition import repartition
from operators.errors import InputError, RepartitionedError
from operators.examples import RunningAggregate
from operators.testing import OperatorHarness
from statestore import StateStore
from tests._s3 import BUCKET, MotoS3
from tests.operators._harness_state import (
    LatestRow,
    append_feed,
    append_join,
    evicting_dedup,
    evicting_feed,
    harness_state,
    join_feed,
    streaming_join,
    typed_feed,
)

REPO = Path(__file__).parents[2]
OPERATOR = "running_aggregate"
KEYS = [f"k{i:02d}" for i in range(12)]

#: Run as ``python -c``: make every import of pyspark fail, then run the
#: relstate command with the arguments.
WITHOUT_PYSPARK = """
import sys

class NoPySpark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ImportError(f"{name} is blocked by the test")
        return None

sys.meta_path.insert(0, NoPySpark())
from operators.cli import main

code = main(sys.argv[1:])
assert not any(m.split(".")[0] == "pyspark" for m in sys.modules)
sys.exit(code)
"""


def aggregate_feed(harness: OperatorHarness, partition: int, batch: int) -> None:
    """Batch ``batch``'s values for the keys Spark hashes to ``partition``."""
    mine = [k for k in KEYS if spark_partition([k], [pa.string()], 2) == partition]
    harness.process_rows([(k, batch * 10 + i) for i, k in enumerate(mine)])


@pytest.fixture
def aggregates(tmp_path: Path) -> Path:
    """RunningAggregate's state on 2 partitions after batches 0..2."""
    return harness_state(tmp_path, RunningAggregate, aggregate_feed)


def run_without_pyspark(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK, *args],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


class TestInspectWithoutSpark:
    def test_metadata_and_rows_where_pyspark_cannot_be_imported(self, aggregates: Path) -> None:
        """`relstate inspect` prints the metadata and a table's rows in a
        process where every import of pyspark fails."""
        proc = run_without_pyspark("inspect", str(aggregates))
        assert proc.returncode == 0, proc.stderr
        assert "batches recorded: 0..2 (latest committed 2" in proc.stdout
        assert f"operator {OPERATOR}" in proc.stdout
        parts = [line.split() for line in proc.stdout.splitlines() if line.startswith("  0 ")]
        assert parts and parts[0][1] == "2" and parts[0][3] == "0..2"
        proc = run_without_pyspark("inspect", str(aggregates), "--table", "aggregates")
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == f"operator {OPERATOR}, table aggregates, latest committed batch: " + (
            f"{len(KEYS)} row(s) shown"
        )
        totals = {line.split()[0]: line.split()[1:] for line in lines[3:]}
        assert totals == {k: ["3", str(sum(b * 10 + i for b in range(3)))] for k, i in _slots()}


def _slots() -> list[tuple[str, int]]:
    """Each key with its place among its partition's keys (its value offset)."""
    out = []
    for p in (0, 1):
        mine = [k for k in KEYS if spark_partition([k], [pa.string()], 2) == p]
        out += [(k, i) for i, k in enumerate(mine)]
    return out


class TestCredentialsNotPrinted:
    def test_inspect_and_errors_redact_the_uri(
        self, aggregates: Path, s3: MotoS3, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A location with KEY:SECRET@ in its URI is printed without them by
        `relstate inspect` and in the errors of the readers and of
        repartition."""
        prefix = f"secret-{uuid.uuid4().hex}"
        s3.upload(aggregates, s3.uri(prefix))
        uri = s3.uri(prefix).replace("test:test@", "AKIDLEAK:SECRETLEAK@")
        assert cli.main(["inspect", uri]) == 0
        out = capsys.readouterr().out
        assert f"state at s3://***@{BUCKET}/{prefix}?endpoint_override=" in out
        assert cli.main(["inspect", uri, "--operator", "nope"]) == 2
        err = capsys.readouterr().err
        assert "holds operators" in err and "s3://***@" in err
        errors = []
        location = StateLocation(uri)
        meta = location.table(OPERATOR, "aggregates")
        for call in (
            lambda: read_rows(location, OPERATOR, meta, 0, batch_id=7),
            lambda: repartition(uri, 2),
            lambda: StateLocation(uri.replace(prefix, "nothing-here")),
        ):
            with pytest.raises(InputError) as info:
                call()
            errors.append(str(info.value))
        for text in [out, err, *errors]:
            assert "AKIDLEAK" not in text and "SECRETLEAK" not in text


class TestJoinSide:
    @pytest.mark.parametrize(
        ("make", "feed", "tables"),
        [
            (streaming_join, join_feed, ("left", "right")),
            (append_join, append_feed, ("left_rows", "right_rows")),
        ],
    )
    def test_each_side_maps_to_its_table(
        self, tmp_path: Path, make: Any, feed: Any, tables: tuple[str, str]
    ) -> None:
        """joinSide=left/right reads a StreamingJoin's left/right table and an
        AppendJoin's left_rows/right_rows."""
        location = StateLocation(str(harness_state(tmp_path, make, feed)))
        name = location.operator(None)
        assert [location.side_table(name, s).name for s in ("left", "right")] == list(tables)

    def test_an_operator_without_sides_is_refused(self, aggregates: Path) -> None:
        """joinSide on an operator that is no join names the tables it has."""
        location = StateLocation(str(aggregates))
        with pytest.raises(InputError, match=r"has tables \['aggregates', '__timers'\], none"):
            location.side_table(OPERATOR, "left")


class TestChangeFeedColumns:
    def test_a_table_column_named_like_a_feed_column_is_refused(self, tmp_path: Path) -> None:
        """A table with a column named partition (or batch_id, change_type)
        has no change feed: a clear error instead of two columns of one name."""
        schema = pa.schema([("k", pa.int64()), ("partition", pa.int32())])

        def feed(harness: OperatorHarness, partition: int, batch: int) -> None:
            harness.process_rows([(partition, batch)])

        state = harness_state(tmp_path, lambda: LatestRow(schema), feed)
        location = StateLocation(str(state))
        meta = location.table("latest", "rows")
        with pytest.raises(InputError, match=r"has column\(s\) \['partition'\], which the change"):
            read_changes(location, "latest", meta, 0, 1)


def reference_changes(
    location: StateLocation, operator: str, table: str, partition: int, start: int, end: int
) -> Counter[tuple[Any, ...]]:
    """The change feed from whole-table reads of each batch and the one
    before (none before the first), compared key by key."""
    meta = location.table(operator, table)
    keys = [meta.columns.get_field_index(n) for n, _, _ in meta.key_columns]

    def state(batch: int) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        if batch < 0:
            return {}
        rows = read_rows(location, operator, meta, partition, batch).to_pylist()
        return {tuple(tuple(r.values())[i] for i in keys): tuple(r.values()) for r in rows}

    out: Counter[tuple[Any, ...]] = Counter()
    for batch in range(start, end + 1):
        before, after = state(batch - 1), state(batch)
        for key, row in after.items():
            if key not in before:
                out[(batch, "insert", partition, *row)] += 1
            elif before[key] != row:
                out[(batch, "update_preimage", partition, *before[key])] += 1
                out[(batch, "update_postimage", partition, *row)] += 1
        for key, row in before.items():
            if key not in after:
                out[(batch, "delete", partition, *row)] += 1
    return out


FEEDS = {
    "join": (streaming_join, join_feed, "left"),
    "evicting_dedup": (evicting_dedup, evicting_feed, "seen"),
    "typed_cells": (lambda: LatestRow(layout="cell"), typed_feed, "rows"),
    "typed_rows": (LatestRow, typed_feed, "rows"),
}


class TestChangeFeed:
    @pytest.mark.parametrize("workload", sorted(FEEDS))
    def test_each_batch_net_change_from_any_start(
        self, tmp_path: Path, workload: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """From batch 0, 1 or 4 to the end, each batch's changes equal the
        comparison of whole-table reads; only the first batch and the batches
        that took a snapshot (no changelog of their own) scan the table."""
        make, feed, table = FEEDS[workload]
        location = StateLocation(str(harness_state(tmp_path, make, feed, batches=7)))
        name = location.operator(None)
        meta = location.table(name, table)
        scanned: list[int | None] = []
        real = _state_read._keyed

        def spy(store: Any, meta: Any) -> Any:
            scanned.append(store.version)
            return real(store, meta)

        monkeypatch.setattr(_state_read, "_keyed", spy)
        for partition in (0, 1):
            snapshots = [
                v
                for v in range(1, 7)
                if not location.commit(name, partition, v).changelogs  # type: ignore[union-attr]
            ]
            assert snapshots  # the harness snapshots every third version
            for start in (0, 1, 4):
                scanned.clear()
                got = read_changes(location, name, meta, partition, start)
                rows = Counter(tuple(r.values()) for r in got.to_pylist())
                assert rows == reference_changes(location, name, table, partition, start, 6)
                full = [0] if start == 0 else []
                full += [x for v in snapshots if v >= max(start, 1) for x in (v - 1, v)]
                assert scanned == full

    def test_a_start_before_the_kept_versions_is_refused(self, aggregates: Path) -> None:
        """When the batch before the start is no longer kept (retention
        removed batch 0), the feed is refused naming the earliest start."""
        location = StateLocation(str(aggregates))
        checkpoint = location.checkpoint(OPERATOR, 1)
        for manifest in (Path(checkpoint.root) / "manifests").glob(f"{0:020d}-*.json"):
            manifest.unlink()
        meta = location.table(OPERATOR, "aggregates")
        kept = r"no longer kept \(partition 1 keeps 1..2\); start at 2"
        with pytest.raises(InputError, match=kept):
            read_changes(location, OPERATOR, meta, 1, 1)
        assert read_changes(location, OPERATOR, meta, 1, 2).num_rows > 0


class TestChangeFeedAcrossRepartition:
    def test_a_feed_that_crosses_the_repartition_is_refused(self, aggregates: Path) -> None:
        """After `relstate repartition` at batch 2, a feed starting at or
        before 2 raises RepartitionedError naming 3 as the earliest start;
        from 3 on, the next batch's changes are read as usual."""
        repartition(str(aggregates), 3)
        location = StateLocation(str(aggregates))
        meta = location.table(OPERATOR, "aggregates")
        for start in (0, 2):
            with pytest.raises(RepartitionedError, match="Start at 3 or later") as info:
                read_changes(location, OPERATOR, meta, 1, start)
            assert info.value.earliest_start == 3
        winners = {}
        schemas = [table_schema(m) for m in location.tables(OPERATOR)]
        for p in range(3):
            with StateStore(location.root, OPERATOR, p, schemas) as store:
                store.load(2)
                store.table("aggregates").upsert((f"new-{p}", 1, p))
                winners[str(p)] = store.commit(3).commit_id
                store.record_winner(3, winners[str(p)])
        record = {"batch_id": 3, "winners": winners, "watermark": None, "metrics": {}}
        (aggregates / "_runner" / "batches" / f"{3:020d}.json").write_text(json.dumps(record))
        got = read_changes(location, OPERATOR, meta, 1, 3).to_pylist()
        assert [(r["batch_id"], r["change_type"], r["key"]) for r in got] == [
            (3, "insert", "new-1")
        ]


class TestMetadata:
    def test_rows_per_table(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Each table's row gives that table's rows in the partition, which
        add up to the partition's rows; inspect prints each table's total."""
        location = StateLocation(str(harness_state(tmp_path, streaming_join, join_feed)))
        found = metadata(location).to_pylist()
        assert {m["status"] for m in found} == {"ok"}
        for m in found:
            meta = location.table("join", m["table"])
            assert m["table_rows"] == read_rows(location, "join", meta, m["partition"]).num_rows
        for p in (0, 1):
            mine = [m for m in found if m["partition"] == p]
            assert sum(m["table_rows"] for m in mine) == mine[0]["partition_rows"]
        lefts = sum(m["table_rows"] for m in found if m["table"] == "left")
        assert lefts > 0
        assert cli.main(["inspect", str(location.root)]) == 0
        assert f"; key k asc, v asc; {lefts} rows\n" in capsys.readouterr().out

    def test_a_partition_without_the_batch_is_marked_not_failed(
        self, aggregates: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Metadata at a batch that one partition no longer keeps gives the
        other partition's rows and one row for that partition saying why;
        inspect prints the same."""
        location = StateLocation(str(aggregates))
        checkpoint = location.checkpoint(OPERATOR, 1)
        for manifest in (Path(checkpoint.root) / "manifests").glob(f"{0:020d}-*.json"):
            manifest.unlink()
        found = metadata(location, batch_id=0).to_pylist()
        assert {(m["partition"], m["table"], m["status"]) for m in found} >= {
            (0, "aggregates", "ok")
        }
        (unread,) = [m for m in found if m["partition"] == 1]
        assert unread["table"] is None and unread["kept_versions"] == [1, 2]
        assert "batch 0 of operator 'running_aggregate' partition 1 is not kept" in unread["status"]
        assert cli.main(["inspect", str(aggregates), "--batch", "0"]) == 0
        out = capsys.readouterr().out
        assert "  partition 1 not read: batch 0 of operator" in out
        assert [line.split()[0] for line in out.splitlines() if line.startswith("  0 ")] == ["0"]

    def test_a_batch_the_runner_did_not_record_raises(self, aggregates: Path) -> None:
        """Metadata at a batch after the runner's latest record raises the
        error reading rows there raises, rather than one row per partition
        saying it was not read."""
        location = StateLocation(str(aggregates))
        meta = location.table(OPERATOR, "aggregates")
        message = "batch 99 is not committed: the runner recorded batches up to 2"
        with pytest.raises(InputError, match=message):
            read_rows(location, OPERATOR, meta, 0, batch_id=99)
        with pytest.raises(InputError, match=message):
            metadata(location, batch_id=99)


class TestInspectOutput:
    def test_a_directory_without_state_is_refused(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`relstate inspect` on a directory relstate did not write (a demo
        directory: a checkpoint and an output beside it; an empty one) says
        there is no relstate state, names a checkpoint inside it, and exits
        2, with or without --table."""
        (tmp_path / "demo" / "checkpoint" / "state").mkdir(parents=True)
        (tmp_path / "demo" / "output" / "batch=0").mkdir(parents=True)
        (tmp_path / "empty").mkdir()
        for args, says in (
            (["demo"], "only directories ['checkpoint', 'output']"),
            (["demo", "--table", "rows"], "its directory 'checkpoint' is one: give that"),
            (["empty"], "it holds nothing"),
        ):
            assert cli.main(["inspect", str(tmp_path / args[0]), *args[1:]]) == 2
            captured = capsys.readouterr()
            assert captured.out == ""
            assert "there is no relstate state at" in captured.err and says in captured.err

    def test_harness_and_inspect_print_no_log_lines_by_default(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """By default the harness's state commits and inspect's reads print no
        log lines: stdout holds only inspect's own output, stderr nothing."""
        monkeypatch.delenv("RELSTATE_LOG", raising=False)
        schema = pa.schema([("k", pa.int64()), ("name", pa.string())])

        def feed(harness: OperatorHarness, partition: int, batch: int) -> None:
            harness.process_rows([(1, "a")])

        state = harness_state(tmp_path, lambda: LatestRow(schema), feed, 2, 2, [["bigint"]])
        assert capsys.readouterr() == ("", "")
        assert cli.main(["inspect", str(state), "--table", "rows"]) == 0
        captured = capsys.readouterr()
        assert "state_store" not in captured.out
        assert captured.err == ""

    def test_rows_print_null_as_null(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A null prints as `null` in a table's rows, an empty string as
        nothing: the two no longer look alike."""
        schema = pa.schema([("k", pa.int64()), ("name", pa.string())])

        def feed(harness: OperatorHarness, partition: int, batch: int) -> None:
            harness.process_rows([(1, None), (2, ""), (3, "x")])

        state = harness_state(tmp_path, lambda: LatestRow(schema), feed, 1, 1, [["bigint"]])
        assert capsys.readouterr() == ("", "")  # the harness logs nothing by default
        assert cli.main(["inspect", str(state), "--table", "rows"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split() for line in lines[3:]] == [["1", "null"], ["2"], ["3", "x"]]
