"""Stateful processors for the differential tests against Spark's
``transformWithState`` / ``transformWithStateInPandas``.

Each processor is written once, as its logic over one grouping key's rows,
and comes in both of Spark's flavours: ``Processor.rows()`` takes and yields
``Row`` objects (``transformWithState``), ``Processor.pandas()`` takes and
yields pandas DataFrames (``transformWithStateInPandas``). The logic sorts a
key's rows by ``seq`` before it reads them: Spark does not promise the order
of a key's rows within a micro-batch, and neither does relstate.

Every input row has the columns of :data:`INPUT_DDL`: the grouping key ``k``,
a sequence number ``seq`` (unique over the stream), an operation ``op`` that
tells the processor what to do with the row, a user key ``u``, a value ``v``
and an event time ``ts``. Outputs carry what the processor saw (processing
time, watermark, state read back), so that equal outputs mean equal
behaviour, not just equal counts. Numbers that may be absent are ``-1``
rather than null: a pandas column of integers cannot hold a null.
"""

from __future__ import annotations

import calendar
import datetime as dt
from abc import abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType

__all__ = [
    "INPUT_DDL",
    "PROCESSORS",
    "DeleteIfExists",
    "EventTimeFirstBatch",
    "EventTimeTimers",
    "InitialState",
    "ListOps",
    "ListTtl",
    "MapOps",
    "MapTtl",
    "MultiState",
    "ProcessingTimers",
    "Processor",
    "RunningCount",
    "TimerEdges",
    "ValueTtl",
    "epoch_ms",
    "timestamp",
]

#: The input columns of every processor here.
INPUT_DDL = "k string, seq long, op string, u string, v long, ts timestamp"

_EPOCH = dt.datetime(1970, 1, 1)


def epoch_ms(ts: Any) -> int:
    """Milliseconds since the epoch of a timestamp as either flavour hands it
    to Python: a naive ``datetime`` (rows) or a ``pandas.Timestamp``, both
    in the session time zone, which the tests keep at UTC."""
    if hasattr(ts, "value"):  # pandas.Timestamp: nanoseconds
        return int(ts.value) // 1_000_000
    return calendar.timegm(ts.timetuple()) * 1000 + ts.microsecond // 1000


def timestamp(ms: int) -> dt.datetime:
    """The naive UTC ``datetime`` of ``ms``, as an output timestamp."""
    return _EPOCH + dt.timedelta(milliseconds=ms)


def _text(values: Iterable[Any]) -> str:
    return ",".join(str(v) for v in values)


class Processor(StatefulProcessor):
    """A processor's logic and both of its flavours.

    Subclasses set :attr:`OUTPUT` (Spark's DDL of the output rows) and write
    :meth:`rows_of` (a key's input rows, as dicts sorted by ``seq``, to
    output tuples); :meth:`timer` and :meth:`initial` where they use timers
    or an initial state.
    """

    #: The output schema as Spark's DDL.
    OUTPUT: ClassVar[str]
    #: ``transformWithState`` arguments: output mode and time mode.
    OUTPUT_MODE: ClassVar[str] = "Update"
    TIME_MODE: ClassVar[str] = "None"

    def __init__(self, pandas: bool = False) -> None:
        self.is_pandas = pandas
        self.handle: StatefulProcessorHandle

    @classmethod
    def rows(cls) -> Processor:
        """The processor for ``transformWithState`` (rows in and out)."""
        return cls(pandas=False)

    @classmethod
    def pandas(cls) -> Processor:
        """The processor for ``transformWithStateInPandas``."""
        return cls(pandas=True)

    @classmethod
    def columns(cls) -> list[str]:
        """The output column names."""
        return [part.strip().split(" ", 1)[0] for part in cls.OUTPUT.split(",")]

    # -- the logic ----------------------------------------------------------------------

    @abstractmethod
    def rows_of(
        self, key: str, rows: list[dict[str, Any]], tv: TimerValues
    ) -> Iterable[tuple[Any, ...]]:
        """A key's output for its rows of one batch."""

    def timer(self, key: str, tv: TimerValues, info: ExpiredTimerInfo) -> Iterable[tuple[Any, ...]]:
        """What an expired timer emits (nothing unless overridden)."""
        return ()

    def initial(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> None:
        """Take a key's initial state (no initial state unless overridden)."""

    # -- Spark's calls, in either flavour -----------------------------------------------

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Any]:
        records = sorted(self._records(rows), key=lambda r: r["seq"])
        return self._emit(self.rows_of(key[0], records, timerValues))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        return self._emit(self.timer(key[0], timerValues, expiredTimerInfo))

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        self.initial(key[0], list(self._records([initialState])), timerValues)

    def close(self) -> None:
        """Nothing to release."""

    def _records(self, chunks: Iterable[Any]) -> Iterator[dict[str, Any]]:
        for chunk in chunks:
            if self.is_pandas:
                yield from chunk.to_dict("records")
            else:
                yield chunk.asDict()

    def _emit(self, out: Iterable[tuple[Any, ...]]) -> Iterator[Any]:
        got = list(out)
        if self.is_pandas:
            if got:
                import pandas as pd

                yield pd.DataFrame(got, columns=self.columns())
            return
        make = Row(*self.columns())
        for values in got:
            yield make(*values)


