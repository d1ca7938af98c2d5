"""The plan of a query's stages, read without Spark: which job runs each
stage and the SQL text of each stage's input."""

from __future__ import annotations

import pyarrow as pa

from operators import ROW_KIND, FkJoin, Pipeline
from operators._spark.plan import SOURCE, QueryPlan

LEFT = pa.schema([("k", pa.string()), ("fk", pa.string())])
RIGHT = pa.schema([("id", pa.string()), ("v", pa.string())])


def _fk_join_plan() -> tuple[QueryPlan, FkJoin]:
    """The FK join's two stages over two changelog sources, its results the output."""
    join = FkJoin(LEFT, ["k"], RIGHT, "id", "fk", sequence_column="seq")
    pipeline = Pipeline()
    kind = pa.field(ROW_KIND, pa.string())
    left = pipeline.source(join.keyed_input().append(kind), "left", sequence="seq")
    right = pipeline.source(join.with_sequence(RIGHT).append(kind), "right", sequence="seq")
    output = join.add_to(pipeline, left, right)
    return QueryPlan(pipeline, {output.index}), join


def test_the_fk_joins_stages_run_in_one_job_passing_the_left_rows_on() -> None:
    """The subscription stage runs in the result stage's job, and passes
    the left source's rows on to it: one job, the batch read once."""
    plan, _ = _fk_join_plan()
    assert plan.fused == {0: 1}
    assert plan.passing == {0: (0, 0)}
    assert plan.job_of(0) == plan.job_of(1) == 1


def test_a_stage_input_is_sql_text_over_the_batch() -> None:
    """The subscription stage's input is one projection of the batch: its
    two sides by source, with side and sequence columns, partitioned by the
    coalesced keys; the task orders its rows, retractions first."""
    plan, _ = _fk_join_plan()
    first, order = plan.stage_input(0)
    assert len(first.parts) == 1
    columns = first.parts[0].columns
    assert any(
        c.startswith(f"CASE {SOURCE} WHEN 0 THEN") and c.endswith("AS __side") for c in columns
    )
    assert any(c.endswith("AS __seq") for c in columns)
    assert any("AS __pass" in c for c in columns)
    assert len(first.by) == 1 and first.by[0].startswith("coalesce(")
    assert order is not None and order.kinds
    second, _ = plan.stage_input(1)
    assert len(second.parts) == 1
    assert any("__pass" in c for c in second.parts[0].columns)
