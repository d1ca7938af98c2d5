"""What users run: the operator API, the Spark runner and its sinks.

``operators.testing`` (the harnesses that run operators and pipelines
without Spark), ``operators.typing`` (the contract types) and
``operators.examples`` are modules of their own; docs/layout.md says where
the rest lives. Importing this package does not import PySpark:
``relstate inspect`` reads state where PySpark cannot be imported.
"""

from operators._api.changelog import ROW_KIND, RowKind, row_kinds
from operators._api.operator import Operator, OperatorContext, TimeDomain, Timer
from operators._api.watermark import Watermark
from operators._engine.graph import Stream
from operators._fk_join.join import FkJoin
from operators._spark.pipeline import Pipeline, run_fk_join
from operators._spark.runner import QueryOptions, RelstateQuery, run_operator, stage_progress
from operators._spark.session import register_sources
from operators._spark.sinks import ParquetSink
from operators.errors import InputError, RunnerError
from operators.typing import BatchSink, BatchSummary

__all__ = [
    "ROW_KIND",
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
    "Watermark",
    "register_sources",
    "row_kinds",
    "run_fk_join",
    "run_operator",
    "stage_progress",
]
