"""Operators' metric names, each defined once: the joins' (one scheme for
the changelog and the append join) and those other operators share. A
side's counters are Spark's state-operator names behind the side's name and
a dot (``left.numTotalStateRows``); counters of the join as a whole are
Spark-style names alone. docs/operators/join.md, "Metrics", says what
each counts."""

from __future__ import annotations

__all__ = [
    "EVICTED",
    "EVICTION_TIME",
    "EXPIRED",
    "LATE",
    "MATCHED",
    "PADDED",
    "REMOVED",
    "STORE_TIME",
    "TOTAL",
    "UNKNOWN_RETRACTIONS",
    "UPDATED",
    "side_metric",
]

#: Rows in the side's state after the batch.
TOTAL = "numTotalStateRows"
#: Rows the side wrote (stored, or a stored row changed).
UPDATED = "numUpdatedStateRows"
#: Rows that left the side's state.
REMOVED = "numRemovedStateRows"
#: Rows the side's TTL deleted (changelog mode).
EXPIRED = "numExpiredStateRows"
#: Rows the watermark evicted from the side (append mode).
EVICTED = "numRowsEvictedByWatermark"
#: Late input rows of the side, dropped (append mode).
LATE = "numRowsDroppedByWatermark"
#: Retractions of rows the side (or the operator, or a group) does not hold
#: (changelog mode).
UNKNOWN_RETRACTIONS = "numRetractionsOfUnknownRows"
#: Joined pairs emitted (append mode; the join as a whole).
MATCHED = "numMatchedRows"
#: Null-padded rows emitted at eviction (append mode; the join as a whole).
PADDED = "numNullPaddedRows"
#: Milliseconds spent evicting (append mode; the join as a whole), which the
#: runner's ``allRemovalsTimeMs`` does not see.
EVICTION_TIME = "evictionTimeMs"
#: Milliseconds spent storing the batch's rows at its close (append mode; the
#: join as a whole), which the runner's ``allUpdatesTimeMs`` does not see.
STORE_TIME = "storeTimeMs"


def side_metric(side: str, metric: str) -> str:
    """The name of a side's counter: ``left.numTotalStateRows``."""
    return f"{side}.{metric}"
