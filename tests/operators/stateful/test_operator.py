"""StatefulProcessorOperator through OperatorHarness: every handle call, TTL
at its boundary, timers in both time modes, initial state, deleteIfExists,
bad input."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from _processors import (
    Chain,
    DeletesOld,
    Everything,
    PandasRunningCount,
    RunningCount,
    Timeout,
    TtlEverything,
)
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor

from operators import RowKind
from operators.errors import InputError
from operators.stateful import StatefulProcessorOperator
from operators.testing import OperatorHarness, PipelineHarness

KV = pa.schema([("key", pa.string()), ("value", pa.string())])
OPS = pa.schema([("key", pa.string()), ("op", pa.string()), ("arg", pa.string())])
EVENTS = pa.schema(
    [("key", pa.string()), ("value", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))]
)
INS = RowKind.INSERT


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each case on both state backends."""
    return str(request.param)


def harness(op: StatefulProcessorOperator, backend: str) -> OperatorHarness:
    return OperatorHarness(op, backend, consistency="strict")


def calls(h: OperatorHarness, *ops: tuple[str, str | None]) -> list[str]:
    """Run ``ops`` for key ``a`` in order; what each returned."""
    out = h.process_rows([("a", op, arg) for op, arg in ops])
    return [row[2] for _, row in out]


class TestHandle:
    def everything(self, backend: str, processor: StatefulProcessor | None = None) -> Any:
        op = StatefulProcessorOperator(
            processor or Everything(), OPS, ["key"], "key string, op string, result string"
        )
        return harness(op, backend)

    def test_value_state_calls(self, backend: str) -> None:
        """ValueState: exists/get before a value, update, get, clear, across commits."""
        h = self.everything(backend)
        assert calls(
            h, ("v.exists", None), ("v.get", None), ("v.update", "x"), ("v.get", None)
        ) == ["False", "None", "None", "('x',)"]
        h.commit()
        assert calls(h, ("v.exists", None), ("v.clear", None), ("v.get", None)) == [
            "True",
            "None",
            "None",
        ]
        h.commit()
        assert calls(h, ("v.exists", None)) == ["False"]
        assert list(h.table("value").scan()) == []

    def test_list_state_calls(self, backend: str) -> None:
        """ListState: appendValue, appendList, put, clear, get in order across commits."""
        h = self.everything(backend)
        assert calls(h, ("l.exists", None), ("l.appendValue", "a"), ("l.appendList", "b,c")) == [
            "False",
            "None",
            "None",
        ]
        h.commit()
        assert calls(h, ("l.get", None), ("l.appendValue", "d"), ("l.get", None)) == [
            "[('a',), ('b',), ('c',)]",
            "None",
            "[('a',), ('b',), ('c',), ('d',)]",
        ]
        h.commit()
        assert calls(h, ("l.put", "x,y"), ("l.get", None)) == ["None", "[('x',), ('y',)]"]
        h.commit()
        assert list(h.table("list").scan()) == [("a", 0, "x"), ("a", 1, "y")]
        assert calls(h, ("l.clear", None), ("l.exists", None), ("l.get", None)) == [
            "None",
            "False",
            "[]",
        ]
        h.commit()
        assert list(h.table("list").scan()) == []

    def test_map_state_calls(self, backend: str) -> None:
        """MapState: every call, the map's rows keyed by (key, user key)."""
        h = self.everything(backend)
        assert calls(
            h,
            ("m.exists", None),
            ("m.updateValue", "p"),
            ("m.updateValue", "q"),
            ("m.containsKey", "p"),
            ("m.getValue", "q"),
            ("m.getValue", "z"),
        ) == ["False", "None", "None", "True", "('q!',)", "None"]
        h.commit()
        assert list(h.table("map").scan()) == [("a", "p", "p!"), ("a", "q", "q!")]
        assert calls(
            h,
            ("m.iterator", None),
            ("m.keys", None),
            ("m.values", None),
            ("m.removeKey", "p"),
            ("m.keys", None),
            ("m.exists", None),
        ) == [
            "[(('p',), ('p!',)), (('q',), ('q!',))]",
            "[('p',), ('q',)]",
            "[('p!',), ('q!',)]",
            "None",
            "[('q',)]",
            "True",
        ]
        h.commit()
        assert calls(h, ("m.clear", None), ("m.exists", None)) == ["None", "False"]
        h.commit()
        assert list(h.table("map").scan()) == []

    def test_keys_are_apart(self, backend: str) -> None:
        """Two grouping keys in one batch see their own state."""
        h = self.everything(backend)
        out = h.process_rows([("a", "v.update", "1"), ("b", "v.get", None), ("a", "v.get", None)])
        assert [r[2] for _, r in out] == ["None", "('1',)", "None"] or sorted(
            r[2] for _, r in out
        ) == ["('1',)", "None", "None"]
        assert {r[0]: r[2] for _, r in out if r[1] == "v.get"} == {"a": "('1',)", "b": "None"}


