"""The sink protocols: what the runner gives each batch's output to."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["BatchSink", "StagedSink"]


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
