"""A query's state location built without Spark: each partition run in an
:class:`~operators.testing.OperatorHarness` on a real store, with the
runner's records of each batch, so that the state readers can be tested on
state of any operator for the cost of the harness alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from operators import Operator
from operators._state_location import RUNNER
from operators.testing import OperatorHarness
from statestore import PartitionCheckpoint

__all__ = ["Feed", "harness_state"]

#: Feeds batch ``batch`` of partition ``partition`` into the harness.
Feed = Callable[[OperatorHarness, int, int], object]


def harness_state(
    root: Path,
    make: Callable[[], Operator],
    feed: Feed,
    partitions: int = 2,
    batches: int = 3,
    key_types: list[list[str]] | None = None,
) -> Path:
    """Run ``make()`` on ``partitions`` partitions for ``batches`` batches,
    ``feed`` giving each its input, and record every batch as the runner
    does (its query, and each batch's winning commits); the state location."""
    name = make().name
    state = root / "checkpoint"
    for partition in range(partitions):
        with OperatorHarness(make(), "rocksdb", root, partition_id=partition) as harness:
            for batch in range(batches):
                feed(harness, partition, batch)
                harness.commit()
    runner = state / RUNNER
    (runner / "batches").mkdir(parents=True)
    query = {"operator": name, "partitions": partitions, "key_types": key_types or [["string"]]}
    (runner / "query.json").write_text(json.dumps(query))
    for batch in range(batches):
        winners = {
            str(p): PartitionCheckpoint(str(state), name, p).commits(batch)[0]
            for p in range(partitions)
        }
        record = {"batch_id": batch, "winners": winners, "watermark": None, "metrics": {}}
        (runner / "batches" / f"{batch:020d}.json").write_text(json.dumps(record))
    return state
