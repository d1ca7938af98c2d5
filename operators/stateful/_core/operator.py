"""``StatefulProcessorOperator``: a user's Spark ``StatefulProcessor`` run as a
relstate operator, unchanged, with its state variables in state tables.

Per partition and batch it does what Spark's ``TransformWithStateExec`` does,
in Spark's order: ``init`` on a fresh handle, the initial state (batch 0
only), the input rows grouped by key (in ``EventTime`` mode rows at or below
the previous batch's watermark are dropped first), the due timers in time
order, then ``close``. docs/transform-with-state.md has the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from encoding import KeyCodec, TableSchema
from operators._api.operator import Operator, OperatorContext, TimeDomain, Timer
from operators._api.relational import cast_column
from operators.errors import InputError
from operators.stateful._core.handle import ExpiredTimerInfo, RuntimeHandle, TimerValues
from operators.stateful._core.state import (
    ListStateImpl,
    MapStateImpl,
    Scope,
    ValueStateImpl,
    VariableState,
    rows_batch,
)
from operators.stateful._core.types import arrow_schema
from operators.stateful._core.variables import (
    EXPIRES_AT,
    POSITION,
    StateVariable,
    declare,
    timers_table,
)
from statestore import ConsistencyMode, TableMeta

if TYPE_CHECKING:
    from operators._api.watermark import Watermark

__all__ = ["BatchState", "StatefulProcessorOperator"]

_MODES = {"append": "Append", "update": "Update"}
_TIME_MODES = {"none": "None", "processingtime": "ProcessingTime", "eventtime": "EventTime"}
_ROW = "$row"
#: Spark's counter names.
LATE = "numRowsDroppedByWatermark"
FIRED = "numExpiredTimers"
REGISTERED = "numRegisteredTimers"
DELETED = "numDeletedTimers"
EXPIRED = "numValuesRemovedDueToTTLExpiry"
_STATES: dict[str, type[VariableState]] = {
    "value": ValueStateImpl,
    "list": ListStateImpl,
    "map": MapStateImpl,
}


def _table(data: Any, what: str) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas
        return pa.Table.from_pandas(data, preserve_index=False)
    raise InputError(f"{what} is a pyarrow Table or a pandas DataFrame, got {type(data).__name__}")


class StatefulProcessorOperator(Operator):
    """Runs ``processor`` (a ``pyspark.sql.streaming.StatefulProcessor``) over
    relstate state, as ``df.groupBy(*grouping_keys).transformWithState(...)``
    (``flavour="rows"``: ``Row`` iterators in and out) or
    ``transformWithStateInPandas`` (``flavour="pandas"``: DataFrames).

    ``input_schema`` is the Arrow schema of the input rows, ``output_schema``
    Spark's (a ``StructType`` or a DDL string). ``output_mode`` is
    ``"Append"`` or ``"Update"`` (both emit what the processor returns, as
    Spark does); ``time_mode`` ``"None"``, ``"ProcessingTime"`` or
    ``"EventTime"``. ``event_time_column`` is Spark's ``eventTimeColumnName``:
    an output timestamp column that carries the watermark downstream (an
    emitted row older than the batch's late-row watermark fails the batch, as
    in Spark). In ``EventTime`` mode input rows are late against the
    watermark of ``input_event_time`` (default: the column of the query's
    watermark on the input).

    ``initial_state`` (a pyarrow Table or pandas DataFrame) goes to
    ``handleInitialState`` in batch 0, grouped by ``initial_state_keys``
    (default: the grouping key names), which must have the grouping keys'
    types (they are cast to them): one call per row for ``rows``, one per key
    with its rows as a DataFrame for ``pandas``.

    The processor's ``init`` runs once here, on a recording handle, so that
    its state variables are known (and refused, if relstate cannot hold one)
    before the query starts; it runs again at the start of every batch, as
    in Spark, and must declare the same variables.
    """

    consistency = ConsistencyMode.UNCHECKED
    #: Spark calls handleInputRows once per key and batch: all of a key's rows
    #: of the batch come in one call.
    takes_whole_batch = True
    #: PySpark's ``TwsTester`` refuses an event-time timer at or below the
    #: watermark; Spark's operator takes it (it fires in the same batch).
    refuse_past_event_timers = False

    def __init__(
        self,
        processor: Any,
        input_schema: pa.Schema,
        grouping_keys: Sequence[str],
        output_schema: Any,
        output_mode: str = "Update",
        time_mode: str = "None",
        event_time_column: str | None = None,
        initial_state: Any = None,
        flavour: str = "rows",
        *,
        input_event_time: str | None = None,
        initial_state_keys: Sequence[str] | None = None,
        name: str = "transform_with_state",
    ) -> None:
        if not callable(getattr(processor, "handleInputRows", None)) or not callable(
            getattr(processor, "init", None)
        ):
            raise InputError(
                f"processor must be a StatefulProcessor (init, handleInputRows), got "
                f"{type(processor).__name__}"
            )
        if flavour not in ("rows", "pandas"):
            raise InputError(f"flavour is 'rows' or 'pandas', got {flavour!r}")
        mode = _MODES.get(str(output_mode).lower())
        if mode is None:
            raise InputError(
                f"outputMode {output_mode!r}: transformWithState takes 'Append' or 'Update'"
            )
        time = _TIME_MODES.get(str(time_mode).lower())
        if time is None:
            raise InputError(
                f"timeMode {time_mode!r}: one of 'None', 'ProcessingTime', 'EventTime'"
            )
        if isinstance(grouping_keys, str):
            grouping_keys = [grouping_keys]
        missing = [k for k in grouping_keys if k not in input_schema.names]
        if not grouping_keys or missing:
            raise InputError(
                f"grouping keys {list(grouping_keys)} must be columns of the input "
                f"{input_schema.names}"
            )
        self.name = name
        self.processor = processor
        self.flavour = flavour
        self.output_mode = mode
        self.time_mode = time
        self.grouping_keys = list(grouping_keys)
        # Spark's transformWithState partitions by the whole grouping key;
        # the initial state is routed by it too, so a stage takes no less.
        self.partition_keys = (tuple(self.grouping_keys),)
        self.partition_keys_exact = initial_state is not None
        self.grouping = [input_schema.field(k) for k in grouping_keys]
        self.inputs = [input_schema]
        self.output = arrow_schema(output_schema, "outputStructType")
        self.event_time_column = event_time_column or None
        if self.event_time_column is not None:
            if self.event_time_column not in self.output.names:
                raise InputError(
                    f"eventTimeColumnName {self.event_time_column!r} is not a column of the "
                    f"output {self.output.names}"
                )
            if not pa.types.is_timestamp(self.output.field(self.event_time_column).type):
                raise InputError(
                    f"eventTimeColumnName {self.event_time_column!r} must be a timestamp column"
                )
        if input_event_time is not None and (
            input_event_time not in input_schema.names
            or not pa.types.is_timestamp(input_schema.field(input_event_time).type)
        ):
            raise InputError(
                f"input_event_time {input_event_time!r} must be a timestamp column of the "
                f"input {input_schema.names}"
            )
        self.input_event_time = input_event_time
        self.initial_state = self._initial(initial_state, initial_state_keys)
        self.initial_state_keys = list(initial_state_keys or self.grouping_keys)
        recorded = declare(processor, self.grouping, time)
        self.variables: dict[str, StateVariable] = recorded.variables
        #: Names ``init`` passed to ``deleteIfExists``.
        self.deleted = list(recorded.deleted)
        tables: list[TableSchema] = []
        for variable in self.variables.values():
            tables.extend(variable.tables(self.grouping))
        if time != "None":
            tables.append(timers_table(self.grouping))
        ids = [t.table_id for t in tables]
        if len(set(ids)) != len(ids):
            raise InputError(
                f"the state variables {sorted(self.variables)} hash to one table id; "
                "rename one of them"
            )
        self.tables = tables
        self._domain = TimeDomain.EVENT_TIME if time == "EventTime" else TimeDomain.PROCESSING_TIME
        #: Stored tables of variables ``init`` deleted with ``deleteIfExists``:
        #: emptied as a batch opens.
        self.purged: list[str] = []
        self._batch: BatchState | None = None

    def _initial(self, data: Any, keys: Sequence[str] | None) -> pa.Table | None:
        if data is None:
            return None
        table = _table(data, "initial_state")
        names = list(keys or self.grouping_keys)
        if len(names) != len(self.grouping_keys) or any(n not in table.column_names for n in names):
            raise InputError(
                f"initial_state needs its grouping columns {names} (one per grouping key "
                f"{self.grouping_keys}); it has {table.column_names}"
            )
        for name, field in zip(names, self.grouping, strict=True):
            column = cast_column(table.column(name), field, "initial_state grouping column")
            table = table.set_column(table.column_names.index(name), name, column)
        return table

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_batch"] = None
        state.pop("_codec", None)  # it holds struct.Struct objects: made where used
        return state

    @property
    def key_codec(self) -> KeyCodec:
        """Encodes a grouping key into a timer's key string and back."""
        codec: KeyCodec | None = self.__dict__.get("_codec")
        if codec is None:
            codec = self._codec = KeyCodec(TableSchema(1, self.grouping, self.grouping_keys))
        return codec

    # -- the query ----------------------------------------------------------------------

    def check_watermarks(self, watermarks: Mapping[int, Watermark]) -> None:
        """In ``EventTime`` mode the input's watermark column judges late rows,
        unless ``input_event_time`` names one."""
        if self.time_mode == "EventTime" and self.input_event_time is None and 0 in watermarks:
            self.input_event_time = watermarks[0].column

    def check_state(self, stored: Sequence[TableMeta]) -> None:
        """Before the query starts on state a run of the processor left: each
        declared variable must go on from its stored table (else an
        :class:`InputError` naming it and its call); a stored variable this
        ``init`` no longer declares is kept as it is, as Spark keeps it, and
        one it passes to ``deleteIfExists`` is emptied."""
        declared = {t.name: t for t in self.tables}
        for meta in stored:
            if meta.table_id >= 0xFFFF_0000:
                continue  # relstate's own (the timers): every operator has it
            new = declared.get(meta.name)
            variable = self.variables.get(meta.name)
            if new is not None and variable is not None:
                check_variable(variable, new, meta, len(self.grouping))
            elif new is None:
                self.tables = [*self.tables, meta.table_schema()]
                base = meta.name.removesuffix("$ttl")
                if base in self.deleted:
                    self.purged.append(meta.name)

    def wants_batch_without_input(self, watermark_moved: bool) -> bool:
        """Spark's ``shouldRunAnotherBatch``: in ``ProcessingTime`` mode after
        every batch (timers and TTL move with the clock), in ``EventTime``
        mode when the watermark moved."""
        if self.time_mode == "ProcessingTime":
            return True
        return self.time_mode == "EventTime" and watermark_moved

    # -- the batch ----------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        """Spark's start of a partition's batch: ``init``, expired TTL
        entries removed, the initial state in batch 0."""
        batch = self._batch = BatchState(self, ctx)
        handle = RuntimeHandle(batch)
        self.processor.init(handle)
        handle.check(self.variables)
        for name in self.purged:
            table = ctx.table(name)
            if table.row_count:
                table.delete_keys(table.scan_batch().select(list(table.schema.key_names)))
        removed = sum(s.expire(ctx.processing_time) for s in batch.states.values())
        if removed:
            ctx.count(EXPIRED, removed)
        if ctx.batch_id == 0 and self.initial_state is not None:
            self._handle_initial_state(ctx, batch)

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Late rows out, the rest grouped by key, ``handleInputRows`` per key."""
        state = self._state()
        batch = self._on_time(ctx, batch)
        if not batch.num_rows:
            return
        names = self.inputs[0].names
        keys, starts, order = _groups(batch, self.grouping_keys)
        state.enter_chunk(keys)
        values = batch.select(names).take(order)
        timer_values = state.timer_values
        handle = self.processor.handleInputRows
        scope = state.scope
        if self.flavour == "rows":
            rows = _rows(values)
            for i, key in enumerate(state.chunk_keys):
                scope.key = key
                state.collect(handle(key, iter(rows[starts[i] : starts[i + 1]]), timer_values))
        else:
            frame = _frame(values)
            for i, key in enumerate(state.chunk_keys):
                scope.key = key
                part = frame.iloc[starts[i] : starts[i + 1]]
                part.index = _range_index(starts[i + 1] - starts[i])
                state.collect(handle(key, iter([part]), timer_values))
        state.leave_chunk()
        state.emit(ctx)

    def on_timer(self, ctx: OperatorContext, timer: Timer) -> None:
        """``handleExpiredTimer`` for the timer's key, called by keyword as
        Spark calls it, the key a ``Row`` of the grouping columns as Spark
        gives it there; the timer is deleted after it, as Spark does (one the
        handler registers again at the same time is gone too). A timer that
        a ``handleExpiredTimer`` of this batch registered fires in the next
        batch, as in Spark: the batch's timers are those due when its timers
        start."""
        state = self._state()
        key = self.key_codec.decode(bytes.fromhex(timer.key))
        if (key, timer.time) in state.deferred:
            ctx.register_timer(timer)
            return
        state.fire(key, timer.time)
        ctx.count(FIRED)
        state.emit(ctx)

    def flush(self, ctx: OperatorContext) -> None:
        """Write the state the processor changed to the tables."""
        if self._batch is not None:
            self._batch.flush()

    def close(self, ctx: OperatorContext) -> None:
        """The processor's ``close``, as Spark calls it at the end of a
        partition's batch. In ``EventTime`` mode before the first watermark
        Spark's watermark is 0, and event-time timers at or below it fire
        here (relstate's timers wait for a watermark)."""
        if self._batch is not None:
            if self.time_mode == "EventTime" and ctx.watermark is None:
                self._batch.fire_at_zero()
                self._batch.emit(ctx)
            self._batch.flush()
            self.processor.close()
            self._batch = None

    # -- helpers ------------------------------------------------------------------------

    def _state(self) -> BatchState:
        if self._batch is None:
            raise InputError(f"operator {self.name!r}: a batch step before open")
        return self._batch

    def _on_time(self, ctx: OperatorContext, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Spark's late-row filter in ``EventTime`` mode: a row whose event
        time is at or below the previous batch's watermark is dropped."""
        column = self.input_event_time
        mark = ctx.previous_watermark
        if self.time_mode != "EventTime" or column is None or mark is None:
            return batch
        times = batch.column(column)
        micros = pc.cast(times, pa.timestamp("us", tz=times.type.tz)).cast(pa.int64())
        kept = pc.fill_null(pc.greater(micros, mark * 1000), True)
        late = batch.num_rows - pc.sum(kept.cast(pa.int64())).as_py()
        if late:
            ctx.count(LATE, late)
            return batch.filter(kept)
        return batch

    def _handle_initial_state(self, ctx: OperatorContext, state: BatchState) -> None:
        table = self.initial_state
        assert table is not None
        names = self.initial_state_keys
        if ctx.partition_count > 1:
            types = [f.type for f in self.grouping]
            key_lists = [table.column(n).to_pylist() for n in names]
            mine = [
                ctx.partition_of(key, types) == ctx.partition_id
                for key in zip(*key_lists, strict=True)
            ]
            table = table.filter(pa.array(mine, pa.bool_()))
        if not table.num_rows:
            return
        batch = table.combine_chunks().to_batches()[0]
        renamed = batch.select(names).rename_columns(self.grouping_keys)
        keys, starts, order = _groups(renamed, self.grouping_keys)
        state.enter_chunk(keys)
        values = batch.take(order)
        handler = getattr(self.processor, "handleInitialState", None)
        scope = state.scope
        if handler is not None:
            if self.flavour == "rows":
                rows = _rows(values)
                for i, key in enumerate(state.chunk_keys):
                    scope.key = key
                    for row in rows[starts[i] : starts[i + 1]]:
                        handler(key, row, state.timer_values)
            else:
                frame = _frame(values)
                for i, key in enumerate(state.chunk_keys):
                    scope.key = key
                    part = frame.iloc[starts[i] : starts[i + 1]]
                    part.index = _range_index(starts[i + 1] - starts[i])
                    handler(key, part, state.timer_values)
        state.leave_chunk()


class BatchState:
    """One partition's batch of a :class:`StatefulProcessorOperator`: the
    variables' states, the current key, the timers, the output so far."""

    def __init__(self, operator: StatefulProcessorOperator, ctx: OperatorContext) -> None:
        self.operator = operator
        self.ctx = ctx
        self.grouping = operator.grouping
        self.time_mode = operator.time_mode
        self.scope = Scope(ctx.processing_time, operator.grouping_keys)
        self.states: dict[str, VariableState] = {}
        for name, variable in operator.variables.items():
            ttl = ctx.table(variable.ttl_table) if variable.ttl_ms else None
            cls = _STATES[variable.kind]
            self.states[name] = cls(variable, self.scope, ctx.table(name), ttl)
        self.chunk_keys: list[tuple[Any, ...]] = []
        mode = operator.time_mode
        if mode == "None":
            self.timer_values = TimerValues(-1, -1)
        else:
            # Spark's watermark is 0 before the first one, in both modes.
            mark = ctx.watermark
            self.timer_values = TimerValues(ctx.processing_time, 0 if mark is None else mark)
        self._out: list[Any] = []
        #: Timers (key, time) a ``handleExpiredTimer`` registered in this
        #: batch: they wait for the next one.
        self.deferred: set[tuple[tuple[Any, ...], int]] = set()
        self._in_timer = False
        #: What the handlers returned, as they returned it, when the caller
        #: takes it raw (``TwsTester``) instead of as the batch's output.
        self.raw: list[Any] | None = None

    # -- chunks and output ----------------------------------------------------------------

    def enter_chunk(self, keys: pa.Table) -> None:
        columns = [c.to_pylist() for c in keys.columns]
        self.chunk_keys = list(zip(*columns, strict=True))
        self.scope.chunk = keys
        self.scope.chunk_keys = set(self.chunk_keys)

    def leave_chunk(self) -> None:
        self.flush()
        self.scope.chunk = None
        self.scope.chunk_keys = set()

    def collect(self, result: Iterable[Any] | None) -> None:
        """Take what a handler returned (an iterator of Rows or DataFrames)."""
        if result is not None:
            self._out.extend(result)

    def flush(self) -> None:
        for state in self.states.values():
            state.flush()

    def emit(self, ctx: OperatorContext) -> None:
        """Hand what the handlers returned on as one Arrow batch."""
        if not self._out:
            return
        out, self._out = self._out, []
        if self.raw is not None:
            self.raw.extend(out)
            return
        operator = self.operator
        if operator.flavour == "rows":
            batch = _rows_out(out, operator.output)
        else:
            batch = _frames_out(out, operator.output)
        if not batch.num_rows:
            return
        self._check_event_times(batch)
        ctx.emit_batch(batch.columns)

    def _check_event_times(self, batch: pa.RecordBatch) -> None:
        column = self.operator.event_time_column
        mark = self.ctx.previous_watermark
        if column is None or mark is None or self.operator.time_mode != "EventTime":
            return
        times = batch.column(column)
        micros = pc.cast(times, pa.timestamp("us", tz=times.type.tz)).cast(pa.int64())
        oldest = pc.min(micros).as_py()
        if oldest is not None and oldest < mark * 1000:
            raise InputError(
                f"EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED: the processor emitted a row "
                f"whose {column!r} ({oldest} us) is older than the watermark ({mark} ms); Spark "
                "fails the batch too"
            )

    # -- timers -------------------------------------------------------------------------

    def _timers_allowed(self, call: str) -> None:
        if self.time_mode == "None":
            raise InputError(f"{call}: timers need timeMode 'ProcessingTime' or 'EventTime'")

    def _timer(self, key: tuple[Any, ...], time: int) -> Timer:
        encoded = self.operator.key_codec.encode(key).hex()
        return Timer(time, encoded, self.operator._domain)

    def fire(self, key: tuple[Any, ...], time: int) -> None:
        """Call ``handleExpiredTimer`` for the timer ``(key, time)``, then
        delete it."""
        self.scope.key = key
        handler = getattr(self.operator.processor, "handleExpiredTimer", None)
        if handler is not None:
            self._in_timer = True
            try:
                self.collect(
                    handler(
                        key=self._key_row(key),
                        timerValues=self.timer_values,
                        expiredTimerInfo=ExpiredTimerInfo(time),
                    )
                )
            finally:
                self._in_timer = False
        self.delete_timer(key, time, count=False)

    def _key_row(self, key: tuple[Any, ...]) -> Any:
        from pyspark.sql import Row

        return Row(**dict(zip(self.operator.grouping_keys, key, strict=True)))

    def fire_at_zero(self) -> None:
        """Fire the event-time timers at or below 0, Spark's watermark before
        the first one."""
        table = self.ctx.table("$timers")
        due = [row for row in table.scan() if row[-1] <= 0]
        for row in due:
            self.fire(tuple(row[:-1]), row[-1])
            self.ctx.count(FIRED)

    def register_timer(self, time: int) -> None:
        self._timers_allowed("registerTimer")
        if self.operator.refuse_past_event_timers and self.time_mode == "EventTime":
            mark = self.ctx.watermark or 0
            if time <= mark:
                from pyspark.errors.exceptions.base import IllegalArgumentException

                raise IllegalArgumentException(
                    message=f"Cannot register timer with expiry {time} ms which is not later "
                    f"than the current watermark {mark} ms."
                )
        key = self.scope.key
        if self._in_timer:
            self.deferred.add((key, time))
        self.ctx.register_timer(self._timer(key, time))
        self.ctx.table("$timers").upsert((*key, time))
        self.ctx.count(REGISTERED)

    def delete_timer(self, key: tuple[Any, ...], time: int, count: bool = True) -> None:
        self._timers_allowed("deleteTimer")
        self.ctx.delete_timer(self._timer(key, time))
        if self.ctx.table("$timers").delete_key((*key, time)) is not None and count:
            self.ctx.count(DELETED)

    def list_timers(self) -> Iterator[int]:
        self._timers_allowed("listTimers")
        rows = self.ctx.table("$timers").scan(self.scope.key)
        return iter([row[-1] for row in rows])


def _groups(batch: pa.RecordBatch, names: Sequence[str]) -> tuple[pa.Table, list[int], pa.Array]:
    """The distinct keys of ``batch`` in order of first appearance, where each
    key's rows start in ``order`` (one more start at the end), and ``order``:
    the row positions grouped by key, in input order within a key."""
    table = pa.Table.from_batches([batch.select(list(names))])
    table = table.append_column(_ROW, pa.array(np.arange(batch.num_rows, dtype=np.int64)))
    grouped = table.group_by(list(names), use_threads=False).aggregate([(_ROW, "list")])
    lists = grouped.column(f"{_ROW}_list").combine_chunks()
    offsets = lists.offsets.to_pylist()
    return grouped.select(list(names)), offsets, lists.values


def _rows(values: pa.RecordBatch) -> list[Any]:
    """The rows as PySpark ``Row`` s with the batch's column names. Each is a
    tuple made in C whose class (a ``Row`` subclass made per batch) holds the
    names; it behaves, compares and pickles as the ``Row`` Spark hands over."""
    from pyspark.sql import Row

    names = list(values.schema.names)
    row = type("Row", (Row,), {"__fields__": names, "__module__": Row.__module__})
    columns = [c.to_pylist() for c in values.columns]
    return list(map(partial(tuple.__new__, row), zip(*columns, strict=True)))


def _frame(values: pa.RecordBatch) -> Any:
    """The rows as pandas, as PySpark hands them to a pandas UDF: timestamps
    naive in UTC."""
    columns = []
    for column, field in zip(values.columns, values.schema, strict=True):
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            column = column.cast(pa.timestamp(field.type.unit))
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=values.schema.names).to_pandas()


