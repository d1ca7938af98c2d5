"""The one SparkSession the Spark tests share (local[2,3], few shuffle
partitions, UI off); starting one costs seconds, so it is session-scoped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operators._spark.session import local_spark


@pytest.fixture(scope="session")
def fault_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where tests arm fault points (statestore._faults.arm) for every process
    of the Spark session, Python workers included."""
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="session")
def spark(fault_dir: Path) -> Iterator[Any]:
    """A local SparkSession for the whole test session: local[2,3], so that a
    failed task is retried (plain local[2] never retries)."""
    # Read by the Python workers, which inherit the JVM's environment.
    os.environ["RELSTATE_FAULT_DIR"] = str(fault_dir)
    session = local_spark(
        "relstate-tests",
        {
            "spark.default.parallelism": "2",
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        },
    )
    yield session
    session.stop()
