"""The batch journal: the one reader and writer of the runner's records."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from encoding import TableSchema
from operators import InputError
from operators._checkpoint.journal import BatchRecord, Journal, QueryShape, StageShape
from statestore import PartitionCheckpoint, StateStore, StoreConfig, WinnerConflictError


def _journal(tmp_path: Path) -> Journal:
    return Journal(pafs.LocalFileSystem(), str(tmp_path / "state"))


SHAPE = QueryShape((StageShape("join", ("bigint",)), StageShape("revenue", ("string",))), 3)


class TestJournal:
    def test_record_round_trip(self, tmp_path: Path) -> None:
        """A record written is read back equal: every stage's winners,
        watermarks, event times and metrics."""
        journal = _journal(tmp_path)
        journal.write_shape(SHAPE)
        record = BatchRecord(
            4,
            {"join": {0: "a", 1: "b"}, "revenue": {0: "c"}},
            watermark=10,
            stage_watermarks={"join": 10, "revenue": 5},
            max_event_time={"orders": 20},
            metrics={"join": {"numOutputRows": 3}},
        )
        journal.write(record)
        assert journal.record(4) == record
        assert journal.batches() == [4] and journal.latest() == 4
        assert journal.previous(5) == record and journal.previous(4) is None

    def test_records_before_pipelines_read_as_one_format(self, tmp_path: Path) -> None:
        """A record of one operator (flat winners and metrics) and one of a
        pipeline (stage_winners, metrics under stage.name) read as records
        with winners and metrics per stage."""
        journal = _journal(tmp_path)
        runner = tmp_path / "state" / "_runner"
        (runner / "batches").mkdir(parents=True)
        (runner / "query.json").write_text(
            json.dumps({"operator": "agg", "partitions": 2, "key_types": [["string"]]})
        )
        (runner / "batches" / f"{0:020d}.json").write_text(
            json.dumps(
                {
                    "batch_id": 0,
                    "winners": {"0": "x"},
                    "watermark": 3,
                    "max_event_time": {},
                    "metrics": {"numOutputRows": 2},
                }
            )
        )
        assert journal.shape() == QueryShape((StageShape("agg", ("string",)),), 2)
        old = journal.record(0)
        assert old is not None
        assert old.winners == {"agg": {0: "x"}} and old.metrics == {"agg": {"numOutputRows": 2}}
        (runner / "batches" / f"{1:020d}.json").write_text(
            json.dumps(
                {
                    "batch_id": 1,
                    "winners": {},
                    "watermark": None,
                    "max_event_time": {},
                    "stage_winners": {"a": {"0": "y"}, "b": {"0": "z"}},
                    "metrics": {"a.numOutputRows": 1, "b.numOutputRows": 2, "numOutputRows": 2},
                }
            )
        )
        staged = journal.record(1)
        assert staged is not None and staged.winners == {"a": {0: "y"}, "b": {0: "z"}}
        assert staged.metrics == {"a": {"numOutputRows": 1}, "b": {"numOutputRows": 2}}

    def test_a_query_of_another_shape_is_refused(self, tmp_path: Path) -> None:
        """Binding a shape with other stages, partitions or key types than
        the recorded one is an InputError naming what changed."""
        journal = _journal(tmp_path)
        journal.bind_shape(SHAPE)
        journal.bind_shape(SHAPE)
        with pytest.raises(InputError, match="partitions 3"):
            journal.bind_shape(QueryShape(SHAPE.stages, 4))
        with pytest.raises(InputError, match="key types"):
            journal.bind_shape(QueryShape((StageShape("join", ("int",)), SHAPE.stages[1]), 3))
        with pytest.raises(InputError, match="stages"):
            journal.bind_shape(QueryShape(SHAPE.stages[:1], 3))

    def test_stage_partitions_are_recorded_and_older_shapes_still_read(
        self, tmp_path: Path
    ) -> None:
        """The query record gives each stage its partition count (the
        query's for a keyed stage, 1 for a keyless one); a record without
        per-stage counts reads as the query's count for every stage, and one
        whose counts contradict the stages' keys is refused; a keyed stage
        made keyless is refused at start."""
        journal = _journal(tmp_path)
        shape = QueryShape((StageShape("agg", ("bigint",)), StageShape("top", ())), 4)
        journal.bind_shape(shape)
        written = json.loads((tmp_path / "state" / "_runner" / "query.json").read_text())
        assert [s["partitions"] for s in written["stages"]] == [4, 1]
        assert journal.shape() == shape and shape.stage_partitions() == {"agg": 4, "top": 1}
        with pytest.raises(InputError, match=r"key types \[\['bigint'\], \[\]\]"):
            journal.bind_shape(QueryShape((shape.stages[0], StageShape("top", ("bigint",))), 4))
        for stage in written["stages"]:
            del stage["partitions"]
        older = QueryShape.from_json(written)
        assert older == shape
        written["stages"][1]["partitions"] = 4
        with pytest.raises(InputError, match=r"'top' 4 partitions .* a keyless stage has 1"):
            QueryShape.from_json(written)

    def test_prune_keeps_the_newest_records(self, tmp_path: Path) -> None:
        """Pruning keeps the newest N records (and their start times) and
        deletes the rest."""
        journal = _journal(tmp_path)
        for batch in range(6):
            journal.processing_time(batch)
            journal.write(BatchRecord(batch, {"s": {0: "c"}}))
        assert journal.prune(2) == 4
        assert journal.batches() == [4, 5]
        left = sorted(p.name for p in (tmp_path / "state" / "_runner" / "batches").iterdir())
        assert left == [f"{b:020d}{s}" for b in (4, 5) for s in (".json", ".start")]

    def test_processing_time_is_recorded_once(self, tmp_path: Path) -> None:
        """A batch that runs again gets the processing time of its first run."""
        journal = _journal(tmp_path)
        first = journal.processing_time(7)
        assert journal.processing_time(7) == first

    def test_winners_are_recorded_for_every_partition(self, tmp_path: Path) -> None:
        """record_winners names each stage partition's winning commit in its
        checkpoint (what a reader that names no commit loads), again without
        harm, and raises when a partition already names another commit."""
        journal = _journal(tmp_path)
        table = TableSchema(1, pa.schema([("k", pa.int64())]), ["k"], name="t")
        config = StoreConfig(partition_count=3)
        winners: dict[str, dict[int, str]] = {}
        for stage in ("join", "revenue"):
            for partition in range(3):
                store = StateStore(journal.root, stage, partition, [table], config)
                store.load(None)
                winners.setdefault(stage, {})[partition] = store.commit(0).commit_id
                store.close()
        record = BatchRecord(0, winners, watermark=None, stage_watermarks={}, max_event_time={})
        journal.record_winners(record)
        journal.record_winners(record)
        for stage, by_partition in winners.items():
            for partition, commit_id in by_partition.items():
                checkpoint = PartitionCheckpoint(journal.root, stage, partition)
                assert checkpoint.winner(0) == commit_id
        store = StateStore(journal.root, "revenue", 1, [table], config)
        store.load(None)
        other = store.commit(0).commit_id
        store.close()
        conflicting = {**winners, "revenue": {**winners["revenue"], 1: other}}
        with pytest.raises(WinnerConflictError):
            journal.record_winners(replace(record, winners=conflicting))
