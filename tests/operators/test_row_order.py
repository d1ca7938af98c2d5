"""The order a stage's task gives its partition's rows (operators._engine.row_order)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from bench.versus import spark_order
from operators._engine import row_order as _row_order
from operators._engine.row_order import SEQ, SIDE, RowOrder, RowSorter

KINDS = ["+I", "-U", "+U", "-D", None]


def partition(n: int, seed: int) -> pa.Table:
    """``n`` rows with a side, a sequence number (some null, many shared)
    and a row kind (some null), and each row's place in the input."""
    rng = random.Random(seed)
    return pa.table(
        {
            SIDE: pa.array([rng.choice([0, 1]) for _ in range(n)], pa.int32()),
            SEQ: pa.array([rng.choice([None, *range(40)]) for _ in range(n)], pa.int64()),
            "row_kind": pa.array([rng.choice(KINDS) for _ in range(n)], pa.string()),
            "at": pa.array(range(n), pa.int64()),
        }
    )


def expected(rows: pa.Table, order: RowOrder) -> list[int]:
    """The input places of ``rows`` in ``order``, by Python's stable sort:
    nulls first, retractions first at one number."""

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        seq = (r[SEQ] is not None, r[SEQ])
        side = (r[SIDE] is not None, r[SIDE]) if order.sides else ()
        kind = (r["row_kind"] not in ("-U", "-D"),) if order.kinds else ()
        return (*side, seq, *kind)

    return [r["at"] for r in sorted(rows.to_pylist(), key=key)]


def ordered(rows: pa.Table, order: RowOrder, memory_bytes: int, chunk: int = 97) -> pa.Table:
    with RowSorter(order, memory_bytes) as sorter:
        for batch in rows.to_batches(chunk):
            sorter.add(batch)
        return pa.Table.from_batches(list(sorter.rows()))


ORDERS = [RowOrder(sides, kinds) for sides in (True, False) for kinds in (True, False)]


@pytest.mark.parametrize("order", ORDERS, ids=repr)
def test_rows_come_in_order_and_stable_without_the_sequence(order: RowOrder) -> None:
    """In memory, the rows come by side (when the order has it), sequence
    number (nulls first), retractions first (when it has kinds), and rows
    equal in all of that in the order they came; the sequence column is
    gone, every other column is as it was."""
    rows = partition(3_000, seed=1)
    out = ordered(rows, order, _row_order.SORT_BYTES)
    assert out.column_names == [SIDE, "row_kind", "at"]
    assert out.column("at").to_pylist() == expected(rows, order)


