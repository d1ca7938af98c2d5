"""The two-stage revenue pipeline (tests/operators/_pipeline_work.py) on
Spark, over parquet files of changes: one file per side per batch. Run as a
script (``python _pipeline_job.py ROOT``) it is a driver of its own, for the
tests that kill the driver."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))

from _pipeline_work import build

from operators import ParquetSink, Pipeline, RelstateQuery


def write_changes(root: Path, changes: list[tuple[pa.Table, pa.Table]]) -> None:
    """Each batch's two changelogs as files, each newer than the one before."""
    now = time.time()
    for side, name in enumerate(("orders", "customers")):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i, pair in enumerate(changes):
            path = root / name / f"part-{i:04d}.parquet"
            pq.write_table(pair[side], path)
            os.utime(path, (now + i, now + i))


def streams(spark: Any, root: Path) -> tuple[Any, Any]:
    """The two changelogs as streams, one file per batch."""
    from _pipeline_work import CUSTOMERS, ORDERS
    from pyspark.sql.pandas.types import from_arrow_schema

    frames = []
    for name, schema in (("orders", ORDERS), ("customers", CUSTOMERS)):
        spark_schema = from_arrow_schema(schema.append(pa.field("row_kind", pa.string())))
        frames.append(
            spark.readStream.schema(spark_schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(root / name))
        )
    return frames[0], frames[1]


def run(
    spark: Any, root: Path, partitions: int = 3, **options: Any
) -> tuple[ParquetSink, RelstateQuery]:
    """Run the pipeline over every file under ``root`` to the end."""
    orders_frame, customers_frame = streams(spark, root)
    pipeline = Pipeline()
    orders = pipeline.source(orders_frame, "orders", sequence="seq")
    customers = pipeline.source(customers_frame, "customers", sequence="seq")
    _, revenue = build(pipeline, orders, customers)
    sink = ParquetSink(str(root / "out"))
    query = pipeline.start(
        revenue,
        sink,
        checkpoint=str(root / "checkpoint"),
        partitions=partitions,
        trigger={"availableNow": True},
        **options,
    )
    query.awaitTermination()
    return sink, query


if __name__ == "__main__":
    from operators._spark import local_spark

    session = local_spark("relstate-pipeline-job", {"spark.default.parallelism": "2"})
    run(session, Path(sys.argv[1]))
    session.stop()
