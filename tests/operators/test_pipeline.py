"""Pipelines without Spark: what the builder refuses, and what the harness
runs (the stages, the routing by Spark's hash, the watermark rule)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from _pipeline_work import (
    KINDS,
    TOP_COLUMNS,
    SegmentRevenue,
    build_top,
    changes,
    harness_pipeline,
    top_customers,
)

from bench.revenue_pipeline import CUSTOMERS, ORDERS
from encoding import Direction, KeyColumn
from operators import InputError, Operator, OperatorContext, Pipeline, RowKind, Watermark
from operators._engine.spark_hash import spark_partition
from operators._tools.demo import materialised
from operators.aggregate import Aggregate, GroupAggregate
from operators.examples import RunningAggregate
from operators.testing import OperatorHarness, PipelineHarness
from operators.topn import TopN


def _revenue_pipeline() -> tuple[Pipeline, str, str]:
    pipeline, joined, revenue = harness_pipeline()
    return pipeline, joined.name, revenue.name


class TestBuildErrors:
    def test_missing_column(self) -> None:
        """An operator input column the stream lacks is refused as the stage is added."""
        pipeline = Pipeline()
        stream = pipeline.source(pa.schema([("key", pa.string())]), "s")
        with pytest.raises(InputError, match=r"has no column 'value'"):
            pipeline.stage(RunningAggregate(), stream, keys=["key"])

    def test_wrong_type(self) -> None:
        """A column of another type than the operator declares is refused, naming both."""
        pipeline = Pipeline()
        stream = pipeline.source(pa.schema([("key", pa.string()), ("value", pa.string())]))
        with pytest.raises(
            InputError, match=r"'value' .* has type string, the operator expects int64"
        ):
            pipeline.stage(RunningAggregate(), stream, keys=["key"])

    def test_key_column_missing_and_key_types_differ(self) -> None:
        """A key column the stream lacks, and keys of two types on the two sides, are refused."""
        pipeline = Pipeline()
        orders = pipeline.source(ORDERS, "orders", sequence="seq")
        customers = pipeline.source(CUSTOMERS, "customers", sequence="seq")
        revenue = SegmentRevenue()
        revenue.inputs = [pa.schema([("customer", pa.int64()), ("amount", pa.int64())])]
        with pytest.raises(InputError, match=r"no key column\(s\) \['client'\]"):
            pipeline.stage(revenue, orders, keys=["client"])
        strings = pipeline.source(pa.schema([("customer", pa.string())]), "strings")
        pair = _Lagging("pair")
        pair.inputs = [pa.schema([("customer", pa.int64())]), strings.schema]
        with pytest.raises(InputError, match="hash alike"):
            pipeline.stage(pair, customers, strings, keys=["customer"])

    def test_upsert_stream_refused_where_retractions_are_needed(self) -> None:
        """The output of an aggregate built with update_before=False (+U with
        no -U) is refused as the input of a stage that needs the -U rows
        (a top-N), and accepted by one that reads it by key."""
        pipeline = Pipeline()
        stream = pipeline.source(pa.schema([("key", pa.string()), ("value", pa.int64())]), "s")
        upsert = pipeline.stage(
            GroupAggregate(
                stream.schema, ["key"], [Aggregate.sum("value", "total")], update_before=False
            ),
            stream,
            keys=["key"],
        )
        top = TopN(upsert.schema, [KeyColumn("total", Direction.DESC)], 3, name="top")
        with pytest.raises(
            InputError, match=r"upsert stream keyed by \['key'\].*update_before=True"
        ):
            pipeline.stage(top, upsert, keys=())
        by_key = _Lagging("by_key")
        by_key.inputs = [upsert.schema]
        by_key.needs_update_before = False
        pipeline.stage(by_key, upsert, keys=["key"])
        retracting = pipeline.stage(
            GroupAggregate(stream.schema, ["key"], [Aggregate.count()], name="counts"),
            stream,
            keys=["key"],
        )
        pipeline.stage(
            TopN(retracting.schema, [KeyColumn("count", Direction.DESC)], 3, name="top2"),
            retracting,
            keys=(),
        )

    def test_upsert_stream_partitioned_off_its_key_is_refused(self) -> None:
        """A stage that reads an upsert stream by its key must get every row
        of one key in one task: partitioned by columns outside the upsert
        key it is refused; by the key, a part of it, or keyless, accepted."""
        pipeline = Pipeline()
        schema = pa.schema([("key", pa.string()), ("region", pa.string()), ("value", pa.int64())])
        stream = pipeline.source(schema, "s")
        upsert = pipeline.stage(
            GroupAggregate(
                schema, ["key", "region"], [Aggregate.sum("value", "total")], update_before=False
            ),
            stream,
            keys=["key"],
        )
        for name, keys in (("by_total", ["total"]), ("by_key_total", ["key", "total"])):
            reader = _Lagging(name)
            reader.inputs = [upsert.schema]
            reader.needs_update_before = False
            with pytest.raises(InputError, match=r"partitioned by \['total'\]"):
                pipeline.stage(reader, upsert, keys=keys)
        for name, keys in (("by_key", ["key"]), ("by_both", ["region", "key"]), ("one", [])):
            reader = _Lagging(name)
            reader.inputs = [upsert.schema]
            reader.needs_update_before = False
            pipeline.stage(reader, upsert, keys=keys)

    def test_arity_names_and_completeness(self) -> None:
        """Wrong input counts, a stage name used twice, an output that is not a
        stage or is given twice, and a source no stage reads are each refused."""
        pipeline = Pipeline()
        stream = pipeline.source(pa.schema([("key", pa.string()), ("value", pa.int64())]), "s")
        with pytest.raises(InputError, match="takes 1 input"):
            pipeline.stage(RunningAggregate(), stream, stream, keys=["key"])
        first = pipeline.stage(RunningAggregate(), stream, keys=["key"])
        with pytest.raises(InputError, match="named 'running_aggregate' already"):
            pipeline.stage(RunningAggregate(), stream, keys=["key"])
        with pytest.raises(InputError, match="must be its stages' streams"):
            pipeline.check_complete([stream])
        with pytest.raises(InputError, match="as an output twice"):
            pipeline.check_complete([first, first])
        pipeline.source(pa.schema([("x", pa.int64())]), "unused")
        with pytest.raises(InputError, match="'unused' is read by no stage"):
            pipeline.check_complete([first])

    def test_every_stage_feeds_a_stage_or_is_an_output(self) -> None:
        """A stage read by no later stage must be one of the outputs; with
        several outputs, each such stage may be one."""
        pipeline = Pipeline()
        stream = pipeline.source(pa.schema([("key", pa.string()), ("value", pa.int64())]), "s")
        first = pipeline.stage(RunningAggregate(), stream, keys=["key"])
        second = pipeline.stage(RunningAggregate(name="second"), stream, keys=["key"])
        with pytest.raises(InputError, match="'second' goes nowhere"):
            pipeline.check_complete([first])
        pipeline.check_complete([first, second])

    def test_keyless_stage(self) -> None:
        """keys=() makes a keyless stage (one partition in a query of any
        count); keys given for one side only, or as None, are refused, and
        the harness refuses more than one partition for a keyless stage."""
        pipeline = Pipeline()
        stream = pipeline.source(pa.schema([("key", pa.string()), ("value", pa.int64())]), "s")
        keyed = pipeline.stage(RunningAggregate(), stream, keys=["key"])
        pipeline.stage(RunningAggregate(name="all"), stream, keys=())
        keyless = pipeline.stages[1]
        assert keyless.keyless and keyless.partitions(4) == 1
        assert not pipeline.stages[0].keyless and pipeline.stages[0].partitions(4) == 4
        pair = _Lagging("pair")
        pair.inputs = [pa.schema([("key", pa.string())])] * 2
        with pytest.raises(InputError, match="each list of one length"):
            pipeline.stage(pair, stream, keyed, keys=[[], ["key"]])
        with pytest.raises(InputError, match=r"keys=\(\) for a keyless stage"):
            pipeline.stage(RunningAggregate(name="none"), stream, keys=None)  # type: ignore[arg-type]
        with pytest.raises(InputError, match=r"keyless stage\(s\) \['all'\] run on one partition"):
            PipelineHarness(pipeline, [3, 3])
        with PipelineHarness(pipeline, [3, 1]) as harness:
            assert [len(h) for h in harness.harnesses] == [3, 1]

    def test_event_time_and_sequence_columns(self) -> None:
        """A watermark on a missing column and a sequence column that is not
        an integer are refused when the source is added."""
        pipeline = Pipeline()
        with pytest.raises(InputError, match="no event-time column 'ts'"):
            pipeline.source(ORDERS, "a", watermark=Watermark("ts", 10))
        with pytest.raises(InputError, match="must be an integer"):
            pipeline.source(CUSTOMERS, "b", sequence="segment")

    def test_unknown_start_option(self) -> None:
        """A misspelt query option is refused as Python refuses a keyword, naming the options."""
        pipeline = Pipeline()
        stream = pipeline.source(pa.schema([("key", pa.string()), ("value", pa.int64())]), "s")
        output = pipeline.stage(RunningAggregate(), stream, keys=["key"])
        with pytest.raises(TypeError, match=r"\['triger'\]; the options are .*'trigger'"):
            pipeline.start(output, print, "/nowhere", 1, triger={"once": True})  # type: ignore[call-arg]


class TestPipelineHarness:
    @pytest.mark.parametrize("seed", range(6))
    def test_two_stages_equal_the_stages_run_one_after_the_other(self, seed: int) -> None:
        """A join feeding a running aggregate, 3 partitions, 4 batches of
        random changelogs: the revenue stage's output after every batch
        materialises to the revenue of the join's materialised output, which
        equals the join of the materialised inputs."""
        pipeline, joined, revenue = _revenue_pipeline()
        all_orders: list[dict[str, Any]] = []
        all_customers: list[dict[str, Any]] = []
        out_join: list[dict[str, Any]] = []
        out_revenue: list[dict[str, Any]] = []
        with PipelineHarness(pipeline, 3) as harness:
            for o, c in changes(seed, 4):
                outputs = harness.run_batch({"orders": o, "customers": c})
                out_join += outputs[joined].to_pylist()
                out_revenue += outputs[revenue].to_pylist()
                all_orders += o.to_pylist()
                all_customers += c.to_pylist()
                orders = materialised(all_orders, ["order_id", "customer", "amount"])
                customers = materialised(all_customers, ["customer", "segment"])
                segment = {cid: seg for cid, seg in customers}
                expected: dict[str, list[int]] = {}
                for (_, cid, amount), n in orders.items():
                    if cid in segment:
                        acc = expected.setdefault(segment[cid], [0, 0])
                        acc[0] += n
                        acc[1] += n * amount
                got = materialised(out_revenue, ["key", "count", "total"])
                assert got == Counter({(k, v[0], v[1]): 1 for k, v in expected.items()})

    @pytest.mark.parametrize("seed", range(6))
    def test_keyed_stage_then_keyless_top(self, seed: int) -> None:
        """Revenue per customer (3 partitions) feeding a keyless top-3 over
        all customers, 4 batches of random order changelogs: the top stage
        runs as one partition holding every customer's row, and its output
        after every batch materialises to the top 3 of the materialised
        orders, computed directly."""
        pipeline = Pipeline()
        orders = pipeline.source(ORDERS.append(KINDS), "orders", sequence="seq")
        _, top = build_top(pipeline, orders)
        all_orders: list[dict[str, Any]] = []
        out_top: list[dict[str, Any]] = []
        with PipelineHarness(pipeline, 3) as harness:
            assert [len(h) for h in harness.harnesses] == [3, 1]
            for o, _ in changes(seed, 4):
                outputs = harness.run_batch({"orders": o})
                out_top += outputs[top.name].to_pylist()
                all_orders += o.to_pylist()
                live = materialised(all_orders, ["order_id", "customer", "amount"])
                assert materialised(out_top, TOP_COLUMNS) == top_customers(live)
            # The top's one partition holds every customer's (revenue, customer, orders).
            customers = {c for _, c, _ in live}
            assert {row[1] for row in harness.harnesses[1][0].table("rows").scan()} == customers

    def test_rows_go_to_sparks_partition_of_their_key(self) -> None:
        """Each partition of a stage holds exactly the keys Spark's hash puts there."""
        pipeline = Pipeline()
        stream = pipeline.source(pa.schema([("key", pa.string()), ("value", pa.int64())]), "s")
        pipeline.stage(RunningAggregate(), stream, keys=["key"])
        keys = [f"k{i}" for i in range(40)]
        with PipelineHarness(pipeline, 4) as harness:
            harness.run_batch({"s": pa.table({"key": keys, "value": list(range(40))})})
            for p, part in enumerate(harness.harnesses[0]):
                held = {row[0] for row in part.table("aggregates").scan()}
                assert held == {k for k in keys if spark_partition([k], [pa.string()], 4) == p}

    def test_watermark_passes_from_stage_to_stage(self) -> None:
        """Spark's rule in the harness: the query watermark is the source's
        max event time minus its delay from the batch after, and a stage's
        input watermark is its upstream's output watermark (here lowered by
        5 ms by the first stage)."""
        pipeline = Pipeline()
        events = pipeline.source(
            pa.schema([("key", pa.string()), ("ts", pa.int64())]),
            "events",
            watermark=Watermark("ts", 100),
        )
        first = pipeline.stage(_Lagging("first"), events, keys=["key"])
        pipeline.stage(_Lagging("second"), first, keys=["key"])
        with PipelineHarness(pipeline, 2) as harness:
            harness.run_batch({"events": pa.table({"key": ["a", "b"], "ts": [1_000, 1_500]})})
            assert harness.stage_watermarks == {"first": None, "second": None}
            harness.run_batch({"events": pa.table({"key": ["a"], "ts": [1_200]})})
            assert harness.stage_watermarks == {"first": 1_400, "second": 1_395}
            seen = [h.watermark for h in harness.harnesses[1]]
            assert seen == [1_395, 1_395]


