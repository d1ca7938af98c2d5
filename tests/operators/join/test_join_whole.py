"""``StreamingJoin(whole_micro_batch=True)`` (operators/join/_whole.py)
against the join without it, inner and outer: the same rows in the same
order, the same state and state metrics; micro-batches it cannot take go by
the rules; the joins it cannot take refuse it; and through the Spark
runner."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import OperatorContext, RowKind
from operators._api.dirty import InputPolicy
from operators.errors import InputError
from operators.join import JoinType, StreamingJoin, _streaming
from operators.testing import OperatorHarness
from tests.operators.join import test_join_differential as differential
from tests.operators.join.test_join_batch import (
    NULLABLE,
    SIDE,
    RowAtATime,
    _state_metrics,
    changes,
    dirty_changes,
    make,
    nullable_changes,
)
from tests.operators.join.test_join_spark import run_join

Runs = list[tuple[int, list[tuple[Any, ...]], list[RowKind]]]


class Whole(StreamingJoin):
    """The join with ``whole_micro_batch=True``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, whole_micro_batch=True, **kwargs)


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each micro-batch was joined whole (``False``: by the rules)."""
    seen: list[bool] = []
    join_whole = _streaming.join_whole

    def counted(*args: Any) -> bool:
        seen.append(join_whole(*args))
        return seen[-1]

    monkeypatch.setattr(_streaming, "join_whole", counted)
    return seen


def outputs(
    join: StreamingJoin,
    runs: Runs,
    path: Path,
    policy: InputPolicy | None = None,
    backend: str = "rocksdb",
) -> list[Any]:
    """Every emitted row in order, both sides' final state and each
    commit's state metrics, a commit every 7 runs."""
    with OperatorHarness(join, backend=backend, path=path) as h:
        if policy is not None:
            h.policy = policy
        metrics = []
        for b, (side, rows, kinds) in enumerate(runs):
            h.process_rows(rows, kinds, side)
            if b % 7 == 6:
                h.commit()
                metrics.append(h.last_metrics)
        h.commit()
        metrics.append(h.last_metrics)
        state = [list(h.table(t).scan()) for t in ("left", "right")]
        return [h.output, state, _state_metrics(metrics)]


MakeRow = Callable[[random.Random, int], tuple[Any, ...]]

VARIANTS: dict[str, tuple[pa.Schema, MakeRow]] = {
    "ints": (
        pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.int64())]),
        lambda rnd, i: (i, rnd.randrange(4), rnd.randrange(3)),
    ),
    "strings": (
        pa.schema([("id", pa.string()), ("k", pa.string()), ("v", pa.int32())]),
        lambda rnd, i: (
            f"{rnd.choice(['é', 'z', 'a', ''])}{i}",
            rnd.choice(["", "é", "ab"]),
            i % 3,
        ),
    ),
    "binary-bool": (
        pa.schema([("id", pa.binary()), ("k", pa.bool_()), ("v", pa.int64())]),
        lambda rnd, i: (bytes([i % 256, 255 - i % 7]), rnd.random() < 0.5, rnd.randrange(3)),
    ),
    "timestamps": (
        pa.schema([("id", pa.int64()), ("k", pa.timestamp("us")), ("v", pa.date32())]),
        lambda rnd, i: (
            i,
            datetime(2026, 1, 1) + timedelta(seconds=rnd.randrange(3)),
            date(2026, 1, 1 + rnd.randrange(3)),
        ),
    ),
    "two-keys-float": (
        pa.schema(
            [("id", pa.int64()), ("k1", pa.int64()), ("k2", pa.string()), ("v", pa.float64())]
        ),
        lambda rnd, i: (i, rnd.randrange(2), rnd.choice(["x", "y"]), rnd.choice([-0.0, 0.0, 1.5])),
    ),
}


