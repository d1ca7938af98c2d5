"""The operator API: what a stateful operator declares and the context it
processes one partition's micro-batch with."""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from encoding import TableSchema
from operators._api.changelog import RowKind, row_kinds
from operators.typing import Logger
from statestore import ConsistencyMode, StateTable

if TYPE_CHECKING:
    from operators._api.watermark import Watermark

__all__ = [
    "Operator",
    "OperatorContext",
    "TimeDomain",
    "Timer",
]


class TimeDomain(enum.Enum):
    """What a timer's time is measured in."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


@dataclass(frozen=True, order=True)
class Timer:
    """A registered timer: it fires once its domain's time reaches ``time``
    (milliseconds since the epoch). ``key`` says what it is for."""

    time: int
    key: str
    domain: TimeDomain = field(default=TimeDomain.EVENT_TIME, compare=False)


class OperatorContext(abc.ABC):
    """What an operator sees while it processes one partition's part of a
    micro-batch: its state tables, the batch id, the event-time watermark and
    processing time (milliseconds since the epoch), a metrics sink, a bound
    structlog logger, timers, and where its output goes."""

    batch_id: int
    partition_id: int
    #: The event-time watermark in force for this batch (``None`` before the
    #: first watermark), in milliseconds since the epoch.
    watermark: int | None
    #: The watermark of the previous batch (``None`` before the first one):
    #: Spark judges a row late against it (``event time <= previous_watermark``),
    #: while state is evicted at :attr:`watermark`.
    previous_watermark: int | None
    #: The batch's processing time, milliseconds since the epoch.
    processing_time: int
    #: Counters the operator adds to; summed over partitions per batch.
    metrics: dict[str, int]
    log: Logger

    @abc.abstractmethod
    def table(self, name: str) -> StateTable:
        """The operator's state table ``name``."""

    @property
    @abc.abstractmethod
    def tables(self) -> Mapping[str, StateTable]:
        """Every state table of the operator, by name."""

    @abc.abstractmethod
    def emit(self, row: Sequence[Any], kind: RowKind = RowKind.INSERT) -> None:
        """Output one row (in the operator's output schema) with a row kind."""

    def emit_batch(
        self, columns: Sequence[pa.Array | pa.ChunkedArray], kind: RowKind = RowKind.INSERT
    ) -> None:
        """Output many rows at once, all of one row kind: one array per column
        of the operator's output schema, in its order. The same as calling
        :meth:`emit` for each row, which is what this default does (making a
        Python object of every value); the context the test harness and the
        Spark runner give an operator keeps the columns in Arrow instead."""
        lists = [c.to_pylist() for c in columns]
        for row in zip(*lists, strict=True):
            self.emit(row, kind)

    def emit_rows(self, rows: Sequence[Sequence[Any]], kinds: Sequence[RowKind]) -> None:
        """Output ``rows`` in order, each with the row kind at its position in
        ``kinds``: the same as calling :meth:`emit` for each, which is what
        this default does; the context the test harness and the Spark runner
        give an operator takes the lists in one step."""
        for row, kind in zip(rows, kinds, strict=True):
            self.emit(row, kind)

    @abc.abstractmethod
    def register_timer(self, timer: Timer) -> None:
        """Fire ``operator.on_timer`` once the timer's time is reached;
        registering the same timer twice fires it once."""

    @abc.abstractmethod
    def delete_timer(self, timer: Timer) -> None:
        """Forget a registered timer (nothing if it is not registered)."""

    def count(self, metric: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``metric``."""
        self.metrics[metric] = self.metrics.get(metric, 0) + n


class Operator(abc.ABC):  # noqa: B024 - process_row or process_batch, either one
    """A stateful stream operator over state tables.

    A subclass declares :attr:`tables` (its state), :attr:`inputs` (one Arrow
    schema per input: one, or two for a join) and :attr:`output` (the schema of
    its output rows, without the row-kind column), and implements
    :meth:`process_row` or, to work a whole Arrow batch at once,
    :meth:`process_batch`. Inputs may carry a ``row_kind`` column (a
    changelog); without it every row is an insert.

    The same operator object runs in the test harness and, pickled, in Spark's
    Python workers, so it holds configuration only: state lives in its tables.
    """

    #: A short name; the checkpoint keeps the operator's state under it.
    name: str = "operator"
    #: The state tables. Ids must be distinct and below 0xFFFF0000 (relstate's
    #: own tables, the timers, use ids above it).
    tables: Sequence[TableSchema] = ()
    #: One schema per input, without the row-kind column.
    inputs: Sequence[pa.Schema] = ()
    #: The schema of an output row, without the row-kind column.
    output: pa.Schema = pa.schema([])
    #: Rows of one partition are processed in the order of this input column
    #: (the runner sorts by it; Spark's shuffle keeps no order). ``None``: any
    #: order.
    sequence_column: str | None = None
    #: How the tables check writes (docs/state-table.md): ``STRICT`` reads the
    #: stored row before each write and raises on a contradiction;
    #: ``UNCHECKED`` reads nothing, for an operator that reads every key before
    #: it writes it.
    consistency: ConsistencyMode = ConsistencyMode.STRICT
    #: ``None`` (the default): the output is a changelog of rows, each ``+U``
    #: after the ``-U`` of the row it replaces. Column names: the output is an
    #: upsert stream keyed by them, ``+U`` with no ``-U`` before it (a ``+U``
    #: replaces the row its key holds), as Flink's group aggregate emits
    #: without ``generateUpdateBefore``. A pipeline refuses to feed such a
    #: stream to a stage that :attr:`needs_update_before`.
    output_upsert_key: tuple[str, ...] | None = None
    #: Whether the operator needs the ``-U`` row before each ``+U`` of its
    #: inputs (it retracts the row a ``-U`` names). Every built-in operator
    #: does; an operator that reads an upsert stream by its key says
    #: ``False``.
    needs_update_before: bool = True

    def check_watermarks(self, watermarks: Mapping[int, Watermark]) -> None:  # noqa: B027
        """Called once by the runner as a query starts, with its watermarks
        (input index -> event-time column and delay): raise
        :class:`~operators.errors.InputError` if the operator cannot keep its
        semantics under them. By default any watermarks will do."""

    def output_watermark(self, watermark: int | None) -> int | None:
        """The watermark of this operator's output, given its input watermark
        (``None``: none yet): what a later stage of a pipeline gets as its
        input watermark (operators/_engine/watermark.py). By default the same; an
        operator whose output rows may carry event times older than its input
        watermark (a join that emits a row of a buffered side) says how much
        older here, as Spark's stream-stream join does."""
        return watermark

    def watermark_rows(self, batch: pa.RecordBatch, side: int) -> pa.BooleanArray | None:
        """Which rows of an input batch count towards that input's event-time
        watermark (``None``, the default: every row). Spark drops the rows a
        query can never use (an inner join's null-key rows) before its
        watermark sees them; an operator that drops rows the same way says so
        here, so that its watermark is Spark's."""
        return None

    def open(self, ctx: OperatorContext) -> None:  # noqa: B027 - optional hook
        """Called before a batch's first row (per partition)."""

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Process one Arrow batch of input ``side``; by default row by row,
        each row a tuple in the order of ``inputs[side]`` (other columns of the
        batch, a sequence column say, are left out)."""
        kinds = row_kinds(batch)
        names = self.inputs[side].names
        columns = [batch.column(n).to_pylist() for n in names]
        for kind, row in zip(kinds, _rows(columns, batch.num_rows), strict=True):
            self.process_row(ctx, row, kind, side)

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        """Process one input row of input ``side`` with its row kind."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement process_row or process_batch"
        )

    def on_watermark(self, ctx: OperatorContext, watermark: int) -> None:  # noqa: B027
        """Called once per batch when the event-time watermark has advanced to
        ``watermark``, after the batch's rows and due timers: evict, emit."""

    def on_timer(self, ctx: OperatorContext, timer: Timer) -> None:  # noqa: B027
        """Called for each due timer, in time order, after the batch's rows."""

    def flush(self, ctx: OperatorContext) -> None:  # noqa: B027 - optional hook
        """Write to the state tables what the operator holds back within a
        micro-batch (a join writes its held rows once per micro-batch, not
        per input batch), so that whoever reads the tables next sees them
        current. Called after the batch's rows, timers and watermark, before
        :meth:`close`, and by the test harness before it hands a table or the
        metrics out in the middle of a batch. By default nothing is held."""

    def close(self, ctx: OperatorContext) -> None:  # noqa: B027 - optional hook
        """Called after the batch, before the commit (per partition)."""


def _rows(columns: list[list[Any]], n: int) -> Iterator[tuple[Any, ...]]:
    if not columns:
        return iter([()] * n)
    return zip(*columns, strict=True)
