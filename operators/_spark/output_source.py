"""``format("relstate-output")``: a query's committed output, written by a
:class:`~operators.ParquetSink`, read by another Spark query as a table or as
a stream, exactly once.

Register it once per session with :func:`operators.register_sources`::

    spark.read.format("relstate-output").load(path)  # every committed batch
    spark.readStream.format("relstate-output").load(path)  # each once, in order

The rows are the output's columns (``row_kind`` included: ``+I``, ``-U``,
``+U``, ``-D``) and ``batch``, the id of the writer's batch that produced them.
The stream's offsets are those batch ids (``{"batch": N}``: every committed
batch up to N); only committed batches are read, so a batch whose writer died
between writing and committing is read once, after the writer ran it again
and committed it. Options: ``path`` (or ``load(path)``),
``maxBatchesPerTrigger`` (the most writer batches one trigger reads;
``Trigger.AvailableNow`` honours it too) and ``startingBatch`` (the first
writer batch a new reading query reads; default 0). Timestamps are in UTC.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from operators._spark.output_files import OutputFiles
from operators.errors import InputError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["BATCH", "OutputSource"]

#: The column that names the writer's batch of each row.
BATCH = "batch"
_OPTIONS = ("path", "maxbatchespertrigger", "startingbatch")


@dataclass(frozen=True)
class _Options:
    path: str
    max_batches: int | None
    starting_batch: int

    @classmethod
    def of(cls, options: Mapping[str, str]) -> _Options:
        given = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(given) - set(_OPTIONS))
        if unknown:
            raise InputError(
                f"relstate-output: unknown option(s) {unknown}; "
                "known: path, maxBatchesPerTrigger, startingBatch"
            )
        if not given.get("path"):
            raise InputError(
                "relstate-output needs the ParquetSink's path: "
                'spark.read.format("relstate-output").load(path)'
            )
        return cls(
            given["path"],
            _count(given, "maxbatchespertrigger", "maxBatchesPerTrigger", 1),
            _count(given, "startingbatch", "startingBatch", 0) or 0,
        )


def _count(given: Mapping[str, str], key: str, name: str, least: int) -> int | None:
    if key not in given:
        return None
    try:
        value = int(given[key])
    except ValueError:
        value = least - 1
    if value < least:
        raise InputError(
            f"relstate-output: {name} must be an integer >= {least}, not {given[key]!r}"
        )
    return value


class _Part(InputPartition):
    """One Parquet file of one committed batch: one Spark task."""

    def __init__(self, batch_id: int, file: str) -> None:
        super().__init__((batch_id, file))
        self.batch_id = batch_id
        self.file = file


def _struct(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    struct: StructType = from_arrow_schema(schema)
    return struct


def _parts(sink: OutputFiles, batch_ids: Sequence[int]) -> list[_Part]:
    return [_Part(b, f) for b in batch_ids for f in sink.committed_files(b)]


def _read(path: str, part: InputPartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    """The rows of ``part`` with its batch id, in the reader's schema."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if not isinstance(part, _Part):
        # Spark reads a table with no partitions as one InputPartition(None).
        return

    target = to_arrow_schema(schema, timezone="UTC")
    table = OutputFiles(path).read_part(part.file)
    table = table.append_column(BATCH, pa.array([part.batch_id] * table.num_rows, pa.int64()))
    table = table.select(target.names).cast(target)
    yield from table.to_batches()


class OutputSource(DataSource):
    """``relstate-output``: a ParquetSink's committed batches, as a table
    (``spark.read``) or as a stream (``spark.readStream``)."""

    @classmethod
    def name(cls) -> str:
        return "relstate-output"

    def schema(self) -> StructType:
        options = _Options.of(self.options)
        schema = OutputFiles(options.path).schema()
        if schema is None:
            raise InputError(
                f"relstate-output: {options.path} holds no output yet (no "
                "_relstate/schema.arrow): start the writing query first, or give the "
                "schema with .schema(...)"
            )
        if BATCH in schema.names:
            raise InputError(
                f"relstate-output: the output at {options.path} has a column {BATCH!r} "
                "of its own, which the reader's batch id would hide"
            )
        return _struct(schema.append(pa.field(BATCH, pa.int64(), nullable=False)))

    def reader(self, schema: StructType) -> DataSourceReader:
        return _TableReader(_Options.of(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(_Options.of(self.options), schema)


class _TableReader(DataSourceReader):
    def __init__(self, options: _Options, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        sink = OutputFiles(self.options.path)
        return _parts(sink, [b for b in sink.committed() if b >= self.options.starting_batch])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options.path, partition, self.schema)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"batch": N}``: every committed writer batch up to N has
    been read. The first offset is the one before ``startingBatch``."""

    def __init__(self, options: _Options, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.sink = OutputFiles(options.path)
        #: Trigger.AvailableNow's target: the last batch committed when the
        #: query started (``None``: no target).
        self.target: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        return {"batch": self.options.starting_batch - 1}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_batches is None:
            return ReadAllAvailable()
        # Spark's limits are built in; a writer batch counts as one "file".
        return ReadMaxFiles(self.options.max_batches)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        after = int(start["batch"])
        ready = [b for b in self.sink.committed() if b > after]
        if self.target is not None:
            ready = [b for b in ready if b <= self.target]
        if isinstance(limit, ReadMaxFiles):
            ready = ready[: limit.max_files]
        return {"batch": ready[-1] if ready else after}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        committed = self.sink.committed()
        return {"batch": committed[-1]} if committed else None

    def prepareForTriggerAvailableNow(self) -> None:
        committed = self.sink.committed()
        self.target = committed[-1] if committed else self.options.starting_batch - 1

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        low, high = int(start["batch"]), int(end["batch"])
        return _parts(self.sink, [b for b in self.sink.committed() if low < b <= high])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options.path, partition, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the writer's files stay (they are its output)."""
