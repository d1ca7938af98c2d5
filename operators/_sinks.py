"""Sinks for the runner's output: a callback, or an idempotent Parquet sink
that the runner's tasks write into directly (one Spark job per batch)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from statestore import filesystem_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BatchSink", "ParquetSink", "StagedSink", "filesystem_of", "write_atomically"]


class BatchSink(Protocol):
    """Receives each micro-batch's output. It must be idempotent: a batch that
    runs again (after a failure) is given to it again with the same id."""

    def __call__(self, output: DataFrame, batch_id: int) -> None: ...


@runtime_checkable
class StagedSink(Protocol):
    """A sink the runner's tasks write into: each task attempt writes its
    partition's output as a part in the batch run's staging area, and the
    driver publishes exactly the parts of the attempts that won, at once.
    Parts of losing attempts (retried, speculative, zombie) are never
    published."""

    def stage(self, batch_id: int) -> str:
        """A fresh staging area for one run of batch ``batch_id``."""
        ...

    def write_part(
        self, staging: str, partition: int, schema: pa.Schema, batches: Iterable[pa.RecordBatch]
    ) -> str:
        """Write one task attempt's output (in an executor); the part's name."""
        ...

    def publish(self, staging: str, parts: Sequence[str], batch_id: int) -> None:
        """Make ``parts`` (and nothing else) batch ``batch_id``'s output."""
        ...


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
        staging = self.stage(batch_id)
        output.write.mode("error").parquet(f"{self.path}/{staging}")
        self._replace(staging, batch_id)

    def stage(self, batch_id: int) -> str:
        """A fresh staging directory (relative to ``path``) for one run of
        batch ``batch_id``."""
        return f"_staging/{batch_id}-{uuid.uuid4().hex}"

    def write_part(
        self, staging: str, partition: int, schema: pa.Schema, batches: Iterable[pa.RecordBatch]
    ) -> str:
        """Write one task attempt's output as a Parquet file of its own in
        ``staging`` (an empty output too, so every batch has its schema)."""
        name = f"part-{partition:05d}-{uuid.uuid4().hex}.parquet"
        self._fs.create_dir(f"{self._root}/{staging}", recursive=True)
        with pq.ParquetWriter(f"{self._root}/{staging}/{name}", schema, filesystem=self._fs) as out:
            for batch in batches:
                if batch.num_rows:
                    out.write_table(pa.Table.from_batches([batch]).cast(schema))
        return name

    def publish(self, staging: str, parts: Sequence[str], batch_id: int) -> None:
        """Move ``parts`` into a directory of their own, which then replaces
        ``batch=N``; whatever else ``staging`` holds (losing attempts' parts,
        or one a zombie task writes later) stays out of the output."""
        ready = self.stage(batch_id)
        self._fs.create_dir(f"{self._root}/{ready}", recursive=True)
        for part in parts:
            self._fs.move(f"{self._root}/{staging}/{part}", f"{self._root}/{ready}/{part}")
        self._replace(ready, batch_id)
        self._fs.delete_dir(f"{self._root}/{staging}")

    def _replace(self, staging: str, batch_id: int) -> None:
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
