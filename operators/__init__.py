"""What users run: the operator API, the Spark runner and its sinks.

``operators.testing`` (the record-at-a-time harness) and ``operators.examples``
are modules of their own. Importing this package does not import PySpark:
``relstate inspect`` reads state where PySpark cannot be imported.
"""

from operators._changelog import ROW_KIND, RowKind, row_kinds
from operators._dirty import BadRows, UnknownRetractions
from operators._fk_join import FkJoin, run_fk_join
from operators._operator import Operator, OperatorContext, TimeDomain, Timer
from operators._pipeline import Pipeline, Stream
from operators._runner import (
    BatchSummary,
    QueryOptions,
    RelstateQuery,
    run_operator,
    stage_progress,
)
from operators._sinks import BatchSink, ParquetSink
from operators._spark import local_spark, register_sources
from operators._watermark import Watermark
from operators.errors import InputError, RunnerError

__all__ = [
    "ROW_KIND",
    "BadRows",
    "BatchSink",
    "BatchSummary",
    "FkJoin",
    "InputError",
    "Operator",
    "OperatorContext",
    "ParquetSink",
    "Pipeline",
    "QueryOptions",
    "RelstateQuery",
    "RowKind",
    "RunnerError",
    "Stream",
    "TimeDomain",
    "Timer",
    "UnknownRetractions",
    "Watermark",
    "local_spark",
    "register_sources",
    "row_kinds",
    "run_fk_join",
    "run_operator",
    "stage_progress",
]
