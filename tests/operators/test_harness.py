"""OperatorHarness: what it returns, versions, timers and watermarks, and bad
input, on both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute
import pytest

from encoding import TableSchema
from operators._api.changelog import ROW_KIND, RowKind
from operators._api.operator import Operator, OperatorContext, TimeDomain, Timer
from operators.errors import InputError
from operators.testing import OperatorHarness
from statestore import ConsistencyMode, InconsistencyError, VersionNotFoundError

INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE


class Probe(Operator):
    """A test operator. A plain row ``(key, value)`` is upserted into (or, when
    it retracts, deleted from) the table ``seen`` and echoed with its kind. A
    row whose key is ``event:NAME``, ``processing:NAME`` or ``delete:NAME``
    registers or deletes the timer ``(value, NAME)``. A fired timer emits
    ``("fired:DOMAIN:NAME", time)``; a timer named ``again:NAME`` then
    registers ``(time - 1, NAME)``, already due, and one named ``cancel:NAME``
    deletes ``(time + 1, NAME)``. ``on_watermark`` emits ``("watermark", w)``.
    """

    name = "probe"
    inputs = (
        pa.schema(
            [
                pa.field("key", pa.string(), nullable=False),
                pa.field("value", pa.int64(), nullable=False),
            ]
        ),
    )
    output = pa.schema([("key", pa.string()), ("value", pa.int64())])
    tables = (
        TableSchema(
            1,
            pa.schema([pa.field("key", pa.string(), nullable=False), ("value", pa.int64())]),
            ["key"],
            name="seen",
        ),
    )

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        key, value = row
        action, _, name = key.partition(":")
        if action == "event":
            ctx.register_timer(Timer(value, name, TimeDomain.EVENT_TIME))
        elif action == "processing":
            ctx.register_timer(Timer(value, name, TimeDomain.PROCESSING_TIME))
        elif action == "delete":
            ctx.delete_timer(Timer(value, name, TimeDomain.EVENT_TIME))
        else:
            seen = ctx.table("seen")
            if kind.is_accumulate:
                seen.upsert((key, value))
            else:
                seen.delete_key((key,))
            ctx.emit((key, value), kind)

    def on_timer(self, ctx: OperatorContext, timer: Timer) -> None:
        ctx.emit((f"fired:{timer.domain.value}:{timer.key}", timer.time))
        action, _, name = timer.key.partition(":")
        if action == "again":
            ctx.register_timer(Timer(timer.time - 1, name, timer.domain))
        elif action == "cancel":
            ctx.delete_timer(Timer(timer.time + 1, name, timer.domain))

    def on_watermark(self, ctx: OperatorContext, watermark: int) -> None:
        ctx.emit(("watermark", watermark))


class Inserter(Probe):
    """Probe whose plain rows are inserted without a read: a second insert of a
    key contradicts the table."""

    consistency = ConsistencyMode.UNCHECKED

    def process_row(
        self, ctx: OperatorContext, row: tuple[Any, ...], kind: RowKind, side: int
    ) -> None:
        ctx.table("seen").insert(row)


class Closer(Probe):
    """Probe that emits ``("closed", batch_id)`` when a batch closes."""

    def close(self, ctx: OperatorContext) -> None:
        ctx.emit(("closed", ctx.batch_id))


def fired(name: str, time: int, domain: str = "event_time") -> tuple[RowKind, tuple[str, int]]:
    """What Probe emits when a timer fires."""
    return INS, (f"fired:{domain}:{name}", time)


@pytest.fixture(params=["memory", "rocksdb"])
def make_harness(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., OperatorHarness]]:
    """Opens harnesses on one backend (RocksDB under tmp_path); all closed at the end."""
    opened: list[OperatorHarness] = []

    def make(operator: Operator | None = None, consistency: str | None = None) -> OperatorHarness:
        path = tmp_path / f"h{len(opened)}"
        harness = OperatorHarness(
            operator or Probe(), backend=request.param, path=path, consistency=consistency
        )
        opened.append(harness)
        return harness

    yield make
    for harness in opened:
        harness.close()


@pytest.fixture
def harness(make_harness: Callable[..., OperatorHarness]) -> OperatorHarness:
    """A harness running Probe."""
    return make_harness()


def seen(harness: OperatorHarness) -> list[tuple[Any, ...]]:
    """The rows of Probe's table."""
    return list(harness.table("seen").scan())


