"""The foreign-key join (KIP-213) without Spark: the issue's cases, Kafka's
corrected instruction set, stale responses, and a differential test against
a batch join, all over several partitions per stage."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from fk_driver import FkDriver

from operators import FkJoin, InputError, RowKind

STRINGS = pa.schema([("key", pa.string()), ("value", pa.string())])


def _fk_after_bar(row: tuple[Any, ...]) -> str | None:
    """The issue's FK: the part of the left value after '|'."""
    value = row[1]
    return None if value is None or "|" not in value else value.split("|", 1)[1]


def _parenthesised(left: tuple[Any, ...], right: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """The issue's joiner "(left,right)", keyed by the left key."""
    return (left[0], f"({left[1]},{'null' if right is None else right[1]})")


def issue_join(how: str) -> FkJoin:
    """The join of the issue's cases: string tables, FK after '|'."""
    return FkJoin(
        left=STRINGS,
        left_key=["key"],
        right=STRINGS,
        right_key="key",
        foreign_key=_fk_after_bar,
        how=how,
        joiner=_parenthesised,
        output=STRINGS,
    )


def _values(changes: dict[tuple[Any, ...], tuple[Any, ...] | None]) -> dict[str, str | None]:
    return {k[0]: None if v is None else v[1] for k, v in changes.items()}


#: A step: table changes ("left"/"right", key, value; None deletes), then
#: the output per key (None: a delete) for the inner join and the left join.
Step = tuple[list[tuple[str, str, str | None]], dict[str, str | None], dict[str, str | None]]

#: Case (1) of the issue, verbatim.
CASE_1: list[Step] = [
    ([("right", f"rhs{i}", f"rhsValue{i}") for i in (1, 2, 3)], {}, {}),
    (
        [("left", "lhs1", "lhsValue1|rhs1"), ("left", "lhs2", "lhsValue2|rhs2")],
        {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs2": "(lhsValue2|rhs2,rhsValue2)"},
        {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs2": "(lhsValue2|rhs2,rhsValue2)"},
    ),
    (
        [("left", "lhs3", "lhsValue3|rhs1")],
        {"lhs3": "(lhsValue3|rhs1,rhsValue1)"},
        {"lhs3": "(lhsValue3|rhs1,rhsValue1)"},
    ),
    ([("left", "lhs1", None)], {"lhs1": None}, {"lhs1": None}),
]

#: Case (2) of the issue, verbatim.
CASE_2: list[Step] = [
    (
        [
            ("left", "lhs1", "lhsValue1|rhs1"),
            ("left", "lhs2", "lhsValue2|rhs2"),
            ("left", "lhs3", "lhsValue3|rhs1"),
        ],
        {},
        {
            "lhs1": "(lhsValue1|rhs1,null)",
            "lhs2": "(lhsValue2|rhs2,null)",
            "lhs3": "(lhsValue3|rhs1,null)",
        },
    ),
    (
        [("right", "rhs1", "rhsValue1")],
        {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs3": "(lhsValue3|rhs1,rhsValue1)"},
        {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs3": "(lhsValue3|rhs1,rhsValue1)"},
    ),
    (
        [("right", "rhs2", "rhsValue2")],
        {"lhs2": "(lhsValue2|rhs2,rhsValue2)"},
        {"lhs2": "(lhsValue2|rhs2,rhsValue2)"},
    ),
    ([("right", "rhs3", "rhsValue3")], {}, {}),
    (
        [("right", "rhs1", None)],
        {"lhs1": None, "lhs3": None},
        {"lhs1": "(lhsValue1|rhs1,null)", "lhs3": "(lhsValue3|rhs1,null)"},
    ),
]


def play(d: FkDriver, changes: list[tuple[str, str, str | None]]) -> dict[str, str | None]:
    """Apply one step's changes as one micro-batch; its output per key."""
    for table, key, value in changes:
        if table == "left":
            d.upsert_left((key, value)) if value is not None else d.delete_left((key,))
        else:
            d.upsert_right((key, value)) if value is not None else d.delete_right(key)
    return _values(d.flush())


@pytest.mark.parametrize("how", ["inner", "left"])
class TestIssueCases:
    @pytest.mark.parametrize("case", [CASE_1, CASE_2], ids=["case1", "case2"])
    def test_output_per_key_after_each_step(self, how: str, case: list[Step]) -> None:
        """The issue's cases (1) and (2): the output per key after each step,
        for the inner and the left join, over several partitions."""
        d = FkDriver(issue_join(how))
        for changes, inner, left in case:
            assert play(d, changes) == (inner if how == "inner" else left)
            assert d.output == d.batch_join()


class TestInstructionSet:
    def test_fk_change_in_a_left_join_emits_no_null(self) -> None:
        """KAFKA-16394: moving K from one FK to another emits only the new
        join, never a null result for the old FK."""
        d = FkDriver(issue_join("left"))
        play(d, [("right", "rhs1", "r1"), ("right", "rhs2", "r2"), ("left", "k", "v|rhs1")])
        assert play(d, [("left", "k", "v|rhs2")]) == {"k": "(v|rhs2,r2)"}

    @pytest.mark.parametrize(("how", "after"), [("inner", None), ("left", "(v,null)")])
    def test_fk_to_null_retracts_an_inner_result(self, how: str, after: str | None) -> None:
        """KAFKA-16407: an inner join's result is deleted when K's FK becomes
        null; a left join keeps K with nulls."""
        d = FkDriver(issue_join(how))
        play(d, [("right", "rhs1", "r1"), ("left", "k", "v|rhs1")])
        assert play(d, [("left", "k", "v")]) == {"k": after}

    @pytest.mark.parametrize(("how", "before"), [("inner", {}), ("left", {"k": "(v,null)"})])
    def test_fk_from_null_to_a_value_joins(self, how: str, before: dict[str, str]) -> None:
        """KAFKA-16407: K whose FK goes from null to a value joins that FK's
        right row (inner: a first result; left: it replaces the nulls)."""
        d = FkDriver(issue_join(how))
        assert play(d, [("right", "rhs1", "r1"), ("left", "k", "v")]) == before
        assert play(d, [("left", "k", "v|rhs1")]) == {"k": "(v|rhs1,r1)"}

    def test_old_fk_no_longer_reaches_k(self) -> None:
        """After an FK change, updates of the old right row no longer reach K."""
        d = FkDriver(issue_join("inner"))
        play(d, [("right", "rhs1", "a"), ("right", "rhs2", "b"), ("left", "k", "v|rhs1")])
        play(d, [("left", "k", "v|rhs2")])
        assert play(d, [("right", "rhs1", "a2")]) == {}


class TestStaleResults:
    def test_response_for_an_older_left_row_is_dropped(self) -> None:
        """A right change answers K's old subscription before K moves to
        another FK in the same batch: that response is computed for the old
        left row, reaches K's partition, and is dropped as stale."""
        d = FkDriver(issue_join("inner"), partitions=(4, 3))
        play(d, [("right", "rhs1", "a"), ("right", "rhs2", "b"), ("left", "k", "v|rhs1")])
        # The first change answers k's subscription at rhs1, then k moves.
        assert play(d, [("right", "rhs1", "a2"), ("left", "k", "v|rhs2")]) == {"k": "(v|rhs2,b)"}
        assert d.stale_dropped == d.expected_stale == 1
        assert d.output == d.batch_join()

    def test_every_stale_response_is_counted(self) -> None:
        """Three right changes answer K's old row before K moves: three
        responses for one old row, each dropped and counted; the answers for
        K's current row are not stale."""
        d = FkDriver(issue_join("inner"), partitions=(4, 3))
        play(d, [("right", "rhs1", "a"), ("right", "rhs2", "b"), ("left", "k", "v|rhs1")])
        changes = [("right", "rhs1", f"a{i}") for i in range(3)]
        changes += [("left", "k", "v|rhs2"), ("right", "rhs2", "b2")]
        assert play(d, changes) == {"k": "(v|rhs2,b2)"}
        assert d.stale_dropped == d.expected_stale == 3

    @pytest.mark.parametrize(("how", "after"), [("inner", None), ("left", "(v,null)")])
    def test_responses_for_a_k_without_fk_are_all_stale(self, how: str, after: str | None) -> None:
        """A right change answers K and J, then K's FK becomes null and J is
        deleted: both responses are stale."""
        d = FkDriver(issue_join(how), partitions=(4, 3))
        play(d, [("right", "rhs1", "a"), ("left", "k", "v|rhs1"), ("left", "j", "w|rhs1")])
        changes = [("right", "rhs1", "a2"), ("left", "k", "v"), ("left", "j", None)]
        assert play(d, changes) == {"k": after, "j": None}
        assert d.stale_dropped == d.expected_stale == 2


class TestChangesInOneBatch:
    @pytest.mark.parametrize("how", ["inner", "left"])
    @pytest.mark.parametrize("last", ["x|rhs3", "v|rhs1"], ids=["elsewhere", "back"])
    def test_a_left_row_changes_twice_in_one_batch(self, how: str, last: str) -> None:
        """K moves rhs1 -> rhs2 -> its last FK in one batch, with right
        changes between: K's one output row joins its last row (also when
        that is the row it started the batch with); the answers to the
        middle row are stale."""
        d = FkDriver(issue_join(how), partitions=(4, 3))
        rights = [("right", f"rhs{i}", f"r{i}") for i in (1, 2, 3)]
        play(d, [*rights, ("left", "k", "v|rhs1")])
        changes = [("left", "k", "w|rhs2"), ("right", "rhs2", "r2b"), ("right", "rhs1", "r1b")]
        changes += [("left", "k", last), ("right", "rhs3", "r3b")]
        right = "r3b" if last.endswith("rhs3") else "r1b"
        assert play(d, changes) == {"k": f"({last},{right})"}
        assert d.stale_dropped == d.expected_stale == 2  # w|rhs2's: subscribed, then r2b
        assert d.output == d.batch_join()

    @pytest.mark.parametrize("right_first", [True, False], ids=["right-first", "left-first"])
    @pytest.mark.parametrize("seed", range(4))
    def test_a_right_change_and_a_left_fk_change_in_one_batch(
        self, right_first: bool, seed: int
    ) -> None:
        """K moves from rhs1 to rhs2 while rhs2 (and the old rhs1) change in
        the same batch, the move and rhs2's change sharing one sequence number
        and their tie broken at random: in any order K joins rhs2's new row."""
        d = FkDriver(issue_join("inner"), shared_sequences=True, tie_break=random.Random(seed))
        play(d, [("right", "rhs1", "a"), ("right", "rhs2", "b"), ("left", "k", "v|rhs1")])
        # The driver numbers the move like the right change queued next to it.
        move, old, new = ("left", "k", "v|rhs2"), ("right", "rhs1", "a2"), ("right", "rhs2", "b2")
        changes = [old, new, move] if right_first else [move, new, old]
        assert play(d, changes) == {"k": "(v|rhs2,b2)"}
        assert d.output == d.batch_join()


class TestSequences:
    def test_right_numbers_below_the_lefts_still_join_the_newest_row(self) -> None:
        """The right table numbers its changes on its own, far below the
        left's: rhs2's change, made after K moved to rhs2, carries a smaller
        number, so the join meets it first; K still joins rhs2's row as it
        stands after the batch."""
        d = FkDriver(issue_join("inner"), right_sequence_start=-1000)
        play(d, [("right", "rhs1", "a"), ("right", "rhs2", "b"), ("left", "k", "v|rhs1")])
        assert play(d, [("left", "k", "v|rhs2"), ("right", "rhs2", "b2")]) == {"k": "(v|rhs2,b2)"}

    @pytest.mark.parametrize("right_start", [-(10**6), 1, 10**6])
    @pytest.mark.parametrize("seed", range(10))
    def test_tables_numbered_independently_join_as_they_stand(
        self, right_start: int, seed: int
    ) -> None:
        """Each table numbers its own changes (the right's counter far below,
        level with, or far above the left's; ties broken at random): after
        every batch the output equals the batch join of the tables as they
        stand, so the two tables' numbers need not share a clock."""
        rng = random.Random(seed)
        d = FkDriver(
            random_join(rng),
            partitions=(rng.randint(1, 4), rng.randint(1, 4)),
            tie_break=random.Random(seed),
            right_before_images=rng.random() < 0.5,
            right_sequence_start=right_start,
        )
        shape = Shape.draw(rng, wide=False)
        for _ in range(rng.randint(1, 6)):
            random_batch(rng, d, shape)
            d.flush()
            assert d.output == d.batch_join()


class TestRightUpdates:
    @pytest.mark.parametrize("shared", [False, True])
    def test_right_key_change_unjoins_the_old_subscribers(self, shared: bool) -> None:
        """A right update that changes the row's key (-U at rhs1, +U at rhs2,
        sharing a number or not): K at rhs1 loses its join (inner: a delete),
        J at rhs2 joins the moved row."""
        d = FkDriver(issue_join("inner"), shared_sequences=shared)
        play(d, [("right", "rhs1", "a"), ("left", "k", "v|rhs1"), ("left", "j", "w|rhs2")])
        d.update_right("rhs1", ("rhs2", "a"))
        assert _values(d.flush()) == {"k": None, "j": "(w|rhs2,a)"}
        assert d.output == d.batch_join()
        assert play(d, [("right", "rhs2", "b")]) == {"j": "(w|rhs2,b)"}

    def test_right_update_with_before_image_joins_the_new_row(self) -> None:
        """A right update sent as -U/+U of one key: K joins the new row; the
        -U's answer (nulls) is superseded by the +U's, not stale."""
        d = FkDriver(issue_join("left"), right_before_images=True)
        play(d, [("right", "rhs1", "a"), ("left", "k", "v|rhs1")])
        assert play(d, [("right", "rhs1", "b")]) == {"k": "(v|rhs1,b)"}
        assert d.stale_dropped == d.expected_stale == 0


@pytest.mark.parametrize("how", ["inner", "left"])
class TestRetractionsOfUnknownKeys:
    """Kafka's left table is keyed by K: a tombstone for a K it does not hold
    (never seen, or deleted already) emits nothing and fails nothing, and
    one deletes K whatever row K holds."""

    @pytest.mark.parametrize("same_batch", [False, True])
    def test_delete_twice_in_a_row(self, how: str, same_batch: bool) -> None:
        """The second -D of a deleted K emits nothing and counts in
        numRetractionsOfUnknownRows, in the batch after the first or in the
        same one; the first still deletes K's result."""
        d = FkDriver(issue_join(how))
        play(d, [("right", "rhs1", "r1"), ("left", "k", "v|rhs1")])
        d.delete_left(("k",))
        if not same_batch:
            assert _values(d.flush()) == {"k": None}
        d.retract_left(("k", "v|rhs1"))
        assert _values(d.flush()) == ({"k": None} if same_batch else {})
        assert d.results_metric("numRetractionsOfUnknownRows") == 1
        assert play(d, [("right", "rhs1", "r2")]) == {}

    def test_delete_of_a_key_never_seen(self, how: str) -> None:
        """A -D and a -U of keys the join never held emit nothing and are
        counted; the rest of the batch goes on."""
        d = FkDriver(issue_join(how))
        d.upsert_right(("rhs1", "r1"))
        d.retract_left(("ghost", "v|rhs1"))
        d.retract_left(("ghost2", "w"), RowKind.UPDATE_BEFORE)
        d.upsert_left(("k", "v|rhs1"))
        assert _values(d.flush()) == {"k": "(v|rhs1,r1)"}
        assert d.results_metric("numRetractionsOfUnknownRows") == 2
        assert d.harness.last_metrics["fkjoin-subscriptions"]["numSubscriptionRows"] == 1

    def test_retraction_of_another_row_deletes_the_key(self, how: str) -> None:
        """A -D whose before-image is not the row K holds deletes K all the
        same (counted in numRetractionsOfMismatchedRows). It unsubscribes K
        from the before-image's FK: K's subscription at the held row's FK
        stays until K subscribes there again, and its answers are dropped as
        stale."""
        d = FkDriver(issue_join(how))
        play(d, [("right", "rhs1", "r1"), ("right", "rhs2", "r2"), ("left", "k", "v|rhs1")])
        d.retract_left(("k", "old|rhs2"))
        assert _values(d.flush()) == {"k": None}
        assert d.results_metric("numRetractionsOfMismatchedRows") == 1
        assert play(d, [("right", "rhs1", "r1b")]) == {}
        assert d.stale_dropped == 1
        assert play(d, [("left", "k", "w|rhs1")]) == {"k": "(w|rhs1,r1b)"}


class TestBadChangelog:
    def test_update_without_before_image_is_refused(self) -> None:
        """A +U of a key the left table holds, with no -U first, is an
        InputError: subscriptions would otherwise leak."""
        d = FkDriver(issue_join("inner"))
        d.upsert_left(("k", "v|rhs1"))
        d.flush()
        d._change(0, ("k", "w|rhs2"), RowKind.UPDATE_AFTER, d._number(0))
        with pytest.raises(InputError, match="before-image"):
            d.flush()


LEFT = pa.schema([("id", pa.int64()), ("fk", pa.int64()), ("payload", pa.string())])
RIGHT = pa.schema([("rid", pa.int64()), ("rval", pa.string())])
#: The tables holding their changelogs' sequence numbers as a column.
LEFT_SEQ = pa.schema([*LEFT, ("seq", pa.int64())])
RIGHT_SEQ = pa.schema([*RIGHT, ("seq", pa.int64())])


def _rekeyed(left: tuple[Any, ...], right: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """A faulty joiner: it moves the result to another left key."""
    return (f"{left[0]}!", f"({left[1]},{None if right is None else right[1]})")


def _with_right_seq(left: tuple[Any, ...], right: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """The left row, then the right row with its sequence number as 'rseq'."""
    return (*left, *(right if right is not None else (None,) * len(RIGHT_SEQ)))


def seq_holding_join(holder: str, how: str = "left") -> FkJoin:
    """A join of int tables where ``holder`` ('left', 'right', 'both') hold
    the sequence column."""
    left = LEFT_SEQ if holder in ("left", "both") else LEFT
    right = RIGHT_SEQ if holder in ("right", "both") else RIGHT
    if holder != "both":
        return FkJoin(left, ["id"], right, "rid", "fk", how=how)
    output = pa.schema([*left, *RIGHT, ("rseq", pa.int64())])
    return FkJoin(left, ["id"], right, "rid", "fk", how, _with_right_seq, output)


class TestDescription:
    def test_sequence_column_as_a_key_is_refused(self) -> None:
        """The sequence column cannot be the left key, the right key or the FK."""
        right_by_seq = pa.schema([("seq", pa.int64()), ("rval", pa.string())])
        with pytest.raises(InputError, match="sequence column 'seq' is a key"):
            FkJoin(LEFT_SEQ, ["seq"], RIGHT, "rid", "fk")
        with pytest.raises(InputError, match="sequence column 'seq' is a key"):
            FkJoin(LEFT, ["id"], right_by_seq, "seq", "fk")
        with pytest.raises(InputError, match="sequence column 'seq' is a key"):
            FkJoin(LEFT_SEQ, ["id"], RIGHT, "rid", "seq")

    def test_sequence_column_held_by_a_table_must_be_int64(self) -> None:
        """A table may hold the sequence column only as int64."""
        left = pa.schema([*LEFT, ("seq", pa.int32())])
        with pytest.raises(InputError, match="must be int64"):
            FkJoin(left, ["id"], RIGHT, "rid", "fk")


class TestSequenceColumnInRows:
    def test_before_image_numbered_by_its_change_retracts_the_held_row(self) -> None:
        """A left table holding the sequence column: an update's -U carries
        the update's number, not the held row's, and still retracts it; the
        output carries the row's number from its last insert or update."""
        d = FkDriver(seq_holding_join("left"))
        d.upsert_right((1, "a"))
        d.upsert_left((7, 1, "x", None))
        first = d.flush()[(7,)]
        d.upsert_left((7, 2, "y", None))
        before_image = d._changes[0][0][0]
        assert first is not None and before_image[3] > first[3]  # not the held number
        second = d.flush()[(7,)]
        assert second is not None and second[3] > first[3]
        assert second == (7, 2, "y", d.left[(7,)][3], None, None)

    def test_right_row_carries_its_number_into_the_output(self) -> None:
        """A right table holding the sequence column: an update that changes
        only the number still reaches the subscribers, with the new number."""
        d = FkDriver(seq_holding_join("both"))
        d.upsert_right((1, "a", None))
        d.upsert_left((7, 1, "x", None))
        d.flush()
        d.upsert_right((1, "a", None))
        assert d.flush() == {(7,): (*d.left[(7,)], *d.right[1])}

    @pytest.mark.parametrize("holder", ["left", "right", "both"])
    @pytest.mark.parametrize("seed", range(20))
    def test_output_equals_batch_join(self, holder: str, seed: int) -> None:
        """Random changelogs of tables that hold their sequence numbers:
        after every batch the output equals the batch join."""
        rng = random.Random(seed)
        d = FkDriver(seq_holding_join(holder, rng.choice(["inner", "left"])))
        for _ in range(rng.randint(1, 5)):
            random_batch(rng, d, Shape(10, 4))
            d.flush()
            assert d.output == d.batch_join()


class TestJoiner:
    def test_a_joiner_must_keep_the_left_key(self) -> None:
        """A joiner returning another left key than K's fails the batch with
        an InputError: the upsert changelog would gain a row for a key that
        no later change of K updates or deletes."""
        join = FkJoin(STRINGS, ["key"], STRINGS, "key", _fk_after_bar, "left", _rekeyed, STRINGS)
        d = FkDriver(join)
        d.upsert_left(("k", "v|rhs1"))
        with pytest.raises(InputError, match=r"joiner returned left key \('k!',\)"):
            d.flush()


def _fk_column_function(row: tuple[Any, ...]) -> Any:
    return row[1]


def random_join(rng: random.Random) -> FkJoin:
    """A join of int tables: inner or left, FK a column or a function."""
    foreign_key: str | Callable[[tuple[Any, ...]], Any] = rng.choice(["fk", _fk_column_function])
    return FkJoin(LEFT, ["id"], RIGHT, "rid", foreign_key, how=rng.choice(["inner", "left"]))


@dataclass(frozen=True)
class Shape:
    """The size of a random run: left keys, right keys (FKs), changes per
    batch at most, and the share of left upserts that point at the hot FK 0."""

    keys: int
    fks: int
    changes: int = 20
    hot: float = 0.3

    @classmethod
    def draw(cls, rng: random.Random, wide: bool) -> Shape:
        """A small run (2-12 keys), or a wide one: 50-200 keys, most of them
        subscribed to the hot FK."""
        if not wide:
            return cls(rng.randint(2, 12), rng.randint(1, 6))
        return cls(rng.randint(50, 200), rng.randint(5, 20), 60, rng.uniform(0.5, 0.9))


def load_batch(rng: random.Random, d: FkDriver, shape: Shape) -> None:
    """Queue every left key (the hot FK's share of them pointing at it) and
    most right rows: a first batch that gives the hot FK its subscribers."""
    for key in range(shape.keys):
        fk = 0 if rng.random() < shape.hot else rng.choice([None, *range(shape.fks)])
        d.upsert_left((key, fk, "x"))
    for fk in range(shape.fks):
        if rng.random() < 0.8:
            d.upsert_right((fk, f"r{fk}"))


def random_batch(rng: random.Random, d: FkDriver, shape: Shape) -> None:
    """Queue random changes: left upserts (FK changes, null FKs, the hot FK),
    left deletes, tombstones of left keys not held, right upserts, right rows
    moving to a free key (``-U``/``+U``) and right deletes."""
    fks = shape.fks
    for _ in range(rng.randint(1, shape.changes)):
        op = rng.random()
        if op < 0.45:
            fk = 0 if rng.random() < shape.hot else rng.choice([None, *range(fks)])
            d.upsert_left((rng.randrange(shape.keys), fk, rng.choice("xyz")))
        elif op < 0.6 and d.left:
            d.delete_left(rng.choice(sorted(d.left)))
        elif op < 0.63:
            absent = [k for k in range(shape.keys + 2) if (k,) not in d.left]
            d.retract_left((rng.choice(absent), rng.choice([None, *range(fks)]), "x"))
        elif op < 0.85:
            fk = rng.randrange(fks)
            d.upsert_right((fk, f"r{fk}.{rng.randrange(3)}"))
        elif op < 0.92 and d.right and len(d.right) < fks:
            fk = rng.choice(sorted(d.right))
            free = rng.choice([f for f in range(fks) if f not in d.right])
            d.update_right(fk, (free, f"r{fk}.moved"))
        elif d.right:
            d.delete_right(rng.choice(sorted(d.right)))


#: Differential seeds run on RocksDB (slower: a checkpoint per commit).
ROCKSDB_SEEDS = (0, 75, 150)


def run_random(seed: int, shared: bool, wide: bool, strict: bool = False) -> None:
    """One random run of the join (``shared``: sequence numbers shared and
    ties broken at random; ``wide``: a loaded first batch with a hot FK;
    ``strict``: both stages' tables checked); after every batch the output
    equals the batch join and, without shared numbers, the stale responses
    are counted exactly."""
    rng = random.Random(seed)
    d = FkDriver(
        random_join(rng),
        partitions=(rng.randint(1, 4), rng.randint(1, 4)),
        shared_sequences=shared,
        tie_break=random.Random(seed) if shared else None,
        right_before_images=rng.random() < 0.5,
        backend="rocksdb" if seed in ROCKSDB_SEEDS else "memory",
        strict=strict,
    )
    shape = Shape.draw(rng, wide)
    try:
        for batch in range(rng.randint(1, 6) + wide):
            (load_batch if wide and batch == 0 else random_batch)(rng, d, shape)
            d.flush()
            assert d.output == d.batch_join()
            if not shared:
                assert d.stale_dropped == d.expected_stale
    finally:
        d.close()


class TestDifferential:
    @pytest.mark.parametrize("seed", range(300))
    def test_output_equals_batch_join_after_every_batch(self, seed: int) -> None:
        """Random changelogs of both tables, several partitions and batches:
        after every batch the materialised output equals the batch join, and
        (where each change has its own number) the stale responses are
        counted exactly. Odd seeds share sequence numbers between the tables
        and within update pairs, and order rows that tie at random (a left
        and a right change with one number meet in either order); half the
        seeds send right updates as -U/+U pairs; every tenth seed is wide
        (50-200 keys loaded in a first batch, a hot FK with most of them as
        subscribers); a few seeds (wide ones, and one with ties) run on
        RocksDB."""
        run_random(seed, shared=seed % 2 == 1, wide=seed % 10 == 0)


class TestStrictTables:
    @pytest.mark.parametrize("seed", range(0, 300, 10))
    def test_every_write_is_of_the_row_the_table_holds(self, seed: int) -> None:
        """The differential's random runs (wide and RocksDB ones among them)
        with both stages' tables strict: no write contradicts the stored row
        (the stages read each key before writing it, so they run their tables
        unchecked), and the output equals the batch join after every batch."""
        run_random(seed, shared=seed % 20 == 10, wide=seed % 20 == 0, strict=True)
