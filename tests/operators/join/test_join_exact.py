"""StreamingJoin on hand-written changelogs: the exact cases of issue 5, null
keys, upserts, appearances and the output schema, on both harness backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators._api.changelog import RowKind
from operators.errors import InputError
from operators.join import JoinType, StreamingJoin, ViewKind
from operators.testing import Emitted, OperatorHarness

INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
L, R = 0, 1

#: Issue 5's inputs: order lines and their shipping, joined on line_order_id.
LINES = pa.schema(
    [("order_id", pa.string()), ("line_order_id", pa.string()), ("addr", pa.string())]
)
SHIPPING = pa.schema([("line_order_id", pa.string()), ("ship_mode", pa.string())])

#: Issue 5's steps: (side, kind, row).
STEPS: list[tuple[int, RowKind, tuple[str, ...]]] = [
    (L, INS, ("O1", "K1", "A1")),
    (L, INS, ("O1", "K2", "A1")),
    (R, INS, ("K2", "AIR")),
    (L, UA, ("O1", "K2", "A2")),
    (R, UA, ("K2", "SHIP")),
    (R, INS, ("K1", "TRUCK")),
    (R, DEL, ("K2", "SHIP")),
    (R, INS, ("K2", "RAIL")),
]


@pytest.fixture(params=["memory", "rocksdb"])
def make_harness(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[StreamingJoin], OperatorHarness]]:
    """Opens strict harnesses on one backend (each test runs on both); all
    closed at the end."""
    opened: list[OperatorHarness] = []

    def make(operator: StreamingJoin) -> OperatorHarness:
        harness = OperatorHarness(
            operator,
            backend=request.param,
            path=tmp_path / f"h{len(opened)}",
            consistency="strict",
        )
        opened.append(harness)
        return harness

    yield make
    for harness in opened:
        harness.close()


def lines_join(join_type: JoinType) -> StreamingJoin:
    """Issue 5's join: each side's unique key is its join key."""
    return StreamingJoin(
        join_type,
        LINES,
        SHIPPING,
        ["line_order_id"],
        ["line_order_id"],
        left_unique_key=["line_order_id"],
        right_unique_key=["line_order_id"],
        condition=lambda left, right: True,
        right_prefix="r_",
    )


def run_steps(harness: OperatorHarness) -> list[list[Emitted]]:
    """What each of issue 5's steps emits."""
    return [harness.process_element(row, kind, side) for side, kind, row in STEPS]


