"""The time condition of an append-mode join, and what the watermark lets it
forget: Spark's state watermark per side (docs/operators/join.md, "Append mode").

Times inside the join are microseconds since the epoch, as Spark keeps them;
watermarks are milliseconds, as the runner gives them. The time functions
take one time or a numpy array of them, so that a batch is worked at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from operators.errors import InputError

__all__ = ["TimeRange", "TimeWindows", "event_time_micros"]

_MS = 1000

#: Microseconds: one time, or an array of them.
Micros = TypeVar("Micros", int, npt.NDArray[np.int64])


@dataclass(frozen=True)
class TimeRange:
    """``right.ts BETWEEN left.ts - before_ms AND left.ts + after_ms``.

    A stored row is keyed by its own event time; a new row looks for rows of
    the other side whose event time lies in its range.
    """

    before_ms: int
    after_ms: int

    def __post_init__(self) -> None:
        if self.before_ms + self.after_ms < 0:
            raise InputError(
                f"the time range [left.ts - {self.before_ms} ms, left.ts + {self.after_ms} ms] "
                "is empty: before_ms + after_ms must be >= 0"
            )

    def bucket(self, t: Micros) -> Micros:
        """The time a row is stored and matched under: its own event time."""
        return t

    def lateness_time(self, t: Micros) -> Micros:
        """The time (µs) the watermark judges a row of event time ``t`` by:
        the row is late when it is at or below the watermark."""
        return t

    def other_bounds(self, side: int, t: Micros) -> tuple[Micros, Micros]:
        """The stored times (inclusive) of the other side that a row of
        ``side`` with event time ``t`` matches."""
        before, after = self.before_ms * _MS, self.after_ms * _MS
        if side == 0:
            return t - before, t + after
        return t - after, t + before

    def state_watermark(self, side: int, watermark: int) -> int:
        """Rows of ``side`` stored under a time at or below this (µs) can meet
        no row of the other side that is not late: Spark's state value
        watermark. From ``right.ts <= left.ts + after`` a left row is done once
        ``left.ts <= wm - after``; from ``right.ts >= left.ts - before`` a right
        row once ``right.ts <= wm - before``; Spark takes one millisecond more
        for a non-strict bound, and so does this."""
        offset = self.after_ms if side == 0 else self.before_ms
        return (watermark - offset - 1) * _MS


@dataclass(frozen=True)
class TimeWindows:
    """Equal tumbling windows of ``size_ms``: both sides' event times are
    bucketed into windows, and the window is part of the join key."""

    size_ms: int

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise InputError(f"a window size is a number of milliseconds > 0, got {self.size_ms}")

    def bucket(self, t: Micros) -> Micros:
        """The start (µs) of the window holding ``t``."""
        return t - t % (self.size_ms * _MS)

    def lateness_time(self, t: Micros) -> Micros:
        """The end (µs) of the window holding ``t``: in Spark a stream has one
        event-time column, and in a window join it is the window, so a row is
        late only once its whole window is at or below the watermark."""
        return self.bucket(t) + self.size_ms * _MS

    def other_bounds(self, side: int, t: Micros) -> tuple[Micros, Micros]:
        """Rows of the other side in the same window."""
        start = self.bucket(t)
        return start, start

    def state_watermark(self, side: int, watermark: int) -> int:
        """A window is done once its end is at or below the watermark (Spark's
        state key watermark on the window column): its start (µs) is at or
        below ``wm - size``."""
        return (watermark - self.size_ms) * _MS


def event_time_micros(column: pa.Array | pa.ChunkedArray, name: str) -> npt.NDArray[np.int64]:
    """The event times of a timestamp column (any unit) or an int64 column of
    milliseconds, as microseconds. Nulls raise :class:`InputError`."""
    if column.null_count:
        raise InputError(
            f"event-time column {name!r} holds nulls; every row of an append-mode join "
            "needs an event time, so filter or fill them first"
        )
    if pa.types.is_timestamp(column.type):
        micros = pc.cast(column, pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
        return np.asarray(micros, dtype=np.int64)
    if pa.types.is_integer(column.type):
        return np.asarray(column.cast(pa.int64()), dtype=np.int64) * _MS
    raise InputError(
        f"event-time column {name!r} has type {column.type}; use a timestamp or an "
        "integer of milliseconds since the epoch"
    )
