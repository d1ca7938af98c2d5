"""Pipelines of keyed stages without Spark: their checks, the batch records
that hold every stage's winners, and the metrics of a multi-stage batch."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import FkJoin, InputError, Operator, OperatorContext, RowKind, Source, Stage
from operators._runner import _BatchRecord, _Driver, _Plan
from operators._stage_runner import _stage_meta
from operators._stages import check_stages
from operators._task import state_tables
from operators.examples import RunningAggregate
from operators.testing import StageHarness
from statestore import PartitionCheckpoint, StateStore, StoreConfig

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def _join() -> FkJoin:
    return FkJoin(SCHEMA, ["k"], pa.schema([("r", pa.int64())]), "r", "k")


class TestCheckStages:
    def test_the_fk_join_stages_pass(self) -> None:
        """The FK join's two stages over two inputs are a valid pipeline."""
        check_stages(_join().stages(), 2)

    def test_duplicate_operator_names_are_refused(self) -> None:
        """Two stages with one operator name would share state: refused."""
        stage = Stage(RunningAggregate(), (Source(0, ("key",)),))
        with pytest.raises(InputError, match="distinct names"):
            check_stages([stage, stage], 1)

    def test_a_source_must_be_an_earlier_stage(self) -> None:
        """A stage cannot read its own output or a later stage's."""
        stage = Stage(RunningAggregate(), (Source(0, ("key",), from_stage=True, sequence="s"),))
        with pytest.raises(InputError, match="earlier stage 0"):
            check_stages([stage], 1)

    def test_a_stage_output_source_needs_its_sequence_column(self) -> None:
        """Rows of an earlier stage are ordered by a column the source names."""
        first = Stage(RunningAggregate(), (Source(0, ("key",)),))
        second = RunningAggregate()
        second.name = "second"
        later = Stage(second, (Source(0, ("key",), from_stage=True),))
        with pytest.raises(InputError, match=r"Source\.sequence"):
            check_stages([first, later], 1)

    def test_one_source_per_input(self) -> None:
        """A stage gives each of its operator's inputs a source."""
        stage = Stage(RunningAggregate(), (Source(0, ("key",)), Source(0, ("key",))))
        with pytest.raises(InputError, match="1 input"):
            check_stages([stage], 1)


class _Arrivals(Operator):
    """Emits each row of either side as it arrives: the order it was fed."""

    name = "arrivals"
    inputs = (SCHEMA, SCHEMA)
    output = SCHEMA

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        ctx.emit(row)


def _arrival_order(tie_break: random.Random | None) -> list[str]:
    """The order one partition gets a row of each side with one number,
    and a row with the next number."""
    stage = Stage(_Arrivals(), (Source(0, ("k",)), Source(1, ("k",))))
    left = pa.table({"k": [1, 1], "v": ["left", "left-later"], "seq": [5, 6]})
    right = pa.table({"k": [1], "v": ["right"], "seq": [5]})
    with StageHarness([stage], 2, 1, "seq", tie_break=tie_break) as harness:
        return harness.run_batch([left, right]).column("v").to_pylist()


class TestStageHarness:
    def test_ties_come_in_side_order_without_tie_break(self) -> None:
        """Without tie_break, of two rows with one number and kind, side 0's
        comes first, every time."""
        assert _arrival_order(None) == ["left", "right", "left-later"]

    def test_tie_break_orders_ties_both_ways(self) -> None:
        """With tie_break, tied rows come in either order (over a few
        draws), and rows with different numbers stay in order."""
        orders = {tuple(_arrival_order(random.Random(seed))) for seed in range(20)}
        assert orders == {("left", "right", "left-later"), ("right", "left", "left-later")}


def _committed(location: str, name: str, version: int) -> str:
    operator = RunningAggregate()
    operator.name = name
    config = StoreConfig(local_dir=str(Path(location).parent / f"local-{name}"))
    with StateStore(location, name, 0, state_tables(operator), config) as store:
        store.load(None)
        return store.commit(version).commit_id


class TestStageRecords:
    def _driver(self, location: str) -> _Driver:
        plan = _Plan(RunningAggregate(), location, 1, [["key", "value"]], {}, StoreConfig())
        return _Driver(plan, [["key"]], lambda df, n: None, None)

    def test_a_record_without_stage_winners_reads_as_before(self, tmp_path: Path) -> None:
        """A batch record written before pipelines existed (no stage_winners)
        reads with its winners and no stage winners."""
        driver = self._driver(str(tmp_path / "state"))
        old = {"batch_id": 0, "winners": {"0": "abc"}, "watermark": None}
        old |= {"max_event_time": {}, "metrics": {"numOutputRows": 1}}
        path = Path(driver._record_path(0))
        path.write_text(json.dumps(old))
        record = driver._read_record(0)
        assert record.winners == {0: "abc"} and record.stage_winners == {}

    def test_stage_winners_are_recorded_per_stage(self, tmp_path: Path) -> None:
        """A multi-stage record round-trips, and recording it writes each
        stage's winner into that stage's own checkpoint."""
        location = str(tmp_path / "state")
        driver = self._driver(location)
        winners = {name: {0: _committed(location, name, 0)} for name in ("a", "b")}
        record = _BatchRecord(0, {}, None, {}, {}, stage_winners=winners)
        driver._write_record(record)
        assert driver._read_record(0) == record
        driver._record_winners(record)
        for name, by_partition in winners.items():
            assert PartitionCheckpoint(location, name, 0).winner(0) == by_partition[0]

    def test_metas_are_tagged_with_their_stage(self) -> None:
        """A stage's metrics appear under 'stage.name' and summed under their
        own name, output rows only for the last stage."""
        meta = {"partition": 0, "commit_id": "c", "metrics": {"numOutputRows": 5, "x": 2}}
        inner = _stage_meta(meta, "first", last=False)
        assert inner["stage"] == "first"
        assert inner["metrics"] == {"first.numOutputRows": 5, "first.x": 2, "x": 2}
        assert _stage_meta(meta, "last", last=True)["metrics"]["numOutputRows"] == 5
