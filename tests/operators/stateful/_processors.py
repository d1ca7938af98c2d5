"""Small StatefulProcessors the stateful tests run (rows and pandas flavours)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark import cloudpickle
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import LongType, StringType, StructField, StructType

# Spark's Python workers unpickle these classes; this module is not installed.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class RunningCount(StatefulProcessor):
    """A count per key in a value state (DDL schema), emitted each batch."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n bigint")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        current = self.count.get()
        n = 0 if current is None else current[0]
        for _ in rows:
            n += 1
        self.count.update((n,))
        yield Row(key=key[0], count=n)

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        self.count.update((initialState.start,))

    def close(self) -> None:
        pass


class PandasRunningCount(StatefulProcessor):
    """RunningCount over pandas DataFrames (StructType schema)."""

    def init(self, handle: Any) -> None:
        schema = StructType([StructField("n", LongType(), True)])
        self.count = handle.getValueState("count", schema)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        current = self.count.get()
        n = 0 if current is None else current[0]
        for frame in rows:
            n += len(frame)
        self.count.update((n,))
        yield pd.DataFrame({"key": [key[0]], "count": [n]})

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        self.count.update((int(initialState["start"].sum()),))

    def close(self) -> None:
        pass


class Everything(StatefulProcessor):
    """Every call of the three state kinds, driven by the input's ``op`` column:
    each row ``(key, op, arg)`` runs one call and emits what it returns."""

    def init(self, handle: Any) -> None:
        self.value = handle.getValueState("value", "v string")
        self.list = handle.getListState("list", "v string")
        self.map = handle.getMapState("map", "k string", "v string")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        for row in rows:
            yield Row(key=key[0], op=row.op, result=repr(self._call(row.op, row.arg)))

    def _call(self, op: str, arg: str | None) -> Any:
        calls = {
            "v.exists": lambda: self.value.exists(),
            "v.get": lambda: self.value.get(),
            "v.update": lambda: self.value.update((arg,)),
            "v.clear": lambda: self.value.clear(),
            "l.exists": lambda: self.list.exists(),
            "l.get": lambda: list(self.list.get()),
            "l.put": lambda: self.list.put([(a,) for a in (arg or "").split(",")]),
            "l.appendValue": lambda: self.list.appendValue((arg,)),
            "l.appendList": lambda: self.list.appendList([(a,) for a in (arg or "").split(",")]),
            "l.clear": lambda: self.list.clear(),
            "m.exists": lambda: self.map.exists(),
            "m.getValue": lambda: self.map.getValue((arg,)),
            "m.containsKey": lambda: self.map.containsKey((arg,)),
            "m.updateValue": lambda: self.map.updateValue((arg,), (f"{arg}!",)),
            "m.iterator": lambda: sorted(self.map.iterator()),
            "m.keys": lambda: sorted(self.map.keys()),
            "m.values": lambda: sorted(self.map.values()),
            "m.removeKey": lambda: self.map.removeKey((arg,)),
            "m.clear": lambda: self.map.clear(),
        }
        return calls[op]()

    def close(self) -> None:
        pass


class TtlEverything(Everything):
    """Everything with a TTL of 1000 ms on each state variable."""

    def init(self, handle: Any) -> None:
        self.value = handle.getValueState("value", "v string", 1000)
        self.list = handle.getListState("list", "v string", 1000)
        self.map = handle.getMapState("map", "k string", "v string", 1000)


class Timeout(StatefulProcessor):
    """Emits a key's count when no row came for ``after`` ms of processing
    time (ProcessingTime) or of watermark (EventTime): one timer per key,
    moved by every batch of rows; a TTL'd last-seen value too."""

    def __init__(self, after: int = 1000, event_time: bool = False) -> None:
        self.after = after
        self.event_time = event_time

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n bigint")
        self.seen = handle.getValueState("seen", "v string", 5000)

    def _now(self, timerValues: Any) -> int:
        if self.event_time:
            return int(timerValues.getCurrentWatermarkInMs())
        return int(timerValues.getCurrentProcessingTimeInMs())

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        current = self.count.get()
        n = 0 if current is None else current[0]
        last = None
        for row in rows:
            n += 1
            last = row.value
        self.count.update((n,))
        self.seen.update((last,))
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        self.handle.registerTimer(self._now(timerValues) + self.after)
        return iter([])

    def handleExpiredTimer(
        self, key: Any, timerValues: Any, expiredTimerInfo: Any
    ) -> Iterator[Any]:
        current = self.count.get()
        seen = self.seen.get()
        self.count.clear()
        yield Row(
            key=key[0],
            count=0 if current is None else current[0],
            seen=None if seen is None else seen[0],
            fired=expiredTimerInfo.getExpiryTimeInMs(),
        )

    def close(self) -> None:
        pass


class DeletesOld(StatefulProcessor):
    """Declares ``tmp``, then deletes it with deleteIfExists, as Spark's tests do."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count", "n bigint")
        self.tmp = handle.getValueState("tmp", StructType([StructField("v", StringType())]))
        handle.deleteIfExists("tmp")
        handle.deleteIfExists("never_declared")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        list(rows)
        self.tmp.exists()
        return iter([])

    def close(self) -> None:
        pass


class Chain(StatefulProcessor):
    """Registers a timer at ``now + after`` per row; each firing registers one
    already due (at now - 1) and emits what Spark hands it."""

    def __init__(self, after: int, event_time: bool = False) -> None:
        self.after, self.event_time = after, event_time

    def init(self, handle: Any) -> None:
        self.handle = handle

    def _now(self, tv: Any) -> int:
        return int(
            tv.getCurrentWatermarkInMs() if self.event_time else tv.getCurrentProcessingTimeInMs()
        )

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        list(rows)
        self.handle.registerTimer(max(self._now(timerValues) + self.after, 0))
        yield Row(key=key[0], what="rows", at=timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
        fired = expiredTimerInfo.getExpiryTimeInMs()
        if fired > 0 or not self.event_time:
            self.handle.registerTimer(self._now(timerValues) - 1)
        yield Row(key=f"{type(key).__name__}:{key.key}", what="fired", at=fired)

    def close(self) -> None:
        pass