def varied_changes(seed: int, make_row: MakeRow, unique: str | None) -> Runs:
    """Runs of one side's changes: inserts of new rows, deletes (``-D`` or
    ``-U``) of live ones, updates (``-U`` then ``+U`` of the same identity
    with new values, in one run or two), rows deleted before and inserted
    again with new values and, without a unique key, live rows inserted
    again. ``unique``: the identity (``"id"``, ``"k"``: the key columns,
    ``None``: the whole row); a row whose identity is live is not inserted
    (that would be an upsert)."""
    rnd = random.Random(seed)
    live: list[list[tuple[Any, ...]]] = [[], []]
    gone: list[list[tuple[Any, ...]]] = [[], []]

    def identity(row: tuple[Any, ...]) -> Any:
        if unique == "id":
            return row[0]
        if unique == "k":
            return row[1:-1]
        return row

    runs: Runs = []
    serial = 0
    for _ in range(40):
        side = rnd.randrange(2)
        rows: list[tuple[Any, ...]] = []
        kinds: list[RowKind] = []
        for _ in range(rnd.randint(1, 8)):
            serial += 1
            pick = rnd.random()
            mine = live[side]
            if mine and pick < 0.25:
                old = mine.pop(rnd.randrange(len(mine)))
                gone[side].append(old)
                rows.append(old)
                kinds.append(rnd.choice([RowKind.DELETE, RowKind.UPDATE_BEFORE]))
                continue
            if mine and pick < 0.4 and unique is not None:  # an update: -U then +U
                old = mine.pop(rnd.randrange(len(mine)))
                new = (*old[:-1], make_row(rnd, serial)[-1])
                rows += [old, new]
                kinds += [RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER]
                mine.append(new)
                continue
            if mine and pick < 0.5 and unique is None:  # the same row again
                row = rnd.choice(mine)
            elif gone[side] and pick < 0.6:  # back, with new values
                back = gone[side].pop(rnd.randrange(len(gone[side])))
                row = (*back[:-1], make_row(rnd, serial)[-1])
            else:
                row = make_row(rnd, serial)
            if unique is not None and any(identity(r) == identity(row) for r in mine):
                continue
            mine.append(row)
            rows.append(row)
            kinds.append(rnd.choice([RowKind.INSERT, RowKind.UPDATE_AFTER]))
        if rows:
            runs.append((side, rows, kinds))
    return runs