class TestOperatorHarness:
    # -- what calls return ---------------------------------------------------------

    def test_process_element_returns_what_was_emitted(self, harness: OperatorHarness) -> None:
        """process_element returns exactly the rows the operator emitted for it, with kinds."""
        assert harness.process_element(("a", 1)) == [(INS, ("a", 1))]
        assert harness.process_element(("a", 1), "-D") == [(DEL, ("a", 1))]
        assert harness.process_element(("event:t", 5)) == []

    def test_process_rows_returns_rows_in_order(self, harness: OperatorHarness) -> None:
        """process_rows returns the emitted rows in input order; kinds are RowKinds or symbols."""
        rows = [("a", 1), ("b", 2), ("a", 1), ("a", 3), ("b", 2)]
        kinds: list[RowKind | str] = [INS, "+I", UB, "+U", DEL]
        assert harness.process_rows(rows, kinds) == [
            (INS, ("a", 1)),
            (INS, ("b", 2)),
            (UB, ("a", 1)),
            (UA, ("a", 3)),
            (DEL, ("b", 2)),
        ]
        assert seen(harness) == [("a", 3)]

    def test_process_rows_defaults_to_inserts(self, harness: OperatorHarness) -> None:
        """Without kinds every row is an insert; no rows emit nothing."""
        assert harness.process_rows([("a", 1), ("b", 2)]) == [(INS, ("a", 1)), (INS, ("b", 2))]
        assert harness.process_rows([]) == []

    def test_process_batch_with_and_without_row_kinds(self, harness: OperatorHarness) -> None:
        """process_batch takes an Arrow batch as the runner gives it: a row-kind column,
        or none (append-only), and extra columns are ignored."""
        plain = pa.record_batch(
            {"key": ["a", "b"], "value": pa.array([1, 2], pa.int64()), "extra": [0.5, 1.5]}
        )
        assert harness.process_batch(plain) == [(INS, ("a", 1)), (INS, ("b", 2))]
        changelog = pa.record_batch(
            {ROW_KIND: ["-U", "+U"], "key": ["a", "a"], "value": pa.array([1, 7], pa.int64())}
        )
        assert harness.process_batch(changelog) == [(UB, ("a", 1)), (UA, ("a", 7))]
        assert seen(harness) == [("a", 7), ("b", 2)]

    def test_process_arrow_returns_arrow(self, harness: OperatorHarness) -> None:
        """process_arrow returns what the operator emitted as one Arrow batch
        with the row-kind column last, and leaves output alone."""
        batch = pa.record_batch(
            {ROW_KIND: ["+I", "-D"], "key": ["a", "b"], "value": pa.array([1, 2], pa.int64())}
        )
        out = harness.process_arrow(batch)
        assert out.schema.names == ["key", "value", ROW_KIND]
        assert out.to_pylist() == [
            {"key": "a", "value": 1, ROW_KIND: "+I"},
            {"key": "b", "value": 2, ROW_KIND: "-D"},
        ]
        assert harness.output == []
        assert seen(harness) == [("a", 1)]

    def test_output_accumulates(self, harness: OperatorHarness) -> None:
        """output holds everything emitted so far, across calls and commits, in order."""
        harness.process_element(("a", 1))
        harness.process_element(("event:t", 3))
        harness.commit()
        harness.process_element(("b", 2))
        harness.advance_watermark(10)
        assert harness.output == [
            (INS, ("a", 1)),
            (INS, ("b", 2)),
            fired("t", 3),
            (INS, ("watermark", 10)),
        ]

    # -- versions --------------------------------------------------------------------

    def test_commit_returns_batch_ids(self, harness: OperatorHarness) -> None:
        """Successive commits return batch ids 0, 1, 2, empty batches included."""
        harness.process_element(("a", 1))
        assert harness.commit() == 0
        assert harness.commit() == 1
        harness.process_element(("b", 1))
        assert harness.commit() == 2
        assert harness.batch_id == 3

    def test_rows_emitted_in_close_reach_the_output(
        self, make_harness: Callable[..., OperatorHarness]
    ) -> None:
        """What an operator emits in close (at commit) is in the output."""
        harness = make_harness(Closer())
        harness.process_element(("a", 1))
        harness.commit()
        assert harness.output == [(INS, ("a", 1)), (INS, ("closed", 0))]

    def test_restore_gives_the_state_after_the_version(self, harness: OperatorHarness) -> None:
        """restore(v) brings back the state committed as v, drops the batch in
        progress, and the next commit is v + 1."""
        harness.process_element(("a", 1))
        harness.commit()
        harness.process_element(("a", 2), "+U")
        harness.process_element(("b", 1))
        harness.commit()
        harness.process_element(("c", 1))
        harness.commit()
        harness.process_element(("d", 1))  # not committed
        harness.restore(1)
        assert seen(harness) == [("a", 2), ("b", 1)]
        harness.restore(0)
        assert seen(harness) == [("a", 1)]
        harness.process_element(("e", 5))
        assert harness.commit() == 1
        harness.restore(1)
        assert seen(harness) == [("a", 1), ("e", 5)]
        assert harness.commit() == 2

    def test_restore_none_gives_the_empty_state(self, harness: OperatorHarness) -> None:
        """restore(None) empties every table, forgets the watermark, and the next commit is 0."""
        harness.process_element(("a", 1))
        harness.process_element(("event:t", 3))
        harness.advance_watermark(1)
        harness.commit()
        harness.restore(None)
        assert seen(harness) == []
        assert harness.watermark is None
        assert harness.advance_watermark(100) == [(INS, ("watermark", 100))]
        assert harness.commit() == 0

    def test_restore_of_an_unknown_version_raises(self, harness: OperatorHarness) -> None:
        """Restoring a version that was never committed raises VersionNotFoundError."""
        harness.commit()
        with pytest.raises(VersionNotFoundError):
            harness.restore(5)

    def test_restore_brings_back_the_watermark(self, harness: OperatorHarness) -> None:
        """The watermark is restored with the version, so on_watermark runs again
        when it advances past it."""
        harness.advance_watermark(10)
        harness.commit()
        harness.advance_watermark(20)
        harness.commit()
        harness.restore(0)
        assert harness.watermark == 10
        assert harness.advance_watermark(10) == []
        assert harness.advance_watermark(15) == [(INS, ("watermark", 15))]

    def test_last_metrics_after_commit(self, harness: OperatorHarness) -> None:
        """commit leaves the batch's counters in last_metrics: output rows and the
        state metrics of the operator's tables (timers excluded)."""
        harness.process_rows([("a", 1), ("b", 2), ("event:t", 1)])
        harness.process_element(("b", 2), "-D")
        harness.advance_watermark(1)
        harness.commit()
        m = harness.last_metrics
        assert m["numOutputRows"] == 5  # a, b, -b, the timer, the watermark
        assert m["numTotalStateRows"] == 1
        assert m["numUpdatedStateRows"] == 2
        assert m["numRemovedStateRows"] == 1
        assert harness.metrics == {}

    def test_consistency_mode(self, make_harness: Callable[..., OperatorHarness]) -> None:
        """The harness uses the operator's consistency mode unless told otherwise:
        unchecked lets the newest insert win, strict raises InconsistencyError."""
        unchecked = make_harness(Inserter())
        unchecked.process_rows([("a", 1), ("a", 2)])
        assert seen(unchecked) == [("a", 2)]
        strict = make_harness(Inserter(), consistency="strict")
        strict.process_element(("a", 1))
        with pytest.raises(InconsistencyError, match="insert over an existing row"):
            strict.process_element(("a", 2))
        assert seen(strict) == [("a", 1)]

    # -- timers and watermarks -------------------------------------------------------------

    def test_event_timers_fire_in_time_order_once(self, harness: OperatorHarness) -> None:
        """Event-time timers fire when the watermark reaches them, in time order
        (then by name), each once; on_watermark comes after them."""
        harness.process_rows([("event:c", 30), ("event:a", 10), ("event:b", 10), ("event:d", 40)])
        assert harness.advance_watermark(9) == [(INS, ("watermark", 9))]
        assert harness.advance_watermark(30) == [
            fired("a", 10),
            fired("b", 10),
            fired("c", 30),
            (INS, ("watermark", 30)),
        ]
        assert harness.advance_watermark(35) == [(INS, ("watermark", 35))]
        assert harness.advance_watermark(1000) == [fired("d", 40), (INS, ("watermark", 1000))]

    def test_registering_twice_fires_once(self, harness: OperatorHarness) -> None:
        """The same timer registered twice (even across batches) fires once."""
        harness.process_rows([("event:t", 5), ("event:t", 5)])
        harness.commit()
        harness.process_element(("event:t", 5))
        assert harness.advance_watermark(5) == [fired("t", 5), (INS, ("watermark", 5))]

    def test_processing_time_timers(self, harness: OperatorHarness) -> None:
        """Processing-time timers fire in time order when processing time reaches
        them, independently of the watermark."""
        harness.process_rows([("processing:b", 200), ("processing:a", 100), ("event:e", 100)])
        assert harness.set_processing_time(99) == []
        assert harness.set_processing_time(250) == [
            fired("a", 100, "processing_time"),
            fired("b", 200, "processing_time"),
        ]
        assert harness.set_processing_time(300) == []

    def test_deleted_timer_does_not_fire(self, harness: OperatorHarness) -> None:
        """A deleted timer does not fire; deleting an unknown one does nothing."""
        harness.process_rows([("event:t", 5), ("event:u", 6)])
        harness.commit()
        harness.process_rows([("delete:t", 5), ("delete:nothing", 1)])
        assert harness.advance_watermark(10) == [fired("u", 6), (INS, ("watermark", 10))]

    def test_timer_deleted_while_firing_does_not_fire(self, harness: OperatorHarness) -> None:
        """A due timer that an earlier timer of the same call deletes does not fire."""
        harness.process_rows([("event:cancel:t", 5), ("event:t", 6), ("event:u", 7)])
        assert harness.advance_watermark(10) == [
            fired("cancel:t", 5),
            fired("u", 7),
            (INS, ("watermark", 10)),
        ]

    def test_timer_registered_while_firing_and_due_fires_in_the_same_call(
        self, harness: OperatorHarness
    ) -> None:
        """A timer that a firing timer registers, already due, fires in the same call."""
        harness.process_element(("event:again:again:t", 10))
        assert harness.advance_watermark(20) == [
            fired("again:again:t", 10),
            fired("again:t", 9),
            fired("t", 8),
            (INS, ("watermark", 20)),
        ]
        harness.process_element(("processing:again:p", 10))
        assert harness.set_processing_time(10) == [
            fired("again:p", 10, "processing_time"),
            fired("p", 9, "processing_time"),
        ]

    def test_timers_survive_commit_and_restore(self, harness: OperatorHarness) -> None:
        """Registered timers are state: restoring a version brings back its timers,
        including ones that fired after it."""
        harness.process_rows([("event:t", 5), ("processing:p", 50)])
        harness.commit()
        harness.restore(0)
        assert harness.advance_watermark(5) == [fired("t", 5), (INS, ("watermark", 5))]
        assert harness.set_processing_time(50) == [fired("p", 50, "processing_time")]
        harness.commit()
        harness.restore(0)  # processing time is not state: it stays at 50
        assert harness.advance_watermark(7) == [
            fired("t", 5),
            fired("p", 50, "processing_time"),
            (INS, ("watermark", 7)),
        ]
        harness.restore(1)
        assert harness.advance_watermark(100) == [(INS, ("watermark", 100))]

    def test_on_watermark_only_when_it_advances(self, harness: OperatorHarness) -> None:
        """on_watermark runs when the watermark moves forward, never when it stays or goes back."""
        assert harness.advance_watermark(5) == [(INS, ("watermark", 5))]
        assert harness.advance_watermark(5) == []
        assert harness.advance_watermark(3) == []
        assert harness.watermark == 5
        harness.commit()
        assert harness.advance_watermark(5) == []
        assert harness.advance_watermark(6) == [(INS, ("watermark", 6))]

    # -- bad input ---------------------------------------------------------------------------

    def _bad_input_leaves_state(
        self, harness: OperatorHarness, feed: Callable[[], object], match: str
    ) -> None:
        harness.process_rows([("a", 1), ("event:t", 5)])
        harness.commit()
        harness.process_element(("b", 2))
        with pytest.raises(InputError, match=match):
            feed()
        assert seen(harness) == [("a", 1), ("b", 2)]
        assert harness.table("seen").row_count == 2
        harness.commit()
        harness.restore(1)
        assert seen(harness) == [("a", 1), ("b", 2)]
        assert harness.advance_watermark(5) == [fired("t", 5), (INS, ("watermark", 5))]

    def test_missing_column(self, harness: OperatorHarness) -> None:
        """A batch without an input column raises InputError naming it; state is untouched."""
        batch = pa.record_batch({"key": ["x"]})
        self._bad_input_leaves_state(
            harness, lambda: harness.process_batch(batch), "has no column 'value'"
        )

    def test_wrong_type(self, harness: OperatorHarness) -> None:
        """A column of another type raises InputError naming both types; state is untouched."""
        batch = pa.record_batch({"key": ["x"], "value": pa.array([1], pa.int32())})
        self._bad_input_leaves_state(
            harness, lambda: harness.process_batch(batch), "has type int32, expected int64"
        )

    def test_rows_that_do_not_fit_the_schema(self, harness: OperatorHarness) -> None:
        """Rows of the wrong width or with values of the wrong type raise InputError."""
        self._bad_input_leaves_state(
            harness, lambda: harness.process_element(("x", "not a number")), "do not fit"
        )
        with pytest.raises(InputError, match="row of 3 values"):
            harness.process_element(("x", 1, 2))

    def test_unknown_row_kind(self, harness: OperatorHarness) -> None:
        """An unknown row kind raises InputError, whether given to process_rows or
        in a batch's row-kind column; state is untouched."""
        self._bad_input_leaves_state(
            harness,
            lambda: harness.process_rows([("x", 1), ("y", 2)], ["+I", "+X"]),
            r"unknown row kind\(s\) \[\"'\+X'\"\]",
        )
        batch = pa.record_batch(
            {"key": ["x"], "value": pa.array([1], pa.int64()), ROW_KIND: [None]}
        )
        with pytest.raises(InputError, match="unknown row kind"):
            harness.process_batch(batch)

    def test_null_in_a_non_nullable_column(self, harness: OperatorHarness) -> None:
        """A null in a column declared not nullable raises InputError; state is untouched."""
        self._bad_input_leaves_state(
            harness,
            lambda: harness.process_rows([("x", 1), ("y", None)]),
            "'value' of input 0 .* holds nulls",
        )

    def test_unknown_side(self, harness: OperatorHarness) -> None:
        """Feeding an input the operator does not have raises InputError."""
        with pytest.raises(InputError, match="has 1 input"):
            harness.process_element(("x", 1), side=1)
        batch = pa.record_batch({"key": ["x"], "value": pa.array([1], pa.int64())})
        with pytest.raises(InputError, match="has 1 input"):
            harness.process_batch(batch, side=1)