_LONG = StructType([StructField("v", LongType())])


class RunningCount(Processor):
    """A running count of rows per key in a value state (``exists``, ``get``,
    ``update``); Update mode."""

    OUTPUT = "k string, count long"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", _LONG)

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        before = self.count.get()[0] if self.count.exists() else 0
        self.count.update((before + len(rows),))
        yield (key, before + len(rows))


class ListOps(Processor):
    """Every call of a list state, one per row as its ``op`` says:
    ``append`` (``appendValue``), ``appendList``, ``put``, ``clear``, ``get``.
    After each it emits whether the list exists and what it holds, in order;
    Append mode."""

    OUTPUT = "k string, seq long, op string, present boolean, items string"
    OUTPUT_MODE = "Append"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.items = handle.getListState("items", "v long")

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        for row in rows:
            op, v = row["op"], row["v"]
            if op == "append":
                self.items.appendValue((v,))
            elif op == "appendList":
                self.items.appendList([(v,), (v + 1,)])
            elif op == "put":
                self.items.put([(v,), (v * 10,)])
            elif op == "clear":
                self.items.clear()
            yield (key, row["seq"], op, self.items.exists(), _text(i[0] for i in self.items.get()))


class MapOps(Processor):
    """Every call of a map state, one per row as its ``op`` says, on user key
    ``u``: ``update`` (``updateValue``), ``remove`` (``removeKey``),
    ``clear``, ``get`` (``getValue``) and ``contains`` (``containsKey``).
    After each it emits the call's answer, ``exists``, and the map through
    ``iterator``, ``keys`` and ``values`` (each sorted: the order a map
    iterates in is not part of the API); Update mode."""

    OUTPUT = (
        "k string, seq long, op string, answer string, present boolean, "
        "items string, ukeys string, uvalues string"
    )

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("m", "u string", _LONG)

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        for row in rows:
            op, u, v = row["op"], (row["u"],), row["v"]
            answer = ""
            if op == "update":
                self.map.updateValue(u, (v,))
            elif op == "remove":
                self.map.removeKey(u)
            elif op == "clear":
                self.map.clear()
            elif op == "get":
                got = self.map.getValue(u)
                answer = "none" if got is None else str(got[0])
            elif op == "contains":
                answer = str(self.map.containsKey(u))
            items = sorted(f"{k[0]}={w[0]}" for k, w in self.map.iterator())
            keys = sorted(k[0] for k in self.map.keys())  # noqa: SIM118 (a MapState, no dict)
            values = sorted(w[0] for w in self.map.values())
            yield (
                key,
                row["seq"],
                op,
                answer,
                self.map.exists(),
                _text(items),
                _text(keys),
                _text(values),
            )