@pytest.mark.parametrize("order", ORDERS, ids=repr)
@pytest.mark.parametrize(
    ("memory_bytes", "merge_rows", "merge_bytes", "ways"),
    [
        (2_000, 64, 1 << 20, 16),
        (20_000, 7, 1 << 20, 16),
        (1, 1_000, 1 << 20, 16),
        (3_000, 1_000, 500, 3),
    ],
)
def test_a_partition_past_the_memory_budget_is_merged_from_runs_in_the_same_order(
    order: RowOrder,
    memory_bytes: int,
    merge_rows: int,
    merge_bytes: int,
    ways: int,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Past its memory budget the sorter writes sorted runs to disk and
    merges them, a file batch of each at a time (of at most so many rows and
    about so many bytes), so many runs at once (more in passes): the rows
    come in the same order as sorted in memory, ties in input order across
    runs too; the runs are gone once the sorter closes."""
    monkeypatch.setattr(_row_order, "MERGE_ROWS", merge_rows)
    monkeypatch.setattr(_row_order, "MERGE_BYTES", merge_bytes)
    monkeypatch.setattr(_row_order, "MERGE_WAYS", ways)
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    rows = partition(2_000, seed=2)
    with RowSorter(order, memory_bytes) as sorter:
        for batch in rows.to_batches(97):
            sorter.add(batch)
        assert sorter.spilled > 1
        assert os.listdir(tmp_path)
        out = pa.Table.from_batches(list(sorter.rows()))
    assert out.column("at").to_pylist() == expected(rows, order)
    assert os.listdir(tmp_path) == []


def test_a_merge_holds_a_bounded_batch_of_at_most_so_many_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """However many runs a partition makes, a merge holds a file batch of
    about ``MERGE_BYTES`` from each of at most ``MERGE_WAYS`` runs at once:
    more runs are merged in passes first."""
    monkeypatch.setattr(_row_order, "MERGE_BYTES", 2_000)
    monkeypatch.setattr(_row_order, "MERGE_WAYS", 4)
    held: list[tuple[int, int]] = []
    merged = _row_order._merged

    def watched(order: RowOrder, paths: list[str]) -> Any:
        runs = [_row_order._Run(p, i) for i, p in enumerate(paths)]
        held.append((len(paths), max(r.rows.nbytes for r in runs if r.rows is not None)))
        for run in runs:
            run.source.close()
        return merged(order, paths)

    monkeypatch.setattr(_row_order, "_merged", watched)
    rows = partition(3_000, seed=7)
    out = ordered(rows, RowOrder(sides=True, kinds=True), memory_bytes=4_000, chunk=100)
    assert out.column("at").to_pylist() == expected(rows, RowOrder(sides=True, kinds=True))
    assert len(held) > 1  # passes before the last merge
    assert all(ways <= 4 for ways, _ in held)
    assert all(size <= 2 * 2_000 for _, size in held)


def test_runs_are_removed_when_the_reader_stops_early(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A task that fails while its operator reads the ordered rows leaves
    no run behind: closing the sorter removes them, read or not."""
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    sorter = RowSorter(RowOrder(sides=False, kinds=True), memory_bytes=1)
    for batch in partition(500, seed=3).to_batches(50):
        sorter.add(batch)
    first = next(sorter.rows())
    assert first.num_rows and os.listdir(tmp_path)
    sorter.close()
    assert os.listdir(tmp_path) == []


def test_runs_go_to_the_executors_first_local_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In a Spark task, the runs go where Spark spills: the first of the
    local directories Spark names to its Python workers."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{first},{second}")
    with RowSorter(RowOrder(sides=False, kinds=False), memory_bytes=1) as sorter:
        for batch in partition(100, seed=6).to_batches(50):
            sorter.add(batch)
        assert [p.name.startswith("relstate-sort-") for p in first.iterdir()] == [True]
        assert list(second.iterdir()) == []
    assert list(first.iterdir()) == []


def test_no_rows_give_nothing() -> None:
    """A partition with no rows (or only empty batches) gives no batch."""
    order = RowOrder(sides=True, kinds=True)
    with RowSorter(order) as sorter:
        sorter.add(partition(3, seed=4).to_batches()[0].slice(0, 0))
        assert list(sorter.rows()) == []


@pytest.mark.spark
@pytest.mark.parametrize("order", ORDERS, ids=repr)
def test_spark_sorting_by_the_orders_expressions_gives_the_same_keys(
    spark: Any, order: RowOrder
) -> None:
    """The order as Spark sort expressions (what the bench's ceiling has
    Spark sort by) puts the rows' keys in the same order as the task does;
    rows that tie may come in another order (Spark's sort is not stable)."""
    from pyspark.sql import functions as F

    from operators._spark.session import without_adaptive_execution

    rows = partition(400, seed=5)
    frame = spark.createDataFrame(rows.to_pandas().astype({SEQ: "Int64"})).coalesce(1)
    with without_adaptive_execution(spark):
        by_spark = frame.sortWithinPartitions(*map(F.expr, spark_order(order))).toPandas()
    places = ordered(rows, order, _row_order.SORT_BYTES).column("at").to_pylist()
    by_task = rows.to_pandas().set_index("at").loc[places].reset_index()

    def keys(frame: Any) -> list[tuple[Any, ...]]:
        kinds = [k in ("-U", "-D") for k in frame["row_kind"]]
        seqs = [None if s != s or s is None else int(s) for s in frame[SEQ]]
        sides = list(frame[SIDE]) if order.sides else [None] * len(seqs)
        return list(zip(sides, seqs, kinds if order.kinds else [None] * len(seqs), strict=True))

    assert keys(by_spark) == keys(by_task)