class BatchEmitter(Probe):
    """Probe that echoes each input batch twice around one plain row: once
    with ``emit_batch`` as inserts, a marker row with ``emit``, then the
    values doubled with ``emit_batch`` as ``-U`` rows."""

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        keys, values = batch.column("key"), batch.column("value")
        ctx.emit_batch([keys, values])
        ctx.emit(("marker", batch.num_rows))
        ctx.emit_batch([keys, pa.compute.multiply(values, 2)], UB)


class TestEmitBatch:
    def test_batches_and_rows_keep_their_order_and_kinds(
        self, make_harness: Callable[..., OperatorHarness]
    ) -> None:
        """Rows emitted as a batch and one at a time come out in emit order,
        each batch with its own kind, and count as output rows."""
        h = make_harness(BatchEmitter())
        out = h.process_rows([("a", 1), ("b", 2)])
        assert out == [
            (INS, ("a", 1)),
            (INS, ("b", 2)),
            (INS, ("marker", 2)),
            (UB, ("a", 2)),
            (UB, ("b", 4)),
        ]
        h.commit()
        assert h.last_metrics["numOutputRows"] == 5

    def test_columns_are_cast_to_the_output_types(
        self, make_harness: Callable[..., OperatorHarness]
    ) -> None:
        """A column of another type that fits is cast to the output schema's."""

        class Narrow(BatchEmitter):
            def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
                ctx.emit_batch([batch.column("key"), batch.column("value").cast(pa.int32())])

        assert make_harness(Narrow()).process_rows([("a", 7)]) == [(INS, ("a", 7))]

    def test_wrong_width_or_type_is_refused(
        self, make_harness: Callable[..., OperatorHarness]
    ) -> None:
        """A batch with too few columns, or a column that cannot be cast, is an
        InputError naming the problem."""

        class Short(BatchEmitter):
            def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
                ctx.emit_batch([batch.column("key")])

        class Wrong(BatchEmitter):
            def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
                ctx.emit_batch([batch.column("key"), batch.column("key")])

        with pytest.raises(InputError, match="emitted 1 columns"):
            make_harness(Short()).process_rows([("a", 1)])
        with pytest.raises(InputError, match="'value' of type string"):
            make_harness(Wrong()).process_rows([("a", 1)])

    def test_rows_emitted_as_lists_keep_their_order_and_kinds(
        self, make_harness: Callable[..., OperatorHarness]
    ) -> None:
        """Rows handed over with ``emit_rows`` come out in order with their
        own kinds, after rows emitted before them; a kind list of another
        length is an InputError."""

        class Lists(BatchEmitter):
            def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
                ctx.emit(("first", 0))
                ctx.emit_rows([("a", 1), ("b", 2)], [UB, UA])

        class Uneven(BatchEmitter):
            def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
                ctx.emit_rows([("a", 1)], [])

        out = make_harness(Lists()).process_rows([("x", 1)])
        assert out == [(INS, ("first", 0)), (UB, ("a", 1)), (UA, ("b", 2))]
        with pytest.raises(InputError, match="1 rows with 0 row kinds"):
            make_harness(Uneven()).process_rows([("a", 1)])


class TestTimerLoops:
    def test_timer_that_rearms_itself_fires_once_per_call(self) -> None:
        """A timer whose on_timer registers itself again (already due) fires
        once per firing call instead of looping forever."""
        from operators import Operator, Timer
        from operators.testing import OperatorHarness

        class Rearm(Operator):
            name = "rearm"
            inputs = (pa.schema([("k", pa.string())]),)
            output = pa.schema([("k", pa.string())])

            def process_row(self, ctx: OperatorContext, row: Any, kind: RowKind, side: int) -> None:
                ctx.register_timer(Timer(5, "t"))

            def on_timer(self, ctx: OperatorContext, timer: Timer) -> None:
                ctx.emit(("fired",))
                ctx.register_timer(timer)

        with OperatorHarness(Rearm()) as harness:
            harness.process_element(("x",))
            assert len(harness.advance_watermark(10)) == 1
            assert len(harness.advance_watermark(11)) == 1
