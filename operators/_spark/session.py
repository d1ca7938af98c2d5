"""The local Spark session that ``relstate demo`` and the tests run on, the
registration of relstate's data sources in any session, and the setting the
runner's batches (and the bench's Spark-alone floors) run under.

Nothing here imports PySpark until it is called, so that ``import operators``
(and ``relstate inspect``) works where PySpark cannot be imported."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_spark", "register_sources", "without_adaptive_execution"]


def local_spark(app: str, conf: Mapping[str, str] | None = None) -> SparkSession:
    """A ``local[2,3]`` session (two cores; a failed task is retried, which
    plain ``local[2]`` never does), UI and console progress off, Spark's own
    logging at ERROR, bound to loopback, Python workers on this interpreter,
    and relstate's data sources (``relstate-state``, ``relstate-metadata``,
    ``relstate-output``) registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2,3]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.log.level", "ERROR")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark


def register_sources(spark: SparkSession) -> None:
    """Make ``relstate-state``, ``relstate-metadata`` and ``relstate-output``
    readable in ``spark``."""
    from operators._spark.output_source import OutputSource
    from operators._spark.state_source import MetadataSource, StateSource

    spark.dataSource.register(StateSource)
    spark.dataSource.register(MetadataSource)
    spark.dataSource.register(OutputSource)


@contextmanager
def without_adaptive_execution(session: SparkSession) -> Iterator[None]:
    """Adaptive query execution off while a batch's stages are planned and
    run, and as it was after. Each stage is one shuffle into ``mapInArrow``
    with a fixed partition count, which adaptive execution cannot improve; it
    would only run the shuffle as a job of its own and plan the rest again
    (a second job per stage), also for a stage
    output cached for the next stage. ``foreachBatch`` calls run one at a
    time on the query's own session, so nothing else sees the change."""
    key = "spark.sql.adaptive.enabled"
    # Unset, Spark gives its default, "true"; the "or" is for the Optional type.
    before = session.conf.get(key) or "true"
    session.conf.set(key, "false")
    try:
        yield
    finally:
        session.conf.set(key, before)
