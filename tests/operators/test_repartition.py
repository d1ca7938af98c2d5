"""`relstate repartition` without Spark, on state written the way the runner
writes it: rows move to the partition Spark's hash gives them, the runner's
records follow, an interrupted run finishes, and what cannot be repartitioned
is refused with a clear error."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from encoding import TableSchema
from operators import cli
from operators._checkpoint.journal import QueryShape, StageShape
from operators._checkpoint.location import StateLocation
from operators._checkpoint.read import read_rows
from operators._engine.spark_hash import spark_partition
from operators._engine.task import TIMERS, state_tables
from operators._tools import repartition as _repartition
from operators._tools.repartition import repartition
from operators.dedup import DropDuplicates, DropDuplicatesWithinWatermark
from operators.errors import InputError
from operators.join import AppendJoin, StreamingJoin, TimeRange
from operators.join._append_state import FLOORS
from statestore import StateStore, StoreConfig
from statestore._metadata import TableMeta
from tests._s3 import MotoS3

OPERATOR = "by_user"
EVENTS = TableSchema(
    1,
    pa.schema([("user", pa.int64()), ("seq", pa.int32()), ("amount", pa.float64())]),
    ["user", "seq"],
    name="events",
)
TOTALS = TableSchema(
    2, pa.schema([("user", pa.int64()), ("total", pa.float64())]), ["user"], name="totals"
)
TABLES = [EVENTS, TOTALS, TIMERS]


def _rows(seed: int) -> dict[str, list[tuple[Any, ...]]]:
    rng = random.Random(seed)
    events = {(rng.randint(-(10**12), 10**12), rng.randint(0, 5)) for _ in range(300)}
    rows = [(u, s, rng.uniform(0, 100)) for u, s in sorted(events)]
    totals: dict[int, float] = {}
    for u, _, amount in rows:
        totals[u] = totals.get(u, 0.0) + amount
    return {"events": rows, "totals": sorted(totals.items())}


def write_state(
    root: Path,
    partitions: int,
    rows: dict[str, list[tuple[Any, ...]]],
    key_types: list[str],
    place: Any = None,
) -> str:
    """Commit ``rows`` as batch 0 of a query on ``partitions`` partitions,
    each row in the partition of its ``user`` (or ``place(row)``), with the
    runner's query and batch records."""

    def at(row: tuple[Any, ...]) -> int:
        return place(row) if place else spark_partition([row[0]], [pa.int64()], partitions)

    per_partition = [
        {name: [r for r in table_rows if at(r) == p] for name, table_rows in rows.items()}
        for p in range(partitions)
    ]
    return commit_state(root, OPERATOR, TABLES, per_partition, key_types)


def commit_state(
    root: Path,
    operator: str,
    tables: list[TableSchema],
    per_partition: list[dict[str, list[tuple[Any, ...]]]],
    key_types: list[str],
) -> str:
    """Commit each partition's rows as batch 0 of ``operator``, as the runner
    would, with its query and batch records; the checkpoint's path."""
    state = root / "checkpoint" / "state"
    winners = {}
    partitions = len(per_partition)
    for p, rows in enumerate(per_partition):
        config = StoreConfig(local_dir=str(root / "local"), partition_count=partitions)
        with StateStore(str(state), operator, p, tables, config) as store:
            store.load(None)
            for name, table_rows in rows.items():
                for row in table_rows:
                    store.table(name).insert(row)
            info = store.commit(0)
            store.record_winner(0, info.commit_id)
            winners[str(p)] = info.commit_id
    runner = state / "_runner"
    (runner / "batches").mkdir(parents=True)
    query = {"operator": operator, "partitions": partitions, "key_types": [key_types]}
    (runner / "query.json").write_text(json.dumps(query))
    record = {
        "batch_id": 0,
        "winners": winners,
        "watermark": 7,
        "max_event_time": {"0": 9},
        "metrics": {"numOutputRows": 3},
    }
    (runner / "batches" / f"{0:020d}.json").write_text(json.dumps(record))
    return str(root / "checkpoint")


def all_rows(
    checkpoint: str, table: TableSchema, operator: str = OPERATOR
) -> dict[int, list[tuple[Any, ...]]]:
    location = StateLocation(checkpoint)
    meta = location.table(operator, table.name)
    return {
        p: [tuple(r.values()) for r in read_rows(location, operator, meta, p).to_pylist()]
        for p in location.partitions(operator)
    }


