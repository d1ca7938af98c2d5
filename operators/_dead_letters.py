"""Rows a stage cannot take, set aside (``bad_rows="set_aside"``).

A row an operator cannot take (an unknown row kind, a null in a column its
input declares not nullable) fails its batch by default; under
``set_aside`` it goes to the query's dead-letter table instead and the batch
goes on without it. The table is Parquet under the state location
(``<state>/dead-letters``, or a directory the ``dead_letters`` option
names): one file per batch and stage, written by the driver before the batch
is recorded and named by both, so a batch that runs again (a retried job, a
restarted driver) writes its file again in place, and each bad row is in the
table once. docs/dirty-input.md says how to read it and how to recover.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from operators._changelog import ROW_KIND, RowKind
from operators._sinks import write_atomically

__all__ = ["DEAD_LETTERS", "SCHEMA", "SET_ASIDE", "DeadLetters", "letters", "row_faults"]

#: The dead-letter table's directory under a state location, by default.
DEAD_LETTERS = "dead-letters"
#: The counter of rows a stage set aside in a batch.
SET_ASIDE = "numRowsSetAside"

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

_KINDS = pa.array([k.value for k in RowKind])


def row_faults(declared: pa.Schema, batch: pa.RecordBatch) -> list[str | None]:
    """Per row of ``batch`` (an input of an operator that declares
    ``declared``), why the operator cannot take it, or ``None``: an unknown
    row kind, or a null in a column declared not nullable. Worked in Arrow;
    only the rows found bad become Python objects."""
    bad = pa.repeat(pa.scalar(False), batch.num_rows)
    masks: list[tuple[pa.Array, str]] = []
    index = batch.schema.get_field_index(ROW_KIND)
    if index >= 0:
        kinds = batch.column(index)
        unknown = pc.invert(pc.fill_null(pc.is_in(kinds, value_set=_KINDS), False))
        masks.append((unknown, "unknown row kind"))
    for fld in declared:
        at = batch.schema.get_field_index(fld.name)
        if at >= 0 and not fld.nullable and batch.column(at).null_count:
            masks.append((pc.is_null(batch.column(at)), f"null in non-nullable {fld.name!r}"))
    for mask, _ in masks:
        bad = pc.or_(bad, mask)
    if not pc.any(bad).as_py():
        return [None] * batch.num_rows
    reasons: list[str | None] = [None] * batch.num_rows
    for mask, reason in masks:
        for i in pc.indices_nonzero(mask).to_pylist():
            if reasons[i] is None:
                reasons[i] = reason
    return reasons


def as_json(row: Mapping[str, Any]) -> str:
    """A row as the dead-letter table holds it."""
    return json.dumps(dict(row), default=_plain, sort_keys=False)


def _plain(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time, dt.timedelta, decimal.Decimal)):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not a value a row holds")


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


def letters(
    sources: Sequence[str],
    partition: int,
    side: int,
    batch: pa.RecordBatch,
    reasons: Sequence[str | None],
) -> list[dict[str, Any]]:
    """The dead letters of ``batch``'s rows with a reason (input ``side``
    of a stage whose inputs read ``sources``), without batch and stage."""
    source = sources[side] if side < len(sources) else f"input {side}"
    picked = [i for i, r in enumerate(reasons) if r is not None]
    rows = batch.take(pa.array(picked, pa.int64())).to_pylist() if picked else []
    return [
        {
            "source": source,
            "input": side,
            "partition": partition,
            "reason": reasons[i],
            "row": as_json(row),
        }
        for i, row in zip(picked, rows, strict=True)
    ]