class TestIssueCases:
    def test_inner(self, make_harness: Callable[[StreamingJoin], OperatorHarness]) -> None:
        """Issue 5's inner join case, step by step."""
        harness = make_harness(lines_join(JoinType.INNER))
        assert run_steps(harness) == [
            [],
            [],
            [(INS, ("O1", "K2", "A1", "K2", "AIR"))],
            [(UA, ("O1", "K2", "A2", "K2", "AIR"))],
            [(UA, ("O1", "K2", "A2", "K2", "SHIP"))],
            [(INS, ("O1", "K1", "A1", "K1", "TRUCK"))],
            [(DEL, ("O1", "K2", "A2", "K2", "SHIP"))],
            [(INS, ("O1", "K2", "A2", "K2", "RAIL"))],
        ]

    def test_left_outer(self, make_harness: Callable[[StreamingJoin], OperatorHarness]) -> None:
        """Issue 5's left outer join case, step by step: the upserts raise no
        count, so the padded row comes back after the -D."""
        harness = make_harness(lines_join(JoinType.LEFT))
        assert run_steps(harness) == [
            [(INS, ("O1", "K1", "A1", None, None))],
            [(INS, ("O1", "K2", "A1", None, None))],
            [(DEL, ("O1", "K2", "A1", None, None)), (INS, ("O1", "K2", "A1", "K2", "AIR"))],
            [(INS, ("O1", "K2", "A2", "K2", "AIR"))],
            [(INS, ("O1", "K2", "A2", "K2", "SHIP"))],
            [(DEL, ("O1", "K1", "A1", None, None)), (INS, ("O1", "K1", "A1", "K1", "TRUCK"))],
            [(DEL, ("O1", "K2", "A2", "K2", "SHIP")), (INS, ("O1", "K2", "A2", None, None))],
            [(DEL, ("O1", "K2", "A2", None, None)), (INS, ("O1", "K2", "A2", "K2", "RAIL"))],
        ]

    def test_left_outer_state(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """After issue 5's steps the left view holds one row per join key, each
        with one association, and the right view one row per join key."""
        harness = make_harness(lines_join(JoinType.LEFT))
        run_steps(harness)
        harness.commit()
        assert list(harness.table("left").scan()) == [("O1", "K1", "A1", 1), ("O1", "K2", "A2", 1)]
        assert list(harness.table("right").scan()) == [("K1", "TRUCK"), ("K2", "RAIL")]
        assert harness.last_metrics["left.numTotalStateRows"] == 2


PAIRS = pa.schema([("k", pa.int64()), ("v", pa.string())])


def pairs_join(join_type: JoinType, **kwargs: Any) -> StreamingJoin:
    """(k, v) joined with (k, v) on k, no unique keys unless given."""
    return StreamingJoin(join_type, PAIRS, PAIRS, ["k"], ["k"], right_prefix="r_", **kwargs)


class TestRules:
    def test_full_outer_both_sides_padded(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """In a full join a match retracts the padded row of the side already
        stored, and a retraction pads the side that stays."""
        h = make_harness(pairs_join(JoinType.FULL))
        assert h.process_element((1, "a"), INS, L) == [(INS, (1, "a", None, None))]
        assert h.process_element((1, "x"), INS, R) == [
            (DEL, (1, "a", None, None)),
            (INS, (1, "a", 1, "x")),
        ]
        assert h.process_element((1, "a"), DEL, L) == [
            (DEL, (1, "a", 1, "x")),
            (INS, (None, None, 1, "x")),
        ]

    def test_inner_retraction_keeps_its_kind(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """In an inner join a -U/+U pair of one side gives -U/+U pairs out."""
        h = make_harness(pairs_join(JoinType.INNER))
        h.process_element((1, "a"), INS, L)
        h.process_element((1, "x"), INS, R)
        assert h.process_element((1, "a"), UB, L) == [(UB, (1, "a", 1, "x"))]
        assert h.process_element((1, "b"), UA, L) == [(UA, (1, "b", 1, "x"))]

    def test_appearances_each_match(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """A row stored twice (no unique key) is matched, padded and retracted
        once per appearance, and its associations counted once per row."""
        h = make_harness(pairs_join(JoinType.LEFT))
        h.process_element((1, "a"), INS, L)
        h.process_element((1, "a"), INS, L)
        assert h.process_element((1, "x"), INS, R) == [
            (DEL, (1, "a", None, None)),
            (INS, (1, "a", 1, "x")),
            (DEL, (1, "a", None, None)),
            (INS, (1, "a", 1, "x")),
        ]
        assert list(h.table("left").scan()) == [(1, "a", 2, 1)]
        assert h.process_element((1, "x"), DEL, R) == [
            (DEL, (1, "a", 1, "x")),
            (INS, (1, "a", None, None)),
            (DEL, (1, "a", 1, "x")),
            (INS, (1, "a", None, None)),
        ]
        assert h.process_element((1, "a"), DEL, L) == [(DEL, (1, "a", None, None))]
        assert list(h.table("left").scan()) == [(1, "a", 1, 0)]

    def test_condition_decides_associations(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """A row the condition rejects is no match: no pair, no count."""
        h = make_harness(pairs_join(JoinType.LEFT, condition=lambda l_, r_: l_[1] < r_[1]))
        h.process_element((1, "m"), INS, L)
        assert h.process_element((1, "a"), INS, R) == []
        assert h.process_element((1, "z"), INS, R) == [
            (DEL, (1, "m", None, None)),
            (INS, (1, "m", 1, "z")),
        ]
        assert list(h.table("left").scan()) == [(1, "m", 1, 1)]


class TestNullKeys:
    def test_null_keys_never_match(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """Null join keys match nothing, not even each other: both sides of a
        full join stay padded."""
        h = make_harness(pairs_join(JoinType.FULL))
        assert h.process_element((None, "a"), INS, L) == [(INS, (None, "a", None, None))]
        assert h.process_element((None, "x"), INS, R) == [(INS, (None, None, None, "x"))]
        assert h.process_element((None, "a"), DEL, L) == [(DEL, (None, "a", None, None))]

    def test_null_safe_matches_nulls(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """With null_safe a null key equals a null key."""
        h = make_harness(pairs_join(JoinType.INNER, null_safe=True))
        h.process_element((None, "a"), INS, L)
        assert h.process_element((None, "x"), INS, R) == [(INS, (None, "a", None, "x"))]


class TestUpserts:
    def test_upsert_that_loses_its_match(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """An upsert whose new row fails the condition retracts the old pair
        and pads the new row; the other side's count drops."""
        h = make_harness(
            pairs_join(
                JoinType.FULL,
                left_unique_key=["k"],
                right_unique_key=["k"],
                condition=lambda l_, r_: l_[1] != "no",
            )
        )
        h.process_element((1, "a"), INS, L)
        h.process_element((1, "x"), INS, R)
        assert h.process_element((1, "no"), UA, L) == [
            (DEL, (1, "a", 1, "x")),
            (INS, (None, None, 1, "x")),
            (INS, (1, "no", None, None)),
        ]
        assert h.process_element((1, "b"), UA, L) == [
            (DEL, (1, "no", None, None)),
            (DEL, (None, None, 1, "x")),
            (INS, (1, "b", 1, "x")),
        ]
        assert list(h.table("right").scan()) == [(1, "x", 1)]

    def test_unique_key_outside_join_key(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """A unique key outside the join key keys rows (join key, unique key):
        an upsert replaces only the row with its unique key."""
        schema = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string())])
        join = StreamingJoin(
            JoinType.INNER, schema, PAIRS, ["k"], ["k"], left_unique_key=["id"], right_prefix="r_"
        )
        assert join.views[0].kind is ViewKind.INPUT_SIDE_HAS_UNIQUE_KEY
        assert join.views[1].kind is ViewKind.INPUT_SIDE_HAS_NO_UNIQUE_KEY
        h = make_harness(join)
        h.process_element((1, 5, "a"), INS, L)
        h.process_element((2, 5, "b"), INS, L)
        assert h.process_element((5, "x"), INS, R) == [
            (INS, (1, 5, "a", 5, "x")),
            (INS, (2, 5, "b", 5, "x")),
        ]
        assert h.process_element((2, 5, "c"), UA, L) == [(UA, (2, 5, "c", 5, "x"))]
        assert list(h.table("left").scan()) == [(1, 5, "a"), (2, 5, "c")]


class TestTTL:
    def test_boundary_with_a_ttl_per_side(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """Flink's boundary, each side with its own TTL: a row written at t
        still joins at t + ttl - 1 and is gone at t + ttl (left 1000 ms,
        right 3000 ms)."""
        h = make_harness(pairs_join(JoinType.INNER, left_ttl_ms=1000, right_ttl_ms=3000))
        h.set_processing_time(100)
        h.process_element((1, "a"), INS, L)
        h.process_element((2, "x"), INS, R)
        h.set_processing_time(1099)
        assert h.process_element((1, "y"), INS, R) == [(INS, (1, "a", 1, "y"))]
        h.set_processing_time(1100)
        assert h.process_element((1, "z"), INS, R) == []
        assert h.metrics["left.numExpiredStateRows"] == 1
        h.set_processing_time(3099)
        assert h.process_element((2, "b"), INS, L) == [(INS, (2, "b", 2, "x"))]
        h.set_processing_time(3100)
        assert h.process_element((2, "c"), INS, L) == []
        assert h.metrics["right.numExpiredStateRows"] == 1

    @pytest.mark.parametrize(
        ("join_type", "outer", "inner"), [(JoinType.LEFT, L, R), (JoinType.RIGHT, R, L)]
    )
    def test_outer_row_is_padded_once_its_match_expired(
        self,
        make_harness: Callable[[StreamingJoin], OperatorHarness],
        join_type: JoinType,
        outer: int,
        inner: int,
    ) -> None:
        """An outer row arriving at t + ttl - 1 joins the other side's row
        written at t; one arriving at t + ttl finds it expired and is emitted
        null-padded."""
        ttl = {"left_ttl_ms" if inner == L else "right_ttl_ms": 1000}
        h = make_harness(pairs_join(join_type, **ttl))
        h.set_processing_time(0)
        assert h.process_element((1, "x"), INS, inner) == []

        def pair(row: tuple[Any, ...], match: tuple[Any, ...]) -> tuple[Any, ...]:
            return row + match if outer == L else match + row

        h.set_processing_time(999)
        assert h.process_element((1, "a"), INS, outer) == [(INS, pair((1, "a"), (1, "x")))]
        h.set_processing_time(1000)
        assert h.process_element((1, "b"), INS, outer) == [(INS, pair((1, "b"), (None, None)))]

    def test_sweep_at_exactly_the_expiry_deletes(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """The sweep follows the same boundary: the batch at t + ttl (when the
        sweep is due) deletes a row written at t, which no read met."""
        h = make_harness(pairs_join(JoinType.INNER, left_ttl_ms=1000))
        h.set_processing_time(0)
        h.process_element((1, "a"), INS, L)
        h.commit()
        h.set_processing_time(1000)
        h.commit()
        assert list(h.table("left").scan()) == []
        assert h.last_metrics["left.numExpiredStateRows"] == 1

    def test_expired_rows_are_gone(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """A row not written for its side's TTL or longer matches nothing and
        is removed; a row written since stays."""
        h = make_harness(pairs_join(JoinType.LEFT, right_ttl_ms=1000))
        h.set_processing_time(0)
        h.process_element((1, "x"), INS, R)
        h.process_element((2, "y"), INS, R)
        h.set_processing_time(800)
        h.process_element((2, "y2"), INS, R)
        h.set_processing_time(1500)
        assert h.process_element((1, "a"), INS, L) == [(INS, (1, "a", None, None))]
        assert h.process_element((2, "b"), INS, L) == [(INS, (2, "b", 2, "y2"))]
        assert h.metrics["right.numExpiredStateRows"] == 2
        assert [r[:2] for r in h.table("right").scan()] == [(2, "y2")]

    def test_sweep_removes_rows_nobody_reads(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """Expired rows that no read meets are deleted by the sweep at the start
        of the first batch a TTL after the last sweep."""
        h = make_harness(pairs_join(JoinType.INNER, left_ttl_ms=1000))
        h.set_processing_time(0)
        h.process_element((1, "a"), INS, L)
        h.commit()
        h.set_processing_time(2000)
        h.process_element((9, "z"), INS, R)
        h.commit()
        assert list(h.table("left").scan()) == []
        assert h.last_metrics["left.numExpiredStateRows"] == 1
        assert h.last_metrics["left.numTotalStateRows"] == 0


class TestSchema:
    def test_output_nullability(self) -> None:
        """The output has left then right columns, a side nullable when the
        other side is outer."""
        strict = pa.schema([pa.field("k", pa.int64(), nullable=False)])
        join = StreamingJoin(JoinType.LEFT, strict, strict, ["k"], ["k"], left_prefix="l_")
        assert join.output == pa.schema(
            [pa.field("l_k", pa.int64(), nullable=False), pa.field("k", pa.int64())]
        )

    def test_name_clash_asks_for_a_prefix(self) -> None:
        """Equal output names raise InputError telling to set a prefix."""
        with pytest.raises(InputError, match="set left_prefix or right_prefix"):
            StreamingJoin(JoinType.INNER, PAIRS, PAIRS, ["k"], ["k"])

    def test_key_types_must_agree(self) -> None:
        """Join keys of different types raise InputError."""
        other = pa.schema([("k", pa.string())])
        with pytest.raises(InputError, match="different types"):
            StreamingJoin(JoinType.INNER, PAIRS, other, ["k"], ["k"], right_prefix="r_")


class TestMetrics:
    def test_per_side_counters(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """Each side counts its state rows, rows written (association changes
        included) and rows removed; numOutputRows counts the output."""
        h = make_harness(pairs_join(JoinType.LEFT))
        h.process_element((1, "a"), INS, L)
        h.process_element((1, "x"), INS, R)
        h.process_element((1, "x"), DEL, R)
        h.commit()
        m = h.last_metrics
        assert m["left.numTotalStateRows"] == 1 and m["right.numTotalStateRows"] == 0
        assert m["left.numUpdatedStateRows"] == 3  # stored, then 0 -> 1 -> 0 associations
        assert m["right.numUpdatedStateRows"] == 1 and m["right.numRemovedStateRows"] == 1
        assert m["numOutputRows"] == 5

    def test_retraction_of_an_unknown_row(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """A retraction of a row never stored is counted; it retracts pairs
        with inner rows (as Flink does) but none with an outer row that has no
        association, which has no pair."""
        h = make_harness(pairs_join(JoinType.RIGHT))
        h.process_element((1, "x"), INS, R)
        h.process_element((2, "b"), INS, L)
        assert h.process_element((1, "a"), DEL, L) == []
        assert h.process_element((2, "y"), DEL, R) == [(DEL, (2, "b", 2, "y"))]
        assert h.metrics["left.numRetractionsOfUnknownRows"] == 1
        assert h.metrics["right.numRetractionsOfUnknownRows"] == 1
        assert list(h.table("right").scan()) == [(1, "x", 1, 0)]

    def test_every_counter(self, make_harness: Callable[[StreamingJoin], OperatorHarness]) -> None:
        """docs/operators/join.md, "Metrics": every counter of the changelog
        join, per side as ``<side>.<Spark's name>``, and nothing else; the
        TTL's sweep table is auxiliary, so it is in no state-row count."""
        h = make_harness(pairs_join(JoinType.FULL, left_ttl_ms=1000))
        h.set_processing_time(0)
        h.process_rows([(1, "a"), (2, "b")], side=L)
        h.process_rows([(1, "x"), (4, "y"), (4, "y")], [INS, INS, DEL], side=R)
        h.process_element((3, "c"), DEL, L)
        h.commit()
        assert counters(h.last_metrics) == {
            "numOutputRows": 7,
            "numTotalStateRows": 3,
            "numUpdatedStateRows": 5,
            "numRemovedStateRows": 1,
            "left.numTotalStateRows": 2,
            "left.numUpdatedStateRows": 3,  # two stored, (1, a) gains an association
            "left.numRetractionsOfUnknownRows": 1,
            "right.numTotalStateRows": 1,
            "right.numUpdatedStateRows": 2,
            "right.numRemovedStateRows": 1,
        }
        h.set_processing_time(2000)  # the left rows expire; the sweep deletes them
        h.commit()
        assert counters(h.last_metrics) == {
            "numTotalStateRows": 1,
            "numRemovedStateRows": 2,
            "left.numExpiredStateRows": 2,
            "left.numRemovedStateRows": 2,
            "right.numTotalStateRows": 1,
        }


def counters(metrics: dict[str, int]) -> dict[str, int]:
    """The counters of a batch that are not zero, times left out."""
    return {k: v for k, v in metrics.items() if v and not k.endswith("TimeMs")}


class TestRightJoin:
    def test_right_side_is_outer(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """In a right join the right side is padded and the left is inner."""
        h = make_harness(pairs_join(JoinType.RIGHT))
        assert h.process_element((1, "a"), INS, L) == []
        assert h.process_element((2, "y"), INS, R) == [(INS, (None, None, 2, "y"))]
        assert h.process_element((2, "b"), INS, L) == [
            (DEL, (None, None, 2, "y")),
            (INS, (2, "b", 2, "y")),
        ]
        assert h.process_element((2, "b"), UB, L) == [
            (DEL, (2, "b", 2, "y")),
            (INS, (None, None, 2, "y")),
        ]


class TestTTLRestore:
    def test_write_times_survive_a_restore(
        self, make_harness: Callable[[StreamingJoin], OperatorHarness]
    ) -> None:
        """Write times are state: after a restore a row expires as it would
        have, and a batch thrown away leaves no sweep behind."""
        h = make_harness(pairs_join(JoinType.INNER, left_ttl_ms=1000))
        h.set_processing_time(0)
        h.process_element((1, "a"), INS, L)
        version = h.commit()
        h.set_processing_time(5000)
        h.process_element((2, "b"), INS, L)
        h.restore(version)
        h.set_processing_time(900)
        assert h.process_element((1, "x"), INS, R) == [(INS, (1, "a", 1, "x"))]
        h.set_processing_time(1901)
        assert h.process_element((1, "y"), INS, R) == []
