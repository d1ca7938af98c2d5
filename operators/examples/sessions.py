"""Sessionisation with an event-time gap.

Per user, rows whose event times are at most ``gap`` milliseconds apart (one
after the other) form a session. A session is emitted, once, as
``(user, start, end, count, total)`` when the watermark passes ``end + gap``:
from then on no row that is not late can reach it. A row below the watermark
is late: it is dropped and counted as ``numLateRowsDropped``. A row that is not
late but arrives after later rows may reach two open sessions and merge them.

State is the open sessions, keyed ``(user, start)``, and one event-time timer
per open session at the first watermark that closes it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from encoding import TableSchema
from operators._api.changelog import ROW_KIND, RowKind
from operators._api.operator import Operator, OperatorContext, TimeDomain, Timer
from operators.errors import InputError

__all__ = ["Sessions"]

_EPOCH = dt.datetime(1970, 1, 1)
_MICROSECOND = dt.timedelta(microseconds=1)


def _micros(ts: dt.datetime) -> int:
    """Microseconds since the epoch of a naive ``timestamp[us]`` value."""
    return (ts - _EPOCH) // _MICROSECOND


class Sessions(Operator):
    """Per-user sessions of an append-only ``(user, ts, value)`` stream:
    ``SELECT user, MIN(ts), MAX(ts), COUNT(*), SUM(value)`` per session, a
    session ending after ``gap`` milliseconds without a row."""

    def __init__(self, gap: int = 30 * 60 * 1000, name: str = "sessions") -> None:
        if gap < 0:
            raise InputError(f"the session gap is a number of milliseconds >= 0, got {gap}")
        self.gap = gap
        self.name = name
        ts = pa.timestamp("us")
        self.inputs = [
            pa.schema(
                [
                    pa.field("user", pa.string(), nullable=False),
                    pa.field("ts", ts, nullable=False),
                    pa.field("value", pa.int64(), nullable=False),
                ]
            )
        ]
        session = pa.schema(
            [
                pa.field("user", pa.string(), nullable=False),
                pa.field("start", ts, nullable=False),
                pa.field("end", ts, nullable=False),
                pa.field("count", pa.int64(), nullable=False),
                pa.field("total", pa.int64(), nullable=False),
            ]
        )
        self.output = session
        # The open sessions; a user's sessions are a prefix scan, in start order.
        self.tables = [TableSchema(1, session, ["user", "start"], name="sessions")]

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Reject a changelog with retractions before touching state, then go
        row by row."""
        if batch.schema.get_field_index(ROW_KIND) >= 0:
            kinds = set(batch.column(ROW_KIND).to_pylist())
            if kinds - {RowKind.INSERT.value}:
                raise InputError(
                    f"operator {self.name!r} takes an append-only input (row kind '+I'); "
                    f"got row kinds {sorted(kinds)}"
                )
        super().process_batch(ctx, batch, side)

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        user, ts, value = row
        t = _micros(ts)
        if ctx.watermark is not None and t < ctx.watermark * 1000:
            ctx.count("numLateRowsDropped")
            return
        gap = self.gap * 1000
        table = ctx.table("sessions")
        # The open sessions this row reaches: start <= t + gap and end >= t - gap.
        # A user's open sessions are more than `gap` apart, so there are at most
        # two, and walking back from the last start <= t + gap finds them first.
        reached = []
        for session in table.scan((user,), end=(t + gap + 1,), reverse=True):
            if _micros(session[2]) < t - gap:
                break
            reached.append(session)
        start, end, count, total = ts, ts, 1, value
        for session in reached:
            table.delete(session)
            ctx.delete_timer(self._timer(session))
            start, end = min(start, session[1]), max(end, session[2])
            count, total = count + session[3], total + session[4]
        merged = (user, start, end, count, total)
        table.insert(merged)
        ctx.register_timer(self._timer(merged))

    def on_timer(self, ctx: OperatorContext, timer: Timer) -> None:
        start, _, user = timer.key.partition(" ")
        table = ctx.table("sessions")
        session = table.get_row((user, int(start)))
        if session is not None:
            table.delete(session)
            ctx.emit(session, RowKind.INSERT)

    def _timer(self, session: tuple[Any, ...]) -> Timer:
        """The timer that closes ``session``: at the first watermark (ms) above
        ``end + gap``, since a row at exactly ``end + gap`` still joins it."""
        user, start, end = session[0], _micros(session[1]), _micros(session[2])
        closes = (end + self.gap * 1000) // 1000 + 1
        return Timer(closes, f"{start} {user}", TimeDomain.EVENT_TIME)
