"""The example operators: exact outputs for hand-written inputs, and property
tests against simple batch models, across commits and restores."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators._api.changelog import RowKind
from operators.errors import InputError
from operators.examples import RunningAggregate, Sessions
from operators.testing import Emitted, OperatorHarness

INS, UB, UA, DEL = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE


def examples_for(backend: str) -> settings:
    """Property-test settings: a RocksDB harness takes about 0.1 s to open and
    close (more on a busy machine), so it gets fewer examples."""
    return settings(max_examples=100 if backend == "memory" else 25, deadline=None)


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request: pytest.FixtureRequest) -> str:
    """The harness backend: every test here runs on both."""
    name: str = request.param
    return name


@pytest.fixture
def make_harness(backend: str, tmp_path: Path) -> Iterator[Callable[[Any], OperatorHarness]]:
    """Opens harnesses on the backend (RocksDB under tmp_path); all closed at the end."""
    opened: list[OperatorHarness] = []

    def make(operator: Any) -> OperatorHarness:
        harness = OperatorHarness(operator, backend=backend, path=tmp_path / f"h{len(opened)}")
        opened.append(harness)
        return harness

    yield make
    for harness in opened:
        harness.close()


# -- RunningAggregate --------------------------------------------------------------------

Aggregates = dict[Any, tuple[int, int]]

#: A changelog step, resolved against the rows that exist when it runs:
#: ("insert", key, value), ("update", pick, key, value) retracts an existing
#: row and adds (key, value), ("delete", pick), or, between batches,
#: ("commit",) and ("restore", pick) of a committed version (or the empty state).
_keys = st.sampled_from(["a", "b", "c", "d"])
_values = st.integers(-5, 10)
_picks = st.integers(0, 1000)
_changes = st.one_of(
    st.tuples(st.just("insert"), _keys, _values),
    st.tuples(st.just("update"), _picks, _keys, _values),
    st.tuples(st.just("delete"), _picks),
)
_aggregate_steps = st.lists(
    st.one_of(
        st.tuples(st.just("rows"), st.lists(_changes, min_size=1, max_size=8)),
        st.just(("commit",)),
        st.tuples(st.just("restore"), _picks),
    ),
    max_size=12,
)


def group_by(rows: Counter[tuple[Any, int]]) -> Aggregates:
    """SELECT key, COUNT(*), SUM(value) GROUP BY key over a multiset of rows."""
    out: dict[Any, tuple[int, int]] = {}
    for (key, value), n in rows.items():
        count, total = out.get(key, (0, 0))
        out[key] = (count + n, total + n * value)
    return out


def resolve(
    rows: Counter[tuple[Any, int]], changes: list[tuple[Any, ...]]
) -> tuple[list[tuple[Any, int]], list[RowKind]]:
    """The changelog rows of abstract changes, applying them to ``rows``: a
    retraction takes an existing row (an insert of ("a", 0) when there is none)."""
    batch: list[tuple[Any, int]] = []
    kinds: list[RowKind] = []
    for change in changes:
        existing = sorted(rows.elements())
        if change[0] == "insert" or not existing:
            new = (change[1], change[2]) if change[0] == "insert" else ("a", 0)
            batch.append(new)
            kinds.append(INS)
            rows[new] += 1
            continue
        old = existing[change[1] % len(existing)]
        rows[old] -= 1
        if rows[old] == 0:
            del rows[old]
        batch.append(old)
        if change[0] == "delete":
            kinds.append(DEL)
        else:
            new = (change[2], change[3])
            batch.append(new)
            kinds += [UB, UA]
            rows[new] += 1
    return batch, kinds


def materialise(table: Aggregates, changes: list[Emitted]) -> None:
    """Apply an output changelog to its materialised table, checking that each
    retraction names the row the table holds and each insert a new key."""
    for kind, (key, count, total) in changes:
        if kind.is_retract:
            assert table.pop(key) == (count, total), f"{kind} of a row the output does not hold"
        else:
            assert key not in table, f"{kind} of key {key!r} that the output already holds"
            assert count > 0
            table[key] = (count, total)


class TestRunningAggregate:
    def test_exact_changelog(self, make_harness: Callable[[Any], OperatorHarness]) -> None:
        """Inserts, -U/+U pairs and deletes give the exact aggregate changelog,
        including a key going to zero count (-D) and coming back (+I)."""
        h = make_harness(RunningAggregate())
        assert h.process_rows([("a", 1), ("b", 10), ("a", 2)]) == [
            (INS, ("a", 1, 1)),
            (INS, ("b", 1, 10)),
            (UB, ("a", 1, 1)),
            (UA, ("a", 2, 3)),
        ]
        assert h.commit() == 0
        assert h.process_rows([("a", 1), ("a", 5)], ["-U", "+U"]) == [
            (UB, ("a", 2, 3)),
            (UA, ("a", 1, 2)),
            (UB, ("a", 1, 2)),
            (UA, ("a", 2, 7)),
        ]
        assert h.process_element(("b", 10), "-D") == [(DEL, ("b", 1, 10))]
        assert h.table("aggregates").get_row(("b",)) is None
        assert h.process_element(("b", 4)) == [(INS, ("b", 1, 4))]
        assert h.commit() == 1
        assert list(h.table("aggregates").scan()) == [("a", 2, 7), ("b", 1, 4)]

    def test_update_of_a_keys_only_row(
        self, make_harness: Callable[[Any], OperatorHarness]
    ) -> None:
        """A -U/+U pair on a key's only row retracts its aggregate (-D), then inserts it (+I)."""
        h = make_harness(RunningAggregate())
        h.process_element(("a", 1))
        assert h.process_rows([("a", 1), ("a", 3)], [UB, UA]) == [
            (DEL, ("a", 1, 1)),
            (INS, ("a", 1, 3)),
        ]

    def test_retraction_of_an_unknown_key(
        self, make_harness: Callable[[Any], OperatorHarness]
    ) -> None:
        """A retraction of a key with no rows emits nothing, changes no state and
        is counted as retractionsOfUnknownKeys."""
        h = make_harness(RunningAggregate())
        assert h.process_element(("zz", 1), "-D") == []
        assert h.metrics["retractionsOfUnknownKeys"] == 1
        h.commit()
        assert h.last_metrics["numTotalStateRows"] == 0

    def test_other_key_types(self, make_harness: Callable[[Any], OperatorHarness]) -> None:
        """The key type is configuration: an int64 key works the same way."""
        import pyarrow as pa

        h = make_harness(RunningAggregate(key_type=pa.int64()))
        assert h.process_rows([(7, 1), (7, 2)]) == [
            (INS, (7, 1, 1)),
            (UB, (7, 1, 1)),
            (UA, (7, 2, 3)),
        ]

    def test_output_matches_group_by(self, backend: str) -> None:
        """For a random consistent changelog, the materialised output equals a
        GROUP BY of the materialised input after every step, across commits and
        restores of any committed version."""

        @examples_for(backend)
        @given(steps=_aggregate_steps)
        def check(steps: list[tuple[Any, ...]]) -> None:
            rows: Counter[tuple[Any, int]] = Counter()
            output: Aggregates = {}
            versions: dict[int, tuple[Counter[tuple[Any, int]], Aggregates]] = {}
            # Strict, though the operator declares unchecked: a wrong write raises.
            with OperatorHarness(RunningAggregate(), backend=backend, consistency="strict") as h:
                for step in steps:
                    if step[0] == "rows":
                        batch, kinds = resolve(rows, step[1])
                        materialise(output, h.process_rows(batch, kinds))
                    elif step[0] == "commit":
                        versions[h.commit()] = (rows.copy(), dict(output))
                    else:
                        choices: list[int | None] = [None, *sorted(versions)]
                        version = choices[step[1] % len(choices)]
                        h.restore(version)
                        for v in [v for v in versions if version is None or v > version]:
                            del versions[v]
                        saved = (Counter(), {}) if version is None else versions[version]
                        rows, output = saved[0].copy(), dict(saved[1])
                    assert output == group_by(rows)
                    assert (
                        dict((r[0], (r[1], r[2])) for r in h.table("aggregates").scan()) == output
                    )

        check()


