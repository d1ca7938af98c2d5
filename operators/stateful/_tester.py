"""``TwsTester``: PySpark's ``pyspark.sql.streaming.tws_tester.TwsTester``
(Spark 4.2+) with the same constructor and calls, over relstate state, so a
processor's existing unit tests run against relstate unchanged. Each call is
one batch of the operator, committed; unlike Spark's tester it applies TTL
(against the processing time ``setProcessingTime`` sets).

Beyond Spark's arguments, ``keyType`` (keyword only) gives the grouping
key's Arrow type; by default it is read from the first key the tester sees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from operators._engine.task import BatchRun, state_tables
from operators.stateful._core import BatchState, StatefulProcessorOperator, TimerValues
from statestore import ConsistencyMode, MemoryStateStore

__all__ = ["TwsTester"]


class TwsTester:
    """Unit-test a ``StatefulProcessor`` without Spark, over relstate state;
    the calls of PySpark's ``TwsTester`` (``test``, ``testInPandas``,
    ``peek*State``, ``update*State``, ``deleteState``, ``setProcessingTime``,
    ``setWatermark``)."""

    def __init__(
        self,
        processor: Any,
        initialStateRow: list[tuple[Any, Any]] | None = None,
        initialStatePandas: list[tuple[Any, Any]] | None = None,
        timeMode: str = "None",
        outputMode: str = "Append",
        eventTimeExtractor: Callable[[Any], int] | None = None,
        *,
        keyType: pa.DataType | None = None,
    ) -> None:
        from pyspark.errors import PySparkValueError

        self.processor = processor
        self._timeMode = timeMode.lower()
        self._outputMode = outputMode
        self._eventTimeExtractor = eventTimeExtractor
        self._usingPandas = False
        self._currentProcessingTimeMs = 0
        self._currentWatermarkMs = 0
        assert self._timeMode in ["none", "eventtime", "processingtime"]
        if self._timeMode == "eventtime" and eventTimeExtractor is None:
            raise PySparkValueError(
                errorClass="ARGUMENT_REQUIRED",
                messageParameters={
                    "arg_name": "eventTimeExtractor",
                    "condition": "timeMode is EventTime",
                },
            )
        self._keyType = keyType
        self._op: StatefulProcessorOperator | None = None
        self._store: MemoryStateStore | None = None
        self._version = -1
        if initialStateRow is not None:
            assert initialStatePandas is None, "Cannot specify both Row and Pandas initial states."
            self._initial(initialStateRow)
        elif initialStatePandas is not None:
            self._usingPandas = True
            self._initial(initialStatePandas)
        elif keyType is not None:
            self._operator(None)

    # -- the operator and its batches -----------------------------------------------------

    def _operator(self, key: Any) -> StatefulProcessorOperator:
        if self._op is None:
            key_type = self._keyType or pa.scalar(key).type
            op = StatefulProcessorOperator(
                self.processor,
                pa.schema([pa.field("key", key_type)]),
                ["key"],
                pa.schema([]),
                output_mode=self._outputMode
                if self._outputMode.lower() != "complete"
                else "Update",
                time_mode=self._timeMode,
                name="tws_tester",
            )
            op.refuse_past_event_timers = True
            store = MemoryStateStore(op.name, 0, state_tables(op), ConsistencyMode.STRICT)
            store.load(None)
            self._store = store
            self._op = op
        return self._op

    def _batch(
        self, key: Any, step: Callable[[BatchState, BatchRun], Any], watermark: int | None = None
    ) -> Any:
        """Run ``step`` in one committed batch of the operator."""
        op = self._operator(key)
        assert self._store is not None
        previous = self._currentWatermarkMs
        mark = previous if watermark is None else watermark
        run = BatchRun(
            op,
            self._store.tables,
            self._version + 1,
            0,
            mark if self._timeMode == "eventtime" else None,
            previous if self._timeMode == "eventtime" else None,
            self._currentProcessingTimeMs,
        )
        run.open()
        state = op._state()
        state.raw = []
        # PySpark's tester's TimerValues (no watermark in ProcessingTime mode).
        if self._timeMode == "none":
            state.timer_values = TimerValues(-1, -1)
        elif self._timeMode == "processingtime":
            state.timer_values = TimerValues(self._currentProcessingTimeMs, -1)
        else:
            state.timer_values = TimerValues(self._currentProcessingTimeMs, mark)
        result = step(state, run)
        run.finish()
        self._version += 1
        self._store.commit(self._version)
        return result

    def _initial(self, pairs: list[tuple[Any, Any]]) -> None:
        if not pairs:
            return

        def step(state: BatchState, run: BatchRun) -> None:
            for key, value in pairs:
                state.scope.key = (key,)
                self.processor.handleInitialState((key,), value, state.timer_values)
            state.flush()

        self._batch(pairs[0][0], step)

    def _handle(self, key: Any, values: Iterator[Any]) -> list[Any]:
        def step(state: BatchState, run: BatchRun) -> list[Any]:
            state.scope.key = (key,)
            out = list(self.processor.handleInputRows((key,), values, state.timer_values))
            state.flush()
            return out

        result: list[Any] = self._batch(key, step)
        return result

    # -- Spark's calls ----------------------------------------------------------------------

    def test(self, key: Any, input: list[Any]) -> list[Any]:
        """Process ``input`` (Rows) for ``key``; returns the Rows it emitted.
        In EventTime mode rows at or below the watermark are dropped first."""
        self._usingPandas = False
        rows = input
        if self._timeMode == "eventtime" and self._eventTimeExtractor is not None:
            extract = self._eventTimeExtractor
            rows = [v for v in input if extract(v) > self._currentWatermarkMs]
        return self._handle(key, iter(rows))

    def testInPandas(self, key: Any, input: Any) -> Any:
        """:meth:`test` with a pandas DataFrame in and out."""
        self._usingPandas = True
        frame = input
        if self._timeMode == "eventtime" and self._eventTimeExtractor is not None:
            extract = self._eventTimeExtractor
            mask = frame.apply(lambda row: extract(row) > self._currentWatermarkMs, axis=1)
            frame = frame[mask].reset_index(drop=True)
        return _concat(self._handle(key, iter([frame])))

    def _variable(self, stateName: str, kind: str, key: Any) -> None:
        op = self._operator(key)
        variable = op.variables.get(stateName)
        assert variable is not None and variable.kind == kind, (
            f"State {stateName} has not been initialized."
        )

    def _on(self, stateName: str, kind: str, key: Any, call: Callable[[Any], Any]) -> Any:
        self._variable(stateName, kind, key)

        def step(state: BatchState, run: BatchRun) -> Any:
            state.scope.key = (key,)
            result = call(state.states[stateName])
            state.flush()
            return result

        return self._batch(key, step)

    def updateValueState(self, stateName: str, key: Any, value: tuple[Any, ...]) -> None:
        """Set the value state ``stateName`` of ``key``."""
        self._on(stateName, "value", key, lambda s: s.update(value))

    def peekValueState(self, stateName: str, key: Any) -> tuple[Any, ...] | None:
        """The value state ``stateName`` of ``key`` (``None`` if none)."""
        return self._on(stateName, "value", key, lambda s: s.get())  # type: ignore[no-any-return]

    def updateListState(self, stateName: str, key: Any, value: list[tuple[Any, ...]]) -> None:
        """Set the list state ``stateName`` of ``key``."""

        def put(state: Any) -> None:
            state.clear()
            if value:
                state.put(value)

        self._on(stateName, "list", key, put)

    def peekListState(self, stateName: str, key: Any) -> list[tuple[Any, ...]]:
        """The list state ``stateName`` of ``key`` (empty if none)."""
        return self._on(stateName, "list", key, lambda s: list(s.get()))  # type: ignore[no-any-return]

    def updateMapState(self, stateName: str, key: Any, value: dict[Any, Any]) -> None:
        """Set the map state ``stateName`` of ``key``."""

        def put(state: Any) -> None:
            state.clear()
            for user_key, user_value in dict(value).items():
                state.updateValue(user_key, user_value)

        self._on(stateName, "map", key, put)

    def peekMapState(self, stateName: str, key: Any) -> dict[Any, Any]:
        """The map state ``stateName`` of ``key`` (empty if none)."""
        return self._on(stateName, "map", key, lambda s: dict(s.iterator()))  # type: ignore[no-any-return]

    def deleteState(self, stateName: str, key: Any) -> None:
        """Clear the state ``stateName`` of ``key``."""
        from pyspark.errors import PySparkAssertionError

        op = self._operator(key)
        variable = op.variables.get(stateName)
        if variable is None:
            raise PySparkAssertionError(errorClass="STATE_NOT_EXISTS", messageParameters={})
        self._on(stateName, variable.kind, key, lambda s: s.clear())

    def _fire(self, key_for_type: Any, watermark: int | None) -> Any:
        def step(state: BatchState, run: BatchRun) -> list[Any]:
            run.fire_timers()
            state.flush()
            return list(state.raw or [])

        if self._op is None:
            out: list[Any] = []
        else:
            out = self._batch(None, step, watermark)
        return _concat(out) if self._usingPandas else out

    def setProcessingTime(self, currentTimeMs: int) -> Any:
        """Move processing time to ``currentTimeMs`` and fire the due timers;
        returns what ``handleExpiredTimer`` emitted."""
        from pyspark.errors import PySparkValueError
        from pyspark.errors.exceptions.base import IllegalArgumentException

        if self._timeMode != "processingtime":
            raise PySparkValueError(
                errorClass="UNSUPPORTED_OPERATION",
                messageParameters={
                    "operation": "setProcessingTime with TimeMode other than ProcessingTime"
                },
            )
        if currentTimeMs <= self._currentProcessingTimeMs:
            raise IllegalArgumentException(
                message=f"Processing time must move forward. "
                f"Current: {self._currentProcessingTimeMs} ms, provided: {currentTimeMs} ms."
            )
        self._currentProcessingTimeMs = currentTimeMs
        return self._fire(None, None)

    def setWatermark(self, currentWatermarkMs: int) -> Any:
        """Move the watermark to ``currentWatermarkMs`` and fire the due
        event-time timers; returns what ``handleExpiredTimer`` emitted."""
        from pyspark.errors import PySparkValueError
        from pyspark.errors.exceptions.base import IllegalArgumentException

        if self._timeMode != "eventtime":
            raise PySparkValueError(
                errorClass="UNSUPPORTED_OPERATION",
                messageParameters={"operation": "setWatermark with TimeMode other than EventTime"},
            )
        if currentWatermarkMs <= self._currentWatermarkMs:
            raise IllegalArgumentException(
                message=f"Watermark must move forward. "
                f"Current: {self._currentWatermarkMs} ms, provided: {currentWatermarkMs} ms."
            )
        out = self._fire(None, currentWatermarkMs)
        self._currentWatermarkMs = currentWatermarkMs
        return out


def _concat(frames: list[Any]) -> Any:
    import pandas as pd

    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)