class TestTtl:
    def ttl(self, backend: str) -> OperatorHarness:
        op = StatefulProcessorOperator(
            TtlEverything(), OPS, ["key"], "key string, op string, result string"
        )
        return harness(op, backend)

    def test_value_expires_at_write_plus_ttl(self, backend: str) -> None:
        """Written at t with TTL d: live at t + d - 1, gone at t + d (Spark's StateTTL)."""
        h = self.ttl(backend)
        h.processing_time = 1000
        calls(h, ("v.update", "x"))
        h.commit()
        h.processing_time = 1999
        assert calls(h, ("v.get", None)) == ["('x',)"]
        h.commit()
        h.processing_time = 2000
        assert calls(h, ("v.exists", None), ("v.get", None)) == ["False", "None"]
        h.commit()
        assert list(h.table("value").scan()) == [] and list(h.table("value$ttl").scan()) == []

    def test_update_resets_expiry(self, backend: str) -> None:
        """Updating a value moves its expiry to the update's time + TTL."""
        h = self.ttl(backend)
        h.processing_time = 1000
        calls(h, ("v.update", "x"))
        h.commit()
        h.processing_time = 1500
        calls(h, ("v.update", "y"))
        h.commit()
        h.processing_time = 2400
        assert calls(h, ("v.get", None)) == ["('y',)"]
        h.commit()
        assert list(h.table("value$ttl").scan()) == [(2500, "a")]

    def test_list_elements_expire_one_by_one(self, backend: str) -> None:
        """Each list element expires from its own append; exists() is whether any is left."""
        h = self.ttl(backend)
        h.processing_time = 1000
        calls(h, ("l.appendValue", "old"))
        h.commit()
        h.processing_time = 1600
        calls(h, ("l.appendValue", "new"))
        h.commit()
        h.processing_time = 2000
        assert calls(h, ("l.get", None), ("l.exists", None)) == ["[('new',)]", "True"]
        h.commit()
        h.processing_time = 2600
        assert calls(h, ("l.exists", None)) == ["False"]

    def test_map_entries_expire_one_by_one(self, backend: str) -> None:
        """Each map entry expires from its own update."""
        h = self.ttl(backend)
        h.processing_time = 1000
        calls(h, ("m.updateValue", "p"))
        h.commit()
        h.processing_time = 1500
        calls(h, ("m.updateValue", "q"))
        h.commit()
        h.processing_time = 2000
        assert calls(h, ("m.keys", None), ("m.containsKey", "p")) == ["[('q',)]", "False"]
        h.commit()
        h.processing_time = 2500
        assert calls(h, ("m.exists", None)) == ["False"]


