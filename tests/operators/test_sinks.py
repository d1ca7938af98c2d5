"""ParquetSink's staged parts: what the runner's tasks write and the driver publishes."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from operators._spark.sinks import ParquetSink
from operators.typing import StagedSink

SCHEMA = pa.schema([("key", pa.int64()), ("row_kind", pa.string())])


def _rows(*keys: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(keys, pa.int64()), pa.array(["+I"] * len(keys))], SCHEMA)


def _published(sink: ParquetSink, batch_id: int) -> list[int]:
    table = pq.read_table(sink.batch_dir(batch_id))
    return sorted(table.column("key").to_pylist())


class TestParquetSinkParts:
    def test_only_the_named_parts_are_published(self, tmp_path: Path) -> None:
        """Two attempts of partition 0 write parts; publishing the winner's
        leaves the loser's rows out of the batch."""
        sink = ParquetSink(str(tmp_path / "out"))
        assert isinstance(sink, StagedSink)
        staging = sink.stage(4)
        sink.write_part(staging, 0, SCHEMA, [_rows(1, 2)])  # the losing attempt
        winner = sink.write_part(staging, 0, SCHEMA, [_rows(1), _rows(2, 3)])
        other = sink.write_part(staging, 1, SCHEMA, [_rows(10)])
        sink.publish(staging, [winner, other], 4)
        assert _published(sink, 4) == [1, 2, 3, 10]
        assert len(list(Path(sink.batch_dir(4)).iterdir())) == 2

    def test_a_zombie_part_written_after_publishing_stays_out(self, tmp_path: Path) -> None:
        """A part a late attempt writes into the staging area after the batch
        was published never reaches the batch's output."""
        sink = ParquetSink(str(tmp_path / "out"))
        staging = sink.stage(0)
        part = sink.write_part(staging, 0, SCHEMA, [_rows(1)])
        sink.publish(staging, [part], 0)
        sink.write_part(staging, 0, SCHEMA, [_rows(99)])
        assert _published(sink, 0) == [1]

    def test_a_batch_run_again_replaces_its_output(self, tmp_path: Path) -> None:
        """Publishing a batch again (it ran again) replaces its earlier output."""
        sink = ParquetSink(str(tmp_path / "out"))
        for keys in ((1, 2), (1, 2, 3)):
            staging = sink.stage(7)
            sink.publish(staging, [sink.write_part(staging, 0, SCHEMA, [_rows(*keys)])], 7)
        assert _published(sink, 7) == [1, 2, 3]

    def test_an_empty_part_keeps_the_schema(self, tmp_path: Path) -> None:
        """A task with no output rows still writes a part with the schema, so
        a batch with no output reads as zero rows, not as no data."""
        sink = ParquetSink(str(tmp_path / "out"))
        staging = sink.stage(0)
        sink.publish(staging, [sink.write_part(staging, 0, SCHEMA, [_rows()])], 0)
        table = pq.read_table(sink.batch_dir(0))
        assert table.num_rows == 0
        assert table.schema.names == SCHEMA.names