# -- Sessions ----------------------------------------------------------------------------

BASE = dt.datetime(2024, 1, 1, 12)
EPOCH = dt.datetime(1970, 1, 1)


def at(seconds: float) -> dt.datetime:
    """BASE plus some seconds."""
    return BASE + dt.timedelta(seconds=seconds)


def ms(seconds: float) -> int:
    """at(seconds) as a watermark: milliseconds since the epoch."""
    return (at(seconds) - EPOCH) // dt.timedelta(milliseconds=1)


def session(user: str, start: float, end: float, count: int, total: int) -> Emitted:
    """An emitted session, times in seconds after BASE."""
    return INS, (user, at(start), at(end), count, total)


Session = tuple[str, int, int, int, int]  # user, start us, end us, count, total

_session_steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("rows"),
            st.lists(
                st.tuples(
                    st.sampled_from(["u", "v"]),
                    # Microseconds after BASE, on and around whole milliseconds,
                    # where the gap and the watermark put their boundaries.
                    st.builds(
                        lambda n, d: n * 1000 + d,
                        st.integers(0, 60),
                        st.sampled_from([0, 0, 1, 999]),
                    ),
                    st.integers(0, 9),
                ),
                min_size=1,
                max_size=6,
            ),
        ),
        st.tuples(st.just("watermark"), st.integers(0, 70)),
        st.just(("commit",)),
        st.just(("restart",)),
    ),
    max_size=14,
)


