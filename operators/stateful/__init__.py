"""Spark's stateful API on relstate: a user's ``StatefulProcessor``
(``pyspark.sql.streaming.stateful_processor``) runs unchanged as a relstate
operator, its state variables in state tables. docs/transform-with-state.md
has the rules and what differs from Spark.

- :class:`StatefulProcessorOperator`: the operator (a pipeline stage, for
  ``run_operator`` and the harnesses);
- :func:`transform_with_state`, :func:`transform_with_state_in_pandas`: the
  calls shaped like ``GroupedData.transformWithState(InPandas)``;
- :class:`TwsTester`: PySpark's ``TwsTester`` over relstate state.

Importing this package does not import PySpark; the processor does.
"""

from operators.stateful._core import ExpiredTimerInfo, StatefulProcessorOperator, TimerValues
from operators.stateful._spark import transform_with_state, transform_with_state_in_pandas
from operators.stateful._tester import TwsTester

__all__ = [
    "ExpiredTimerInfo",
    "StatefulProcessorOperator",
    "TimerValues",
    "TwsTester",
    "transform_with_state",
    "transform_with_state_in_pandas",
]