class TestTimers:
    def test_processing_time_timer(self, backend: str) -> None:
        """A processing-time timer fires once, in the first batch whose time reaches it."""
        op = StatefulProcessorOperator(
            Timeout(1000),
            KV,
            ["key"],
            "key string, count long, seen string, fired long",
            time_mode="ProcessingTime",
        )
        h = harness(op, backend)
        h.processing_time = 10_000
        assert h.process_rows([("a", "x"), ("b", "y")]) == []
        h.commit()
        h.processing_time = 10_500
        h.process_rows([("a", "z")])
        assert list(h.table("$timers").scan()) == [("a", 11_500), ("b", 11_000)]
        h.commit()
        assert h.output == []
        h.processing_time = 11_000
        h.commit()
        assert h.output == [(INS, ("b", 1, "y", 11_000))]
        h.processing_time = 11_499
        h.commit()
        h.processing_time = 11_500
        h.commit()
        assert h.output[1:] == [(INS, ("a", 2, "z", 11_500))]
        assert list(h.table("$timers").scan()) == [] and list(h.table("__timers").scan()) == []

    def test_event_time_timer_and_late_rows(self, backend: str) -> None:
        """Event-time timers fire at the watermark; rows <= the previous watermark are dropped."""
        op = StatefulProcessorOperator(
            Timeout(1000, event_time=True),
            EVENTS,
            ["key"],
            "key string, count long, seen string, fired long",
            time_mode="EventTime",
            input_event_time="ts",
        )
        h = harness(op, backend)

        def at(ms: int) -> datetime:
            return datetime.fromtimestamp(ms / 1000, UTC)

        # Batch 0 registers a's timer at 0 + 1000; batch 1's rows come before
        # its timers, so a's row moves it to 5000 + 1000 before it is due.
        h.run_batch([(0, _events([("a", "x", at(5000))]))], watermark=None)
        out = h.run_batch(
            [(0, _events([("a", "late", at(4000)), ("b", "y", at(6000))]))], watermark=5000
        )
        assert h.last_metrics.get("numRowsDroppedByWatermark") in (None, 0)
        out2 = h.run_batch(
            [(0, _events([("b", "late", at(5000)), ("b", "ok", at(5001))]))], watermark=7000
        )
        assert h.last_metrics["numRowsDroppedByWatermark"] == 1
        # b's on-time row moved its timer to 8000; a's fires at 6000.
        assert [row for _, row in out + out2] == [("a", 2, "late", 6000)]


def _events(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [dict(zip(EVENTS.names, r, strict=True)) for r in rows], schema=EVENTS
    )


class TestInitialState:
    def test_rows_initial_state_in_batch_zero(self, backend: str) -> None:
        """handleInitialState runs once, in batch 0, before the rows of its key."""
        initial = pa.table({"key": ["a", "c"], "start": [10, 20]})
        op = StatefulProcessorOperator(
            RunningCount(), KV, ["key"], "key string, count long", initial_state=initial
        )
        h = harness(op, backend)
        assert h.process_rows([("a", "x")]) == [(INS, ("a", 11))]
        h.commit()
        assert list(h.table("count").scan()) == [("a", 11), ("c", 20)]
        assert h.process_rows([("c", "x")]) == [(INS, ("c", 21))]

    def test_pandas_initial_state_per_key(self, backend: str) -> None:
        """In the pandas flavour a key's initial rows come as one DataFrame."""
        import pandas as pd

        initial = pd.DataFrame({"key": ["a", "a"], "start": [1, 2]})
        op = StatefulProcessorOperator(
            PandasRunningCount(),
            KV,
            ["key"],
            "key string, count long",
            initial_state=initial,
            flavour="pandas",
        )
        h = harness(op, backend)
        assert h.process_rows([("a", "x"), ("a", "y")]) == [(INS, ("a", 5))]

    def test_initial_state_split_by_partition(self) -> None:
        """Each partition takes the initial keys Spark's hash routes to it."""
        from operators import Pipeline

        initial = pa.table({"key": [f"k{i}" for i in range(20)], "start": list(range(20))})
        pipeline = Pipeline()
        source = pipeline.source(KV, "input")
        op = StatefulProcessorOperator(
            RunningCount(), KV, ["key"], "key string, count long", initial_state=initial
        )
        pipeline.stage(op, source, keys=["key"])
        with PipelineHarness(pipeline, 3) as ph:
            rows = pa.table({"key": [f"k{i}" for i in range(20)], "value": ["x"] * 20})
            out = ph.run_batch({"input": rows})[op.name]
        got = sorted(
            zip(out.column("key").to_pylist(), out.column("count").to_pylist(), strict=True)
        )
        assert got == sorted((f"k{i}", i + 1) for i in range(20))