#: The TTL of the TTL processors (ms): shorter than the pause the tests
#: make between some batches, longer than a batch takes when not paused.
TTL_MS = 4000


class ValueTtl(Processor):
    """A value state with a TTL, in ProcessingTime mode: ``read`` rows only
    read the count, other rows add one to it (and so refresh its expiry).
    Emits the count it found (-1: none, or expired), the count after, and
    the batch's processing time; Update mode."""

    OUTPUT = "k string, found long, count long, pt long"
    TIME_MODE = "ProcessingTime"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", _LONG, TTL_MS)

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        got = self.count.get()
        found = -1 if got is None else got[0]
        if self.count.exists() != (got is not None):
            raise AssertionError("exists() and get() disagree")
        adds = sum(1 for r in rows if r["op"] != "read")
        if adds:
            self.count.update((max(found, 0) + adds,))
        now = self.count.get()
        yield (key, found, -1 if now is None else now[0], tv.getCurrentProcessingTimeInMs())


class ListTtl(Processor):
    """A list state with a TTL, in ProcessingTime mode: ``append`` rows
    append their value (each element expires on its own), ``put`` rows
    replace the list; every batch emits the list as read back; Update mode."""

    OUTPUT = "k string, present boolean, items string, pt long"
    TIME_MODE = "ProcessingTime"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.items = handle.getListState("items", _LONG, TTL_MS)

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        for row in rows:
            if row["op"] == "append":
                self.items.appendValue((row["v"],))
            elif row["op"] == "put":
                self.items.put([(row["v"],)])
        items = _text(i[0] for i in self.items.get())
        yield (key, self.items.exists(), items, tv.getCurrentProcessingTimeInMs())


class MapTtl(Processor):
    """A map state with a TTL, in ProcessingTime mode: ``update`` rows set
    user key ``u`` (each entry expires on its own), ``read`` rows look it
    up; every row emits ``getValue`` and ``containsKey`` of its user key and
    the map as read back; Append mode."""

    OUTPUT = "k string, seq long, value long, has boolean, items string, pt long"
    OUTPUT_MODE = "Append"
    TIME_MODE = "ProcessingTime"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("m", "u string", _LONG, TTL_MS)

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        for row in rows:
            u = (row["u"],)
            if row["op"] == "update":
                self.map.updateValue(u, (row["v"],))
            got = self.map.getValue(u)
            items = _text(sorted(f"{k[0]}={w[0]}" for k, w in self.map.iterator()))
            yield (
                key,
                row["seq"],
                -1 if got is None else got[0],
                self.map.containsKey(u),
                items,
                tv.getCurrentProcessingTimeInMs(),
            )


#: How far ahead the processing-time timers are set (ms): shorter than the
#: pause the tests make between some batches.
TIMER_MS = 3000


class ProcessingTimers(Processor):
    """Processing-time timers: each batch of a key counts its rows, deletes
    the key's timers (``listTimers``, ``deleteTimer``) and registers two
    new ones, one ``TIMER_MS`` ahead and one far ahead; a ``now`` row also
    registers one a millisecond in the past, which fires in the same batch.
    An expired timer emits its expiry, the timers left and the count, and
    clears the count; Update mode."""

    OUTPUT = "k string, kind string, count long, pt long, expiry long, timers string"
    TIME_MODE = "ProcessingTime"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", _LONG)

    def _timers(self) -> str:
        return _text(sorted(self.handle.listTimers()))

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        pt = tv.getCurrentProcessingTimeInMs()
        count = (self.count.get()[0] if self.count.exists() else 0) + len(rows)
        self.count.update((count,))
        for expiry in list(self.handle.listTimers()):
            self.handle.deleteTimer(expiry)
        self.handle.registerTimer(pt + TIMER_MS)
        self.handle.registerTimer(pt + 1000 * TIMER_MS)
        if any(r["op"] == "now" for r in rows):
            self.handle.registerTimer(pt - 1)
        yield (key, "data", count, pt, -1, self._timers())

    def timer(self, key: str, tv: TimerValues, info: ExpiredTimerInfo) -> Iterator[Any]:
        count = self.count.get()[0] if self.count.exists() else -1
        self.count.clear()
        yield (
            key,
            "expired",
            count,
            tv.getCurrentProcessingTimeInMs(),
            info.getExpiryTimeInMs(),
            self._timers(),
        )


