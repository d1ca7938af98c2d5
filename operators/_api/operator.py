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
from operators._api.changelog import RowKind, row_kind_array, row_kinds
from operators._api.dirty import InputPolicy, UnknownRetractions, unknown_retraction_error
from operators._api.metrics import UNKNOWN_RETRACTIONS
from operators.typing import Logger
from statestore import ConsistencyMode, StateTable, TableMeta

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
    #: How many partitions the operator's stage runs on (the partition of a
    #: key is Spark's hash of it modulo this): an operator that brings rows
    #: of its own, such as an initial state, keeps those of its partition.
    partition_count: int = 1
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
    #: How the stage treats dirty input, and the names its messages give
    #: (operators/_api/dirty.py); the runner and the harness set it per stage.
    policy: InputPolicy = InputPolicy()
    #: The first retraction of a row the operator does not hold that the
    #: batch met, as ``(side, row)``: the example of the stage's one warning.
    unknown_example: tuple[int, tuple[Any, ...]] | None = None

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
        self,
        columns: Sequence[pa.Array | pa.ChunkedArray],
        kind: RowKind | pa.Array = RowKind.INSERT,
    ) -> None:
        """Output many rows at once: one array per column of the operator's
        output schema, in its order; ``kind`` the row kind of all of them, or
        an array of each row's kind symbol (``+I``, ``-U``, ``+U``, ``-D``).
        The same as calling :meth:`emit` for each row, which is what this
        default does (making a Python object of every value); the context
        the test harness and the Spark runner give an operator keeps the
        columns in Arrow instead."""
        lists = [c.to_pylist() for c in columns]
        n = len(lists[0]) if lists else 0
        kinds = (
            [kind] * n
            if isinstance(kind, RowKind)
            else list(map(RowKind.parse, row_kind_array(kind, n, "operator").to_pylist()))
        )
        for row, k in zip(zip(*lists, strict=True), kinds, strict=True):
            self.emit(row, k)

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

    def partition_of(self, key: Sequence[Any], types: Sequence[pa.DataType]) -> int:
        """The partition of the stage the runner puts ``key`` (values of
        ``types``) in: Spark's hash of it modulo :attr:`partition_count`. For
        an operator that brings rows of its own (an initial state) and keeps
        those of its partition."""
        raise NotImplementedError(f"{type(self).__name__} does not place keys")

    def count(self, metric: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``metric``."""
        self.metrics[metric] = self.metrics.get(metric, 0) + n

    def retracted_unknown(
        self,
        side: int,
        row: Sequence[Any],
        key: Sequence[Any] | None = None,
        n: int = 1,
        metric: str = UNKNOWN_RETRACTIONS,
    ) -> bool:
        """Report ``n`` retractions of rows the operator does not hold on
        input ``side`` (``row`` one of them, ``key`` its key): counted in
        ``metric``; under the ``fail`` policy an
        :class:`~operators.errors.InputError` naming the source, key and
        row. Returns whether to apply them (``apply``); under ``drop`` the
        operator does nothing more with them, and the first is the example
        of the stage's warning."""
        self.count(metric, n)
        policy = self.policy.unknown_retractions
        if policy is UnknownRetractions.FAIL:
            raise unknown_retraction_error(self.policy, side, row, key)
        if self.unknown_example is None:
            self.unknown_example = (side, tuple(row))
        return policy is UnknownRetractions.APPLY


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
    #: The columns each input must be partitioned by so that the rows the
    #: operator relates (one group, one join key) meet in one partition: one
    #: tuple per input, all of one length and type; ``()`` for every input
    #: when it relates every row (a global top-N, run as a keyless stage). A
    #: stage given no ``keys=`` partitions by these, and refuses keys that
    #: would part rows the operator relates (any column outside them, or
    #: none). ``None``, the default: the operator does not say, and each
    #: stage running it must be given ``keys=``, taken as they are.
    partition_keys: tuple[tuple[str, ...], ...] | None = None
    #: ``True``: a stage must be partitioned by :attr:`partition_keys` exactly,
    #: not by some of them, because the operator itself places rows by that
    #: whole key (a :class:`~operators.stateful.StatefulProcessorOperator`
    #: routes its initial state to partitions by Spark's hash of the whole
    #: grouping key).
    partition_keys_exact: bool = False
    #: Whether the operator needs the ``-U`` row before each ``+U`` of its
    #: inputs (it retracts the row a ``-U`` names). Every built-in operator
    #: does; an operator that reads an upsert stream by its key says
    #: ``False``.
    needs_update_before: bool = True
    #: ``True``: the runner hands the operator all of an input's rows of a
    #: partition's batch in one :meth:`process_batch` call (a run of one
    #: side), for an operator that must see all the rows of a key in a batch
    #: at once, as Spark's ``transformWithState`` calls ``handleInputRows``
    #: once per key and batch. ``False`` (the default): in chunks of about
    #: 262,144 rows or 64 MiB, which bound the memory a batch takes.
    takes_whole_batch: bool = False

    def check_watermarks(self, watermarks: Mapping[int, Watermark]) -> None:  # noqa: B027
        """Called once by the runner as a query starts, with its watermarks
        (input index -> event-time column and delay): raise
        :class:`~operators.errors.InputError` if the operator cannot keep its
        semantics under them. By default any watermarks will do."""

    def check_state(self, stored: Sequence[TableMeta]) -> None:  # noqa: B027
        """Called once by the runner as a query starts on a checkpoint that
        holds state of this operator, with the tables its newest committed
        state holds: raise :class:`~operators.errors.InputError` if the
        operator cannot go on from them, in its own words (the state store
        refuses an incompatible table as it loads, inside the first batch).
        By default nothing."""

    def wants_batch_without_input(self, watermark_moved: bool) -> bool:
        """Whether the runner should run the next batch even if no input
        comes (Spark's no-data batch), asked after each batch;
        ``watermark_moved``: the next batch's input watermark will differ
        from this one's. An operator whose timers or state expire with
        processing time says ``True``. By default ``False``: a batch runs
        when input comes."""
        return False

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

    def rejected_rows(self, batch: pa.RecordBatch, side: int) -> pa.Array | None:
        """Why each row of an input batch is one the operator cannot take
        (a string per row, null where it can take it), or ``None`` (the
        default): it can take every row that has its columns and a known
        row kind. Under ``bad_rows="set_aside"`` the runner sets such rows
        aside before :meth:`process_batch` sees the batch
        (docs/dirty-input.md); under ``"fail"`` the operator refuses them as
        it always does, with an :class:`~operators.errors.InputError`."""
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