class TestDeleteIfExists:
    def test_deleted_variable_has_no_table_and_fails_on_use(self, backend: str) -> None:
        """deleteIfExists in init drops the variable: no table, a call on it fails (as Spark)."""
        op = StatefulProcessorOperator(DeletesOld(), KV, ["key"], "key string")
        assert [t.name for t in op.tables] == ["count"]
        assert op.deleted == ["tmp", "never_declared"]
        h = harness(op, backend)
        with pytest.raises(InputError, match="'tmp': exists after deleteIfExists"):
            h.process_rows([("a", "x")])


class TestBadInput:
    def test_nested_state_type_refused_at_build(self) -> None:
        """A state schema relstate cannot hold is refused at build, naming variable and call."""

        class Nested(StatefulProcessor):
            def init(self, handle: Any) -> None:
                handle.getValueState("tags", "t array<string>")

            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
                return iter([])

        with pytest.raises(InputError, match=r"'tags' \(getValueState\).*array"):
            StatefulProcessorOperator(Nested(), KV, ["key"], "key string")

    def test_bad_ttl_and_ddl_and_modes(self) -> None:
        """A non-positive TTL, unreadable DDL, unknown modes and a missing key are InputErrors."""

        class BadTtl(StatefulProcessor):
            def init(self, handle: Any) -> None:
                handle.getListState("l", "v int", 0)

            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
                return iter([])

        with pytest.raises(InputError, match=r"'l' .getListState.*ttlDurationMs"):
            StatefulProcessorOperator(BadTtl(), KV, ["key"], "key string")
        with pytest.raises(InputError, match="outputStructType"):
            StatefulProcessorOperator(RunningCount(), KV, ["key"], "key strung")
        with pytest.raises(InputError, match="outputMode"):
            StatefulProcessorOperator(RunningCount(), KV, ["key"], "key string", "Complete")
        with pytest.raises(InputError, match="timeMode"):
            StatefulProcessorOperator(RunningCount(), KV, ["key"], "key string", time_mode="Wall")
        with pytest.raises(InputError, match="grouping keys"):
            StatefulProcessorOperator(RunningCount(), KV, ["nope"], "key string")

    def test_state_use_in_init_and_timers_without_time_mode(self, backend: str) -> None:
        """State read in init is refused at build; a timer in timeMode None fails its batch."""

        class ReadsInInit(StatefulProcessor):
            def init(self, handle: Any) -> None:
                handle.getValueState("v", "x int").get()

            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
                return iter([])

        with pytest.raises(InputError, match=r"'v': get called in init"):
            StatefulProcessorOperator(ReadsInInit(), KV, ["key"], "key string")
        op = StatefulProcessorOperator(
            Timeout(), KV, ["key"], "key string, count long, seen string, fired long"
        )
        h = harness(op, backend)
        with pytest.raises(InputError, match="timeMode"):
            h.process_rows([("a", "x")])

    def test_wrong_value_fails_without_commit(self, backend: str) -> None:
        """A value that does not fit its schema fails the batch, naming the variable."""

        class Wrong(StatefulProcessor):
            def init(self, handle: Any) -> None:
                self.v = handle.getValueState("v", "x int")

            def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
                self.v.update(("not an int",))
                return iter([])

        h = harness(StatefulProcessorOperator(Wrong(), KV, ["key"], "key string"), backend)
        with pytest.raises(InputError, match="state variable 'v'"):
            h.process_rows([("a", "x")])
        h.restore(None)
        assert list(h.table("v").scan()) == []


