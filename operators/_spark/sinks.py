"""Sinks for the runner's output: a callback, or an idempotent Parquet sink
that the runner's tasks write into directly (one Spark job per batch) and
that another Spark query reads, as a table or a stream, through the
``relstate-output`` data source (:mod:`operators._spark.output_source`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from operators._spark.output_files import OutputFiles
from operators._spark.session import register_sources

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ParquetSink"]


class ParquetSink(OutputFiles):
    """Writes each batch's output to its own directory ``batch=N`` under
    ``path`` and replaces it atomically when the batch runs again, so a re-run
    never leaves two copies of a batch (or half of one).

    A batch is *committed* once the runner has recorded it (:meth:`commit`):
    only then is it final, and only committed batches are read by
    :meth:`read` and by the ``relstate-output`` data source. A batch written
    but not committed (the driver died in between) is run again and replaced
    before it is committed.

    The path is local or any URI ``pyarrow.fs`` understands; Spark writes it
    through its own filesystem layer, so a URI must also be one Spark can write.
    """

    def __call__(self, output: DataFrame, batch_id: int) -> None:
        staging = self.stage(batch_id)
        output.write.mode("error").parquet(f"{self.path}/{staging}")
        if self.schema() is None:
            from pyspark.sql.pandas.types import to_arrow_schema

            self.write_schema(to_arrow_schema(output.schema, timezone="UTC"))
        self._replace(staging, batch_id)

    def read(self, spark: SparkSession) -> DataFrame:
        """Every committed batch's output, with its ``batch`` column (through
        the ``relstate-output`` data source)."""
        register_sources(spark)
        return spark.read.format("relstate-output").load(self.path)
