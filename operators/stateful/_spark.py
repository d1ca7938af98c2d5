"""``transform_with_state`` and ``transform_with_state_in_pandas``: Spark's
``df.groupBy(...).transformWithState(...)`` (``InPandas``) as a relstate
query, the same arguments plus where the output and the state go, so that
moving a query is a one-line change."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Unpack

from operators._spark.runner import QueryOptions, RelstateQuery, run_operator
from operators.errors import InputError
from operators.stateful._core import StatefulProcessorOperator

if TYPE_CHECKING:
    from operators.typing import BatchSink

__all__ = ["grouping_columns", "transform_with_state", "transform_with_state_in_pandas"]


def grouping_columns(grouped: Any) -> list[str]:
    """The column names a classic PySpark ``GroupedData`` groups by;
    :class:`InputError` for a grouping by expressions."""
    jgd = getattr(grouped, "_jgd", None)
    if jgd is None or not hasattr(grouped, "_df"):
        raise InputError(
            f"expected a pyspark GroupedData (df.groupBy(...)), got {type(grouped).__name__}"
        )
    exprs = jgd.groupingExprs()
    names = []
    for i in range(exprs.length()):
        expr = exprs.apply(i)
        name = expr.name() if hasattr(expr, "name") else None
        if not isinstance(name, str) or name not in grouped._df.columns:
            raise InputError(
                f"transformWithState on relstate groups by columns; {expr.toString()} is an "
                "expression: add it as a column (withColumn) and group by that"
            )
        names.append(name)
    return names


def _start(
    flavour: str,
    grouped: Any,
    statefulProcessor: Any,
    outputStructType: Any,
    outputMode: str,
    timeMode: str,
    initialState: Any,
    eventTimeColumnName: str,
    sink: BatchSink,
    checkpoint: str,
    partitions: int | None,
    name: str,
    options: QueryOptions,
) -> RelstateQuery:
    from pyspark.sql.pandas.types import to_arrow_schema

    keys = grouping_columns(grouped)
    frame = grouped._df
    schema = to_arrow_schema(frame.schema, timezone="UTC")
    initial = None
    initial_keys = None
    if initialState is not None:
        initial_keys = grouping_columns(initialState)
        initial = initialState._df.toArrow()
    operator = StatefulProcessorOperator(
        statefulProcessor,
        schema,
        keys,
        outputStructType,
        output_mode=outputMode,
        time_mode=timeMode,
        event_time_column=eventTimeColumnName or None,
        initial_state=initial,
        flavour=flavour,
        initial_state_keys=initial_keys,
        name=name,
    )
    if partitions is None:
        partitions = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return run_operator(frame, operator, keys, partitions, checkpoint, sink, **options)


def transform_with_state(
    grouped: Any,
    statefulProcessor: Any,
    outputStructType: Any,
    outputMode: str,
    timeMode: str,
    initialState: Any = None,
    eventTimeColumnName: str = "",
    *,
    sink: BatchSink,
    checkpoint: str,
    partitions: int | None = None,
    name: str = "transform_with_state",
    **options: Unpack[QueryOptions],
) -> RelstateQuery:
    """``grouped.transformWithState(statefulProcessor, outputStructType,
    outputMode, timeMode, initialState, eventTimeColumnName)`` on relstate:
    ``handleInputRows`` gets ``Row`` iterators and returns ``Row`` s. The
    output (with a ``row_kind`` column, every row ``+I``) goes to ``sink``
    each batch; ``checkpoint`` holds Spark's stream checkpoint and the state.
    ``partitions`` defaults to ``spark.sql.shuffle.partitions`` and is fixed
    for the checkpoint's life; ``options`` are :class:`~operators.QueryOptions`.
    ``initialState`` is a ``GroupedData`` of a batch DataFrame, read once as
    the query starts."""
    return _start(
        "rows",
        grouped,
        statefulProcessor,
        outputStructType,
        outputMode,
        timeMode,
        initialState,
        eventTimeColumnName,
        sink,
        checkpoint,
        partitions,
        name,
        options,
    )


def transform_with_state_in_pandas(
    grouped: Any,
    statefulProcessor: Any,
    outputStructType: Any,
    outputMode: str,
    timeMode: str,
    initialState: Any = None,
    eventTimeColumnName: str = "",
    *,
    sink: BatchSink,
    checkpoint: str,
    partitions: int | None = None,
    name: str = "transform_with_state",
    **options: Unpack[QueryOptions],
) -> RelstateQuery:
    """``grouped.transformWithStateInPandas(...)`` on relstate: as
    :func:`transform_with_state`, with pandas DataFrames in and out."""
    return _start(
        "pandas",
        grouped,
        statefulProcessor,
        outputStructType,
        outputMode,
        timeMode,
        initialState,
        eventTimeColumnName,
        sink,
        checkpoint,
        partitions,
        name,
        options,
    )
