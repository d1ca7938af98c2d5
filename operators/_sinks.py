"""Sinks for the runner's output: a callback, or an idempotent Parquet sink."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Protocol

import pyarrow.fs as pafs

from statestore._filesystems import filesystem_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BatchSink", "ParquetSink", "filesystem_of", "write_atomically"]


class BatchSink(Protocol):
    """Receives each micro-batch's output. It must be idempotent: a batch that
    runs again (after a failure) is given to it again with the same id."""

    def __call__(self, output: DataFrame, batch_id: int) -> None: ...


class ParquetSink:
    """Writes each batch's output to its own directory ``batch=N`` under
    ``path`` and replaces it atomically when the batch runs again, so a re-run
    never leaves two copies of a batch (or half of one).

    The path is local or any URI ``pyarrow.fs`` understands; Spark writes it
    through its own filesystem layer, so a URI must also be one Spark can write.
    """

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/")
        self._fs, self._root = filesystem_of(self.path)

    def batch_dir(self, batch_id: int) -> str:
        """Where batch ``batch_id``'s output lives."""
        return f"{self.path}/batch={batch_id}"

    def __call__(self, output: DataFrame, batch_id: int) -> None:
        staging = f"_staging/{batch_id}-{uuid.uuid4().hex}"
        output.write.mode("error").parquet(f"{self.path}/{staging}")
        final = f"{self._root}/batch={batch_id}"
        # Replace: a re-run's output takes the place of the earlier attempt's.
        # A crash between the delete and the move leaves no copy of the batch,
        # never two; the batch then runs again and writes it.
        if self._fs.get_file_info(final).type != pafs.FileType.NotFound:
            self._fs.delete_dir(final)
        self._fs.move(f"{self._root}/{staging}", final)

    def read(self, spark: SparkSession) -> DataFrame:
        """Every batch's output so far, with its ``batch`` column."""
        return spark.read.option("basePath", self.path).parquet(f"{self.path}/batch=*")


def filesystem_of(path: str) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow`` filesystem of a local path or a URI, and the path on it
    (``s3://`` configured from the environment, as checkpoints are)."""
    return filesystem_for(path)


def write_atomically(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file, then a move."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    fs.move(tmp, path)
