"""The parts of ``relstate bench --suite flink`` that need no Flink: the
changelog files Flink reads, the final tables compared, the phase timers,
the workloads and the page (the tests never install Flink)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from bench import flink_workloads, phases
from bench.debezium import (
    OutputsDiffer,
    check_same,
    final_table,
    read_debezium,
    write_debezium,
    write_json,
)
from bench.flink import cpu_seconds
from bench.flink_workloads import workloads
from bench.suite_flink import Measured, Rounds, _relstate, summarise
from bench.versus import Comparison, SuiteResult, markdown
from operators._api.changelog import ROW_KIND, RowKind, row_kinds
from statestore import StateTable


def _changelog(rows: list[tuple[int | None, str | None, str]]) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.int64()),
            "s": pa.array([r[1] for r in rows], pa.string()),
            ROW_KIND: pa.array([r[2] for r in rows], pa.string()),
        }
    )


class TestDebezium:
    def test_changelog_round_trips_through_debezium_json(self, tmp_path: Path) -> None:
        """A changelog written as debezium-json (a -U and its +U one 'u'
        event) reads back to the final table the changelog leaves."""
        batches = [
            _changelog([(1, "a", "+I"), (2, 'q"uote', "+I"), (3, None, "+I")]),
            _changelog([(1, "a", "-U"), (1, "b", "+U"), (2, 'q"uote', "-D"), (None, "z", "+I")]),
        ]
        path = tmp_path / "in" / "part-0.json"
        assert write_debezium(batches, ["k", "s"], path) == 6
        events = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert [e["op"] for e in events] == ["c", "c", "c", "u", "d", "c"]
        assert events[3] == {"before": {"k": 1, "s": "a"}, "after": {"k": 1, "s": "b"}, "op": "u"}
        expected = Counter({(1, "b"): 1, (3, None): 1, (None, "z"): 1})
        assert final_table(batches, ["k", "s"]) == expected
        assert read_debezium(path.parent, ["k", "s"]) == expected

    def test_an_upsert_changelog_leaves_each_keys_last_row(self) -> None:
        """Applied with an upsert key, a changelog without -U rows leaves
        each key's last +I or +U row, gone after a -D; a -U changes nothing."""
        batches = [
            _changelog([(1, "a", "+I"), (2, "b", "+I"), (3, "c", "+I")]),
            _changelog([(1, "a2", "+U"), (2, "b", "-D"), (3, "c", "-U"), (3, "c2", "+U")]),
            _changelog([(1, "a3", "+U"), (2, "b2", "+I")]),
        ]
        expected = Counter({(1, "a3"): 1, (2, "b2"): 1, (3, "c2"): 1})
        assert final_table(batches, ["k", "s"], upsert_key=["k"]) == expected
        # The same batches as a changelog of rows would not apply: +U adds.
        assert final_table(batches, ["k", "s"]) != expected

    def test_an_update_without_its_pair_is_refused(self, tmp_path: Path) -> None:
        """Debezium has no event for a lone -U: writing one fails, naming it."""
        lone = _changelog([(1, "a", "+I"), (1, "a", "-U"), (1, "b", "+I")])
        with pytest.raises(ValueError, match="'-U' followed by '\\+I'"):
            write_debezium([lone], ["k", "s"], tmp_path / "x.json")

    def test_flinks_output_folds_to_its_final_table(self, tmp_path: Path) -> None:
        """Flink writes a -U as 'd' and a +U as 'c'; the files, in-progress
        ones skipped, fold to the rows left, multiplicities kept."""
        out = tmp_path / "out"
        out.mkdir()
        lines = [
            {"before": None, "after": {"k": 1, "c": 1}, "op": "c"},
            {"before": {"k": 1, "c": 1}, "after": None, "op": "d"},
            {"before": None, "after": {"k": 1, "c": 2}, "op": "c"},
            {"before": None, "after": {"k": 7, "c": 1}, "op": "c"},
            {"before": None, "after": {"k": 7, "c": 1}, "op": "c"},
        ]
        (out / "part-0").write_text("\n".join(json.dumps(e) for e in lines) + "\n")
        (out / ".part-1.inprogress").write_text(json.dumps(lines[0]) + "\n")
        assert read_debezium(out, ["k", "c"]) == Counter({(1, 2): 1, (7, 1): 2})

    def test_append_stream_is_written_as_json_lines(self, tmp_path: Path) -> None:
        """An append stream is one JSON object per row, in order, nulls as null."""
        table = pa.table({"k": pa.array([5, None], pa.int64()), "s": ["x", None]})
        path = tmp_path / "a.json"
        assert write_json([table, table], ["k", "s"], path) == 4
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert rows == [{"k": 5, "s": "x"}, {"k": None, "s": None}] * 2


