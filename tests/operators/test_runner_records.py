"""The runner's batch records, and guards that need no Spark session."""

from __future__ import annotations

from pathlib import Path

import pytest

from operators import InputError, run_operator
from operators._runner import _BatchRecord, _Driver, _Plan
from operators._task import state_tables
from operators.examples import RunningAggregate
from statestore import PartitionCheckpoint, StateStore, StoreConfig


def _committed(location: str, version: int) -> str:
    operator = RunningAggregate()
    config = StoreConfig(local_dir=str(Path(location).parent / "local"))
    with StateStore(location, operator.name, 0, state_tables(operator), config) as store:
        store.load(None if version == 0 else version - 1)
        return store.commit(version).commit_id


class TestBatchRecords:
    def test_recorded_batch_is_not_run_again(self, tmp_path: Path) -> None:
        """Spark may run a batch again after the driver died between recording
        it and Spark's own commit: the runner then runs nothing (its output is
        already in the sink), and completes the stores' winner records."""
        location = str(tmp_path / "state")
        plan = _Plan(RunningAggregate(), location, 1, [["key", "value"]], {}, StoreConfig())
        sink_calls: list[int] = []
        driver = _Driver(plan, [["key"]], lambda df, n: sink_calls.append(n), None)
        commit_id = _committed(location, 0)
        driver._write_record(_BatchRecord(0, {0: commit_id}, None, {}, {}))
        driver(object(), 0)  # would fail on any use of the DataFrame
        assert sink_calls == []
        assert PartitionCheckpoint(location, plan.operator.name, 0).winner(0) == commit_id
        driver(object(), 0)  # and again: the winner record is not rewritten

    def test_runner_needs_two_retained_versions(self) -> None:
        """A store config keeping one version is refused: a task retried after
        its commit must still load the version before."""
        with pytest.raises(InputError, match="retain_versions"):
            run_operator(
                [object()],  # type: ignore[list-item]
                RunningAggregate(),
                keys=["key"],
                partitions=1,
                checkpoint="/nonexistent",
                sink=lambda df, n: None,
                store_config=StoreConfig(retain_versions=1),
            )