def sessionise(rows: list[tuple[str, int, int]], gap_us: int) -> list[Session]:
    """Batch sessionisation: per user, sort by time and cut where two successive
    times are more than the gap apart."""
    out: list[Session] = []
    for user in sorted({r[0] for r in rows}):
        times = sorted((t, v) for u, t, v in rows if u == user)
        current: list[tuple[int, int]] = []
        for t, v in times:
            if current and t - current[-1][0] > gap_us:
                out.append(
                    (user, current[0][0], current[-1][0], len(current), sum(x[1] for x in current))
                )
                current = []
            current.append((t, v))
        out.append((user, current[0][0], current[-1][0], len(current), sum(x[1] for x in current)))
    return out


def micros(ts: dt.datetime) -> int:
    return (ts - EPOCH) // dt.timedelta(microseconds=1)


class TestSessions:
    def test_exact_sessions(self, make_harness: Callable[[Any], OperatorHarness]) -> None:
        """A hand-written timeline (gap 10 s): sessions are emitted once the
        watermark passes end + gap, a not-too-late row bridges and merges two
        sessions, and a row below the watermark is dropped and counted."""
        h = make_harness(Sessions(gap=10_000))
        rows = [("alice", at(0), 1), ("alice", at(5), 2), ("alice", at(20), 4), ("bob", at(2), 10)]
        assert h.process_rows(rows) == []
        assert h.advance_watermark(ms(10)) == []
        assert h.commit() == 0
        sessions = h.table("sessions")
        assert [s[:3] for s in sessions.scan(("alice",))] == [
            ("alice", at(0), at(5)),
            ("alice", at(20), at(20)),
        ]

        # 12 s is on time (watermark 10 s) and within 10 s of both alice sessions;
        # 9 s is late, though it would have joined the first.
        assert h.process_rows([("alice", at(12), 8), ("alice", at(9), 100)]) == []
        assert h.metrics["numLateRowsDropped"] == 1
        assert list(sessions.scan(("alice",))) == [("alice", at(0), at(20), 4, 15)]

        # bob's session ends at 2 s: a row at 12 s would still join it.
        assert h.advance_watermark(ms(12)) == []
        assert h.advance_watermark(ms(12) + 1) == [session("bob", 2, 2, 1, 10)]
        assert h.commit() == 1
        assert h.last_metrics["numLateRowsDropped"] == 1
        assert h.last_metrics["numOutputRows"] == 1

        assert h.advance_watermark(ms(30)) == []
        assert h.advance_watermark(ms(31)) == [session("alice", 0, 20, 4, 15)]
        assert h.advance_watermark(ms(100)) == []
        assert list(h.table("sessions").scan()) == []
        assert h.commit() == 2

        # A restore brings back the open session and its timer.
        h.restore(1)
        assert h.process_element(("alice", at(25), 1)) == []
        assert h.advance_watermark(ms(100)) == [session("alice", 0, 25, 5, 16)]

    def test_gap_boundary(self, make_harness: Callable[[Any], OperatorHarness]) -> None:
        """Rows exactly gap apart share a session; a microsecond more starts a new one."""
        h = make_harness(Sessions(gap=1_000))
        h.process_rows(
            [
                ("u", at(0), 1),
                ("u", at(1), 1),
                ("u", at(2) + dt.timedelta(microseconds=1), 1),
            ]
        )
        assert sorted(h.advance_watermark(ms(10))) == [
            (INS, ("u", at(0), at(1), 2, 2)),
            (
                INS,
                (
                    "u",
                    at(2) + dt.timedelta(microseconds=1),
                    at(2) + dt.timedelta(microseconds=1),
                    1,
                    1,
                ),
            ),
        ]

    def test_row_at_the_watermark_is_on_time(
        self, make_harness: Callable[[Any], OperatorHarness]
    ) -> None:
        """A row at the watermark is on time; a microsecond before it, it is late."""
        h = make_harness(Sessions(gap=1_000))
        h.advance_watermark(ms(10))
        h.process_rows([("u", at(10), 1), ("u", at(10) - dt.timedelta(microseconds=1), 2)])
        assert h.metrics["numLateRowsDropped"] == 1
        assert h.advance_watermark(ms(20)) == [session("u", 10, 10, 1, 1)]

    def test_rejects_retractions(self, make_harness: Callable[[Any], OperatorHarness]) -> None:
        """The input is append-only: a batch with a retraction raises InputError
        before any of its rows is processed."""
        h = make_harness(Sessions())
        with pytest.raises(InputError, match="append-only"):
            h.process_rows([("u", at(0), 1), ("u", at(1), 1)], ["+I", "-D"])
        assert list(h.table("sessions").scan()) == []

    def test_rejects_a_negative_gap(self) -> None:
        """A negative gap is a configuration error."""
        with pytest.raises(ValueError, match="gap"):
            Sessions(gap=-1)

    def test_matches_batch_sessionisation(self, backend: str) -> None:
        """For random batches, watermarks, commits and restarts: each session is
        emitted once, at the first watermark above end + gap, and the sessions
        emitted equal a batch sessionisation of every row that was not late; the
        late rows are counted."""

        @examples_for(backend)
        @given(gap=st.sampled_from([0, 1, 7, 20]), steps=_session_steps)
        def check(gap: int, steps: list[tuple[Any, ...]]) -> None:
            gap_us = gap * 1000
            base_ms = ms(0)
            on_time: list[tuple[str, int, int]] = []
            emitted: list[Session] = []
            watermark: int | None = None
            late = 0
            saved: tuple[Any, ...] = ([], [], None)
            committed: int | None = None

            def advance(h: OperatorHarness, to: int) -> None:
                nonlocal watermark
                out = h.advance_watermark(to)
                before, watermark = watermark, max(to, watermark or to)
                for kind, (user, start, end, count, total) in out:
                    assert kind is INS
                    closes = micros(end) + gap_us
                    assert closes < to * 1000
                    assert before is None or closes >= before * 1000
                    emitted.append((user, micros(start), micros(end), count, total))

            with OperatorHarness(Sessions(gap=gap), backend=backend) as h:
                for step in steps:
                    if step[0] == "rows":
                        rows = [(u, BASE + dt.timedelta(microseconds=t), v) for u, t, v in step[1]]
                        assert h.process_rows(rows) == []
                        for u, t, v in step[1]:
                            if watermark is not None and micros(BASE) + t < watermark * 1000:
                                late += 1
                            else:
                                on_time.append((u, micros(BASE) + t, v))
                        assert h.metrics.get("numLateRowsDropped", 0) == late
                    elif step[0] == "watermark":
                        advance(h, base_ms + step[1])
                    elif step[0] == "commit":
                        assert h.commit() == (-1 if committed is None else committed) + 1
                        assert h.last_metrics.get("numLateRowsDropped", 0) == late
                        committed, late = h.batch_id - 1, 0
                        saved = (list(on_time), list(emitted), watermark)
                    else:
                        h.restore(committed)
                        on_time, emitted, watermark = list(saved[0]), list(saved[1]), saved[2]
                        late = 0
                        assert h.watermark == watermark
                advance(h, base_ms + 1_000_000)
            assert sorted(emitted) == sessionise(on_time, gap_us)

        check()