class TestSameAsTheRules:
    @pytest.mark.parametrize("join_type", list(JoinType))
    @pytest.mark.parametrize("unique", [True, False])
    @pytest.mark.parametrize("held_rows", [1_000_000, 0])
    def test_same_rows_state_and_metrics(
        self,
        join_type: JoinType,
        unique: bool,
        held_rows: int,
        taken: list[bool],
        tmp_path: Path,
    ) -> None:
        """Over random runs of inserts, ``+U``, ``-U`` and deletes of live rows
        (few join keys, so rows match many, and join keys go empty and fill
        again), each micro-batch is joined whole and emits the rows the rules
        emit record at a time, in order: in an outer join the padded rows
        too, as they go and come; the state (an outer side's associations
        included) and state metrics are the same; reading the sides whole or
        by key (``held_rows=0``) alike."""
        for seed in range(8):
            runs = changes(seed, 30)
            got = outputs(make(Whole, join_type, unique, held_rows), runs, tmp_path / f"w{seed}")
            want = outputs(make(RowAtATime, join_type, unique), runs, tmp_path / f"r{seed}")
            assert got == want, f"seed {seed}"
        assert taken and all(taken)

    def test_padded_rows_go_and_come(self, tmp_path: Path) -> None:
        """A full join, by hand: a row with no match is emitted padded; the
        first match of a join key retracts the other side's padded rows (once
        per appearance), the last one to go brings them back; untouched rows
        of the join key get their associations rewritten."""
        pad = (None, None, None)
        with OperatorHarness(make(Whole, JoinType.FULL, False), path=tmp_path) as h:
            h.process_rows([(1, 7, 0), (1, 7, 0), (2, 7, 1)], side=0)
            h.commit()
            assert h.output == [(RowKind.INSERT, (1, 7, 0, *pad))] * 2 + [
                (RowKind.INSERT, (2, 7, 1, *pad))
            ]
            assert list(h.table("left").scan()) == [(1, 7, 0, 2, 0), (2, 7, 1, 1, 0)]
            h.output.clear()
            h.process_rows([(5, 7, 9)], side=1)
            h.process_rows([(5, 7, 9)], [RowKind.DELETE], side=1)
            h.commit()
            gone = [(RowKind.DELETE, (1, 7, 0, *pad)), (RowKind.INSERT, (1, 7, 0, 5, 7, 9))] * 2
            back = [(RowKind.DELETE, (1, 7, 0, 5, 7, 9)), (RowKind.INSERT, (1, 7, 0, *pad))] * 2
            assert h.output == [
                *gone,
                (RowKind.DELETE, (2, 7, 1, *pad)),
                (RowKind.INSERT, (2, 7, 1, 5, 7, 9)),
                *back,
                (RowKind.DELETE, (2, 7, 1, 5, 7, 9)),
                (RowKind.INSERT, (2, 7, 1, *pad)),
            ]
            h.output.clear()
            h.process_rows([(6, 7, 3)], side=1)
            h.commit()
            assert list(h.table("left").scan()) == [(1, 7, 0, 2, 1), (2, 7, 1, 1, 1)]
            assert list(h.table("right").scan()) == [(6, 7, 3, 1, 3)]

    def test_emitted_at_the_end_of_the_micro_batch(self, tmp_path: Path) -> None:
        """The rows come out when the micro-batch ends (its commit), not
        with each input batch."""
        with OperatorHarness(make(Whole, JoinType.INNER, True), path=tmp_path) as h:
            assert h.process_rows([(1, 7, 0)], side=0) == []
            assert h.process_rows([(2, 7, 5)], side=1) == []
            h.commit()
            assert h.output == [(RowKind.INSERT, (1, 7, 0, 2, 7, 5))]

    def test_a_table_read_mid_batch_sees_the_rows_so_far(self, tmp_path: Path) -> None:
        """Reading a state table in the middle of a micro-batch joins what
        came so far first (the harness flushes): the table is current, and
        the rows that join emitted come out with the harness's next call."""
        pair = (1, 7, 0, 2, 7, 5)
        with OperatorHarness(make(Whole, JoinType.INNER, True), path=tmp_path) as h:
            h.process_rows([(1, 7, 0)], side=0)
            h.process_rows([(2, 7, 5)], side=1)
            assert list(h.table("left").scan()) == [(1, 7, 0)]
            out = h.process_rows([(1, 7, 0)], [RowKind.DELETE], side=0)
            assert out == [(RowKind.INSERT, pair)]
            h.commit()
            assert h.output == [(RowKind.INSERT, pair), (RowKind.DELETE, pair)]
            assert list(h.table("left").scan()) == []

    def test_sqlite_differential(
        self, monkeypatch: pytest.MonkeyPatch, taken: list[bool], tmp_path: Path
    ) -> None:
        """The join differential's random runs (inner and outer joins,
        several partitions, restores after failed attempts), with the option
        wherever the run's join allows it (no condition), still equal
        SQLite's join after every batch. Its keys are often null, so most
        micro-batches go by the rules; some are joined whole."""
        plain = differential.Config.join

        def join(config: differential.Config) -> StreamingJoin:
            made = plain(config)
            if config.with_condition:
                return made
            return StreamingJoin(
                config.join_type,
                differential.SIDE,
                differential.SIDE,
                config.keys,
                config.keys,
                left_unique_key=differential.UNIQUE_KEYS[config.unique[0]],
                right_unique_key=differential.UNIQUE_KEYS[config.unique[1]],
                null_safe=config.null_safe,
                right_prefix="r_",
                whole_micro_batch=True,
            )

        monkeypatch.setattr(differential.Config, "join", join)
        for seed in range(120):
            differential.run(seed, "memory", tmp_path / str(seed), None)
        assert True in taken and False in taken

    @pytest.mark.parametrize("join_type", [JoinType.INNER, JoinType.FULL])
    @pytest.mark.parametrize(
        ("variant", "unique"),
        [
            (variant, unique)
            for variant in VARIANTS
            for unique in ("id", "k", None)
            # A float in the identity is refused (TestRefused).
            if not (unique is None and variant == "two-keys-float")
        ],
    )
    def test_varied_changes(
        self,
        join_type: JoinType,
        variant: str,
        unique: str | None,
        taken: list[bool],
        tmp_path: Path,
    ) -> None:
        """Rows deleted and inserted again with new values, ``-U``/``+U``
        pairs, whole rows several times (no unique key), a unique key within
        the join key (one row a join key), over key and value types of every
        kind the option takes (strings, binary, booleans, timestamps, two
        key columns, float values with -0.0 and 0.0), inner and full: every
        micro-batch is joined whole, with the rows, order, state and metrics
        of the rules."""
        schema, make_row = VARIANTS[variant]
        keys = [n for n in schema.names if n.startswith("k")]
        uk = None if unique is None else (keys if unique == "k" else ["id"])
        for seed in range(4):
            runs = varied_changes(seed, make_row, unique)
            got = []
            for cls in (Whole, RowAtATime):
                join = cls(join_type, schema, schema, keys, keys, uk, uk, right_prefix="r_")
                got.append(outputs(join, runs, tmp_path / f"{cls.__name__}{seed}"))
            assert got[0] == got[1], f"seed {seed}"
        if variant == "two-keys-float":
            # A retraction of -0.0 read back stored as 0.0 goes by the rules.
            assert True in taken
        else:
            assert taken and all(taken)


