"""TwsTester: PySpark's tester calls over relstate state, with TTL applied."""

from __future__ import annotations

import pandas as pd
import pytest
from _processors import Chain, PandasRunningCount, RunningCount, Timeout, TtlEverything
from pyspark.errors import PySparkValueError
from pyspark.errors.exceptions.base import IllegalArgumentException
from pyspark.sql import Row

from operators.stateful import TwsTester


class TestTwsTester:
    def test_running_count_rows(self) -> None:
        """test() returns the processor's Rows and keeps its state between calls."""
        tester = TwsTester(RunningCount())
        assert tester.test("k1", [Row(key="k1", value="a"), Row(key="k1", value="b")]) == [
            Row(key="k1", count=2)
        ]
        assert tester.test("k1", [Row(key="k1", value="c")]) == [Row(key="k1", count=3)]
        assert tester.peekValueState("count", "k1") == (3,)
        assert tester.peekValueState("count", "k2") is None

    def test_pandas_and_initial_state(self) -> None:
        """testInPandas with initialStatePandas, as PySpark's tester takes them."""
        tester = TwsTester(
            PandasRunningCount(), initialStatePandas=[("k1", pd.DataFrame({"start": [10]}))]
        )
        out = tester.testInPandas("k1", pd.DataFrame({"key": ["k1"], "value": ["a"]}))
        assert out.to_dict("list") == {"key": ["k1"], "count": [11]}

    def test_update_and_peek(self) -> None:
        """update*State sets state, peek*State reads it; an unknown name is an AssertionError."""
        tester = TwsTester(TtlEverything())
        tester.updateValueState("value", "k", ("x",))
        tester.updateListState("list", "k", [("a",), ("b",)])
        tester.updateMapState("map", "k", {("p",): ("q",)})
        assert tester.peekValueState("value", "k") == ("x",)
        assert tester.peekListState("list", "k") == [("a",), ("b",)]
        assert tester.peekMapState("map", "k") == {("p",): ("q",)}
        tester.deleteState("value", "k")
        assert tester.peekValueState("value", "k") is None
        with pytest.raises(AssertionError):
            tester.peekValueState("nope", "k")

    def test_ttl_applies(self) -> None:
        """Unlike Spark's tester, TTL expires state as processing time moves."""
        tester = TwsTester(TtlEverything(), timeMode="ProcessingTime")
        tester.setProcessingTime(1000)
        tester.updateValueState("value", "k", ("x",))
        tester.setProcessingTime(1999)
        assert tester.peekValueState("value", "k") == ("x",)
        tester.setProcessingTime(2000)
        assert tester.peekValueState("value", "k") is None

    def test_processing_time_timers(self) -> None:
        """setProcessingTime fires due timers, returns their rows; time must move forward."""
        tester = TwsTester(Timeout(1000), timeMode="ProcessingTime")
        assert tester.test("a", [Row(key="a", value="x")]) == []
        assert tester.setProcessingTime(999) == []
        assert tester.setProcessingTime(1000) == [Row(key="a", count=1, seen="x", fired=1000)]
        with pytest.raises(IllegalArgumentException):
            tester.setProcessingTime(1000)
        with pytest.raises(PySparkValueError):
            tester.setWatermark(5)

    def test_event_time_late_rows_and_timers(self) -> None:
        """EventTime: rows <= the watermark are dropped; setWatermark fires timers."""
        tester = TwsTester(
            Timeout(100, event_time=True),
            timeMode="EventTime",
            eventTimeExtractor=lambda row: row["ts"],
        )
        tester.setWatermark(50)
        assert (
            tester.test("a", [Row(key="a", value="late", ts=50), Row(key="a", value="x", ts=60)])
            == []
        )
        assert tester.peekValueState("count", "a") == (1,)
        assert tester.setWatermark(150) == [Row(key="a", count=1, seen="x", fired=150)]

    def test_timer_values_as_pysparks_tester(self) -> None:
        """TimerValues as PySpark's tester gives them: no watermark in ProcessingTime mode."""
        tester = TwsTester(Chain(100), timeMode="ProcessingTime")
        tester.setProcessingTime(50)
        assert tester.test("a", [Row(key="a", value="x")]) == [Row(key="a", what="rows", at=-1)]