#: The event-time processor's watermark delay (ms).
DELAY_MS = 5000


class EventTimeTimers(Processor):
    """Event-time timers with late rows: each key keeps the greatest event
    time it has seen and sets a timer there (deleting the one before); the
    timer fires once the watermark passes it and emits it, clearing the
    state. Rows behind the watermark never reach the processor. Outputs carry
    the watermark and an event time ``out_ts`` that passes the watermark on
    (``eventTimeColumnName``); Append mode."""

    OUTPUT = "k string, kind string, out_ts timestamp, wm long, latest long, n long"
    OUTPUT_MODE = "Append"
    TIME_MODE = "EventTime"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.latest = handle.getValueState("latest", _LONG)

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        if not rows:  # PySpark's TwsTester calls with its late rows dropped, maybe all
            return
        seen = max(epoch_ms(r["ts"]) for r in rows)
        before = self.latest.get()[0] if self.latest.exists() else None
        latest = seen if before is None else max(before, seen)
        if before is not None and before != latest:
            self.handle.deleteTimer(before)
        self.latest.update((latest,))
        self.handle.registerTimer(latest)
        wm = tv.getCurrentWatermarkInMs()
        yield (key, "data", timestamp(seen), wm, latest, len(rows))

    def timer(self, key: str, tv: TimerValues, info: ExpiredTimerInfo) -> Iterator[Any]:
        latest = self.latest.get()[0] if self.latest.exists() else -1
        self.latest.clear()
        expiry = info.getExpiryTimeInMs()
        yield (key, "expired", timestamp(expiry), tv.getCurrentWatermarkInMs(), latest, 0)