def _range_index(n: int) -> Any:
    import pandas as pd

    return pd.RangeIndex(n)


def _rows_out(rows: list[Any], schema: pa.Schema) -> pa.RecordBatch:
    """Rows a handler returned, matched to the output schema by field name
    (as PySpark's ``Row.asDict``; a name the row lacks is null), or by
    position for a plain tuple."""
    names = schema.names
    tuples: list[Any] = []
    for row in rows:
        fields = getattr(row, "__fields__", None)
        if fields is None or fields == names:
            tuples.append(row)
        else:
            as_dict = row.asDict()
            tuples.append(tuple(as_dict.get(n) for n in names))
    try:
        return rows_batch(list(schema), tuples)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputError(
            f"the processor returned rows that do not fit the output schema {schema}: {exc}"
        ) from exc


def _column_values(frame: Any, position: int) -> Any:
    """Column ``position`` of a DataFrame as an array. A column's Series is
    made on first access, which costs more than the processor's whole frame;
    pandas 2 reads the block directly (``_get_column_array``)."""
    read = getattr(frame, "_get_column_array", None)
    if read is not None:
        return read(position)
    return frame.iloc[:, position].to_numpy()


def _frames_out(frames: list[Any], schema: pa.Schema) -> pa.RecordBatch:
    """DataFrames a handler returned, as one batch of the output schema:
    columns by name when every label is a string, else by position (as
    PySpark's ``assign_cols_by_name``). Each column's parts are joined in
    numpy and converted to Arrow once."""
    import pandas as pd

    names = schema.names
    parts: list[list[Any]] = [[] for _ in names]
    for frame in frames:
        if not isinstance(frame, pd.DataFrame):
            raise InputError(
                f"a pandas processor returns an iterator of pandas DataFrames, got "
                f"{type(frame).__name__}"
            )
        if not len(frame):
            continue
        labels = frame.columns.tolist()
        if all(isinstance(c, str) for c in labels):
            missing = [n for n in names if n not in labels]
            if missing:
                raise InputError(
                    f"a returned DataFrame lacks output column(s) {missing}; it has {labels}"
                )
            positions: Iterable[int] = [labels.index(n) for n in names]
        elif len(labels) < len(names):
            raise InputError(
                f"a returned DataFrame has {len(labels)} columns, the output schema {len(names)}"
            )
        else:
            positions = range(len(names))
        for column, position in zip(parts, positions, strict=True):
            column.append(_column_values(frame, position))
    if not parts or not parts[0]:
        return pa.RecordBatch.from_pylist([], schema=schema)
    arrays = []
    for column, field in zip(parts, schema, strict=True):
        if len(column) == 1:
            values = column[0]
        elif all(isinstance(c, np.ndarray) for c in column):
            values = np.concatenate(column)
        else:
            values = np.concatenate([np.asarray(c, dtype=object) for c in column])
        try:
            arrays.append(pa.array(values, type=field.type, from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            raise InputError(
                f"the processor returned DataFrames whose column {field.name!r} does not fit "
                f"the output type {field.type}: {exc}"
            ) from exc
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _kind(meta: TableMeta, n_grouping: int) -> str:
    """The kind of state variable a stored table holds."""
    keys = [name for name, _, _ in meta.key_columns]
    if len(keys) > n_grouping and keys[n_grouping] == POSITION:
        return "list"
    return "map" if len(keys) > n_grouping else "value"


def check_variable(
    variable: StateVariable, new: TableSchema, old: TableMeta, n_grouping: int
) -> None:
    """Raise :class:`InputError` naming the variable and its call unless its
    table ``new`` can go on from the stored ``old`` (Spark's rules where it
    has them: a variable keeps its kind, its key and its value schema)."""
    what = f"state variable {variable.name!r} ({variable.call})"
    kind = _kind(old, n_grouping)
    if kind != variable.kind:
        raise InputError(
            f"{what}: the checkpoint holds {variable.name!r} as a {kind} state; a state "
            "variable cannot change its kind (Spark refuses it too: "
            "STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE); use a new name, or deleteIfExists"
        )
    old_fields = [f for f in old.columns if f.name != EXPIRES_AT]
    new_fields = [f for f in new.columns if f.name != EXPIRES_AT]
    if EXPIRES_AT in old.columns.names and variable.ttl_ms is None:
        raise InputError(
            f"{what}: the checkpoint holds it with a TTL and init declares none; relstate "
            "cannot drop a TTL from stored state: keep a TTL (a long one), or use a new name"
        )
    n_key = len(old.key_columns)
    for part, olds, news in (
        ("key", old_fields[:n_key], new_fields[:n_key]),
        ("value", old_fields[n_key:], new_fields[n_key:]),
    ):
        old_types = [str(f.type) for f in olds]
        new_types = [str(f.type) for f in news]
        if old_types != new_types:
            code = "KEY" if part == "key" else "VALUE"
            raise InputError(
                f"{what}: its {part} schema was {[f'{f.name} {f.type}' for f in olds]} and "
                f"init declares {[f'{f.name} {f.type}' for f in news]}; Spark refuses the "
                f"change too (STATE_STORE_{code}_SCHEMA_NOT_COMPATIBLE): use a new name, "
                "or deleteIfExists the old one"
            )
        if [f.name for f in olds] != [f.name for f in news]:
            raise InputError(
                f"{what}: its {part} fields were named {[f.name for f in olds]} and init "
                f"names them {[f.name for f in news]}; relstate keeps a stored field's name "
                "(Spark would take the rename): keep the names"
            )
