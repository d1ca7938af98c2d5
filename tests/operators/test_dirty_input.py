"""Dirty input in the harness: retractions of rows a stage does not hold
under each policy (drop, fail, apply) in a join -> aggregate pipeline, the
one warning per batch and stage, and the policy's settings; rows a stage
cannot take failing the batch or set aside in the dead-letter table."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _dirty_work import (
    APPLIED,
    BAD,
    BATCHES,
    CHANGES,
    GOOD_AND_BAD,
    KIND,
    ORDERS,
    RESULT,
    TOTALS,
    USERS,
    batch_sql,
    build,
    changes,
    totals,
    totals_sql,
)
from pyarrow.fs import LocalFileSystem

from operators import InputError, Pipeline
from operators._checkpoint.dead_letters import DeadLetters
from operators._tools.demo import materialised
from operators.aggregate import Aggregate, GroupAggregate
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
            "(3, 'US', 'pro')",
            "(4, 'DE', 'free')",
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
                r"\((3, 'US', 'pro'|4, 'DE', 'free')\)",
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


def _totals_run(bad_rows: str, dead_letters: Path) -> tuple[Counter[Any], PipelineHarness]:
    """The per-customer totals over the malformed change log, under ``bad_rows``."""
    pipeline = Pipeline()
    output = totals(pipeline, pipeline.source(CHANGES, "orders", sequence="seq"))
    rows: list[dict[str, Any]] = []
    harness = PipelineHarness(pipeline, 2, bad_rows=bad_rows, dead_letters=str(dead_letters))
    with harness:
        for batch_id, batch in enumerate(GOOD_AND_BAD):
            out = harness.run_batch({"orders": changes(batch)})[output.name]
            rows += [{**r, "batch": batch_id} for r in out.to_pylist()]
    return materialised(rows, TOTALS), harness


class TestBadRows:
    def test_a_malformed_row_kind_fails_the_batch_by_default(self, tmp_path: Path) -> None:
        """Under bad_rows='fail' (the default) a file with unknown row kinds
        stops its batch with an InputError naming them; nothing is set aside."""
        with pytest.raises(InputError, match=r"unknown row kind\(s\) \[\"'(\?\?|\+X)'"):
            _totals_run("fail", tmp_path)
        assert DeadLetters(LocalFileSystem(), str(tmp_path)).read().num_rows == 0

    def test_set_aside_goes_on_without_the_bad_rows(self, tmp_path: Path) -> None:
        """Under bad_rows='set_aside' the batch goes on: the dead-letter
        table holds exactly the bad rows (batch, stage, source, reason), the
        result equals batch SQL over the good rows, and running the batches
        again writes each dead letter once."""
        result, harness = _totals_run("set_aside", tmp_path)
        assert result == totals_sql()
        table = DeadLetters(LocalFileSystem(), str(tmp_path)).read()
        letters = table.to_pylist()
        assert {
            (json.loads(r["row"])["row_kind"], json.loads(r["row"])["order_id"]) for r in letters
        } == BAD
        assert {(r["batch_id"], r["stage"], r["source"], r["reason"]) for r in letters} == {
            (1, "per_customer", "orders", "unknown row kind")
        }
        assert (
            len(harness.set_aside) == 2
            and harness.last_metrics["per_customer"]["numRowsSetAside"] == 2
        )
        again, _ = _totals_run("set_aside", tmp_path)
        assert again == result
        assert DeadLetters(LocalFileSystem(), str(tmp_path)).read().equals(table)

    @pytest.mark.parametrize("bad_rows", ["fail", "set_aside"])
    def test_rows_the_operator_refuses_and_null_keys(self, tmp_path: Path, bad_rows: str) -> None:
        """A retraction given to an aggregate built for an append-only input
        and a null in a key column declared not nullable fail the batch, or
        are set aside with their reasons while the good rows are counted."""
        schema = pa.schema(
            [pa.field("customer", pa.string(), nullable=False), ("amount", pa.int64())]
        )
        pipeline = Pipeline()
        orders = pipeline.source(schema.append(pa.field("row_kind", pa.string())), "orders")
        per_customer = GroupAggregate(
            orders.schema, ["customer"], [Aggregate.sum("amount", "revenue")], changelog=False
        )
        output = pipeline.stage(per_customer, orders)
        rows = pa.Table.from_pylist(
            [
                {"customer": "a", "amount": 5, "row_kind": "+I"},
                {"customer": "a", "amount": 5, "row_kind": "-D"},
                {"customer": None, "amount": 7, "row_kind": "+I"},
                {"customer": "b", "amount": 2, "row_kind": "+I"},
            ],
            schema=pa.schema([("customer", pa.string()), ("amount", pa.int64()), KIND]),
        )
        with PipelineHarness(pipeline, 1, bad_rows=bad_rows) as harness:
            if bad_rows == "fail":
                with pytest.raises(InputError, match=r"holds nulls but is declared not nullable"):
                    harness.run_batch({"orders": rows})
                return
            out = harness.run_batch({"orders": rows})[output.name].to_pylist()
            assert sorted((r["customer"], r["revenue"]) for r in out) == [("a", 5), ("b", 2)]
            assert sorted(r["reason"] for r in harness.set_aside) == [
                "a retraction in an append-only input (changelog=False)",
                "null in non-nullable 'customer'",
            ]


class TestTopNUnknownRetractions:
    @pytest.mark.parametrize("with_ties", [False, True])
    def test_fail_and_drop_in_both_paths(self, with_ties: bool) -> None:
        """Top-N meets an unknown delete the same way in its whole-batch path
        (no ties) and its row path (ties): fail raises naming the row, drop
        counts it and leaves the top the valid rows make."""
        from operators import RowKind
        from operators.testing import OperatorHarness
        from operators.topn import TopN

        schema = pa.schema([("page", pa.string()), ("ms", pa.int64())])
        rows = [("a", 5), ("a", 7), ("a", 9)]
        kinds = [RowKind.INSERT, RowKind.INSERT, RowKind.DELETE]

        def top(policy: str) -> OperatorHarness:
            op = TopN(schema, ["ms"], 1, partition_by=["page"], with_ties=with_ties)
            return OperatorHarness(op, unknown_retractions=policy)

        failing = top("fail")
        with pytest.raises(InputError, match=r"does not hold.*\('a', 9\)"):
            failing.process_rows(rows, kinds)
            failing.commit()
        dropping = top("drop")
        dropping.process_rows(rows, kinds)
        dropping.commit()
        assert dropping.output == [(RowKind.INSERT, ("a", 5))]
        assert dropping.last_metrics["numRetractionsOfUnknownRows"] == 1
        assert dropping.last_unknown_example is not None