class InitialState(Processor):
    """An initial state (``handleInitialState``): each initial row adds its
    ``v`` to the key's total and appends it to a list; input rows add theirs
    and emit the total and the initial values; Update mode."""

    OUTPUT = "k string, total long, inits string"
    #: The initial state's columns (grouped by ``k``).
    INITIAL_DDL: ClassVar[str] = "k string, v long"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.total = handle.getValueState("total", _LONG)
        self.inits = handle.getListState("inits", _LONG)

    def initial(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> None:
        for row in rows:
            before = self.total.get()[0] if self.total.exists() else 0
            self.total.update((before + row["v"],))
            self.inits.appendValue((row["v"],))

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        before = self.total.get()[0] if self.total.exists() else 0
        total = before + sum(r["v"] for r in rows)
        self.total.update((total,))
        yield (key, total, _text(sorted(i[0] for i in self.inits.get())))


class DeleteIfExists(Processor):
    """``deleteIfExists``: ``init`` declares ``count`` and ``scratch`` and
    deletes ``scratch`` (and ``never``, which was never declared); each
    batch counts rows in ``count`` and emits whether touching ``scratch``
    raised; Update mode."""

    OUTPUT = "k string, count long, scratch_raised boolean"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", _LONG)
        self.scratch = handle.getValueState("scratch", _LONG)
        handle.deleteIfExists("scratch")
        handle.deleteIfExists("never")

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        count = (self.count.get()[0] if self.count.exists() else 0) + len(rows)
        self.count.update((count,))
        try:
            self.scratch.exists()
        except Exception:  # Spark raises its own error type; any error counts
            raised = True
        else:
            raised = False
        yield (key, count, raised)


class MultiState(Processor):
    """Several state variables in one processor: a value (the row count), a
    list (the last three values, kept with ``put``) and a map (rows per user
    key); Append mode."""

    OUTPUT = "k string, count long, recent string, per_user string"
    OUTPUT_MODE = "Append"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", _LONG)
        self.recent = handle.getListState("recent", _LONG)
        self.per_user = handle.getMapState(
            "per_user", StructType([StructField("u", StringType())]), _LONG
        )

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        count = (self.count.get()[0] if self.count.exists() else 0) + len(rows)
        self.count.update((count,))
        recent = [i[0] for i in self.recent.get()] + [r["v"] for r in rows]
        self.recent.put([(v,) for v in recent[-3:]])
        for row in rows:
            got = self.per_user.getValue((row["u"],))
            self.per_user.updateValue((row["u"],), ((0 if got is None else got[0]) + 1,))
        per_user = _text(sorted(f"{k[0]}={w[0]}" for k, w in self.per_user.iterator()))
        yield (key, count, _text(recent[-3:]), per_user)


class TimerEdges(Processor):
    """Edges of processing-time timers, with a watermark on the input: each
    batch of a key registers a timer already due (5 ms in the past), which
    fires in that batch; its handler registers the firing timer again (it is
    deleted after the handler all the same) and one more already due, which
    Spark fires in the next batch, not this one. Rows carry the watermark
    TimerValues give in ProcessingTime mode and the type of the key
    ``handleExpiredTimer`` gets; Update mode."""

    OUTPUT = "k string, kind string, key_type string, wm long, expiry long, timers string"
    TIME_MODE = "ProcessingTime"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def _timers(self) -> str:
        return _text(sorted(self.handle.listTimers()))

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        self.handle.registerTimer(tv.getCurrentProcessingTimeInMs() - 5)
        yield (key, "data", "", tv.getCurrentWatermarkInMs(), -1, self._timers())

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Any]:
        self.key_type = type(key).__name__
        return super().handleExpiredTimer(key, timerValues, expiredTimerInfo)

    def timer(self, key: str, tv: TimerValues, info: ExpiredTimerInfo) -> Iterator[Any]:
        pt, expiry = tv.getCurrentProcessingTimeInMs(), info.getExpiryTimeInMs()
        self.handle.registerTimer(expiry)
        if expiry == pt - 5:
            self.handle.registerTimer(pt - 1)
        yield (key, "expired", self.key_type, tv.getCurrentWatermarkInMs(), expiry, self._timers())


class EventTimeFirstBatch(Processor):
    """Event-time timers at the watermark: each batch of a key registers a
    timer at the current watermark (0 before the first), which fires in the
    same batch, and one at its greatest event time; the watermark of the
    first batch is 0 on Spark, also when the input has none; Append mode."""

    OUTPUT = "k string, kind string, wm long, at long"
    OUTPUT_MODE = "Append"
    TIME_MODE = "EventTime"

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle

    def rows_of(self, key: str, rows: list[dict[str, Any]], tv: TimerValues) -> Iterator[Any]:
        wm = tv.getCurrentWatermarkInMs()
        self.handle.registerTimer(max(wm, 0))
        latest = max(epoch_ms(r["ts"]) for r in rows)
        self.handle.registerTimer(latest)
        yield (key, "data", wm, latest)

    def timer(self, key: str, tv: TimerValues, info: ExpiredTimerInfo) -> Iterator[Any]:
        yield (key, "expired", tv.getCurrentWatermarkInMs(), info.getExpiryTimeInMs())


#: Every processor here, by name.
PROCESSORS: dict[str, type[Processor]] = {
    cls.__name__: cls
    for cls in (
        RunningCount,
        ListOps,
        MapOps,
        ValueTtl,
        ListTtl,
        MapTtl,
        ProcessingTimers,
        EventTimeTimers,
        InitialState,
        DeleteIfExists,
        MultiState,
        TimerEdges,
        EventTimeFirstBatch,
    )
}