class TestMidBatch:
    def test_rules_then_whole_then_rules(self, taken: list[bool], tmp_path: Path) -> None:
        """A micro-batch read in the middle three times: by the rules (an
        upsert), joined whole, by the rules again: the rows held by the first
        are let go after the second, so the third sees what it wrote (the
        upsert meets the right row the whole join stored)."""
        got = []
        for cls in (Whole, RowAtATime):
            with OperatorHarness(
                make(cls, JoinType.INNER, True), path=tmp_path / cls.__name__
            ) as h:
                h.process_rows([(1, 7, 0)], side=0)
                h.commit()
                h.process_rows([(1, 7, 5)], side=0)  # an upsert
                h.table("left")
                h.process_rows([(2, 7, 0)], side=1)
                h.table("right")
                h.process_rows([(1, 7, 9)], side=0)  # an upsert again
                h.commit()
                got.append([h.output, list(h.table("left").scan()), list(h.table("right").scan())])
        assert got[0] == got[1]
        assert (RowKind.INSERT, (1, 7, 9, 2, 7, 0)) in got[0][0]
        assert taken == [True, False, True, False]

    def test_a_restore_drops_the_runs_held(self, tmp_path: Path) -> None:
        """Runs held for a micro-batch that is restored away are not joined
        into the next one."""
        with OperatorHarness(make(Whole, JoinType.INNER, True), path=tmp_path) as h:
            h.process_rows([(1, 7, 0)], side=0)
            h.commit()
            h.process_rows([(2, 7, 0)], side=1)
            h.restore(0)
            h.process_rows([(3, 7, 1)], side=1)
            h.commit()
            assert h.output == [(RowKind.INSERT, (1, 7, 0, 3, 7, 1))]
            assert list(h.table("right").scan()) == [(3, 7, 1)]

    def test_batches_without_kinds_and_empty_ones(self, taken: list[bool], tmp_path: Path) -> None:
        """Input batches without a row-kind column (inserts), with one of
        another string type, and empty ones, in one micro-batch."""
        with OperatorHarness(make(Whole, JoinType.INNER, True), path=tmp_path) as h:
            columns = {"id": [1, 2], "k": [7, 7], "v": [0, 1]}
            h.process_arrow(pa.record_batch(columns, schema=SIDE), 0)
            h.process_arrow(pa.record_batch({"id": [], "k": [], "v": []}, schema=SIDE), 1)
            kinds = pa.array(["+I"], pa.large_string())
            right = pa.record_batch(
                [pa.array([3]), pa.array([7]), pa.array([5]), kinds],
                names=["id", "k", "v", "row_kind"],
            )
            h.process_arrow(right, 1)
            _, out = h.commit_arrow()
            assert out.column("row_kind").to_pylist() == ["+I", "+I"]
            assert out.column("id").to_pylist() == [1, 2]
        assert taken == [True]


