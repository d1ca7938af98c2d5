"""The contracts relstate's code is written against, in one place: what a
sink, a joiner, a progress callback and a key-value backend must be, what a
batch's summary holds, what an operator's logger is, and the store type that
takes either state store. Implement or annotate against these; the modules
that use them import them from here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

import structlog

from statestore import KVBackend, StoreTables, WriteOp

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = [
    "BatchSink",
    "BatchSummary",
    "Joiner",
    "KVBackend",
    "Logger",
    "Progress",
    "StagedSink",
    "StoreTables",
    "WriteOp",
]

#: The logger an operator gets (``ctx.log``): structlog's, bound to the
#: operator's stage, partition and batch.
Logger = structlog.BoundLogger

#: The FK join's ``joiner``: ``(left_row, right_row or None) -> output row``.
Joiner = Callable[[tuple[Any, ...], tuple[Any, ...] | None], Sequence[Any]]


class BatchSummary(TypedDict):
    """A finished batch as a query's history and progress callback see it."""

    batch_id: int
    #: The query's watermark in the batch (``None``: none yet).
    watermark: int | None
    #: The batch's time in the driver, and of that, in its stages' jobs.
    duration_ms: int
    jobs_ms: int
    #: Each stage's metrics as ``stage.metric``, and summed over the stages
    #: under the metric's own name (``numOutputRows``: the output stages').
    metrics: dict[str, int]
    #: Each stage's own metrics, by stage name.
    stages: dict[str, dict[str, int]]
    stage_watermarks: dict[str, int | None]
    stage_partitions: dict[str, int]


#: A query's progress callback, called with each finished batch's summary.
Progress = Callable[[BatchSummary], None]


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
