"""relstate's log configuration in Spark's Python workers: quiet there by
default, the driver's once a task applies it."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from statestore import LogConfig, apply_log_config, configure_logging, current_log_config

pytestmark = pytest.mark.spark


def _in_worker(spark: Any, shipped: LogConfig | None) -> list[LogConfig]:
    """The configuration a task sees before and after applying ``shipped``."""

    def task(_: Iterator[int]) -> Iterator[LogConfig]:
        yield current_log_config()
        if shipped is not None:
            apply_log_config(shipped)
        yield current_log_config()
        apply_log_config(None)

    result: list[LogConfig] = spark.sparkContext.parallelize([0], 1).mapPartitions(task).collect()
    return result


class TestWorkerLogs:
    def test_a_task_applies_the_drivers_configuration(self, spark: Any) -> None:
        """A worker does not see configure_logging on the driver (it starts
        quiet); the driver's LogConfig, shipped in the task's closure and
        applied, is the worker's configuration from then on."""
        try:
            driver = configure_logging("info", "json")
            before, after = _in_worker(spark, current_log_config())
        finally:
            apply_log_config(None)
        # The worker's own: RELSTATE_LOG as the session started, else the default.
        assert before == LogConfig.parse(os.environ.get("RELSTATE_LOG", ""))
        assert after == driver == LogConfig(logging.INFO, "json")
