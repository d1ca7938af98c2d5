"""relstate's ``TwsTester`` against PySpark's own
(``pyspark.sql.streaming.tws_tester.TwsTester``): the same processor, the same
calls, the same answers.

A user's existing unit tests call the tester key by key; here each case's
batches (:mod:`cases`) become those calls: for each batch, the time set
first (``setProcessingTime`` / ``setWatermark``, whose fired timers are part
of the answer), then ``test`` (rows) or ``testInPandas`` for each key of the
batch. Spark's tester keeps no TTL, so the TTL cases are left out here (the
differential tests against Spark's streaming operator cover them); so are
the cases whose answers depend on what Spark's tester does not model
(``deleteIfExists`` in ``init``, the timer edges of a live query).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.tws_tester import TwsTester as SparkTwsTester

from operators.stateful import TwsTester
from tests.operators.stateful.cases import CASES
from tests.operators.stateful.processors import INPUT_DDL, epoch_ms, timestamp

#: The cases compared, with the time each batch sets (ms), if any.
TIMES: dict[str, list[int] | None] = {
    "RunningCount": None,
    "ListOps": None,
    "MapOps": None,
    "MultiState": None,
    "InitialState": None,
    "ProcessingTimers": [1_000, 2_000, 6_000, 7_000, 12_000],
    "EventTimeTimers": None,
}
_COLUMNS = [part.split()[0] for part in INPUT_DDL.split(", ")]


def _input(rows: list[Any], pandas: bool) -> Any:
    """A key's rows as the tester takes them."""
    dicts = [dict(zip(_COLUMNS, (*r[:5], timestamp(r[5])), strict=True)) for r in rows]
    if pandas:
        import pandas as pd

        return pd.DataFrame(dicts, columns=_COLUMNS)
    return [Row(**d) for d in dicts]


def _answers(out: Any, pandas: bool) -> list[tuple[Any, ...]]:
    if pandas:
        return [tuple(r) for r in out.itertuples(index=False)] if len(out) else []
    return [tuple(r) for r in out]


def _tester(cls: Callable[..., Any], name: str, pandas: bool) -> Any:
    case = CASES[name]
    processor = case.processor.pandas() if pandas else case.processor.rows()
    kwargs: dict[str, Any] = {"timeMode": case.processor.TIME_MODE}
    if case.processor.TIME_MODE == "EventTime":
        kwargs["eventTimeExtractor"] = lambda row: epoch_ms(row["ts"])
    if case.initial is not None:
        if pandas:
            import pandas as pd

            frames: dict[Any, list[Any]] = {}
            for k, v in case.initial:
                frames.setdefault(k, []).append({"k": k, "v": v})
            kwargs["initialStatePandas"] = [(k, pd.DataFrame(r)) for k, r in frames.items()]
        else:
            kwargs["initialStateRow"] = [(k, Row(k=k, v=v)) for k, v in case.initial]
    return cls(processor, **kwargs)


def _run(
    tester: Any, name: str, pandas: bool, times_of: dict[str, list[int] | None] = TIMES
) -> list[list[tuple[Any, ...]]]:
    """Each batch's answers: the timers its time fired, then each key's."""
    case = CASES[name]
    times = times_of[name]
    out = []
    watermark = 0
    for b, rows in enumerate(case.batches):
        answers: list[tuple[Any, ...]] = []
        if times is not None:
            answers += _answers(tester.setProcessingTime(times[b]), pandas)
        if case.processor.TIME_MODE == "EventTime" and b > 0:
            # The watermark a live query would have: the greatest event time
            # seen before this batch minus the delay.
            seen = max(r[5] for batch in case.batches[:b] for r in batch)
            moved = seen - (case.delay_ms or 0)
            if moved > watermark:
                watermark = moved
                answers += _answers(tester.setWatermark(watermark), pandas)
        for key in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == key]
            call = tester.testInPandas if pandas else tester.test
            answers += _answers(call(key, _input(mine, pandas)), pandas)
        out.append(sorted(answers, key=repr))
    return out


@pytest.mark.parametrize("pandas", [False, True], ids=["rows", "pandas"])
@pytest.mark.parametrize("name", sorted(TIMES))
def test_same_answers_as_pysparks_tester(name: str, pandas: bool) -> None:
    """relstate's tester answers every call of a processor's unit test as
    PySpark's tester does, batch by batch."""
    expected = _run(_tester(SparkTwsTester, name, pandas), name, pandas)
    got = _run(_tester(TwsTester, name, pandas), name, pandas)
    assert got == expected


@pytest.mark.parametrize("pandas", [False, True], ids=["rows", "pandas"])
def test_deleted_variable_raises_as_in_a_live_query(pandas: bool) -> None:
    """Where PySpark's tester and Spark's operator disagree, relstate's tester
    follows the operator: a variable ``init`` deleted with ``deleteIfExists``
    raises when used (Spark's streaming query raises; PySpark's tester lets
    the call through)."""
    name = "DeleteIfExists"
    runs: dict[Any, list[list[bool]]] = {}
    for cls in (SparkTwsTester, TwsTester):
        tester = _tester(cls, name, pandas)
        runs[cls] = [
            [raised for _, _, raised in batch] for batch in _run(tester, name, pandas, {name: None})
        ]
    assert runs[TwsTester] == [[True, True], [True]]
    assert runs[SparkTwsTester] == [[False, False], [False]]
