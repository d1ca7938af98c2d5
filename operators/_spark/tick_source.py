"""``format("relstate-tick")``: the stream that makes Spark run a batch with
no input when a stage asks for one (Spark's no-data batches).

A relstate query is a ``foreachBatch`` over its sources; Spark runs a batch
only when a source has new data, as its plan holds no stateful operator of
its own. When an operator asks for the next batch
(:meth:`~operators.Operator.wants_batch_without_input`), the driver records
the request in the batch journal (:meth:`~operators._journal.Journal.request_batch`);
this source's latest offset is that request, so the next trigger sees new
"data" and runs a batch. The source has no rows. Under
``Trigger.AvailableNow`` it takes the requests made before the query
started only, so such a query still ends once its inputs are read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from operators._checkpoint.journal import Journal
from statestore import filesystem_for

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["TICK", "TickSource"]

#: The source's one column (it has no rows).
TICK = "relstate_tick"


class TickSource(DataSource):
    """``relstate-tick``: offsets ``{"batch": N}``, N the latest batch the
    driver asked for at the state location ``path``."""

    @classmethod
    def name(cls) -> str:
        return "relstate-tick"

    def schema(self) -> str:
        return f"{TICK} bigint"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _TickReader(str(self.options["path"]))


class _TickReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, location: str) -> None:
        fs, root = filesystem_for(location)
        self.journal = Journal(fs, root, location)
        #: Trigger.AvailableNow's last request (``None``: no target).
        self.target: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        return {"batch": -1}

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        requested = self.journal.requested_batch()
        if self.target is not None:
            requested = min(requested, self.target)
        after = -1 if start is None else int(start["batch"])
        return {"batch": max(requested, after)}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.journal.requested_batch()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return iter([])

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release."""