class TestByTheRules:
    @pytest.mark.parametrize("join_type", [JoinType.INNER, JoinType.FULL])
    @pytest.mark.parametrize("unique", [True, False])
    def test_dirty_micro_batches(
        self, join_type: JoinType, unique: bool, taken: list[bool], tmp_path: Path
    ) -> None:
        """Under unknown_retractions='apply', micro-batches with retractions of
        rows never stored, upserts and repeated rows go by the rules in
        order: the same output, state and state metrics as without the
        option."""
        policy = InputPolicy.of("apply", None, "j")
        for seed in range(6):
            runs = dirty_changes(seed)
            got = outputs(make(Whole, join_type, unique), runs, tmp_path / f"w{seed}", policy)
            want = outputs(
                make(StreamingJoin, join_type, unique), runs, tmp_path / f"r{seed}", policy
            )
            assert got == want, f"seed {seed}"
        assert False in taken

    def test_associations_left_dirty(self, taken: list[bool], tmp_path: Path) -> None:
        """An applied retraction of a row never stored leaves an outer row's
        associations short of the other side's rows; a later clean
        micro-batch of that join key goes by the rules, which read the
        stored associations, so the output is theirs; one of another join
        key is joined whole."""
        policy = InputPolicy.of("apply", None, "j")
        got = []
        for cls in (Whole, StreamingJoin):
            with OperatorHarness(make(cls, JoinType.FULL, True), path=tmp_path / cls.__name__) as h:
                h.policy = policy
                h.process_rows([(1, 7, 0)], side=0)
                h.process_rows([(5, 7, 1)], side=1)
                h.commit()
                h.process_rows([(6, 7, 2)], [RowKind.DELETE], side=1)  # never stored
                h.commit()
                h.process_rows([(2, 7, 3)], side=0)
                h.commit()
                h.process_rows([(3, 8, 3)], side=0)
                h.commit()
                got.append(
                    [h.output, list(h.table("left").scan()), _state_metrics([h.last_metrics])]
                )
        assert got[0] == got[1]
        assert (RowKind.INSERT, (1, 7, 0, None, None, None)) in got[0][0]
        assert taken == [True, False, False, True]

    @pytest.mark.parametrize("null_safe", [True, False])
    def test_null_keys_and_strings(
        self, null_safe: bool, taken: list[bool], tmp_path: Path
    ) -> None:
        """String ids and null keys and values (no unique key): a micro-batch
        with a null in a row's identity (here, nearly every one) goes by the
        rules, in order."""
        for seed in range(6):
            got = []
            for cls in (Whole, RowAtATime):
                join = cls(
                    JoinType.INNER,
                    NULLABLE,
                    NULLABLE,
                    ["k"],
                    ["k"],
                    null_safe=null_safe,
                    right_prefix="r_",
                    name="j",
                )
                runs = nullable_changes(seed)
                got.append(
                    outputs(join, runs, tmp_path / f"{cls.__name__}{seed}", backend="memory")
                )
            assert got[0] == got[1], f"seed {seed}"
        assert False in taken

    def test_a_retraction_of_another_zero(self, taken: list[bool], tmp_path: Path) -> None:
        """A retraction of ``0.0`` of a row held with ``-0.0`` (equal in
        Python, not bit for bit) sends its micro-batch by the rules, which
        retract the held row: no pair from two versions of one row."""
        schema = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("x", pa.float64())])
        got = []
        for cls in (Whole, RowAtATime):
            join = cls(
                JoinType.INNER, schema, schema, ["k"], ["k"], ["id"], ["id"], right_prefix="r_"
            )
            with OperatorHarness(join, path=tmp_path / cls.__name__) as h:
                h.process_rows([(1, 1, -0.0)], side=1)
                h.process_rows([(1, 1, 0.0)], [RowKind.DELETE], side=1)
                h.process_rows([(5, 1, 2.0)], side=0)
                h.commit()
                got.append([h.output, list(h.table("right").scan())])
        assert got[0] == got[1] == [[], []]
        assert taken == [False]

    def test_strings_sort_by_their_key_bytes(self, taken: list[bool], tmp_path: Path) -> None:
        """Without nulls, string ids of every length and non-ASCII come out in
        the order the rules give (the key bytes), all joined whole."""
        rnd = random.Random(3)
        runs: Runs = []
        for i in range(20):
            ids = ["é", "z", "a", "ab", "", "Z", str(i)]
            rows = [(f"{rnd.choice(ids)}{i}.{j}", rnd.randrange(2), i) for j in range(6)]
            runs.append((i % 2, rows, [RowKind.INSERT] * len(rows)))
        got = outputs(make_strings(Whole), runs, tmp_path / "w")
        want = outputs(make_strings(RowAtATime), runs, tmp_path / "r")
        assert got == want
        assert taken and all(taken)


