"""``spark.read.format("relstate-state")`` and ``format("relstate-metadata")``:
PySpark Python data sources over :mod:`operators._checkpoint.read`.

Register them once per session with :func:`operators.register_sources` (the
sessions of ``relstate demo`` and the tests register them already)::

    register_sources(spark)
    spark.read.format("relstate-state").option("path", checkpoint) \\
        .option("table", "aggregates").option("batchId", 41).load()

Options of ``relstate-state`` (checked by :mod:`operators._spark.state_options`,
which takes Spark's spellings): ``path`` (the query's checkpoint or its state
location), ``operator`` (default: the only one), ``table`` (default: the
operator's only table) or ``joinSide`` (``left``/``right``: a join side's
table), ``batchId`` (any kept batch; default the latest committed),
``partition`` (default: all, one Spark partition each), ``readChangeFeed``
with ``changeStartBatchId`` and ``changeEndBatchId`` (the rows inserted,
updated and deleted, with ``batch_id``, ``change_type`` and ``partition``
columns), and the S3 options ``endpoint``, ``region``, ``access_key``,
``secret_key``, ``session_token``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from operators._checkpoint.location import StateLocation
from operators._checkpoint.read import (
    METADATA_SCHEMA,
    change_schema,
    metadata,
    read_changes,
    read_rows,
)
from operators._spark.state_options import ReadRequest
from operators.errors import InputError
from statestore import TableMeta

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["MetadataSource", "StateSource"]


def _struct(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    struct: StructType = from_arrow_schema(schema)
    return struct


def _read_table(location: StateLocation, request: ReadRequest, operator: str) -> TableMeta:
    """The table the read asks for, by name or by join side."""
    if request.join_side is not None:
        return location.side_table(operator, request.join_side, request.version)
    return location.table(operator, request.table, request.version)


class StateSource(DataSource):
    """A state table's rows, or its change feed."""

    @classmethod
    def name(cls) -> str:
        return "relstate-state"

    def _resolve(self) -> tuple[ReadRequest, str, pa.Schema]:
        request = ReadRequest.of(self.options)
        location = request.location()
        operator = location.operator(request.operator)
        meta = _read_table(location, request, operator)
        schema = change_schema(meta) if request.change_feed else meta.columns
        return request, operator, schema

    def schema(self) -> StructType:
        return _struct(self._resolve()[2])

    def reader(self, schema: StructType) -> DataSourceReader:
        request, operator, arrow = self._resolve()
        return _StateReader(request, operator, arrow)


class _StateReader(DataSourceReader):
    """One input partition per state partition; each task reads its own."""

    def __init__(self, request: ReadRequest, operator: str, schema: pa.Schema) -> None:
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
        meta = _read_table(location, request, self.operator)
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
        return _MetadataReader(ReadRequest.of(self.options, "relstate-metadata"))


class _MetadataReader(DataSourceReader):
    """One input partition: the metadata is a few rows per state partition."""

    def __init__(self, request: ReadRequest) -> None:
        self.request = request

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from metadata(self.request.location(), self.request.batch_id).to_batches()
