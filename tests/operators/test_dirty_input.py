"""Dirty input in the harness: retractions of rows a stage does not hold
under each policy (drop, fail, apply) in a join -> aggregate pipeline, the
one warning per batch and stage, and the policy's settings."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from _dirty_work import APPLIED, BATCHES, ORDERS, RESULT, USERS, batch_sql, build

from operators import InputError, Pipeline
from operators.demo import materialised
from operators.testing import PipelineHarness
from statestore import capture_events


def _run(policy: str | None) -> tuple[Counter[Any], list[Any]]:
    """The pipeline's final result and the events it logged, under the
    query's ``policy`` (``None``: the default)."""
    pipeline = Pipeline()
    order_stream = pipeline.source(ORDERS, "orders")
    user_stream = pipeline.source(USERS, "users", sequence="seq")
    output = build(pipeline, order_stream, user_stream)
    rows: list[dict[str, Any]] = []
    with (
        capture_events() as events,
        PipelineHarness(pipeline, 2, unknown_retractions=policy) as harness,
    ):
        for batch_id, (o, u) in enumerate(BATCHES):
            out = harness.run_batch({"orders": o, "users": u})[output.name]
            rows += [{**r, "batch": batch_id} for r in out.to_pylist()]
    return materialised(rows, RESULT), events


class TestUnknownRetractions:
    def test_drop_equals_batch_sql_over_the_valid_rows(self) -> None:
        """Under drop (the default) the unknown delete and update of a user
        do nothing: the result equals batch SQL over the other rows, and the
        join stage warns once for the batch, naming the source and a row."""
        result, events = _run(None)
        assert result == batch_sql()
        warnings = [e for e in events if e["event"] == "relstate.unknown_retractions"]
        assert len(warnings) == 1
        (warning,) = warnings
        assert warning["log_level"] == "warning"
        assert warning["stage"] == "join" and warning["batch_id"] == 1
        assert warning["source"] == "source 'users' (input 1 of stage 'join')"
        assert warning["count"] == 2 and warning["example"] in (
            "(3, 'US', 'pro', 3)",
            "(4, 'DE', 'free', 4)",
        )

    def test_fail_names_the_source_key_and_row(self) -> None:
        """Under fail the batch stops with an InputError naming the source,
        the key and the row; its first batch stays recorded, the second not."""
        pipeline = Pipeline()
        output = build(
            pipeline,
            pipeline.source(ORDERS, "orders"),
            pipeline.source(USERS, "users", sequence="seq"),
        )
        with PipelineHarness(pipeline, 2, unknown_retractions="fail") as harness:
            (o, u), (o2, u2) = BATCHES
            first = harness.run_batch({"orders": o, "users": u})[output.name]
            with pytest.raises(
                InputError,
                match=r"source 'users' \(input 1 of stage 'join'\): a retraction of a row the "
                r"stage does not hold with key \((3|4),\): "
                r"\((3, 'US', 'pro', 3|4, 'DE', 'free', 4)\)",
            ):
                harness.run_batch({"orders": o2, "users": u2})
            assert harness.batch_id == 1 and first.num_rows == 2

    def test_apply_is_flinks_join(self) -> None:
        """Under apply the join retracts the pairs the unknown rows would
        have made, as Flink's join does: the result is not batch SQL's."""
        result, _ = _run("apply")
        assert result == APPLIED != batch_sql()

    def test_a_stage_setting_wins_over_the_querys(self) -> None:
        """A stage's own unknown_retractions wins over the query's; a value
        outside the choices is refused where it is given."""
        pipeline = Pipeline()
        orders = pipeline.source(ORDERS, "orders")
        users = pipeline.source(USERS, "users", sequence="seq")
        build(pipeline, orders, users)
        with pytest.raises(InputError, match=r"one of \['drop', 'fail', 'apply'\], got 'skip'"):
            PipelineHarness(pipeline, 1, unknown_retractions="skip")
        from operators.join import StreamingJoin

        join = StreamingJoin("inner", ORDERS, USERS, ["user_id"], ["id"], name="strict")
        pipeline.stage(join, orders, users, unknown_retractions="fail")
        stage = pipeline.stages[-1]
        assert pipeline.input_policy(stage, "apply").unknown_retractions.value == "fail"
        assert pipeline.input_policy(pipeline.stages[0], "apply").unknown_retractions.value == (
            "apply"
        )
