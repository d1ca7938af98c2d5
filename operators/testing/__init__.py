"""Run operators and pipelines without Spark: :class:`OperatorHarness` runs
one operator record at a time, :class:`PipelineHarness` a whole pipeline."""

from operators.testing._operator import Emitted, OperatorHarness
from operators.testing._pipeline import PipelineHarness

__all__ = ["Emitted", "OperatorHarness", "PipelineHarness"]
