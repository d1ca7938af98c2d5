"""How a runner task hands its input to the operator: runs of one side, in
order, joined into large batches; and how the batch it runs reaches it (no
Spark needed)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from operators._spark import task as _spark_task
from operators._spark.task import StagePlan, TaskBatch, run_task, side_batches
from operators.errors import RunnerError
from operators.examples import RunningAggregate
from statestore import StoreConfig

COLUMNS = [["k"], ["k"]]


def tagged(sides: list[int], start: int = 0) -> pa.RecordBatch:
    """A batch as a task receives it: both sides' columns, tagged."""
    n = len(sides)
    keys = list(range(start, start + n))
    return pa.record_batch(
        {
            "s0__0": pa.array(
                [k if s == 0 else None for k, s in zip(keys, sides, strict=True)], pa.int64()
            ),
            "s1__0": pa.array(
                [k if s == 1 else None for k, s in zip(keys, sides, strict=True)], pa.int64()
            ),
            "row_kind": ["+I"] * n,
            "__side": pa.array(sides, pa.int32()),
        }
    )


class TestSideBatches:
    def test_runs_keep_order_and_join_across_batches(self) -> None:
        """Runs of one side come out in order, with the side's column names;
        a run that goes on in the next input batch is joined with it."""
        batches = [tagged([0, 0, 1], 0), tagged([1, 1, 0], 3), tagged([0], 6)]
        out = [
            (side, b.column("k").to_pylist()) for side, b in side_batches(iter(batches), COLUMNS)
        ]
        assert out == [(0, [0, 1]), (1, [2, 3, 4]), (0, [5, 6])]
        assert all(
            b.schema.names == ["k", "row_kind"] for _, b in side_batches(iter(batches), COLUMNS)
        )

    def test_a_long_run_is_cut_at_the_chunk_size(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A run longer than the chunk size comes out in chunks of at least
        that size, none lost."""
        monkeypatch.setattr(_spark_task, "CHUNK_ROWS", 4)
        batches = [tagged([0] * 3, 3 * i) for i in range(5)]
        out = [b.column("k").to_pylist() for _, b in side_batches(iter(batches), COLUMNS)]
        assert [len(c) for c in out] == [6, 6, 3]
        assert [k for chunk in out for k in chunk] == list(range(15))

    def test_a_wide_run_is_cut_at_the_chunk_bytes(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A run that holds the chunk's bytes in fewer rows than the chunk
        size is cut there, none lost."""
        monkeypatch.setattr(_spark_task, "CHUNK_BYTES", 3 * 8)
        batches = [tagged([0] * 3, 3 * i) for i in range(4)]
        out = [b.column("k").to_pylist() for _, b in side_batches(iter(batches), COLUMNS)]
        assert [len(c) for c in out] == [3, 3, 3, 3]
        assert [k for chunk in out for k in chunk] == list(range(12))

    def test_empty_input_batches_are_skipped(self) -> None:
        """An empty batch among the input (Arrow may hand one) changes
        nothing: the runs around it are joined as if it were not there."""
        batches = [tagged([0, 0], 0), tagged([], 2), tagged([0, 1], 2)]
        out = [
            (side, b.column("k").to_pylist()) for side, b in side_batches(iter(batches), COLUMNS)
        ]
        assert out == [(0, [0, 1, 2]), (1, [3])]

    def test_one_append_only_input_comes_without_side_or_kinds(self) -> None:
        """A stage of one append-only input gets neither ``__side`` nor
        ``row_kind`` from Spark: every row is side 0 and an insert."""
        batches = [pa.record_batch({"s0__0": pa.array(range(i, i + 3))}) for i in (0, 3)]
        out = list(side_batches(iter(batches), [["k"]]))
        assert [side for side, _ in out] == [0]
        assert out[0][1].to_pydict() == {"k": list(range(6)), "row_kind": ["+I"] * 6}

    def test_no_input_gives_nothing(self) -> None:
        """A task without input rows hands the operator no batch."""
        assert list(side_batches(iter([]), COLUMNS)) == []


class TestTaskBatch:
    def test_the_batch_a_job_carries_reads_back_the_same(self) -> None:
        """What the driver puts in a job's local property is what the tasks
        read back: every field, the previous winners keyed by partition
        number (JSON keys are strings), and no staging area as ``None``."""
        batch = TaskBatch(
            batch_id=7,
            previous_batch=6,
            previous_winners={0: "a1", 11: "b2"},
            watermark=1_700_000_000_000,
            previous_watermark=None,
            processing_time=1_700_000_000_123,
            staging="file:///out/_staging/7-x",
        )
        assert TaskBatch.from_json(batch.to_json()) == batch
        first = TaskBatch(0, None, {}, None, None, 5)
        assert TaskBatch.from_json(first.to_json()) == first
        assert TaskBatch.key(2) == "relstate.batch.2" != TaskBatch.key(0)

    def test_a_task_whose_job_names_no_batch_fails_before_it_opens_a_store(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
    ) -> None:
        """A stage's task run in a job that carries no batch for its stage
        (not the runner's job) raises ``RunnerError`` naming the property,
        and opens no store: nothing is written under the state location."""
        _in_a_task(monkeypatch, None)
        state = tmp_path / "state"
        plan = StagePlan(RunningAggregate(), str(state), 1, [["key"]], {}, StoreConfig(), index=3)
        with pytest.raises(RunnerError, match=r"relstate\.batch\.3"):
            next(run_task(plan)(iter([])))
        assert not state.exists()


class TestPassingOn:
    def test_marked_rows_come_out_and_only_sided_rows_go_in(self) -> None:
        """A task that passes a side on returns the input rows marked
        ``__pass`` as output rows (their columns cast to the passed schema,
        their row kinds, ``__pass`` true, nulls in the operator's columns)
        and hands its operator only the rows with a side, without
        ``__pass``: a row only passed on (side null) never reaches it."""
        from operators._spark.task import PASS, _passing_on, passed_column, task_schema

        passed = pa.schema([("k", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])
        plan = StagePlan(
            RunningAggregate(), "unused", 1, [["key"]], {}, StoreConfig(), 0, None, (0, passed)
        )
        schema = task_schema(plan)
        batch = pa.record_batch(
            {
                "s0__0": pa.array([1, 2, 3], pa.int64()),
                "s0__1": pa.array([0, 1, 2], pa.timestamp("us", tz="Europe/Paris")),
                "row_kind": ["+I", "-D", "+I"],
                "__side": pa.array([0, None, 0], pa.int32()),
                PASS: [True, True, False],
            }
        )
        into: list[pa.RecordBatch] = []
        given = list(_passing_on(iter([batch]), plan, schema, into))
        assert [b.column("s0__0").to_pylist() for b in given] == [[1, 3]]
        assert all(PASS not in b.schema.names for b in given)
        (out,) = into
        assert out.schema == schema
        assert out.column(passed_column(0)).to_pylist() == [1, 2]
        assert out.column(passed_column(1)).type == passed.field("at").type
        assert out.column("row_kind").to_pylist() == ["+I", "-D"]
        assert out.column(PASS).to_pylist() == [True, True]
        operator_columns = [f.name for f in RunningAggregate().output]
        assert all(out.column(n).null_count == 2 for n in operator_columns)
        assert out.column("__meta").null_count == 2

    def test_rows_passed_on_come_out_as_the_task_reads_them(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
    ) -> None:
        """A task returns the rows it passes on after the operator's output
        for each chunk it read with them, not all at its end: it holds no
        more of them than a chunk brings."""
        _in_a_task(monkeypatch, TaskBatch(0, None, {}, None, None, 0))
        monkeypatch.setattr(_spark_task, "CHUNK_ROWS", 2)
        kinds = _passing_task(tmp_path, None)
        # Two rows a chunk: the first chunk is cut when the second batch
        # comes, so the rows passed on of both follow its output.
        assert kinds == ["output", "passed", "passed", "output", "passed", "output", "meta"]


class TestOrdering:
    def test_a_task_orders_its_input_before_its_operator_sees_a_row(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
    ) -> None:
        """A stage with an order gets its partition's rows as they come;
        its task hands them to the operator by sequence number, retractions
        first at one number: the running totals follow that order."""
        from operators._engine.row_order import RowOrder

        _in_a_task(monkeypatch, TaskBatch(0, None, {}, None, None, 0))
        plan = StagePlan(
            RunningAggregate(),
            str(tmp_path / "state"),
            1,
            [["key", "value"]],
            {},
            StoreConfig(),
            0,
            order=RowOrder(sides=False, kinds=True),
        )
        given = [
            pa.record_batch(
                {
                    "s0__0": ["k"] * 2,
                    "s0__1": pa.array(values, pa.int64()),
                    "row_kind": kinds,
                    "__seq": pa.array(seqs, pa.int64()),
                }
            )
            # The delete of 1 shares its number with the insert of 100.
            for values, kinds, seqs in [
                ([1, 10], ["+I", "+I"], [0, 2]),
                ([100, 1], ["+I", "-D"], [1, 1]),
            ]
        ]
        out = [b for b in run_task(plan)(iter(given)) if b.num_rows]
        totals = [t for b in out[:-1] for t in b.column("total").to_pylist()]
        kinds = [k for b in out[:-1] for k in b.column("row_kind").to_pylist()]
        rows = list(zip(kinds, totals, strict=True))
        # 1 (seq 0), then -1 before +100 (seq 1), then +10 (seq 2).
        assert [t for k, t in rows if k in ("+I", "+U")] == [1, 100, 110]
        assert all("__seq" not in b.schema.names for b in out)

    def test_a_task_past_its_sort_memory_gives_the_operator_the_same_rows(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
    ) -> None:
        """A task whose input passes its sort memory orders it through
        sorted runs on disk: its operator emits what it emits when the
        task sorts in memory, and no run is left behind."""
        from operators._engine import row_order as _row_order
        from operators._engine.row_order import RowOrder

        _in_a_task(monkeypatch, TaskBatch(0, None, {}, None, None, 0))
        monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
        monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "spill"))
        (tmp_path / "spill").mkdir()
        given = [
            pa.record_batch(
                {
                    "s0__0": [f"k{(7 * i + j) % 5}" for j in range(4)],
                    "s0__1": pa.array([i * 10 + j for j in range(4)], pa.int64()),
                    "row_kind": ["+I"] * 4,
                    "__seq": pa.array([(13 * i + 3 * j) % 31 for j in range(4)], pa.int64()),
                }
            )
            for i in range(8)
        ]
        spills: list[int] = []
        spill = _row_order.RowSorter._spill

        def counted(sorter: _row_order.RowSorter) -> None:
            spills.append(1)
            spill(sorter)

        monkeypatch.setattr(_row_order.RowSorter, "_spill", counted)
        emitted = {}
        for memory in (_row_order.SORT_BYTES, 1):
            monkeypatch.setattr(_row_order, "SORT_BYTES", memory)
            monkeypatch.setattr(_row_order, "MERGE_ROWS", 3)
            plan = StagePlan(
                RunningAggregate(),
                str(tmp_path / f"state-{memory}"),
                1,
                [["key", "value"]],
                {},
                StoreConfig(),
                0,
                order=RowOrder(sides=False, kinds=True),
            )
            out = [b for b in run_task(plan)(iter(given)) if b.num_rows][:-1]
            emitted[memory] = pa.Table.from_batches(out).drop_columns(["__ord", "__meta"])
        # An accumulation per input row (five keys: five +I, then -U/+U pairs).
        kinds = emitted[1].column("row_kind").to_pylist()
        assert kinds.count("+I") + kinds.count("+U") == 32
        assert emitted[1].equals(emitted[_row_order.SORT_BYTES])
        assert len(spills) == len(given)  # a run per input batch, all at 1 byte
        assert not [p for p in (tmp_path / "spill").iterdir() if p.name.startswith("relstate-sort")]

    def test_rows_passed_on_come_out_as_read_while_the_task_orders(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
    ) -> None:
        """A task that orders its input and passes rows on returns the rows
        passed on of each input batch as it reads it, before the operator's
        output (which waits for the last row): it does not hold them."""
        from operators._engine.row_order import RowOrder

        _in_a_task(monkeypatch, TaskBatch(0, None, {}, None, None, 0))
        kinds = _passing_task(tmp_path, RowOrder(sides=False, kinds=True))
        assert kinds == ["passed", "passed", "passed", "output", "meta"]