class TestCheckSame:
    def test_equal_tables_pass(self) -> None:
        """The same rows with the same multiplicities are the same output."""
        check_same(Counter({(1,): 2}), Counter({(1,): 2}), "w")

    def test_a_difference_fails_the_suite(self) -> None:
        """A missing row, an extra row or a wrong multiplicity raises,
        counting each side's surplus."""
        mine = Counter({(1, "a"): 1, (2, "b"): 2})
        theirs = Counter({(1, "a"): 1, (2, "b"): 1, (3, "c"): 1})
        with pytest.raises(OutputsDiffer, match=r"w: .* 1 rows Flink's does not and lacks 1"):
            check_same(mine, theirs, "w")

    def test_an_over_retracted_row_is_named(self) -> None:
        """A row retracted more often than inserted shows as such."""
        with pytest.raises(OutputsDiffer, match="1 rows retracted more than inserted"):
            check_same(Counter({(1,): -1}), Counter(), "w")


class TestPhaseTimer:
    def test_nested_calls_count_for_their_own_phase(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A timed call inside another counts only for its own phase, and a
        generator's steps count where they run."""
        clock = [0.0]
        monkeypatch.setattr("time.perf_counter", lambda: clock[0])
        timer = phases.PhaseTimer()

        def inner() -> None:
            clock[0] += 2.0

        def steps() -> object:
            clock[0] += 1.0
            yield 1
            clock[0] += 1.0
            yield 2

        timed_inner = timer._timed(inner, phases.ROCKSDB)
        timed_steps = timer._timed(steps, phases.ENCODING)

        def outer() -> None:
            clock[0] += 3.0
            timed_inner()
            for _ in timed_steps():
                clock[0] += 10.0  # the caller's own time between steps

        timer._timed(outer, phases.TABLE)()
        assert timer.seconds[phases.ROCKSDB] == 2.0
        assert timer.seconds[phases.ENCODING] == 2.0
        assert timer.seconds[phases.TABLE] == 23.0

    def test_a_real_run_is_split_and_the_classes_restored(self, tmp_path: Path) -> None:
        """Installed around a harness run on RocksDB, the timers see the
        table, the encoding, RocksDB and the commit, within the run's own
        time; removed, the classes are as they were."""
        work = next(w for w in workloads(400) if w.name == "aggregate")
        before = StateTable.__dict__["get_rows"]
        timer = phases.PhaseTimer()
        with timer.installed():
            assert StateTable.__dict__["get_rows"] is not before
            seconds = _relstate(work, tmp_path / "run", timer=timer)
        assert StateTable.__dict__["get_rows"] is before
        assert all(timer.seconds[p] > 0 for p in phases.PHASES)
        assert sum(timer.seconds.values()) < seconds


class TestWorkloads:
    def test_both_sides_read_the_same_rows(self) -> None:
        """Each workload's Flink inputs hold, in order, exactly the rows of
        relstate's micro-batches on that side, and count its rows."""
        for work in workloads(2_000):
            for side, source in enumerate(work.inputs):
                theirs = pa.concat_tables(source.tables)
                mine = pa.concat_tables(
                    pa.Table.from_batches([b]) for m in work.micro for s, b in m if s == side
                )
                assert mine.select(theirs.column_names).equals(theirs), work.name
            assert work.rows == sum(b.num_rows for m in work.micro for _, b in m), work.name

    def test_only_the_workloads_named_are_made(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """``only`` keeps the workloads named, in the suite's order, and
        makes no changelog that only the others read."""
        made: list[str] = []
        real = flink_workloads._joins
        monkeypatch.setattr(
            flink_workloads, "_joins", lambda rows: made.append("joins") or real(rows)
        )
        works = workloads(2_000, only=["dedup_last", "aggregate"])
        assert [w.name for w in works] == ["aggregate", "dedup_last"]
        assert made == []
        assert [w.name for w in workloads(2_000, only=["join_full_uk"])] == ["join_full_uk"]
        assert made == ["joins"]

    def test_the_joins_hold_each_side_whole(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """relstate's joins run in their best configuration: ``held_rows`` is
        at least a side's changelog rows, so no side is read by key however
        large the run (here the default bound made smaller than a side)."""
        monkeypatch.setattr(flink_workloads, "HELD_ROWS", 10)
        for work in workloads(2_000, only=["join_inner_uk", "join_full_nouk"]):
            side_rows = [
                sum(b.num_rows for m in work.micro for s, b in m if s == side) for side in (0, 1)
            ]
            assert work.operator().held_rows >= max(side_rows) > 10, work.name

    def test_flink_tables_say_their_format_and_keys(self, tmp_path: Path) -> None:
        """A changelog input is debezium-json, an append stream json with a
        processing-time column; a unique key is a primary key not enforced."""
        by_name = {w.name: w for w in workloads(400)}
        left = by_name["join_inner_uk"].inputs[0].ddl(tmp_path)
        assert "'format'='debezium-json'" in left and "PRIMARY KEY (id) NOT ENFORCED" in left
        assert "PRIMARY KEY" not in by_name["join_inner_nouk"].inputs[0].ddl(tmp_path)
        dedup = by_name["dedup_last"].inputs[0].ddl(tmp_path)
        assert "'format'='json'" in dedup and "pt AS PROCTIME()" in dedup
        assert " UNION ALL " in by_name["join_full_uk"].scan()

    def test_relstates_aggregate_leaves_the_aggregate_of_the_live_rows(
        self, tmp_path: Path
    ) -> None:
        """relstate's output of the aggregate workload (the Arrow batches of
        its input batches and of its commits, where it emits), applied as
        an upsert changelog keyed by the group (it writes no -U, as Flink's
        into a blackhole), is the aggregate of the rows its changelog leaves
        live: what Flink's must match."""
        work = next(w for w in workloads(2_000) if w.name == "aggregate")
        kept: list[pa.RecordBatch] = []
        _relstate(work, tmp_path / "run", kept)
        assert work.upsert_key == ("k",)
        assert not any(RowKind.UPDATE_BEFORE in row_kinds(b) for b in kept if b.num_rows)
        mine = final_table(kept, work.output.names, work.upsert_key)
        live = final_table(work.inputs[0].tables, ["k", "v", "id"])
        groups: dict[int, list[int]] = {}
        for (k, v, _), n in live.items():
            groups.setdefault(k, []).extend([v] * n)
        expected = Counter(
            {(k, len(vs), sum(vs), min(vs), max(vs), len(set(vs))): 1 for k, vs in groups.items()}
        )
        assert +mine == expected

    def test_relstates_dedup_last_leaves_each_keys_last_row(self, tmp_path: Path) -> None:
        """relstate's output of the keep-last workload has no -U, and
        applied as an upsert changelog keyed by k it is each key's last
        row of the append stream."""
        work = next(w for w in workloads(2_000) if w.name == "dedup_last")
        kept: list[pa.RecordBatch] = []
        _relstate(work, tmp_path / "run", kept)
        assert not any(RowKind.UPDATE_BEFORE in row_kinds(b) for b in kept if b.num_rows)
        last: dict[int, tuple[int, int, int]] = {}
        for table in work.inputs[0].tables:
            for row in zip(*(table.column(n).to_pylist() for n in ("k", "v", "id")), strict=True):
                last[row[0]] = row
        assert final_table(kept, work.output.names, work.upsert_key) == Counter(last.values())


class TestPage:
    def test_page_shows_every_round_the_split_and_the_goals(self) -> None:
        """The page has per-row microseconds of each side, where relstate's
        time goes, every round (Flink's as query less scan) and each goal."""
        rounds = Rounds(
            relstate=[2.0, 3.0, 2.5],
            query={"RocksDB": [9.0, 8.0, 10.0], "heap": [3.0, 2.0, 2.5]},
            scan=[1.0, 1.0, 1.5],
            relstate_cpu=[1.0, 1.0, 1.0],
            query_cpu={"RocksDB": [5.0, 5.0, 5.0], "heap": [2.0, 2.0, 2.0]},
            scan_cpu=[0.5, 0.5, 0.5],
        )
        chosen = {("aggregate", "RocksDB"): "RocksDB, mini-batch", ("aggregate", "heap"): "heap"}
        split = (3.0, {p: 0.25 for p in phases.PHASES})
        measured = Measured("aggregate", "group aggregate", 1_000_000, rounds, chosen, split, 0.5)
        result = summarise([measured], 1_000_000, 3, 1, [("load average at round 1", "1.0")])
        page = markdown(result)
        rocks, heap = result.comparisons
        assert (rocks.relstate_seconds, rocks.baseline_seconds, rocks.goal) == (2.5, 8.0, 1.5)
        assert (heap.baseline_seconds, heap.goal) == (1.0, 0.6)
        assert (
            "| aggregate | 1,000,000 | 2.50 | 8.00 (RocksDB, mini-batch) | 1.00 (heap) | 0.50 | - |"
            in page
        )
        assert "| aggregate | 3.00 | 2.00 | 0.25 | 0.25 | 0.25 | 0.25 |" in page
        assert "9.00 - 1.00 = 8.00 s, 8.00 - 1.00 = 7.00 s, 10.00 - 1.50 = 8.50 s" in page
        assert "2.00 s, 3.00 s, 2.50 s" in page and "load average at round 1" in page
        assert "3.20x" in page and "not met" in page
        assert "| aggregate | 1.00 | 4.50 | 1.50 | 4.50x | 1.50x |" in page
        # The heap goal (0.6x) is not met: 1.00 / 0.6 allows 1.67 a row, of
        # which RocksDB took 0.25.
        assert "allows relstate 1.67 µs a row" in page
        assert "alone took 0.25, which leaves 1.42 for everything else" in page

    def test_a_heap_goal_below_relstates_rocksdb_time_says_so(self) -> None:
        """Where relstate's calls into RocksDB alone take longer than a heap
        goal allows, the page says no faster Python meets it; a goal met
        has no such line."""
        chosen = {(n, b): b for n in ("aggregate", "topn") for b in ("RocksDB", "heap")}

        def measured(name: str, relstate: float) -> Measured:
            rounds = Rounds(
                relstate=[relstate], query={"RocksDB": [30.0], "heap": [3.0]}, scan=[1.0]
            )
            split = (relstate, {p: 4.0 if p == phases.ROCKSDB else 0.5 for p in phases.PHASES})
            return Measured(name, name, 1_000_000, rounds, chosen, split, 0.5)

        page = markdown(summarise([measured("aggregate", 9.0), measured("topn", 3.0)], 0, 3, 1, []))
        assert (
            "- `aggregate`: 0.6x Flink's heap time (2.00 µs a row) allows relstate 3.33 µs a "
            "row; its calls into RocksDB alone took 4.00, more than the goal allows" in page
        )
        assert "- `topn`: 0.6x" not in page

    def test_a_join_shows_its_plain_dict_operator_over_the_rounds(self) -> None:
        """A workload with a plain-dict operator (the joins) shows its median
        per row beside the floor, and each of its rounds."""
        rounds = Rounds(
            relstate=[2.0, 2.0, 2.0],
            in_dicts=[1.5, 1.0, 1.2],
            query={"RocksDB": [4.0, 4.0, 4.0], "heap": [2.0, 2.0, 2.0]},
            scan=[1.0, 1.0, 1.0],
        )
        chosen = {("join_inner_uk", "RocksDB"): "RocksDB", ("join_inner_uk", "heap"): "heap"}
        split = (2.0, {p: 0.25 for p in phases.PHASES})
        measured = Measured("join_inner_uk", "join", 1_000_000, rounds, chosen, split, 0.5)
        page = markdown(summarise([measured], 1_000_000, 3, 1, []))
        row = "| join_inner_uk | 1,000,000 | 2.00 | 3.00 (RocksDB) | 1.00 (heap) | 0.50 | 1.20 |"
        assert row in page
        assert "join_inner_uk: rounds, plain-dict operator" in page
        assert "1.50 s, 1.00 s, 1.20 s" in page

    def test_a_query_stopped_at_the_limit_is_a_lower_bound(self) -> None:
        """A Flink query stopped at ``--stop-after`` counts as at least that
        long: its figures and relstate's speed-up over it are marked "≥", a
        goal the bound reaches is met, and one it does not is not known
        (not "not met"); the rounds say which run was stopped."""
        rounds = Rounds(
            relstate=[100.0],
            query={"RocksDB": [1201.0], "heap": [151.0]},
            scan=[1.0],
            relstate_cpu=[100.0],
            query_cpu={"RocksDB": [1300.0], "heap": [50.0]},
            scan_cpu=[1.0],
            stopped={"RocksDB": [True], "heap": [True]},
        )
        chosen = {("aggregate", "RocksDB"): "RocksDB", ("aggregate", "heap"): "heap"}
        split = (100.0, {p: 1.0 for p in phases.PHASES})
        measured = Measured("aggregate", "group aggregate", 10_000_000, rounds, chosen, split, 5.0)
        result = summarise([measured], 10_000_000, 1, 1, [], stop_after=20)
        rocks, heap = result.comparisons
        assert rocks.stopped and rocks.ratio == 12.0 and rocks.goal_met is True
        assert heap.stopped and heap.ratio == 1.5 and heap.goal_met is True
        page = markdown(result)
        assert "| aggregate vs Flink RocksDB | 10,000,000 | 100.00 s | ≥ 1200.00 s" in page
        assert "≥ 12.00x" in page and "(stopped)" in page and "after 20 minutes" in page
        assert "| aggregate | 10,000,000 | 10.00 | ≥ 120.00 (RocksDB) | ≥ 15.00 (heap) |" in page
        short = Comparison("x", 1, 10.0, 5.0, "Flink", goal=1.5, stopped=True)
        assert short.goal_met is None and "not known" in markdown(
            SuiteResult("flink", "t", "d", [short])
        )


class TestCpuSeconds:
    def test_counts_the_process_and_its_children(self) -> None:
        """A process's CPU seconds grow with its own work and take in a
        child's, which a multi-threaded Flink JVM under its worker is."""
        before = cpu_seconds(os.getpid())
        spin = time.process_time() + 0.2
        while time.process_time() < spin:
            pass
        assert cpu_seconds(os.getpid()) - before >= 0.15
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time\nt = time.process_time() + 0.5\n"
                "while time.process_time() < t: pass\ntime.sleep(30)",
            ]
        )
        try:
            deadline = time.monotonic() + 20
            while cpu_seconds(child.pid) < 0.4 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert cpu_seconds(os.getpid()) - cpu_seconds(child.pid) >= before
            assert cpu_seconds(os.getpid()) >= before + 0.15 + 0.4
        finally:
            child.kill()
            child.wait()