def test_import_operators_does_not_import_pyspark() -> None:
    """`import operators` (and operators.stateful) leaves PySpark unimported."""
    code = (
        "import sys, operators, operators.stateful; "
        "assert not any(m == 'pyspark' or m.startswith('pyspark.') for m in sys.modules), "
        "sorted(m for m in sys.modules if m.startswith('pyspark'))[:5]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rows_out_by_name() -> None:
    """Output Rows are matched to the output schema by field name, as PySpark does."""

    class Reordered(RunningCount):
        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            list(rows)
            yield Row(count=7, key=key[0])

    h = OperatorHarness(
        StatefulProcessorOperator(Reordered(), KV, ["key"], "key string, count long")
    )
    assert h.process_rows([("a", "x")]) == [(INS, ("a", 7))]


class _Declares(StatefulProcessor):
    """Declares what it is given: (call, name, schema, ttl) tuples, and deletes names."""

    def __init__(self, *declared: tuple[str, str, str, int | None], deletes: tuple[str, ...] = ()):
        self.declared = declared
        self.deletes = deletes

    def init(self, handle: Any) -> None:
        self.states = {}
        for call, name, schema, ttl in self.declared:
            if call == "getMapState":
                self.states[name] = handle.getMapState(name, "k string", schema, ttl)
            else:
                self.states[name] = getattr(handle, call)(name, schema, ttl)
        for name in self.deletes:
            handle.deleteIfExists(name)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
        for row in rows:
            for state in self.states.values():
                if hasattr(state, "appendValue"):
                    state.appendValue((row.value,))
                elif hasattr(state, "updateValue"):
                    state.updateValue((row.value,), (row.value,))
                else:
                    state.update((row.value,))
        return iter([])

    def close(self) -> None:
        pass


class TestRestart:
    """A processor changed between runs of one checkpoint (check_state, as the runner calls it)."""

    def first_run(self, tmp_path: Any, processor: StatefulProcessor) -> list[Any]:
        from pyarrow.fs import LocalFileSystem

        from operators._checkpoint.location import StateLocation

        op = StatefulProcessorOperator(processor, KV, ["key"], "key string")
        with OperatorHarness(op, "rocksdb", path=tmp_path) as h:
            h.process_rows([("a", "x")])
            h.commit()
        location = StateLocation.of(LocalFileSystem(), str(tmp_path / "checkpoint"), "test")
        return location.stored_tables(op.name)

    def test_kind_change_refused(self, tmp_path: Any) -> None:
        """A variable stored as a value state and declared as a list is an InputError naming it."""
        stored = self.first_run(tmp_path, _Declares(("getValueState", "s", "v string", None)))
        op = StatefulProcessorOperator(
            _Declares(("getListState", "s", "v string", None)), KV, ["key"], "key string"
        )
        with pytest.raises(InputError, match=r"'s' \(getListState\).*as a value state"):
            op.check_state(stored)

    def test_value_type_change_refused(self, tmp_path: Any) -> None:
        """A value field whose type changed is refused, as Spark refuses it."""
        stored = self.first_run(tmp_path, _Declares(("getValueState", "s", "v string", None)))
        op = StatefulProcessorOperator(
            _Declares(("getValueState", "s", "v bigint", None)), KV, ["key"], "key string"
        )
        with pytest.raises(InputError, match="VALUE_SCHEMA_NOT_COMPATIBLE"):
            op.check_state(stored)

    def test_removed_variable_kept_deleted_variable_emptied(self, tmp_path: Any) -> None:
        """A variable init drops is kept; one it passes to deleteIfExists is emptied."""
        stored = self.first_run(
            tmp_path,
            _Declares(
                ("getValueState", "kept", "v string", None),
                ("getListState", "gone", "v string", 1000),
                ("getMapState", "m", "v string", None),
            ),
        )
        op = StatefulProcessorOperator(
            _Declares(("getMapState", "m", "v string", 500), deletes=("gone",)),
            KV,
            ["key"],
            "key string",
        )
        op.check_state(stored)
        assert sorted(op.purged) == ["gone", "gone$ttl"]
        with OperatorHarness(op, "rocksdb", path=tmp_path) as h:
            h.restore(0)
            h.process_rows([("a", "y")])
            h.commit()
            assert list(h.table("kept").scan()) == [("a", "x")]
            assert list(h.table("gone").scan()) == []
            # The TTL added to m: its old entry keeps no expiry, the new one has one.
            assert list(h.table("m").scan()) == [("a", "x", "x", None), ("a", "y", "y", 500)]


class TestSparkEdges:
    """Spark's behaviour where relstate's generic operator rules differ (38spark's findings)."""

    def test_operator_with_integer_key_pickles(self) -> None:
        """An operator grouped by an integer key pickles (its key codec is made where used)."""
        from pyspark import cloudpickle

        schema = pa.schema([("key", pa.int64()), ("value", pa.string())])
        op = StatefulProcessorOperator(
            Timeout(),
            schema,
            ["key"],
            "key long, count long, seen string, fired long",
            time_mode="ProcessingTime",
        )
        assert op.key_codec.decode(op.key_codec.encode((7,))) == (7,)
        copy = cloudpickle.loads(cloudpickle.dumps(op))
        h = OperatorHarness(copy)
        h.processing_time = 5
        h.process_rows([(7, "x")])
        h.commit()
        h.processing_time = 2000
        h.commit()
        assert h.output == [(INS, (7, 1, "x", 1005))]

    def test_timer_registered_by_a_timer_fires_next_batch(self, backend: str) -> None:
        """A timer a handleExpiredTimer registers, already due, fires next batch; key is a Row."""
        op = StatefulProcessorOperator(
            Chain(100), KV, ["key"], "key string, what string, at long", time_mode="ProcessingTime"
        )
        h = harness(op, backend)
        h.processing_time = 1000
        h.process_rows([("a", "x")])
        h.commit()
        h.processing_time = 1100
        h.commit()
        assert [row for _, row in h.output[1:]] == [("Row:a", "fired", 1100)]
        h.processing_time = 1200
        h.commit()
        assert [row for _, row in h.output[2:]] == [("Row:a", "fired", 1099)]

    def test_processing_time_values_carry_the_watermark(self, backend: str) -> None:
        """ProcessingTime: TimerValues carry the watermark (0 before the first), as Spark."""
        op = StatefulProcessorOperator(
            Chain(100), KV, ["key"], "key string, what string, at long", time_mode="ProcessingTime"
        )
        h = harness(op, backend)
        assert h.process_rows([("a", "x")]) == [(INS, ("a", "rows", 0))]
        h.commit()
        h.advance_watermark(5000)
        assert h.process_rows([("a", "x")]) == [(INS, ("a", "rows", 5000))]

    def test_event_time_timer_at_zero_fires_in_batch_zero(self, backend: str) -> None:
        """Before the first watermark Spark's is 0: an event-time timer at 0 fires in batch 0."""
        op = StatefulProcessorOperator(
            Chain(-10, event_time=True),
            KV,
            ["key"],
            "key string, what string, at long",
            time_mode="EventTime",
        )
        h = harness(op, backend)
        h.process_rows([("a", "x")])
        h.commit()
        assert [row for _, row in h.output] == [("a", "rows", 0), ("Row:a", "fired", 0)]
        assert list(h.table("$timers").scan()) == []


def test_state_is_read_by_variable_name(tmp_path: Any) -> None:
    """Offline reading (inspect, the relstate-state source) finds a variable by its name."""
    from pyarrow.fs import LocalFileSystem

    from operators._checkpoint.location import StateLocation
    from operators._checkpoint.read import read_rows

    op = StatefulProcessorOperator(
        TtlEverything(), OPS, ["key"], "key string, op string, result string"
    )
    with OperatorHarness(op, "rocksdb", path=tmp_path) as h:
        h.processing_time = 1000
        h.process_rows([("a", "l.appendList", "p,q"), ("a", "m.updateValue", "z")])
        h.commit()
    location = StateLocation.of(LocalFileSystem(), str(tmp_path / "checkpoint"), "test")
    names = [t.name for t in location.tables(op.name)]
    assert {"value", "list", "list$ttl", "map", "map$ttl"} <= set(names)
    rows = read_rows(location, op.name, location.table(op.name, "list"), 0).to_pylist()
    assert rows == [
        {"key": "a", "$position": 0, "v": "p", "$expires_at": 2000},
        {"key": "a", "$position": 1, "v": "q", "$expires_at": 2000},
    ]
