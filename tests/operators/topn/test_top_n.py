"""TopN on hand-written changelogs: rank changes, retractions inside the
top, ties at the N-th place, offsets, nulls order, a global top, and state
across commits and restores on both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from encoding import Direction, KeyColumn, NullOrder, PartitionLocal
from operators import RowKind
from operators.testing import Emitted, OperatorHarness
from operators.topn import TopN

INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
SCHEMA = pa.schema([("g", pa.string()), ("score", pa.int64()), ("id", pa.int64())])
DESC = [KeyColumn("score", Direction.DESC)]


@pytest.fixture(params=["memory", "rocksdb"])
def make(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., OperatorHarness]]:
    """Opens harnesses of a TopN on the backend; all closed at the end."""
    opened: list[OperatorHarness] = []

    def build(*args: Any, **kw: Any) -> OperatorHarness:
        harness = OperatorHarness(
            TopN(SCHEMA, *args, **kw), backend=request.param, path=tmp_path / f"h{len(opened)}"
        )
        opened.append(harness)
        return harness

    yield build
    for harness in opened:
        harness.close()


def changes(out: list[Emitted]) -> set[Emitted]:
    """What was emitted, in any order."""
    return set(out)


def step(h: OperatorHarness, rows: list[tuple[Any, ...]], kinds: Any = None) -> list[Emitted]:
    """Run rows as one micro-batch (the operator folds a whole batch, and
    emits at its end) and return what it emitted."""
    n = len(h.output)
    h.process_rows(rows, kinds)
    h.commit()
    return h.output[n:]


class TestRankChanges:
    def test_new_row_pushes_last_out(self, make: Callable[..., OperatorHarness]) -> None:
        """A row that enters the top pushes the N-th row out: +I and -D."""
        h = make(DESC, 2, ["g"])
        assert changes(step(h, [("a", 5, 1), ("a", 3, 2), ("a", 1, 3)])) == {
            (INS, ("a", 5, 1)),
            (INS, ("a", 3, 2)),
        }
        assert step(h, [("a", 4, 4)]) == [(DEL, ("a", 3, 2)), (INS, ("a", 4, 4))]

    def test_row_below_top_emits_nothing(self, make: Callable[..., OperatorHarness]) -> None:
        """Rows that come and go below a full top change nothing downstream."""
        h = make(DESC, 2, ["g"])
        step(h, [("a", 5, 1), ("a", 3, 2)])
        assert step(h, [("a", 1, 3), ("a", 2, 4)]) == []
        assert step(h, [("a", 1, 3)], kinds=[DEL]) == []

    def test_chunks_of_one_batch_fold_together(self, make: Callable[..., OperatorHarness]) -> None:
        """A row that enters the top in one chunk of a micro-batch and leaves
        it in another emits nothing."""
        h = make(DESC, 1, ["g"])
        step(h, [("a", 5, 1)])
        h.process_rows([("a", 9, 2)])
        h.process_rows([("a", 9, 2)], kinds=[DEL])
        h.commit()
        assert h.output == [(INS, ("a", 5, 1))]

    def test_retraction_in_top_brings_next(self, make: Callable[..., OperatorHarness]) -> None:
        """Retracting a row of the top brings the next row in."""
        h = make(DESC, 2, ["g"])
        step(h, [("a", 5, 1), ("a", 3, 2), ("a", 1, 3)])
        assert step(h, [("a", 5, 1)], kinds=[DEL]) == [
            (DEL, ("a", 5, 1)),
            (INS, ("a", 1, 3)),
        ]

    def test_update_moves_rank(self, make: Callable[..., OperatorHarness]) -> None:
        """An update that moves a row from below the top into it swaps the
        rows: the old version leaves nothing (it was not in), the pushed-out
        row leaves, the new version enters."""
        h = make(DESC, 2, ["g"])
        step(h, [("a", 5, 1), ("a", 3, 2), ("a", 1, 3)])
        out = step(h, [("a", 1, 3), ("a", 9, 3)], kinds=[UB, UA])
        assert out == [(DEL, ("a", 3, 2)), (INS, ("a", 9, 3))]

    def test_update_inside_top(self, make: Callable[..., OperatorHarness]) -> None:
        """An update of a row that stays in the top is -D of the old version
        and +I of the new."""
        h = make(DESC, 2, ["g"])
        step(h, [("a", 5, 1), ("a", 3, 2), ("a", 1, 3)])
        out = step(h, [("a", 5, 1), ("a", 6, 1)], kinds=[UB, UA])
        assert out == [(DEL, ("a", 5, 1)), (INS, ("a", 6, 1))]

    def test_partitions_are_apart(self, make: Callable[..., OperatorHarness]) -> None:
        """Each partition key has its own top; a null key is one partition."""
        h = make(DESC, 1, ["g"])
        out = step(h, [("a", 1, 1), ("b", 2, 2), (None, 3, 3), (None, 4, 4)])
        assert changes(out) == {(INS, ("a", 1, 1)), (INS, ("b", 2, 2)), (INS, (None, 4, 4))}


class TestTies:
    def test_tie_at_nth_place_by_identity(self, make: Callable[..., OperatorHarness]) -> None:
        """Without ties, rows that tie at the N-th place are ranked by the
        row identity (here the id), ascending."""
        h = make(DESC, 2, ["g"])
        out = step(h, [("a", 5, 1), ("a", 3, 9), ("a", 3, 4)])
        assert changes(out) == {(INS, ("a", 5, 1)), (INS, ("a", 3, 4))}
        assert step(h, [("a", 3, 4)], kinds=[DEL]) == [
            (DEL, ("a", 3, 4)),
            (INS, ("a", 3, 9)),
        ]

    def test_with_ties_keeps_every_tie(self, make: Callable[..., OperatorHarness]) -> None:
        """With ties, every row tying with the N-th is in; a new tie enters,
        and a row that breaks the tie pushes them all out."""
        h = make(DESC, 2, ["g"], with_ties=True)
        out = step(h, [("a", 5, 1), ("a", 3, 2), ("a", 3, 3)])
        assert len(out) == 3
        assert step(h, [("a", 3, 4)]) == [(INS, ("a", 3, 4))]
        out = step(h, [("a", 4, 5)])
        assert changes(out) == {
            (DEL, ("a", 3, 2)),
            (DEL, ("a", 3, 3)),
            (DEL, ("a", 3, 4)),
            (INS, ("a", 4, 5)),
        }

    def test_identical_rows_take_a_rank_each(self, make: Callable[..., OperatorHarness]) -> None:
        """Two identical rows take two places of the top."""
        h = make(DESC, 2, ["g"])
        out = step(h, [("a", 5, 1), ("a", 5, 1), ("a", 4, 2)])
        assert out == [(INS, ("a", 5, 1)), (INS, ("a", 5, 1))]
        assert step(h, [("a", 5, 1)], kinds=[DEL]) == [
            (DEL, ("a", 5, 1)),
            (INS, ("a", 4, 2)),
        ]


class TestOffsetAndOrder:
    def test_offset_skips_rows(self, make: Callable[..., OperatorHarness]) -> None:
        """With an offset, the window starts after that many rows and moves
        when a row enters before it."""
        h = make(DESC, 1, ["g"], offset=1)
        assert step(h, [("a", 5, 1), ("a", 3, 2)]) == [(INS, ("a", 3, 2))]
        assert step(h, [("a", 9, 3)]) == [(DEL, ("a", 3, 2)), (INS, ("a", 5, 1))]

    def test_offset_with_ties(self, make: Callable[..., OperatorHarness]) -> None:
        """Offset and ties: skip rows, take N, and the rows tying with the last."""
        h = make(DESC, 1, ["g"], offset=1, with_ties=True)
        out = step(h, [("a", 9, 1), ("a", 5, 2), ("a", 5, 3), ("a", 1, 4)])
        assert changes(out) == {(INS, ("a", 5, 2)), (INS, ("a", 5, 3))}

    def test_nulls_last_and_first(self, make: Callable[..., OperatorHarness]) -> None:
        """Null order values sort as the order column says."""
        first = make([KeyColumn("score", Direction.DESC, NullOrder.FIRST)], 1, ["g"])
        last = make([KeyColumn("score", Direction.DESC, NullOrder.LAST)], 1, ["g"])
        rows = [("a", None, 1), ("a", 2, 2)]
        assert step(first, rows) == [(INS, ("a", None, 1))]
        assert step(last, rows) == [(INS, ("a", 2, 2))]

    def test_global_top(self, make: Callable[..., OperatorHarness]) -> None:
        """Without a partition key there is one top over every row, and its
        state is marked as not to be repartitioned."""
        h = make(["score", KeyColumn("id", Direction.DESC)], 2)
        out = step(h, [("a", 1, 1), ("b", 1, 2), ("c", 0, 3)])
        assert changes(out) == {(INS, ("c", 0, 3)), (INS, ("b", 1, 2))}
        assert h.operator.key_columns == ()
        # relstate repartition refuses to spread the one top over partitions.
        assert isinstance(h.operator.tables[0].partition_by, PartitionLocal)


class TestState:
    def test_restore_goes_back(self, make: Callable[..., OperatorHarness]) -> None:
        """After a restore, the top is the committed version's."""
        h = make(DESC, 1, ["g"])
        step(h, [("a", 1, 1)])
        v = h.batch_id - 1
        step(h, [("a", 5, 2)])
        h.restore(v)
        assert step(h, [("a", 3, 3)]) == [(DEL, ("a", 1, 1)), (INS, ("a", 3, 3))]

    def test_unknown_retraction_counted(self, make: Callable[..., OperatorHarness]) -> None:
        """Retracting a row that was never added changes nothing and is counted."""
        h = make(DESC, 1, ["g"])
        assert step(h, [("a", 1, 1)], kinds=[DEL]) == []
        assert h.last_metrics["numRetractionsOfUnknownRows"] == 1

    def test_float_partitions_as_their_key_bytes(self, tmp_path: Path) -> None:
        """A float partition key groups as its key bytes do, across batches
        (the rows after a batch laid over those read before it, by
        partition): every NaN one partition, -0.0 and 0.0 one partition."""
        schema = pa.schema([("g", pa.float64()), ("score", pa.int64()), ("id", pa.int64())])
        nan = float("nan")
        with OperatorHarness(
            TopN(schema, DESC, 1, ["g"]), backend="rocksdb", path=tmp_path / "h"
        ) as h:
            h.process_rows([(nan, 5, 1), (nan, 3, 2), (0.0, 1, 3), (-0.0, 2, 4)])
            h.commit()
            first = [(kind, (str(g), v, i)) for kind, (g, v, i) in h.output]
            assert sorted(first) == [(INS, ("0.0", 2, 4)), (INS, ("nan", 5, 1))]
            h.output.clear()
            h.process_rows([(nan, 9, 5), (0.0, 0, 6)])
            h.commit()
            second = [(kind, (str(g), v, i)) for kind, (g, v, i) in h.output]
            assert second == [(DEL, ("nan", 5, 1)), (INS, ("nan", 9, 5))]

    def test_state_keyed_for_prefix_scan(self) -> None:
        """The rows table is keyed (partition, order columns, identity)."""
        op = TopN(SCHEMA, DESC, 3, ["g"], row_key=["id"])
        assert op.tables[0].key_names == ("g", "score", "id")
        assert op.key_columns == ("g",)

    def test_bad_declarations(self) -> None:
        """A limit below one, a negative offset and unknown columns are refused."""
        with pytest.raises(ValueError, match="limit"):
            TopN(SCHEMA, DESC, 0)
        with pytest.raises(ValueError, match="offset"):
            TopN(SCHEMA, DESC, 1, offset=-1)
        with pytest.raises(ValueError, match="not in the input"):
            TopN(SCHEMA, ["nope"], 1)
