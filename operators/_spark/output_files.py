"""The files of a Parquet output: each batch in its own directory
``batch=N``, replaced whole when the batch runs again, made visible to
readers by a commit marker, and the rows' schema beside them. Spark-free: the
runner's tasks write it, and the ``relstate-output`` data source
(:mod:`operators._spark.output_source`) reads it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from statestore import filesystem_for, write_atomically

__all__ = ["COMMITTED_DIR", "SCHEMA_FILE", "OutputFiles", "output_arrow_schema"]

#: Under an output's path: the Arrow schema of its rows (an Arrow IPC
#: stream with no batches), written once, so a reader knows it before any
#: batch. A name starting with ``_`` is hidden from Spark's Parquet reader.
SCHEMA_FILE = "_relstate/schema.arrow"
#: Under an output's path: one marker per committed batch,
#: ``<batch id, 20 digits>.json``.
COMMITTED_DIR = "_relstate/committed"


class OutputFiles:
    """The files of a Parquet output at ``path``: batches written to a
    staging area and published, committed batches listed and read
    (:class:`operators.ParquetSink` says what readers see when).

    The path is local or any URI ``pyarrow.fs`` understands.
    """

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/")
        self._fs, self._root = filesystem_for(self.path)

    def batch_dir(self, batch_id: int) -> str:
        """Where batch ``batch_id``'s output lives."""
        return f"{self.path}/batch={batch_id}"

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
        if parts and self.schema() is None:
            self.write_schema(
                pq.read_schema(f"{self._root}/{staging}/{parts[0]}", filesystem=self._fs)
            )
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

    # -- what readers see ----------------------------------------------------------

    def write_schema(self, schema: pa.Schema) -> None:
        """Record the Arrow schema of the rows (timestamps in UTC), for
        readers that start before the first batch. The first one stays."""
        if self.schema() is not None:
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, output_arrow_schema(schema)):
            pass
        self._fs.create_dir(f"{self._root}/{SCHEMA_FILE.rsplit('/', 1)[0]}", recursive=True)
        write_atomically(self._fs, f"{self._root}/{SCHEMA_FILE}", sink.getvalue().to_pybytes())

    def schema(self) -> pa.Schema | None:
        """The Arrow schema of the rows, ``None`` before the first batch is written."""
        try:
            with self._fs.open_input_stream(f"{self._root}/{SCHEMA_FILE}") as source:
                return pa.ipc.open_stream(source.read()).schema
        except FileNotFoundError:
            return None

    def commit(self, batch_id: int) -> None:
        """Make batch ``batch_id``'s output, as it is now, visible to readers:
        a marker naming its files. The runner calls it after it recorded the
        batch; calling it again (the driver died after recording) rewrites
        the same marker."""
        final = f"{self._root}/batch={batch_id}"
        if self._fs.get_file_info(final).type == pafs.FileType.NotFound:
            raise FileNotFoundError(
                f"batch {batch_id} has no output in {self.path} to commit: "
                "a batch is committed after it is written"
            )
        files = sorted(
            i.base_name
            for i in self._fs.get_file_info(pafs.FileSelector(final))
            if i.base_name.endswith(".parquet")
        )
        marker = {"batch_id": batch_id, "files": files}
        self._fs.create_dir(f"{self._root}/{COMMITTED_DIR}", recursive=True)
        write_atomically(
            self._fs, self._marker(batch_id), json.dumps(marker, sort_keys=True).encode()
        )

    def committed(self) -> list[int]:
        """The ids of the committed batches, in order."""
        selector = pafs.FileSelector(f"{self._root}/{COMMITTED_DIR}", allow_not_found=True)
        return sorted(
            int(i.base_name[: -len(".json")])
            for i in self._fs.get_file_info(selector)
            if i.base_name.endswith(".json") and i.base_name[: -len(".json")].isdigit()
        )

    def committed_files(self, batch_id: int) -> list[str]:
        """The Parquet files (full paths on the sink's filesystem) of
        committed batch ``batch_id``."""
        with self._fs.open_input_stream(self._marker(batch_id)) as source:
            marker = json.loads(source.read())
        return [f"{self._root}/batch={batch_id}/{name}" for name in marker["files"]]

    def read_part(self, file: str) -> pa.Table:
        """The rows of one file :meth:`committed_files` named."""
        return pq.read_table(file, filesystem=self._fs)

    def _marker(self, batch_id: int) -> str:
        return f"{self._root}/{COMMITTED_DIR}/{batch_id:020d}.json"


def output_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as the output's readers see it: every timestamp with a time
    zone in UTC at microseconds (Spark's ``TimestampType``; one without stays
    local, ``TimestampNTZType``), every field nullable."""
    fields = []
    for f in schema:
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            f = f.with_type(pa.timestamp("us", tz="UTC"))
        fields.append(f.with_nullable(True))
    return pa.schema(fields)
