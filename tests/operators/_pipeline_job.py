"""The two-stage revenue pipeline (tests/operators/_pipeline_work.py) on
Spark, over parquet files of changes (``revenue_pipeline.write_changes``):
one file per side per batch. Run as a script (``python _pipeline_job.py
ROOT``) it is a driver of its own, for the tests that kill the driver."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _pipeline_work import build

from bench.revenue_pipeline import sources
from operators import ParquetSink, Pipeline, RelstateQuery


def run(
    spark: Any, root: Path, partitions: int = 3, joined_too: bool = False, **options: Any
) -> tuple[ParquetSink, RelstateQuery]:
    """Run the pipeline over every file under ``root`` to the end; with
    ``joined_too`` the join's rows also go to a sink of their own (``joined``),
    so that the join runs as a Spark job of its own, before the revenue's."""
    pipeline = Pipeline()
    joined, revenue = build(pipeline, *sources(spark, root, pipeline))
    sink = ParquetSink(str(root / "out"))
    more = [(joined, ParquetSink(str(root / "joined")))] if joined_too else []
    query = pipeline.start(
        revenue,
        sink,
        checkpoint=str(root / "checkpoint"),
        partitions=partitions,
        trigger={"availableNow": True},
        more_outputs=more,
        **options,
    )
    query.awaitTermination()
    return sink, query


if __name__ == "__main__":
    from operators._spark.session import local_spark

    session = local_spark("relstate-pipeline-job", {"spark.default.parallelism": "2"})
    run(session, Path(sys.argv[1]), joined_too="--joined-too" in sys.argv[2:])
    session.stop()