class TestRepartition:
    @pytest.mark.parametrize(("old", "new"), [(2, 5), (5, 2), (3, 1)])
    def test_rows_move_to_their_hash_partition(self, tmp_path: Path, old: int, new: int) -> None:
        """Every row of every table ends in the partition of its key under the
        new count, none lost or doubled, and the runner's records name the new
        commits with the batch's watermark kept."""
        rows = _rows(seed=old * 10 + new)
        checkpoint = write_state(tmp_path, old, rows, ["bigint"])
        result = repartition(checkpoint, new)
        assert result.rows == {"events": len(rows["events"]), "totals": len(rows["totals"])}
        for table in (EVENTS, TOTALS):
            found = all_rows(checkpoint, table)
            assert sorted(found) == list(range(new))
            for p, part in found.items():
                assert all(spark_partition([r[0]], [pa.int64()], new) == p for r in part)
            assert sorted(r for part in found.values() for r in part) == rows[table.name]
        location = StateLocation(checkpoint)
        assert location.query() == QueryShape((StageShape(OPERATOR, ("bigint",)),), new)
        record = location.record(0)
        assert record is not None and sorted(record.winners_of(OPERATOR)) == list(range(new))
        assert record.watermark == 7
        assert Path(result.backup).is_dir()

    def test_each_repartition_keeps_its_own_backup(self, tmp_path: Path) -> None:
        """Repartitioning again before the next batch (2 to 3, 3 to 2, 2 to 3)
        keeps every earlier backup: the first still holds the original state."""
        rows = _rows(seed=8)
        checkpoint = write_state(tmp_path, 2, rows, ["bigint"])
        backups = [repartition(checkpoint, n).backup for n in (3, 2, 3)]
        assert len(set(backups)) == 3
        assert all(Path(b).is_dir() for b in backups)
        first = StateLocation(backups[0])
        shape = first.query()
        assert shape is not None and shape.partitions == 2
        assert first.partitions(OPERATOR) == [0, 1]
        found = all_rows(backups[0], TOTALS)
        assert sorted(r for part in found.values() for r in part) == rows["totals"]


def _check_finished(
    checkpoint: str, rows: dict[str, list[tuple[Any, ...]]], new: int, backup_at: str | None = None
) -> None:
    """The state holds ``rows`` on ``new`` partitions, no staging or journal
    is left, and one backup holds the original 2 partitions."""
    for table in (EVENTS, TOTALS):
        found = all_rows(checkpoint, table)
        assert sorted(found) == list(range(new))
        assert sorted(r for part in found.values() for r in part) == rows[table.name]
    state = StateLocation(checkpoint).root
    fs, _ = StateLocation.resolve_root(checkpoint)
    assert not _repartition._exists(fs, f"{state}.repartition")
    assert not _repartition._exists(fs, f"{state}.repartition.json")
    backup = StateLocation(backup_at or f"{state}.before-repartition-0-2-to-{new}")
    assert backup.partitions(OPERATOR) == [0, 1]
    kept = sum(
        read_rows(backup, OPERATOR, backup.table(OPERATOR, "totals"), p).num_rows for p in (0, 1)
    )
    assert kept == len(rows["totals"])


