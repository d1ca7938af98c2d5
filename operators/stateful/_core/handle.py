"""The handle a processor's ``init`` gets in a batch, and the values its
``handleInputRows`` / ``handleExpiredTimer`` / ``handleInitialState`` see:
the same calls as PySpark's ``StatefulProcessorHandle``, ``TimerValues`` and
``ExpiredTimerInfo``, over relstate's state tables and timers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa

from operators.errors import InputError
from operators.stateful._core.state import Scope
from operators.stateful._core.variables import RecordingHandle

__all__ = ["ExpiredTimerInfo", "HandleBatch", "RuntimeHandle", "TimerValues"]


class HandleBatch(Protocol):
    """What a handle works on: a partition's batch of the operator."""

    @property
    def grouping(self) -> Sequence[pa.Field]: ...

    @property
    def time_mode(self) -> str: ...

    @property
    def scope(self) -> Scope: ...

    @property
    def states(self) -> Mapping[str, Any]: ...

    def register_timer(self, time: int) -> None: ...

    def delete_timer(self, key: tuple[Any, ...], time: int, count: bool = True) -> None: ...

    def list_timers(self) -> Iterator[int]: ...


class TimerValues:
    """The batch's processing time and watermark (milliseconds; ``-1`` where
    the time mode has none), as PySpark's ``TimerValues``."""

    __slots__ = ("_processing_time", "_watermark")

    def __init__(self, currentProcessingTimeInMs: int = -1, currentWatermarkInMs: int = -1) -> None:
        self._processing_time = currentProcessingTimeInMs
        self._watermark = currentWatermarkInMs

    def getCurrentProcessingTimeInMs(self) -> int:
        return self._processing_time

    def getCurrentWatermarkInMs(self) -> int:
        return self._watermark


class ExpiredTimerInfo:
    """The time of the timer that fired, as PySpark's ``ExpiredTimerInfo``."""

    __slots__ = ("_expiry",)

    def __init__(self, expiryTimeInMs: int = -1) -> None:
        self._expiry = expiryTimeInMs

    def getExpiryTimeInMs(self) -> int:
        return self._expiry


class _Dropped:
    """A variable that ``deleteIfExists`` removed in the same ``init``: Spark
    fails every later call on it, and so does relstate."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, call: str) -> Any:
        if call.startswith("__"):
            raise AttributeError(call)
        raise InputError(
            f"state variable {self._name!r}: {call} after deleteIfExists({self._name!r}) "
            "removed it in init"
        )


class RuntimeHandle:
    """``StatefulProcessorHandle`` in a batch: each ``get*State`` returns the
    variable's state over its tables; the calls are recorded and must match
    the declarations the operator learnt when it was built."""

    def __init__(self, batch: HandleBatch) -> None:
        self._batch = batch
        self._recorded = RecordingHandle(batch.grouping, batch.time_mode)

    def _state(self, name: str) -> Any:
        state = self._batch.states.get(name)
        return _Dropped(name) if state is None else state

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        self._recorded.getValueState(stateName, schema, ttlDurationMs)
        return self._state(stateName)

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        self._recorded.getListState(stateName, schema, ttlDurationMs)
        return self._state(stateName)

    def getMapState(
        self,
        stateName: str,
        userKeySchema: Any,
        valueSchema: Any,
        ttlDurationMs: int | None = None,
    ) -> Any:
        self._recorded.getMapState(stateName, userKeySchema, valueSchema, ttlDurationMs)
        return self._state(stateName)

    def deleteIfExists(self, stateName: str) -> None:
        self._recorded.deleteIfExists(stateName)

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._batch.register_timer(int(expiryTimestampMs))

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._batch.delete_timer(self._batch.scope.key, int(expiryTimestampMs))

    def listTimers(self) -> Iterator[int]:
        return self._batch.list_timers()

    def check(self, declared: dict[str, Any]) -> None:
        """Raise unless ``init`` declared what it declared when the operator
        was built (a processor whose ``init`` depends on where it runs)."""
        if self._recorded.variables != declared:
            raise InputError(
                f"the processor's init declared {sorted(self._recorded.variables)} in a batch "
                f"but {sorted(declared)} when the query was built; init must declare the "
                "same state variables every time"
            )