def _passing_task(tmp_path: Any, order: Any) -> list[str]:
    """Run a task that passes side 0's marked rows on, ordering its input
    by ``order`` (``None``: as it comes), on three batches of two rows (one
    marked each): what each batch it returns holds, in order."""
    from operators._spark.task import META, PASS

    passed = pa.schema([("key", pa.string()), ("value", pa.int64())])
    plan = StagePlan(
        RunningAggregate(),
        str(tmp_path / "state"),
        1,
        [["key", "value"]],
        {},
        StoreConfig(),
        0,
        None,
        (0, passed),
        order,
    )
    batches = [
        pa.record_batch(
            {
                "s0__0": [f"k{i}", f"k{i}"],
                "s0__1": pa.array([1, 2], pa.int64()),
                "row_kind": ["+I", "+I"],
                "__side": pa.array([0, 0], pa.int32()),
                **({} if order is None else {"__seq": pa.array([2 * i, 2 * i + 1], pa.int64())}),
                PASS: [True, False],
            }
        )
        for i in range(3)
    ]
    out = [b for b in run_task(plan)(iter(batches)) if b.num_rows]
    return [
        "passed"
        if b.column(PASS).true_count
        else "meta"
        if b.column(META).null_count < b.num_rows
        else "output"
        for b in out
    ]


def _in_a_task(monkeypatch: pytest.MonkeyPatch, batch: TaskBatch | None) -> None:
    """Run what follows as if in a Spark task of partition 0, first
    attempt, whose job carries ``batch`` for every stage (``None``: none)."""
    import pyspark

    class Context:
        def partitionId(self) -> int:
            return 0

        def attemptNumber(self) -> int:
            return 0

        def getLocalProperty(self, key: str) -> str | None:
            return None if batch is None else batch.to_json()

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(Context))
