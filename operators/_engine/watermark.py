"""The one watermark rule, shared by the Spark runner and the test harness.

As in Spark: each source with an event-time column tracks the greatest event
time it has seen; the query's watermark for batch N is the minimum over those
sources of (greatest event time seen before batch N - the source's delay),
held until every such source has seen a row, and never moving back. A
pipeline passes it on stage by stage: a stage's input watermark is the least
output watermark of its inputs (a source's is the query's), and a stage's
output watermark is what its operator says of its input one
(:meth:`operators.Operator.output_watermark`; by default the same). Rows are
late for a stage against its previous batch's input watermark, and state is
evicted at the current one, as Spark does for several stateful operators.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from operators._api.operator import Operator

__all__ = ["DELAY_KEY", "StageInputs", "max_event_time", "query_watermark", "stage_watermarks"]

#: The column metadata key under which Spark's ``withWatermark`` records the
#: delay (ms) on the event-time column.
DELAY_KEY = "spark.watermarkDelayMs"


def query_watermark(
    delays: Mapping[str, int],
    max_event_time: Mapping[str, int],
    previous: int | None,
) -> int | None:
    """The query's watermark for a batch: ``delays`` by source name,
    ``max_event_time`` the greatest event time each source saw in earlier
    batches, ``previous`` the watermark of the batch before."""
    if not delays:
        return None
    candidates = []
    for source, delay in delays.items():
        seen = max_event_time.get(source)
        if seen is None:
            return previous  # held until every source has seen a row
        candidates.append(seen - delay)
    current = min(candidates)
    return current if previous is None else max(current, previous)


@dataclass(frozen=True)
class StageInputs:
    """What the rule needs of a stage: its operator and where its inputs
    come from (a source's name, or an earlier stage's index)."""

    operator: Operator
    inputs: Sequence[str | int]


def stage_watermarks(stages: Sequence[StageInputs], watermark: int | None) -> list[int | None]:
    """Each stage's input watermark, given the query's ``watermark``."""
    outputs: list[int | None] = []
    result: list[int | None] = []
    for stage in stages:
        marks = [watermark if isinstance(i, str) else outputs[i] for i in stage.inputs]
        known = [m for m in marks if m is not None]
        given = min(known) if len(known) == len(marks) and known else None
        result.append(given)
        outputs.append(stage.operator.output_watermark(given))
    return result


def max_event_time(column: pa.Array | pa.ChunkedArray) -> int | None:
    """The greatest event time of a column, in ms since the epoch (a
    timestamp of any unit, or integer milliseconds)."""
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
    latest = pc.max(column).as_py()
    return None if latest is None else int(latest)
