"""``spark.read.format("relstate-state")`` and ``format("relstate-metadata")``:
PySpark Python data sources over :mod:`operators._state_read`.

Register them once per session with :func:`operators.register_sources` (the
sessions of ``relstate demo`` and the tests register them already)::

    register_sources(spark)
    spark.read.format("relstate-state").option("path", checkpoint) \\
        .option("table", "aggregates").option("batch_id", 41).load()

Options of ``relstate-state``: ``path`` (the query's checkpoint or its state
location), ``operator`` (default: the only one), ``table`` (default: the
operator's only table; for a join, the side's table), ``batch_id`` (any kept
batch; default the latest committed), ``partition`` (default: all, one Spark
partition each), ``readChangeFeed`` with ``startBatchId`` and ``endBatchId``
(the rows inserted, updated and deleted, with ``batch_id``, ``change_type`` and
``partition`` columns), and the S3 options ``endpoint``, ``region``,
``access_key``, ``secret_key``, ``session_token``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from operators._state_location import StateLocation
from operators._state_read import (
    METADATA_SCHEMA,
    change_schema,
    metadata,
    read_changes,
    read_rows,
)
from operators.errors import InputError
from statestore._filesystems import S3_OPTIONS

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["MetadataSource", "StateSource"]


@dataclass(frozen=True)
class _Request:
    """A read's options, parsed once on the driver and pickled to the tasks."""

    path: str
    s3: dict[str, str]
    operator: str | None
    table: str | None
    batch_id: int | None
    partition: int | None
    change_feed: bool
    start: int | None
    end: int | None

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> _Request:
        opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
        path = opts.get("path")
        if not path:
            raise InputError(
                'give the checkpoint: spark.read.format("relstate-state").option("path", ...)'
            )
        change_feed = opts.get("readchangefeed", "false").lower() == "true"
        start = _int(opts, "startbatchid")
        if change_feed and start is None:
            raise InputError("readChangeFeed needs option startBatchId (the first batch)")
        return cls(
            path=path,
            s3={k: opts[k] for k in S3_OPTIONS if k in opts},
            operator=opts.get("operator"),
            table=opts.get("table"),
            batch_id=_int(opts, "batch_id"),
            partition=_int(opts, "partition"),
            change_feed=change_feed,
            start=start,
            end=_int(opts, "endbatchid"),
        )

    def location(self) -> StateLocation:
        return StateLocation(self.path, self.s3)


def _int(opts: Mapping[str, str], key: str) -> int | None:
    if key not in opts:
        return None
    try:
        return int(opts[key])
    except ValueError:
        raise InputError(f"option {key} must be an integer, got {opts[key]!r}") from None


def _struct(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    struct: StructType = from_arrow_schema(schema)
    return struct


class StateSource(DataSource):
    """A state table's rows, or its change feed."""

    @classmethod
    def name(cls) -> str:
        return "relstate-state"

    def _resolve(self) -> tuple[_Request, str, pa.Schema]:
        request = _Request.of(self.options)
        location = request.location()
        operator = location.operator(request.operator)
        batch = request.end if request.change_feed else request.batch_id
        meta = location.table(operator, request.table, batch)
        schema = change_schema(meta) if request.change_feed else meta.columns
        return request, operator, schema

    def schema(self) -> StructType:
        return _struct(self._resolve()[2])

    def reader(self, schema: StructType) -> DataSourceReader:
        request, operator, arrow = self._resolve()
        return _StateReader(request, operator, arrow)


class _StateReader(DataSourceReader):
    """One input partition per state partition; each task reads its own."""

    def __init__(self, request: _Request, operator: str, schema: pa.Schema) -> None:
        self.request = request
        self.operator = operator
        self.arrow = schema

    def partitions(self) -> list[InputPartition]:
        found = self.request.location().partitions(self.operator)
        wanted = self.request.partition
        if wanted is not None:
            if wanted not in found:
                raise InputError(f"operator {self.operator!r} has partitions {found}, not {wanted}")
            found = [wanted]
        return [InputPartition(p) for p in found]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        request = self.request
        location = request.location()
        batch = request.end if request.change_feed else request.batch_id
        meta = location.table(self.operator, request.table, batch)
        number = int(partition.value)
        if request.change_feed:
            assert request.start is not None
            table = read_changes(location, self.operator, meta, number, request.start, request.end)
        else:
            table = read_rows(location, self.operator, meta, number, request.batch_id)
        yield from table.cast(self.arrow).to_batches()


class MetadataSource(DataSource):
    """Operators, tables and schemas, partitions, kept versions and sizes."""

    @classmethod
    def name(cls) -> str:
        return "relstate-metadata"

    def schema(self) -> StructType:
        return _struct(METADATA_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return _MetadataReader(_Request.of(self.options))


class _MetadataReader(DataSourceReader):
    """One input partition: the metadata is a few rows per state partition."""

    def __init__(self, request: _Request) -> None:
        self.request = request

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from metadata(self.request.location(), self.request.batch_id).to_batches()
