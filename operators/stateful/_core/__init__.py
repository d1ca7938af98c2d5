"""The operator that runs a Spark ``StatefulProcessor``, its handle and its
state variables: the built-in operator part of ``operators.stateful``, which
imports the operator API only (no Spark runtime, no engine)."""

from operators.stateful._core.handle import ExpiredTimerInfo, TimerValues
from operators.stateful._core.operator import BatchState, StatefulProcessorOperator

__all__ = ["BatchState", "ExpiredTimerInfo", "StatefulProcessorOperator", "TimerValues"]
