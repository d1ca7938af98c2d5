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
import pytest

from encoding import TableSchema
from operators import _repartition
from operators._repartition import repartition
from operators._spark_hash import spark_partition
from operators._state_location import StateLocation
from operators._state_read import read_rows
from operators._task import TIMERS
from operators.errors import InputError
from statestore import StateStore, StoreConfig

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
    state = root / "checkpoint" / "state"
    winners = {}
    for p in range(partitions):
        config = StoreConfig(local_dir=str(root / "local"), partition_count=partitions)
        with StateStore(str(state), OPERATOR, p, TABLES, config) as store:
            store.load(None)
            for name, table_rows in rows.items():
                for row in table_rows:
                    at = (
                        place(row) if place else spark_partition([row[0]], [pa.int64()], partitions)
                    )
                    if at == p:
                        store.table(name).insert(row)
            info = store.commit(0)
            store.record_winner(0, info.commit_id)
            winners[str(p)] = info.commit_id
    runner = state / "_runner"
    (runner / "batches").mkdir(parents=True)
    query = {"operator": OPERATOR, "partitions": partitions, "key_types": [key_types]}
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


def all_rows(checkpoint: str, table: TableSchema) -> dict[int, list[tuple[Any, ...]]]:
    location = StateLocation(checkpoint)
    meta = location.table(OPERATOR, table.name)
    return {
        p: [tuple(r.values()) for r in read_rows(location, OPERATOR, meta, p).to_pylist()]
        for p in location.partitions(OPERATOR)
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
        assert location.query() == {
            "operator": OPERATOR,
            "partitions": new,
            "key_types": [["bigint"]],
        }
        record = location.record(0)
        assert record is not None and sorted(record.winners) == list(range(new))
        assert record.watermark == 7
        assert Path(result.backup).is_dir()

    def test_an_interrupted_run_finishes(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Killed after the old state moved aside and before the new one moved
        in, the command run again finishes the move."""
        rows = _rows(seed=3)
        checkpoint = write_state(tmp_path, 2, rows, ["bigint"])
        real = _repartition._move
        calls: list[str] = []

        def failing(fs: Any, src: str, dst: str) -> None:
            calls.append(src)
            if len(calls) == 2:
                raise OSError("killed")
            real(fs, src, dst)

        monkeypatch.setattr(_repartition, "_move", failing)
        with pytest.raises(OSError, match="killed"):
            repartition(checkpoint, 3)
        assert not (tmp_path / "checkpoint" / "state").exists()
        monkeypatch.setattr(_repartition, "_move", real)
        repartition(checkpoint, 3)
        found = all_rows(checkpoint, TOTALS)
        assert sorted(found) == [0, 1, 2]
        assert sorted(r for part in found.values() for r in part) == rows["totals"]


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

    def test_a_row_outside_its_hash_partition(self, tmp_path: Path) -> None:
        """State not partitioned by its leading key (all rows in partition 0)
        is refused rather than scattered wrongly."""
        checkpoint = write_state(tmp_path, 2, _rows(seed=6), ["bigint"], place=lambda r: 0)
        with pytest.raises(InputError, match="not partitioned by its leading"):
            repartition(checkpoint, 3)
