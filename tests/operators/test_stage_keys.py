"""A stage's partition key is its operator's to declare: left out, the
stage takes it; given, keys that would part rows the operator relates are
refused as the stage is added."""

from __future__ import annotations

import pyarrow as pa
import pytest

from operators import InputError, Pipeline
from operators.aggregate import Aggregate, GroupAggregate
from operators.dedup import Deduplicate
from operators.join import StreamingJoin
from operators.topn import TopN

CLICKS = pa.schema([("user_id", pa.int64()), ("page", pa.string()), ("ms", pa.int64())])
USERS = pa.schema([("id", pa.int64()), ("region", pa.string()), ("plan", pa.string())])


def _count_per_page() -> GroupAggregate:
    return GroupAggregate(CLICKS, ["page"], [Aggregate.count(name="clicks")], name="per_page")


def _top_per_page() -> TopN:
    return TopN(CLICKS, ["ms"], 1, partition_by=["page"], name="top")


class TestStageKeys:
    def test_mis_keyed_top_n_and_count_refused(self) -> None:
        """A top-N keyed by another column than its partition column, and a
        count per page keyed by the user, are refused at stage()."""
        pipeline = Pipeline()
        clicks = pipeline.source(CLICKS, "clicks")
        with pytest.raises(InputError, match=r"keys \['user_id'\] would put rows .* \['page'\]"):
            pipeline.stage(_top_per_page(), clicks, keys=["user_id"])
        with pytest.raises(InputError, match=r"keys \['user_id'\] would put rows .* \['page'\]"):
            pipeline.stage(_count_per_page(), clicks, keys=["user_id"])
        with pytest.raises(InputError, match=r"keys \['page', 'user_id'\] would put rows"):
            pipeline.stage(_count_per_page(), clicks, keys=["page", "user_id"])
        with pytest.raises(InputError, match=r"keys=\(\) would run it as one partition"):
            pipeline.stage(_count_per_page(), clicks, keys=())
        assert pipeline.stages == []

    def test_keys_left_out_are_the_operators(self) -> None:
        """Without keys= a stage is partitioned by what its operator
        declares; a global top-N declares none and runs keyless."""
        pipeline = Pipeline()
        clicks = pipeline.source(CLICKS, "clicks")
        users = pipeline.source(USERS, "users")
        pipeline.stage(_count_per_page(), clicks)
        pipeline.stage(_top_per_page(), clicks)
        pipeline.stage(TopN(CLICKS, ["ms"], 3, name="global_top"), clicks)
        pipeline.stage(Deduplicate(CLICKS, ["user_id", "page"], name="dedup"), clicks)
        join = StreamingJoin("inner", CLICKS, USERS, ["user_id"], ["id"])
        pipeline.stage(join, clicks, users)
        assert [[list(i.keys) for i in s.inputs] for s in pipeline.stages] == [
            [["page"]],
            [["page"]],
            [[]],
            [["user_id", "page"]],
            [["user_id"], ["id"]],
        ]
        assert pipeline.stages[2].keyless

    def test_a_subset_in_the_same_positions_is_taken(self) -> None:
        """Some of the declared columns, the same positions on every side,
        keep rows that meet together and are taken; other positions on one
        side, a keyed global top-N, and a subset of a dedup key in another
        order than declared are handled as they part or keep rows."""
        pipeline = Pipeline()
        left = pipeline.source(CLICKS, "clicks")
        right = pipeline.source(
            pa.schema([("u", pa.int64()), ("p", pa.string()), ("t", pa.int64())]), "other"
        )
        join = StreamingJoin("inner", CLICKS, right.schema, ["user_id", "page"], ["u", "p"])
        with pytest.raises(InputError, match=r"keys \[\['user_id'\], \['p'\]\] would put rows"):
            pipeline.stage(join, left, right, keys=[["user_id"], ["p"]])
        pipeline.stage(join, left, right, keys=[["page"], ["p"]])
        with pytest.raises(InputError, match="declares no partition key"):
            pipeline.stage(TopN(CLICKS, ["ms"], 3, name="all"), left, keys=["page"])
        pipeline.stage(Deduplicate(CLICKS, ["user_id", "page"], name="d"), left, keys=["page"])
        assert [list(i.keys) for i in pipeline.stages[0].inputs] == [["page"], ["p"]]


class TestStatefulProcessorKeys:
    def test_grouping_keys_are_the_stage_keys(self) -> None:
        """A StatefulProcessorOperator declares its grouping key: a stage
        left without keys= takes it, and with an initial state (routed by
        the whole grouping key) a stage keyed by some of it is refused."""
        from pyspark.sql.streaming import StatefulProcessor

        from operators.stateful import StatefulProcessorOperator

        class Echo(StatefulProcessor):
            def init(self, handle: object) -> None:
                pass

            def handleInputRows(self, key: object, rows: object, timerValues: object) -> object:
                return iter([])

        kind = "user_id long, page string"
        pipeline = Pipeline()
        clicks = pipeline.source(CLICKS, "clicks")
        for name, keys in (("whole", None), ("some", ["user_id"])):
            plain = StatefulProcessorOperator(Echo(), CLICKS, ["user_id", "page"], kind, name=name)
            pipeline.stage(plain, clicks, keys=keys)
        assert [list(s.inputs[0].keys) for s in pipeline.stages] == [
            ["user_id", "page"],
            ["user_id"],
        ]
        initial = pa.table({"user_id": [1], "page": ["a"]})
        seeded = StatefulProcessorOperator(
            Echo(), CLICKS, ["user_id", "page"], kind, initial_state=initial, name="seeded"
        )
        with pytest.raises(InputError, match=r"places rows by the whole key itself"):
            pipeline.stage(seeded, clicks, keys=["user_id"])
        pipeline.stage(seeded, clicks)
        assert list(pipeline.stages[-1].inputs[0].keys) == ["user_id", "page"]
