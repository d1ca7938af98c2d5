"""The input stream of each test processor (:mod:`processors`): a few small
micro-batches that take the processor through its calls, shared by the
differential tests against Spark and the bench's check of its output."""

from __future__ import annotations

from tests.operators.stateful import processors as p
from tests.operators.stateful._spark_reference import Case, InputRow

__all__ = ["CASES", "EPOCH_MS"]

#: 2026-01-01T00:00:00Z in ms: event times count from here.
EPOCH_MS = 1_767_225_600_000


def _rows(*rows: tuple[str, str, str, int] | tuple[str, str, str, int, int]) -> list[InputRow]:
    """Input rows from (k, op, u, v[, event time in s after EPOCH_MS]);
    ``seq`` numbers them (unique within a batch, and over the stream where
    the caller offsets them)."""
    out = []
    for i, row in enumerate(rows):
        k, op, u, v = row[:4]
        seconds = row[4] if len(row) == 5 else 0
        out.append((k, i, op, u, v, EPOCH_MS + seconds * 1000))
    return out


#: The first batch of a case with TTL or timers only warms Spark up (its
#: first batch starts Python workers, many seconds); a pause after the third
#: batch longer than every TTL and timer here makes state written in the
#: second and third batches expire before the fourth.
_PAUSES = (0.0, 0.0, 5.0, 0.0)
_WARM = [("w", 0, "x", "", 0, EPOCH_MS)]

#: Three batches of one row per key, event times moving on.
_THREE_TIMES = [
    _rows(("a", "x", "", 0, 10), ("b", "x", "", 0, 10)),
    _rows(("a", "x", "", 0, 20)),
    _rows(("c", "x", "", 0, 30)),
]

CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case(
            "RunningCount",
            p.RunningCount,
            [
                _rows(("a", "x", "", 1), ("a", "x", "", 2), ("b", "x", "", 3)),
                _rows(("a", "x", "", 4), ("c", "x", "", 5), ("c", "x", "", 6)),
                _rows(("b", "x", "", 7), ("b", "x", "", 8), ("a", "x", "", 9)),
            ],
        ),
        Case(
            "ListOps",
            p.ListOps,
            [
                _rows(
                    ("a", "append", "", 1),
                    ("a", "append", "", 2),
                    ("a", "appendList", "", 10),
                    ("a", "get", "", 0),
                    ("b", "put", "", 5),
                    ("b", "append", "", 6),
                ),
                _rows(
                    ("a", "clear", "", 0),
                    ("a", "get", "", 0),
                    ("a", "append", "", 3),
                    ("b", "get", "", 0),
                ),
                _rows(("a", "put", "", 7), ("b", "clear", "", 0), ("b", "appendList", "", 20)),
                _rows(("b", "get", "", 0), ("a", "append", "", 8), ("c", "get", "", 0)),
            ],
        ),
        Case(
            "MapOps",
            p.MapOps,
            [
                _rows(
                    ("a", "update", "x", 1),
                    ("a", "update", "y", 2),
                    ("a", "get", "x", 0),
                    ("a", "contains", "z", 0),
                    ("a", "get", "z", 0),
                    ("b", "update", "x", 5),
                ),
                _rows(
                    ("a", "remove", "x", 0),
                    ("a", "get", "x", 0),
                    ("a", "contains", "y", 0),
                    ("a", "update", "y", 3),
                    ("b", "clear", "", 0),
                    ("b", "get", "x", 0),
                ),
                _rows(
                    ("a", "clear", "", 0),
                    ("a", "contains", "y", 0),
                    ("a", "update", "z", 9),
                    ("b", "update", "w", 4),
                    ("b", "remove", "nothing", 0),
                    ("c", "contains", "x", 0),
                ),
            ],
        ),
        Case(
            "ValueTtl",
            p.ValueTtl,
            [
                _WARM,
                _rows(("a", "add", "", 0), ("b", "add", "", 0), ("c", "add", "", 0)),
                _rows(("a", "add", "", 0), ("b", "read", "", 0)),
                _rows(("a", "read", "", 0), ("b", "add", "", 0), ("c", "read", "", 0)),
                _rows(("a", "add", "", 0), ("c", "read", "", 0)),
            ],
            pauses=_PAUSES,
        ),
        Case(
            "ListTtl",
            p.ListTtl,
            [
                _WARM,
                _rows(("a", "append", "", 1), ("b", "append", "", 5)),
                _rows(("a", "append", "", 2), ("b", "put", "", 6)),
                _rows(("a", "append", "", 3), ("b", "read", "", 0)),
                _rows(("a", "read", "", 0), ("b", "append", "", 7)),
            ],
            pauses=_PAUSES,
        ),
        Case(
            "MapTtl",
            p.MapTtl,
            [
                _WARM,
                _rows(("a", "update", "x", 1), ("a", "update", "y", 2)),
                _rows(("a", "update", "y", 3), ("a", "read", "x", 0)),
                _rows(("a", "read", "x", 0), ("a", "read", "y", 0), ("b", "update", "x", 4)),
                _rows(("a", "read", "y", 0), ("b", "read", "x", 0)),
            ],
            pauses=_PAUSES,
        ),
        Case(
            "ProcessingTimers",
            p.ProcessingTimers,
            [
                _WARM,
                _rows(("a", "x", "", 0), ("b", "now", "", 0)),
                _rows(("a", "x", "", 0)),
                _rows(("c", "x", "", 0)),
                _rows(("a", "x", "", 0), ("c", "now", "", 0)),
            ],
            pauses=_PAUSES,
        ),
        Case(
            "EventTimeTimers",
            p.EventTimeTimers,
            [
                _rows(("a", "x", "", 0, 10), ("b", "x", "", 0, 12)),
                _rows(("a", "x", "", 0, 20), ("b", "x", "", 0, 3)),
                _rows(("a", "x", "", 0, 1), ("c", "x", "", 0, 30), ("a", "x", "", 0, 6)),
                _rows(("c", "x", "", 0, 31), ("a", "x", "", 0, 22), ("b", "x", "", 0, 14)),
            ],
            delay_ms=p.DELAY_MS,
            event_time_column="out_ts",
        ),
        Case(
            "InitialState",
            p.InitialState,
            [
                _rows(("a", "x", "", 1), ("b", "x", "", 2)),
                _rows(("z", "x", "", 3), ("a", "x", "", 4)),
            ],
            initial=[("a", 100), ("a", 1), ("z", 50)],
        ),
        Case(
            "DeleteIfExists",
            p.DeleteIfExists,
            [_rows(("a", "x", "", 0), ("b", "x", "", 0)), _rows(("a", "x", "", 0))],
        ),
        Case(
            "MultiState",
            p.MultiState,
            [
                _rows(("a", "x", "x", 1), ("a", "x", "y", 2), ("b", "x", "x", 5)),
                _rows(("a", "x", "x", 3), ("a", "x", "x", 4)),
                _rows(("a", "x", "z", 6), ("b", "x", "y", 7), ("a", "x", "y", 8)),
            ],
        ),
        Case("TimerEdges", p.TimerEdges, _THREE_TIMES, delay_ms=1000),
        Case("EventTimeFirstBatch", p.EventTimeFirstBatch, _THREE_TIMES, delay_ms=1000),
        # EventTime mode on an input without a watermark: Spark's stays 0.
        Case("EventTimeNoWatermark", p.EventTimeFirstBatch, _THREE_TIMES),
    )
}