def make_strings(cls: type[StreamingJoin]) -> StreamingJoin:
    schema = pa.schema([("id", pa.string()), ("k", pa.int64()), ("v", pa.int64())])
    return cls(JoinType.INNER, schema, schema, ["k"], ["k"], ["id"], ["id"], right_prefix="r_")


class TestRefused:
    @pytest.mark.parametrize(
        ("kwargs", "why"),
        [
            ({"condition": lambda left, right: True}, "condition"),
            ({"left_ttl_ms": 1000}, "TTL"),
            ({"left": pa.schema([("id", pa.int64()), ("k", pa.float64())])}, "'k' \\(double\\)"),
            ({"whole_micro_batch": 1}, "True or False"),
            (
                {"left": pa.schema([("id", pa.int64()), ("k", pa.int64()), ("x", pa.null())])},
                "'x' \\(null\\) is in its identity",
            ),
            (
                {
                    "left": pa.schema(
                        [("id", pa.int64()), ("k", pa.int64()), ("d", pa.decimal128(5))]
                    )
                },
                "'d' \\(decimal128\\(5, 0\\)\\) is in its identity",
            ),
        ],
    )
    def test_where_it_cannot_apply(self, kwargs: dict[str, Any], why: str) -> None:
        """A condition, a TTL, a float in a side's identity
        (here its join key), a null-typed or decimal column, or a value not a
        bool is refused when the join is made, naming why."""
        args: dict[str, Any] = {
            "join_type": JoinType.INNER,
            "left": pa.schema([("id", pa.int64()), ("k", pa.int64())]),
            "right": pa.schema([("id", pa.int64()), ("k", pa.int64())]),
            "left_keys": ["k"],
            "right_keys": ["k"],
            "right_prefix": "r_",
            "whole_micro_batch": True,
        }
        args.update(kwargs)
        if "left" in kwargs:
            args["right"] = kwargs["left"]
        with pytest.raises(InputError, match=why):
            StreamingJoin(**args)

    def test_a_float_value_is_refused_without_a_unique_key(self) -> None:
        """Without a unique key the whole row is the identity: a float value
        column is refused; with one, it is only a value, and allowed, while
        a decimal value is refused."""
        floats = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("price", pa.float64())])
        decimal = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("d", pa.decimal128(5))])

        def whole(schema: pa.Schema, unique: list[str] | None) -> StreamingJoin:
            return StreamingJoin(
                JoinType.INNER,
                schema,
                schema,
                ["k"],
                ["k"],
                unique,
                unique,
                right_prefix="r_",
                whole_micro_batch=True,
            )

        with pytest.raises(InputError, match="'price'"):
            whole(floats, None)
        assert whole(floats, ["id"]).whole_micro_batch
        with pytest.raises(InputError, match="'d' is a decimal128"):
            whole(decimal, ["id"])


