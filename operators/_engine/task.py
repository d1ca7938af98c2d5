"""One partition's micro-batch: feed the operator its input, fire due timers,
advance the watermark, collect what it emits. The test harness and the Spark
runner both drive an operator through :class:`BatchRun`; committing is theirs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from encoding import PartitionLocal, TableSchema
from operators._api.changelog import ROW_KIND, RowKind, kind_symbols, row_kind_array
from operators._api.dirty import BadRows, InputPolicy
from operators._api.operator import Operator, OperatorContext, TimeDomain, Timer
from operators._api.relational import cast_column
from operators._engine.dead_letters import SET_ASIDE, letters, row_faults
from operators._engine.spark_hash import spark_partition
from operators.errors import InputError
from statestore import StateTable, get_logger

__all__ = ["TIMERS", "BatchRun", "check_input", "output_schema", "state_metrics", "state_tables"]

#: The timers of an operator partition, kept as state so they survive restarts.
TIMERS = TableSchema(
    0xFFFF_FFF0,
    pa.schema(
        [
            pa.field("domain", pa.int8(), nullable=False),
            pa.field("time", pa.int64(), nullable=False),
            pa.field("key", pa.string(), nullable=False),
        ]
    ),
    ["domain", "time", "key"],
    name="__timers",
    # A timer's key is the operator's own string: no partition can be told.
    partition_by=PartitionLocal(),
    auxiliary=True,
)
_DOMAIN = {TimeDomain.EVENT_TIME: 0, TimeDomain.PROCESSING_TIME: 1}


def state_tables(operator: Operator) -> list[TableSchema]:
    """The operator's tables and relstate's timer table."""
    tables = list(operator.tables)
    for t in tables:
        if t.table_id >= 0xFFFF_0000 or t.name.startswith("__"):
            raise InputError(
                f"operator {operator.name!r}: table {t.name!r} uses id {t.table_id:#x} or "
                "a '__' name, which relstate keeps for itself; use an id below 0xFFFF0000"
            )
    return [*tables, TIMERS]


def check_input(
    operator: Operator, side: int, batch: pa.RecordBatch, where: str | None = None
) -> None:
    """Raise :class:`InputError` unless ``batch`` has every column of input
    ``side`` with its type, and valid row kinds. ``where`` names the input
    as the user named it (``source 'users' (input 1 of stage 'join')``)."""
    if not 0 <= side < len(operator.inputs):
        raise InputError(
            f"operator {operator.name!r} has {len(operator.inputs)} input(s); got side {side}"
        )
    where = where or f"input {side} of operator {operator.name!r}"
    expected = operator.inputs[side]
    for fld in expected:
        index = batch.schema.get_field_index(fld.name)
        if index < 0:
            raise InputError(f"{where} has no column {fld.name!r}; it has {batch.schema.names}")
        actual = batch.schema.field(index).type
        if actual != fld.type:
            raise InputError(
                f"column {fld.name!r} of {where} has type {actual}, expected {fld.type}; "
                "cast it first"
            )
        if not fld.nullable and batch.column(index).null_count:
            raise InputError(
                f"column {fld.name!r} of {where} holds nulls but is declared not nullable "
                "(bad_rows='set_aside' sets such rows aside)"
            )
    unknown = kind_symbols(batch) - {k.value for k in RowKind}
    if unknown:
        raise InputError(
            f"{where}: unknown row kind(s) {sorted(map(repr, unknown))}; a changelog row is "
            "'+I', '-U', '+U' or '-D' (bad_rows='set_aside' sets such rows aside)"
        )


class BatchRun(OperatorContext):
    """The context of one partition's micro-batch, and the steps that run it."""

    def __init__(
        self,
        operator: Operator,
        tables: Mapping[str, StateTable],
        batch_id: int,
        partition_id: int,
        watermark: int | None,
        previous_watermark: int | None,
        processing_time: int | None = None,
        log: Any | None = None,
        partition_count: int = 1,
        policy: InputPolicy | None = None,
    ) -> None:
        self.operator = operator
        self.partition_count = partition_count
        self.policy = InputPolicy(stage=operator.name) if policy is None else policy
        self._tables = {k: v for k, v in tables.items() if k != TIMERS.name}
        self._timers = tables[TIMERS.name]
        self.batch_id = batch_id
        self.partition_id = partition_id
        self.watermark = watermark
        self.previous_watermark = previous_watermark
        self.processing_time = (
            int(time.time() * 1000) if processing_time is None else processing_time
        )
        self.metrics: dict[str, int] = {}
        self.log = (log or get_logger(__name__)).bind(
            operator=operator.name, batch_id=batch_id, partition=partition_id
        )
        self._kinds: list[str] = []
        self._rows: list[Sequence[Any]] = []
        #: Output already in Arrow form, in emit order, before ``_rows``.
        self._batches: list[pa.RecordBatch] = []
        self._update_ns = 0
        self._removal_ns = 0
        self._opened = False
        #: The rows set aside (``bad_rows="set_aside"``), as dead letters
        #: without batch and stage (operators/_dead_letters.py).
        self.set_aside: list[dict[str, Any]] = []

    # -- the context ---------------------------------------------------------------

    def table(self, name: str) -> StateTable:
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError(
                f"operator {self.operator.name!r} has no table {name!r}; it declares "
                f"{sorted(self._tables)}"
            ) from None

    @property
    def tables(self) -> Mapping[str, StateTable]:
        return self._tables

    def emit(self, row: Sequence[Any], kind: RowKind = RowKind.INSERT) -> None:
        self._rows.append(row)
        # The member's own attribute: ``.value`` goes through a descriptor,
        # a cost per output row.
        self._kinds.append(kind._value_)

    def emit_rows(self, rows: Sequence[Sequence[Any]], kinds: Sequence[RowKind]) -> None:
        if len(rows) != len(kinds):
            raise InputError(
                f"operator {self.operator.name!r} emitted {len(rows)} rows with {len(kinds)} "
                "row kinds"
            )
        self._rows.extend(rows)
        self._kinds.extend([k._value_ for k in kinds])

    def emit_batch(
        self,
        columns: Sequence[pa.Array | pa.ChunkedArray],
        kind: RowKind | pa.Array = RowKind.INSERT,
    ) -> None:
        output = self.operator.output
        if len(columns) != len(output):
            raise InputError(
                f"operator {self.operator.name!r} emitted {len(columns)} columns, its output "
                f"schema has {len(output)}"
            )
        n = len(columns[0]) if columns else 0
        if not n:
            return
        if self._rows:
            # Rows emitted one at a time before these come out before them.
            self._batches.append(self._row_batch())
        arrays = [cast_column(c, f, "emitted column") for c, f in zip(columns, output, strict=True)]
        arrays.append(
            pa.repeat(pa.scalar(kind.value, pa.string()), n)
            if isinstance(kind, RowKind)
            else row_kind_array(kind, n, self.operator.name)
        )
        self._batches.append(
            pa.RecordBatch.from_arrays(arrays, schema=output_schema(self.operator))
        )

    def partition_of(self, key: Sequence[Any], types: Sequence[pa.DataType]) -> int:
        return spark_partition(key, types, self.partition_count)

    def register_timer(self, timer: Timer) -> None:
        self._timers.upsert((_DOMAIN[timer.domain], timer.time, timer.key))

    def delete_timer(self, timer: Timer) -> None:
        self._timers.delete_key((_DOMAIN[timer.domain], timer.time, timer.key))

    # -- the steps ------------------------------------------------------------------

    def open(self) -> None:
        """Open the operator's batch (its ``open`` hook), if no step has yet:
        for a driver that calls the operator's handlers itself."""
        self._open()

    def _open(self) -> None:
        if not self._opened:
            self._opened = True
            self.operator.open(self)

    def process(self, side: int, batch: pa.RecordBatch) -> None:
        """Feed one input batch (checked first) to the operator: under
        ``bad_rows="set_aside"`` without the rows it cannot take, which are
        set aside; else such a row fails the batch."""
        if self.policy.bad_rows is BadRows.SET_ASIDE and 0 <= side < len(self.operator.inputs):
            batch = self._without_bad_rows(side, batch)
        check_input(self.operator, side, batch, self.policy.where(side))
        self._open()
        started = time.perf_counter_ns()
        self.operator.process_batch(self, batch, side)
        self._update_ns += time.perf_counter_ns() - started

    def _without_bad_rows(self, side: int, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` without the rows the operator cannot take, which go to
        :attr:`set_aside` and count in ``numRowsSetAside``."""
        reasons = row_faults(self.operator.inputs[side], batch)
        own = self.operator.rejected_rows(batch, side)
        if own is not None:
            reasons = [
                r if r is not None else o for r, o in zip(reasons, own.to_pylist(), strict=True)
            ]
        bad = sum(r is not None for r in reasons)
        if not bad:
            return batch
        self.set_aside += letters(self.policy.sources, self.partition_id, side, batch, reasons)
        self.count(SET_ASIDE, bad)
        return batch.filter(pa.array([r is None for r in reasons]))

    def fire_timers(self) -> int:
        """Fire every due timer in time order (event time up to the watermark,
        processing time up to the processing time); returns how many fired."""
        self._open()
        started = time.perf_counter_ns()
        fired = 0
        for domain, now in (
            (TimeDomain.EVENT_TIME, self.watermark),
            (TimeDomain.PROCESSING_TIME, self.processing_time),
        ):
            if now is None:
                continue
            code = _DOMAIN[domain]
            fired_here: set[tuple[Any, ...]] = set()
            while True:
                # A timer may register another that is already due: loop. One
                # that re-registers itself fires again at the next call, not in
                # this one (which would never end).
                due = [
                    row
                    for row in self._timers.scan((code,), end=(now + 1,))
                    if row not in fired_here
                ]
                if not due:
                    break
                fired_here.update(due)
                for row in due:
                    # An earlier timer of this round may have deleted this one.
                    if self._timers.delete_key(row) is None:
                        continue
                    self.operator.on_timer(self, Timer(row[1], row[2], domain))
                    fired += 1
        self._removal_ns += time.perf_counter_ns() - started
        return fired

    def advance_watermark(self) -> None:
        """Tell the operator the watermark advanced, if it did."""
        wm, prev = self.watermark, self.previous_watermark
        if wm is not None and (prev is None or wm > prev):
            self._open()
            started = time.perf_counter_ns()
            self.operator.on_watermark(self, wm)
            self._removal_ns += time.perf_counter_ns() - started

    def flush(self) -> None:
        """Have the operator write what it holds back to its tables
        (:meth:`~operators.Operator.flush`): they are current after it."""
        if self._opened:
            started = time.perf_counter_ns()
            self.operator.flush(self)
            self._update_ns += time.perf_counter_ns() - started

    def finish(self) -> pa.RecordBatch:
        """Close the operator's batch; the rows emitted since the last
        :meth:`drain`, with their kinds."""
        self._open()
        self.flush()
        self.operator.close(self)
        out = self.drain()
        self.metrics.setdefault("numOutputRows", 0)
        self.metrics["allUpdatesTimeMs"] = self._update_ns // 1_000_000
        self.metrics["allRemovalsTimeMs"] = self._removal_ns // 1_000_000
        return out

    def drain(self) -> pa.RecordBatch:
        """The rows emitted since the last drain, as one Arrow batch of the
        output schema plus the row-kind column."""
        # emit_batch moves rows emitted before it into _batches, so the rows
        # still pending come after every batch.
        batches, self._batches = self._batches, []
        if self._rows:
            batches.append(self._row_batch())
        if not batches:
            out = self._row_batch()
        elif len(batches) == 1:
            out = batches[0]
        else:
            out = _concat(batches)
        # Counted here, not in finish: the harness drains after every call.
        self.metrics["numOutputRows"] = self.metrics.get("numOutputRows", 0) + out.num_rows
        return out

    def _row_batch(self) -> pa.RecordBatch:
        """The rows emitted one at a time since the last call, as a batch."""
        schema = output_schema(self.operator)
        rows, kinds = self._rows, self._kinds
        self._rows, self._kinds = [], []
        width = len(self.operator.output)
        if rows and set(map(len, rows)) != {width}:  # a loop in C
            row = next(r for r in rows if len(r) != width)
            raise InputError(
                f"operator {self.operator.name!r} emitted a row of {len(row)} values, "
                f"its output schema has {width} columns: {row!r}"
            )
        output = self.operator.output
        arrays: list[pa.Array] = []
        if rows and width:
            # Arrow reads row tuples as one struct array: no column tuple
            # made in Python. Rows of another kind (lists) go column by column.
            try:
                arrays = pa.array(rows, type=pa.struct(list(output))).flatten()
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                arrays = []  # the columns raise what is wrong, if anything
        if not arrays:
            columns = list(zip(*rows, strict=True)) if rows else [()] * width
            arrays = [
                pa.array(list(col), type=fld.type) for col, fld in zip(columns, output, strict=True)
            ]
        arrays.append(pa.array(kinds, type=pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of several with one schema."""
    table = pa.Table.from_batches(batches).combine_chunks()
    return table.to_batches()[0] if table.num_rows else batches[0]


def output_schema(operator: Operator) -> pa.Schema:
    """The operator's output schema with the row-kind column last."""
    return pa.schema([*operator.output, pa.field(ROW_KIND, pa.string(), nullable=False)])


def state_metrics(tables: Mapping[str, StateTable]) -> dict[str, int]:
    """Spark's state metrics over the operator's tables. Auxiliary tables
    (the timers, expiry and time indexes) are left out: a key counts once,
    as in Spark."""
    total = updated = removed = 0
    for t in tables.values():
        if t.schema.auxiliary:
            continue
        m = t.metrics
        total += t.row_count
        updated += m.inserted + m.updated
        removed += m.deleted + m.removed_by_range
    return {
        "numTotalStateRows": total,
        "numUpdatedStateRows": updated,
        "numRemovedStateRows": removed,
    }
