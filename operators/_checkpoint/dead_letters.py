"""The dead-letter table: the rows stages set aside (``bad_rows="set_aside"``).

Parquet under the state location (``<state>/dead-letters``, or a directory
the ``dead_letters`` option names): one file per batch and stage, written by
the driver before the batch is recorded and named by both, so a batch that
runs again (a retried job, a restarted driver) writes its file again in
place, and each bad row is in the table once. docs/dirty-input.md says how
to read it and how to recover. The rows are found by
:mod:`operators._engine.dead_letters`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from statestore import write_atomically

__all__ = ["DEAD_LETTERS", "SCHEMA", "DeadLetters"]

#: The dead-letter table's directory under a state location, by default.
DEAD_LETTERS = "dead-letters"

#: A dead letter: the batch, the stage, the source and input it came by,
#: the partition, why it was set aside, and the row (JSON, its columns as
#: the stage's input held them, ``row_kind`` too).
SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("input", pa.int32(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("row", pa.string(), nullable=False),
    ]
)


class DeadLetters:
    """The dead-letter table of a query: a directory of Parquet files, one
    per batch and stage that set rows aside."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")

    def path(self, batch_id: int, stage: str) -> str:
        """The file of ``stage``'s rows of batch ``batch_id``."""
        return f"{self.root}/batch-{batch_id:012d}-{stage}.parquet"

    def write(self, batch_id: int, stage: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write ``stage``'s dead letters of batch ``batch_id`` (rows of
        :data:`SCHEMA` without ``batch_id`` and ``stage``), replacing what an
        earlier run of the batch wrote; with none, remove that."""
        path = self.path(batch_id, stage)
        if not rows:
            if self.fs.get_file_info(path).type != pafs.FileType.NotFound:
                self.fs.delete_file(path)
            return
        table = pa.Table.from_pylist(
            [{**r, "batch_id": batch_id, "stage": stage} for r in rows], schema=SCHEMA
        )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        self.fs.create_dir(self.root, recursive=True)
        write_atomically(self.fs, path, sink.getvalue().to_pybytes())

    def read(self, up_to: int | None = None) -> pa.Table:
        """Every dead letter of batches up to ``up_to`` (all: ``None``), in
        batch and stage order."""
        info = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        files = sorted(f.path for f in info if f.is_file and f.base_name.endswith(".parquet"))
        tables = [pq.read_table(f, filesystem=self.fs, schema=SCHEMA) for f in files]
        table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
        if up_to is not None:
            table = table.filter(pc.less_equal(table.column("batch_id"), up_to))
        return table

    def counts(self, up_to: int | None = None) -> dict[str, int]:
        """How many rows each stage set aside, over batches up to ``up_to``."""
        table = self.read(up_to)
        counted = table.group_by("stage").aggregate([("batch_id", "count")])
        return dict(
            zip(
                counted.column("stage").to_pylist(),
                counted.column("batch_id_count").to_pylist(),
                strict=True,
            )
        )