class _Lagging(Operator):
    """Passes its rows on; its output watermark is 5 ms behind its input's."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inputs = [pa.schema([("key", pa.string()), ("ts", pa.int64())])]
        self.output = self.inputs[0]

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        ctx.emit(row, kind)

    def output_watermark(self, watermark: int | None) -> int | None:
        return None if watermark is None else watermark - 5


def test_operator_harness_run_batch_judges_late_rows_against_the_previous_watermark() -> None:
    """OperatorHarness.run_batch puts the batch's watermark in force from its
    first row and hands the operator the previous one, as a Spark task does."""
    seen: list[tuple[int | None, int | None]] = []

    class Probe(_Lagging):
        def process_row(
            self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
        ) -> None:
            seen.append((ctx.watermark, ctx.previous_watermark))

    with OperatorHarness(Probe("probe")) as harness:
        batch = pa.record_batch({"key": ["a"], "ts": [1]})
        harness.run_batch([(0, batch)], watermark=10)
        harness.run_batch([(0, batch)], watermark=20)
    assert seen == [(10, None), (20, 10)]


def test_append_join_passes_on_its_state_watermark() -> None:
    """AppendJoin's output watermark is the least of its sides' state
    watermarks: with right.ts between left.ts - 10 s and left.ts + 5 s, a left
    row waits 5 s (and Spark's 1 ms), a right row 10 s."""
    from operators.join import AppendJoin, TimeRange

    left = pa.schema([("k", pa.int64()), ("lt", pa.timestamp("us", tz="UTC"))])
    right = pa.schema([("k", pa.int64()), ("rt", pa.timestamp("us", tz="UTC"))])
    join = AppendJoin(
        left, right, ["k"], ["k"], "lt", "rt", TimeRange(10_000, 5_000), right_prefix="r_"
    )
    assert join.output_watermark(None) is None
    assert join.output_watermark(100_000) == 100_000 - 10_000 - 1