class TestInterrupted:
    @pytest.mark.parametrize("step", ["kept", "cleared", "installed"])
    def test_a_run_killed_before_a_step_is_recorded_finishes(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
    ) -> None:
        """Killed after a swap step's work and before the journal records it,
        the command run again finishes the swap with nothing lost."""
        rows = _rows(seed=3)
        checkpoint = write_state(tmp_path, 2, rows, ["bigint"])
        real = _repartition._step

        def killed(fs: Any, journal: str, summary: dict[str, Any], at: str) -> None:
            if at == step:
                raise OSError("killed")
            real(fs, journal, summary, at)

        monkeypatch.setattr(_repartition, "_step", killed)
        with pytest.raises(OSError, match="killed"):
            repartition(checkpoint, 3)
        monkeypatch.setattr(_repartition, "_step", real)
        messages: list[str] = []
        result = repartition(checkpoint, 3, progress=messages.append)
        assert messages == ["finishing an interrupted repartition"]
        assert result.rows == {"events": len(rows["events"]), "totals": len(rows["totals"])}
        _check_finished(checkpoint, rows, 3)

    def test_a_run_killed_while_staging_starts_over(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Killed while writing the new state (no journal yet), the old state is
        untouched and the command run again starts over."""
        rows = _rows(seed=9)
        checkpoint = write_state(tmp_path, 2, rows, ["bigint"])
        real = _repartition.scan_chunks

        def killed(*args: Any) -> Any:
            if args[2] == 1:
                raise OSError("killed")
            return real(*args)

        monkeypatch.setattr(_repartition, "scan_chunks", killed)
        with pytest.raises(OSError, match="killed"):
            repartition(checkpoint, 3)
        assert StateLocation(checkpoint).partitions(OPERATOR) == [0, 1]
        monkeypatch.setattr(_repartition, "scan_chunks", real)
        repartition(checkpoint, 3)
        _check_finished(checkpoint, rows, 3)

    @pytest.mark.parametrize("target", ["backup", "install"])
    def test_on_s3_a_partial_copy_is_redone(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: MotoS3, target: str
    ) -> None:
        """On S3 (moves are copies and deletes), a run killed halfway through
        copying the old state to its backup, or the new state into place,
        leaves a partial tree; the command run again replaces it and finishes."""
        rows = _rows(seed=12)
        local = write_state(tmp_path, 2, rows, ["bigint"])
        uri = s3.uri()
        s3.upload(Path(local) / "state", uri)
        real = _repartition._copy_tree

        def partial(fs: Any, src: str, dst: str) -> None:
            real(fs, src, dst)
            if dst.endswith(".before-repartition-0-2-to-3") == (target == "backup"):
                files = fs.get_file_info(pafs.FileSelector(dst, recursive=True))
                for info in files[: len(files) // 2]:
                    if info.type == pafs.FileType.File:
                        fs.delete_file(info.path)
                raise OSError("killed")

        monkeypatch.setattr(_repartition, "_copy_tree", partial)
        with pytest.raises(OSError, match="killed"):
            repartition(uri, 3)
        monkeypatch.setattr(_repartition, "_copy_tree", real)
        repartition(uri, 3)
        prefix = uri.split("/")[3].split("?")[0]
        _check_finished(uri, rows, 3, s3.uri(f"{prefix}.before-repartition-0-2-to-3"))


class TestBoundedMemory:
    def test_rows_stream_in_chunks_and_new_stores_spill(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With chunk_rows=7, no old partition is read more than 7 rows at a
        time, the new stores spill (their commits' changelogs come in
        parts), and every row still lands once in its partition."""
        rows = _rows(seed=14)
        checkpoint = write_state(tmp_path, 2, rows, ["bigint"])
        real = _repartition.scan_chunks
        chunks: list[int] = []

        def spy(*args: Any) -> Any:
            for meta, chunk in real(*args):
                chunks.append(len(chunk))
                yield meta, chunk

        monkeypatch.setattr(_repartition, "scan_chunks", spy)
        result = repartition(checkpoint, 3, chunk_rows=7)
        assert max(chunks) == 7 and sum(chunks) == len(rows["events"]) + len(rows["totals"])
        assert result.rows == {"events": len(rows["events"]), "totals": len(rows["totals"])}
        state = tmp_path / "checkpoint" / "state" / OPERATOR
        for p in range(3):
            assert sorted((state / str(p) / "changelogs").glob("*-p000001.log"))
        for table in (EVENTS, TOTALS):
            found = all_rows(checkpoint, table)
            for p, part in found.items():
                assert all(spark_partition([r[0]], [pa.int64()], 3) == p for r in part)
            assert sorted(r for part in found.values() for r in part) == rows[table.name]


class TestRunningQuery:
    def test_a_version_after_the_last_record_is_refused_unless_forced(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A partition that committed batch 1 while the runner recorded only
        batch 0 (a batch in flight, or failed) is refused, naming --force,
        and nothing changes; with --force the recorded batch 0 is
        repartitioned and batch 1's attempt is left in the backup."""
        rows = _rows(seed=15)
        checkpoint = write_state(tmp_path, 2, rows, ["bigint"])
        location = StateLocation(checkpoint)
        with StateStore(location.root, OPERATOR, 1, TABLES) as store:
            store.load(0)
            store.table("totals").insert((10**13, 1.0))
            store.commit(1)
        assert cli.main(["repartition", checkpoint, "--partitions", "3"]) == 2
        err = capsys.readouterr().err
        assert "partition 1 of operator 'by_user'" in err
        assert "has version(s) [1] after batch 0" in err and "--force" in err
        assert location.partitions(OPERATOR) == [0, 1]
        assert not (tmp_path / "checkpoint" / "state.repartition").exists()
        assert cli.main(["repartition", checkpoint, "--partitions", "3", "--force"]) == 0
        _check_finished(checkpoint, rows, 3)


class TestRefusals:
    def test_pending_timers(self, tmp_path: Path) -> None:
        """A partition with pending timers is refused: a timer's key does not
        say which partition it belongs to."""
        rows = {**_rows(seed=4), "__timers": [(0, 1000, "anything")]}

        def place(row: tuple[Any, ...]) -> int:
            if row[-1] == "anything":
                return 0
            return spark_partition([row[0]], [pa.int64()], 2)

        checkpoint = write_state(tmp_path, 2, rows, ["bigint"], place=place)
        with pytest.raises(InputError, match="pending timer"):
            repartition(checkpoint, 3)
        assert (tmp_path / "checkpoint" / "state").is_dir()

    def test_key_types_must_lead_every_table(self, tmp_path: Path) -> None:
        """A query keyed by a string cannot have tables led by a bigint."""
        checkpoint = write_state(tmp_path, 2, _rows(seed=5), ["string"])
        with pytest.raises(InputError, match="leading primary-key columns"):
            repartition(checkpoint, 3)

    def test_a_manifest_that_does_not_record_partitioning(self) -> None:
        """A table from a manifest written before relstate recorded how rows map
        to the query's key is refused, with the way out (run one batch)."""
        obj = TableMeta.of(TOTALS).to_json()
        del obj["partition_by"]
        with pytest.raises(InputError, match="one batch with this relstate"):
            _repartition._placements([TableMeta.from_json(obj)], ["bigint"])

    def test_a_pipeline_record_that_does_not_name_its_stages(self, tmp_path: Path) -> None:
        """A query record (the format before pipelines) that names two stages
        but one key is refused: no stage's key is guessed."""
        checkpoint = write_state(tmp_path, 2, _rows(seed=13), ["bigint"])
        runner = tmp_path / "checkpoint" / "state" / "_runner"
        query = json.loads((runner / "query.json").read_text())
        (runner / "query.json").write_text(json.dumps({**query, "operator": f"{OPERATOR}+b"}))
        record_path = runner / "batches" / f"{0:020d}.json"
        record = json.loads(record_path.read_text())
        staged = {**record, "winners": {}, "stage_winners": {OPERATOR: record["winners"]}}
        record_path.write_text(json.dumps(staged))
        with pytest.raises(InputError, match="cannot tell each stage's key"):
            repartition(checkpoint, 3)
        assert json.loads(record_path.read_text()) == staged

    def test_a_query_of_keyless_stages_only(self, tmp_path: Path) -> None:
        """A query whose one stage is keyless (one partition whatever the
        query's count) has nothing to repartition: refused, nothing written."""
        checkpoint = commit_state(tmp_path, OPERATOR, TABLES, [_rows(seed=14)], [])
        with pytest.raises(InputError, match=r"is keyless: .* nothing to repartition"):
            repartition(checkpoint, 3)
        assert not (tmp_path / "checkpoint" / "state.repartition").exists()
        assert StateLocation(checkpoint).partitions(OPERATOR) == [0]

    def test_a_row_outside_its_hash_partition(self, tmp_path: Path) -> None:
        """State not partitioned by its leading key (all rows in partition 0)
        is refused rather than scattered wrongly."""
        checkpoint = write_state(tmp_path, 2, _rows(seed=6), ["bigint"], place=lambda r: 0)
        with pytest.raises(InputError, match="not partitioned by the columns it declares"):
            repartition(checkpoint, 3)


EVENTS_IN = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("us")), ("v", pa.int64())])


