"""``StreamingJoin(whole_micro_batch=True)`` (operators/join/_whole.py)
against the join without it: the same rows in the same order, the same
state and state metrics; micro-batches it cannot take go by the rules; the
joins it cannot take refuse it; and through the Spark runner."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from operators import OperatorContext, ParquetSink, RowKind, run_operator
from operators._api.dirty import InputPolicy
from operators._tools.demo import write_batches
from operators.errors import InputError
from operators.join import JoinType, StreamingJoin, _streaming
from operators.testing import OperatorHarness
from tests.operators.join import test_join_differential as differential
from tests.operators.join.test_join_batch import (
    NULLABLE,
    RowAtATime,
    _state_metrics,
    changes,
    dirty_changes,
    make,
    nullable_changes,
)

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


class TestSameAsTheRules:
    @pytest.mark.parametrize("unique", [True, False])
    @pytest.mark.parametrize("held_rows", [1_000_000, 0])
    def test_same_rows_state_and_metrics(
        self, unique: bool, held_rows: int, taken: list[bool], tmp_path: Path
    ) -> None:
        """Over random runs of inserts, ``+U``, ``-U`` and deletes of live rows
        (few join keys, so rows match many), each micro-batch is joined whole
        and emits the rows the rules emit record at a time, in order; the
        state and state metrics are the same; reading the sides whole or by
        key (``held_rows=0``) alike."""
        for seed in range(8):
            runs = changes(seed, 30)
            got = outputs(
                make(Whole, JoinType.INNER, unique, held_rows), runs, tmp_path / f"w{seed}"
            )
            want = outputs(make(RowAtATime, JoinType.INNER, unique), runs, tmp_path / f"r{seed}")
            assert got == want, f"seed {seed}"
        assert taken and all(taken)

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

    def test_sqlite_differential(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        """The join differential's random runs (several partitions, restores
        after failed attempts, upserts, nulls), with the option wherever the
        run's join allows it, still equal SQLite's join after every batch."""
        plain = differential.Config.join
        with_option = 0

        def join(config: differential.Config) -> StreamingJoin:
            nonlocal with_option
            made = plain(config)
            if config.join_type is JoinType.INNER and not config.with_condition:
                with_option += 1
                made.whole_micro_batch = True
            return made

        monkeypatch.setattr(differential.Config, "join", join)
        for seed in range(120):
            differential.run(seed, "memory", tmp_path / str(seed), None)
        assert with_option > 10


class TestByTheRules:
    @pytest.mark.parametrize("unique", [True, False])
    def test_dirty_micro_batches(self, unique: bool, taken: list[bool], tmp_path: Path) -> None:
        """Under unknown_retractions='apply', micro-batches with retractions of
        rows never stored, upserts and repeated rows go by the rules in
        order: the same output, state and state metrics as without the
        option."""
        policy = InputPolicy.of("apply", None, "j")
        for seed in range(6):
            runs = dirty_changes(seed)
            got = outputs(make(Whole, JoinType.INNER, unique), runs, tmp_path / f"w{seed}", policy)
            want = outputs(
                make(StreamingJoin, JoinType.INNER, unique), runs, tmp_path / f"r{seed}", policy
            )
            assert got == want, f"seed {seed}"
        assert False in taken

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
            ({"join_type": JoinType.LEFT}, "left join"),
            ({"join_type": JoinType.FULL}, "full join"),
            ({"condition": lambda left, right: True}, "condition"),
            ({"left_ttl_ms": 1000}, "TTL"),
            ({"left": pa.schema([("id", pa.int64()), ("k", pa.float64())])}, "'k' \\(double\\)"),
            ({"whole_micro_batch": 1}, "True or False"),
        ],
    )
    def test_where_it_cannot_apply(self, kwargs: dict[str, Any], why: str) -> None:
        """An outer join, a condition, a TTL, a float in a side's identity
        (here its join key) or a value not a bool is refused when the join is
        made, naming why."""
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
        column is refused; with one, it is only a value, and allowed."""
        schema = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("price", pa.float64())])
        with pytest.raises(InputError, match="'price'"):
            StreamingJoin(
                JoinType.INNER,
                schema,
                schema,
                ["k"],
                ["k"],
                whole_micro_batch=True,
                right_prefix="r_",
            )
        join = StreamingJoin(
            JoinType.INNER,
            schema,
            schema,
            ["k"],
            ["k"],
            ["id"],
            ["id"],
            right_prefix="r_",
            whole_micro_batch=True,
        )
        assert join.whole_micro_batch


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
    def test_each_batch_equals_sparks_batch_join(self, spark: Any, tmp_path: Path) -> None:
        """Through the Spark runner (2 partitions, 3 batches of inserts and
        deletes), the materialised output of the inner join with the option
        equals Spark SQL's join of the live rows after each batch."""
        from pyspark.sql.pandas.types import from_arrow_schema

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
        streams = []
        for side in (0, 1):
            write_batches(tmp_path / f"side{side}", files[side], prefix="part")
            streams.append(
                spark.readStream.schema(from_arrow_schema(FILES))
                .option("maxFilesPerTrigger", 1)
                .parquet(str(tmp_path / f"side{side}"))
            )
        join = StreamingJoin(
            JoinType.INNER,
            SPARK_SIDE,
            SPARK_SIDE,
            ["k"],
            ["k"],
            ["id"],
            ["id"],
            right_prefix="r_",
            whole_micro_batch=True,
        )
        sink = ParquetSink(str(tmp_path / "out"))
        query = run_operator(
            streams,
            join,
            keys=[["k"], ["k"]],
            partitions=2,
            checkpoint=str(tmp_path / "ck"),
            sink=sink,
            sequence_column="seq",
            trigger={"availableNow": True},
        )
        query.awaitTermination()
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
                tuple(r) for r in spark.sql("SELECT l.*, r.* FROM l JOIN r ON l.k = r.k").collect()
            )
            assert +held == expected, f"batch {batch}"
            assert all(n >= 0 for n in held.values())