class TestEmitBatchKinds:
    def test_a_kind_per_row(self, tmp_path: Path) -> None:
        """``emit_batch`` with an array of kind symbols emits each row with
        its own kind, through the harness's context and the default one."""

        class Kinds(StreamingJoin):
            def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
                columns = [batch.column(n) for n in ("id", "k", "v")] * 2
                kinds = pa.array(["+I", "-U", "+U", "-D"][: batch.num_rows])
                ctx.emit_batch(columns, kinds)
                OperatorContext.emit_batch(ctx, columns, kinds)

        with OperatorHarness(make(Kinds, JoinType.INNER, True), path=tmp_path) as h:
            h.process_rows([(1, 1, 1), (2, 2, 2), (3, 3, 3)], side=0)
            kinds = [k for k, _ in h.output]
            assert kinds == [RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER] * 2

    @pytest.mark.parametrize(
        ("kinds", "why"),
        [
            (pa.array(["+I"]), "3 rows with 1 row kinds"),
            (pa.array(["+I", "+X", "+I"]), "unknown row kind '\\+X'"),
            (pa.array(["+I", None, "+I"]), "unknown row kind None"),
            (pa.array([1, 2, 3]), "of type int64"),
        ],
    )
    def test_bad_kinds_are_refused(self, kinds: pa.Array, why: str, tmp_path: Path) -> None:
        """Kinds that are not one known symbol per row raise ``InputError``."""

        class Bad(StreamingJoin):
            def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
                ctx.emit_batch([batch.column(n) for n in ("id", "k", "v")] * 2, kinds)

        with (
            OperatorHarness(make(Bad, JoinType.INNER, True), path=tmp_path) as h,
            pytest.raises(InputError, match=why),
        ):
            h.process_rows([(1, 1, 1), (2, 2, 2), (3, 3, 3)], side=0)


SPARK_SIDE = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.int64())])
FILES = pa.schema([*SPARK_SIDE, ("seq", pa.int64()), ("row_kind", pa.string())])


@pytest.mark.spark
class TestThroughSpark:
    @pytest.mark.parametrize("join_type", [JoinType.INNER, JoinType.FULL])
    def test_each_batch_equals_sparks_batch_join(
        self, join_type: JoinType, spark: Any, tmp_path: Path
    ) -> None:
        """Through the Spark runner (2 partitions, 3 batches of inserts and
        deletes), the materialised output of the inner and the full join
        with the option equals Spark SQL's join of the live rows after each
        batch."""

        rnd = random.Random(11)
        live: list[list[tuple[int, int, int]]] = [[], []]
        files: list[list[pa.Table]] = [[], []]
        after = []
        seq = 0
        for _ in range(3):
            rows: list[list[list[Any]]] = [[], []]
            for _ in range(80):
                side = rnd.randrange(2)
                seq += 1
                if live[side] and rnd.random() < 0.3:
                    old = live[side].pop(rnd.randrange(len(live[side])))
                    rows[side].append([*old, seq, RowKind.DELETE.value])
                else:
                    new = (seq, rnd.randrange(5), rnd.randrange(3))
                    live[side].append(new)
                    rows[side].append([*new, seq, RowKind.INSERT.value])
            for side in (0, 1):
                records = [dict(zip(FILES.names, r, strict=True)) for r in rows[side]]
                files[side].append(pa.Table.from_pylist(records, FILES))
            after.append([list(live[0]), list(live[1])])
        join = StreamingJoin(
            join_type,
            SPARK_SIDE,
            SPARK_SIDE,
            ["k"],
            ["k"],
            ["id"],
            ["id"],
            right_prefix="r_",
            whole_micro_batch=True,
        )
        query, sink = run_join(spark, tmp_path, files, join)
        assert len(query.history) == 3
        out = sink.read(spark).collect()
        held: Counter[tuple[Any, ...]] = Counter()
        for batch in range(3):
            for r in out:
                if r["batch"] == batch:
                    row = tuple(r[c] for c in ("id", "k", "v", "r_id", "r_k", "r_v"))
                    held[row] += 1 if RowKind(r["row_kind"]).is_accumulate else -1
            for side, name in ((0, "l"), (1, "r")):
                spark.createDataFrame(
                    after[batch][side], "id long, k long, v long"
                ).createOrReplaceTempView(name)
            expected = Counter(
                tuple(r)
                for r in spark.sql(
                    f"SELECT l.*, r.* FROM l {join_type.value.upper()} JOIN r ON l.k = r.k"
                ).collect()
            )
            assert +held == expected, f"batch {batch}"
            assert all(n >= 0 for n in held.values())