def _hashed(k: int, n: int) -> int:
    return spark_partition([k], [pa.int64()], n)


def _keyed_state(
    old: int, keyed: dict[str, list[tuple[Any, ...]]], key_at: dict[str, int]
) -> list[dict[str, list[tuple[Any, ...]]]]:
    """Each table's rows in the partition of the query key at ``key_at``."""
    return [
        {
            name: [r for r in rows if _hashed(r[key_at[name]], old) == p]
            for name, rows in keyed.items()
        }
        for p in range(old)
    ]


def _key_placement(checkpoint: str, operator: Any, name: str, key_at: int) -> list[int]:
    """Per row of table ``name``: 0 when it is in the partition of its key."""
    table = next(t for t in operator.tables if t.name == name)
    found = all_rows(checkpoint, table, operator.name)
    return [abs(p - _hashed(r[key_at], len(found))) for p, part in found.items() for r in part]


class TestOperatorTables:
    @pytest.mark.parametrize("old", [1, 2])
    def test_dedup_expiry_index_moves_by_its_key_not_its_time(
        self, tmp_path: Path, old: int
    ) -> None:
        """DropDuplicatesWithinWatermark's expiry index, keyed (expires_at, k),
        moves by k like the rows it expires, also from one partition (where no
        row can be seen to be misplaced)."""
        op = DropDuplicatesWithinWatermark(EVENTS_IN, ["k"], event_time="ts", delay_ms=100)
        keys = range(-40, 40)
        seen = [(k, 1_000 + k) for k in keys]
        expiry = [(1_000 + k, k) for k in keys]
        key_at = {"seen": 0, "expiry": 1}
        per = _keyed_state(old, {"seen": seen, "expiry": expiry}, key_at)
        checkpoint = commit_state(tmp_path, op.name, state_tables(op), per, ["bigint"])
        result = repartition(checkpoint, 3)
        assert result.rows == {"seen": 80, "expiry": 80}
        for name, at in key_at.items():
            placed = _key_placement(checkpoint, op, name, at)
            assert len(placed) == 80 and not any(placed)

    def test_drop_duplicates_with_eviction_moves_by_its_key(self, tmp_path: Path) -> None:
        """DropDuplicates over (k, ts) with eviction keys its rows event time
        first; they move by k."""
        op = DropDuplicates(EVENTS_IN, ["k", "ts"], event_time="ts")
        seen = [(1_000 * k, k) for k in range(-30, 30)]
        per = _keyed_state(1, {"seen": seen}, {"seen": 1})
        checkpoint = commit_state(tmp_path, op.name, state_tables(op), per, ["bigint"])
        repartition(checkpoint, 3)
        placed = _key_placement(checkpoint, op, "seen", 1)
        assert len(placed) == 60 and not any(placed)

    def test_append_join_rows_by_key_and_least_floor_everywhere(self, tmp_path: Path) -> None:
        """AppendJoin's rows, keyed by time first, move by their join key,
        and every new partition gets, per side, the least floor of the old
        partitions (a lower bound of every time it now stores), so eviction
        still finds every old row."""
        op = AppendJoin(
            EVENTS_IN,
            EVENTS_IN,
            ["k"],
            ["k"],
            "ts",
            "ts",
            TimeRange(1_000, 1_000),
            right_prefix="r_",
        )
        # rows: (__t, __seq, k, ts, v, __matched), keyed (__t, k, __seq)
        rows = {
            "left_rows": [(100 + k, 5, k, None, k, False) for k in range(20)],
            "right_rows": [(200 + k, 6, k, None, k, True) for k in range(10, 30)],
        }
        key_at = {"left_rows": 2, "right_rows": 2}
        per = _keyed_state(2, rows, key_at)
        per[0]["floors"] = [(0, 100), (1, 250)]
        per[1]["floors"] = [(0, 103), (1, 210)]
        checkpoint = commit_state(tmp_path, op.name, state_tables(op), per, ["bigint"])
        result = repartition(checkpoint, 3)
        assert result.rows["floors"] == 6
        for name, at in key_at.items():
            placed = _key_placement(checkpoint, op, name, at)
            assert len(placed) == 20 and not any(placed)
        floors = all_rows(checkpoint, FLOORS, op.name)
        assert floors == {p: [(0, 100), (1, 210)] for p in range(3)}

    def test_join_ttl_sweeps_get_the_earliest_old_sweep(self, tmp_path: Path) -> None:
        """StreamingJoin's ttl_sweeps (per side, not per key): every new
        partition sweeps at the earliest time an old partition would have."""
        op = StreamingJoin(
            "inner",
            EVENTS_IN,
            EVENTS_IN,
            ["k"],
            ["k"],
            left_ttl_ms=60_000,
            right_ttl_ms=60_000,
            right_prefix="r_",
        )
        left = [(k, None, k, 1, 7) for k in range(30)]
        per = _keyed_state(2, {"left": left}, {"left": 0})
        per[0]["ttl_sweeps"] = [(0, 5_000), (1, 9_000)]
        per[1]["ttl_sweeps"] = [(0, 6_000), (1, 8_000)]
        checkpoint = commit_state(tmp_path, op.name, state_tables(op), per, ["bigint"])
        repartition(checkpoint, 3)
        placed = _key_placement(checkpoint, op, "left", 0)
        assert len(placed) == 30 and not any(placed)
        sweeps = next(t for t in op.tables if t.name == "ttl_sweeps")
        found = all_rows(checkpoint, sweeps, op.name)
        assert found == {p: [(0, 5_000), (1, 8_000)] for p in range(3)}
