"""``relstate bench --suite``: operator suites against a baseline, printed and
written to docs/bench/NAME.md."""

from __future__ import annotations

import subprocess
import sys
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import runner, suites
from bench.suite_dedup import _batch_ms
from bench.versus import Comparison, SuiteResult, ceiling, markdown, runs, terminal
from operators.cli import main


def _result() -> SuiteResult:
    return SuiteResult(
        suite="fake",
        title="A fake operator against a fake baseline",
        description="Two workloads on made-up times.",
        comparisons=[
            Comparison("fast one", 200_000, 2.0, 8.0, "the baseline", goal=3.0),
            Comparison("slow one", 1_000, 4.0, 2.0, "the baseline"),
        ],
        readings=[("harness rate", "12 k rows/s")],
    )


class TestComparison:
    def test_ratio_is_the_baselines_time_over_relstates(self) -> None:
        """A ratio above 1 is a speed-up, and the goal is a floor."""
        fast, slow = _result().comparisons
        assert fast.ratio == 4.0 and fast.goal_met is True
        assert slow.ratio == 0.5 and slow.goal_met is None
        assert Comparison("x", 1, 1.0, 2.0, "b", goal=3.0).goal_met is False

    def test_times_must_be_positive(self) -> None:
        """A zero time would make a meaningless ratio: refused."""
        with pytest.raises(ValueError, match="positive"):
            Comparison("x", 1, 0.0, 1.0, "b")

    def test_of_runs_compares_medians(self) -> None:
        """A comparison of several runs per side compares each side's median,
        so one disturbed run does not move the ratio."""
        c = Comparison.of_runs("x", 1, [1.0, 9.0, 2.0], [4.0, 3.0, 30.0], "b")
        assert (c.relstate_seconds, c.baseline_seconds, c.ratio) == (2.0, 4.0, 2.0)

    def test_ceiling_is_the_baseline_over_the_runner_alone(self) -> None:
        """The ceiling reading divides the baseline's time by the runner's own."""
        assert ceiling(6.0, 2.0).endswith("at most 3.00x for any operator")
        assert ceiling(6.0, 1.5, "any runner").endswith("at most 4.00x for any runner")
        assert runs([1.0, 2.5]) == "1.00 s, 2.50 s"

    def test_tables_show_every_figure(self) -> None:
        """The terminal and markdown tables carry each workload's speed-up and verdict."""
        result = _result()
        for text in (terminal(result), markdown(result)):
            assert "fast one" in text and "4.00x" in text and "≥ 3.0" in text
            assert "slow one" in text and "0.50x" in text
            assert "harness rate" in text and "12 k rows/s" in text
            assert "100.0 k rows/s" in text
        assert "do not edit by hand" in markdown(result)

    def test_a_miss_never_shows_as_the_goal(self) -> None:
        """A speed-up just below its goal gets a third decimal (1.999x, not
        2.00x beside "not met"); one that rounds elsewhere keeps two."""
        missed = Comparison("missed", 1_000, 3.084, 6.166, "the baseline", goal=2.0)
        result = replace(_result(), comparisons=[missed, *_result().comparisons])
        for text in (terminal(result), markdown(result)):
            assert "1.999x" in text and "2.00x" not in text
            assert "4.00x" in text and "0.50x" in text


class TestSuiteCommand:
    @pytest.fixture
    def fake_suite(self, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
        """A suite module 'fake' registered for the test; records its quick flag."""
        calls: list[bool] = []

        def run(quick: bool, workdir: Path, progress: Callable[[str], None]) -> SuiteResult:
            assert workdir.is_dir()
            progress("measuring")
            calls.append(quick)
            return _result()

        module = types.ModuleType("fake_suite")
        module.run = run  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "fake_suite", module)
        monkeypatch.setitem(suites.SUITES, "fake", "fake_suite")
        return calls

    def test_writes_the_suite_page(
        self,
        fake_suite: list[bool],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """The suite runs once with --quick passed on, prints its table and writes its page."""
        monkeypatch.chdir(tmp_path)
        assert main(["bench", "--suite", "fake", "--quick"]) == 0
        assert fake_suite == [True]
        out = capsys.readouterr().out
        assert "fast one" in out and "wrote docs/bench/fake.md" in out
        page = (tmp_path / "docs/bench/fake.md").read_text(encoding="utf-8")
        assert page.startswith("# A fake operator against a fake baseline\n")
        assert "| fast one | 200,000 | 2.00 s |" in page

    def test_load_is_read_before_the_suite_runs(
        self,
        fake_suite: list[bool],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The page's "load at start" is the load before the suite ran, not
        the load its own work left behind."""
        load = [0.5]
        monkeypatch.setattr(runner, "_load", lambda: load[0])
        module = sys.modules["fake_suite"]
        measure = module.run

        def busy(quick: bool, workdir: Path, progress: Callable[[str], None]) -> SuiteResult:
            load[0] = 9.0  # the suite's own Spark and workers
            return measure(quick, workdir, progress)  # type: ignore[no-any-return]

        monkeypatch.setattr(module, "run", busy)
        monkeypatch.chdir(tmp_path)
        assert main(["bench", "--suite", "fake"]) == 0
        page = (tmp_path / "docs/bench/fake.md").read_text(encoding="utf-8")
        assert "load 0.5 at start" in page

    def test_the_page_names_the_commit_measured(
        self,
        fake_suite: list[bool],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The page says which commit of the code it measured (this
        checkout's HEAD, marked when tracked files differ from it), so a
        page run from an old worktree cannot pass for the current code."""
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(runner.__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        commit = runner._commit()
        assert commit is not None and commit.split("+")[0] == head
        monkeypatch.chdir(tmp_path)
        assert main(["bench", "--suite", "fake"]) == 0
        page = (tmp_path / "docs/bench/fake.md").read_text(encoding="utf-8")
        assert f"code at commit {commit}" in page

    def test_no_write_prints_only(
        self, fake_suite: list[bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """--no-write leaves no page behind."""
        monkeypatch.chdir(tmp_path)
        assert main(["bench", "--suite", "fake", "--no-write"]) == 0
        assert fake_suite == [False]
        assert not (tmp_path / "docs").exists()

    def test_unknown_suite_is_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown suite name exits with 2 and lists the suites there are."""
        assert main(["bench", "--suite", "nope"]) == 2
        err = capsys.readouterr().err
        assert "no benchmark suite 'nope'" in err and "'store'" in err and "'dedup'" in err


class TestFkJoinSuite:
    def test_changes_sweep_holds_the_table_size(self) -> None:
        """After the size sweep, the fkjoin suite runs one table size with
        more and more changes per batch (right updates a fifth of the moves)."""
        from bench.suite_fkjoin import _FULL

        sweep = [p for swept, p in _FULL.points() if swept]
        assert [p.sizes for p in sweep] == [(_FULL.sweep_size,)] * len(_FULL.sweep_changes)
        assert [(p.left_changes, p.right_changes) for p in sweep] == [
            (c, c // 5) for c in _FULL.sweep_changes
        ]
        assert sorted(p.left_changes for p in sweep) == [p.left_changes for p in sweep]

    def test_fixed_cost_alternates_rounds_of_every_side(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """At the fixed cost's point, relstate, the Spark-alone floor and the
        four ceilings run FIXED_ROUNDS times, each round in the reverse
        order of the one before, each run on a new checkpoint; every round's
        change batches are kept, and each ceiling's are pooled over the
        rounds."""
        from bench import suite_fkjoin as suite

        calls: list[str] = []

        def side(name: str, seconds: float, checkpoint: str, plain: bool = False) -> Any:
            def run(spark: Any, root: Path, *args: Any, **kwargs: Any) -> Any:
                called = (
                    "ordered"
                    if kwargs.get("ordered")
                    else "stored"
                    if kwargs.get("stores")
                    else name
                )
                path = checkpoint if called == name else f"{called}-checkpoint"
                assert not (root / path).exists(), f"{called} ran on an old checkpoint"
                (root / path).mkdir(parents=True)
                calls.append(called)
                batches = suite._Batches([seconds + len(calls)] * 2, [0.5] * 2, [0.25] * 2)
                if plain:
                    return batches.times
                return (1.0, batches) if name == "relstate" else batches

            return run

        monkeypatch.setattr(suite, "_relstate", side("relstate", 0.0, "ck"))
        monkeypatch.setattr(suite, "_spark_floor", side("floor", 100.0, "floor-checkpoint"))
        monkeypatch.setattr(suite, "_baseline", lambda *a: [9.0, 9.0])
        monkeypatch.setattr(suite, "_stages_alone", side("alone", 200.0, "alone-ck", plain=True))
        monkeypatch.setattr(suite, "_spark_two_stages", side("two", 300.0, "two-stage-checkpoint"))
        point = suite._QUICK.warmup_point()
        unused: Any = None  # the session and the join: every side is a stand-in
        times = suite._measure(unused, tmp_path / "point", unused, point, print, floor=True)
        forward = ["relstate", "floor", "alone", "two", "stored", "ordered"]
        assert calls == [*forward, *reversed(forward), *forward]
        assert times.rounds is not None and len(times.rounds) == suite.FIXED_ROUNDS == 3
        assert (times.rounds[0].relstate.times, times.rounds[0].floor.times) == (
            times.relstate,
            times.floor,
        )
        assert [r.relstate.times for r in times.rounds] == [[1.0] * 2, [12.0] * 2, [13.0] * 2]
        assert [r.floor.times for r in times.rounds] == [[102.0] * 2, [111.0] * 2, [114.0] * 2]
        assert times.alone == [203.0] * 2 + [210.0] * 2 + [215.0] * 2
        assert times.two_stages == [304.0] * 2 + [309.0] * 2 + [316.0] * 2
        assert times.stored is not None and times.stored.times == (
            [305.0] * 2 + [308.0] * 2 + [317.0] * 2
        )
        assert times.ordered is not None and times.ordered.times == (
            [306.0] * 2 + [307.0] * 2 + [318.0] * 2
        )

    def test_where_a_batch_goes_reads_medians_of_each_part(self) -> None:
        """The fixed cost's breakdown reads each part as its own median over
        the batches, in milliseconds: the batch, its time in foreachBatch,
        there in its jobs and the rest, and outside foreachBatch."""
        from bench.suite_fkjoin import _Batches, _pooled, _spent

        runs = [
            _Batches([1.0, 0.8], [0.6, 0.5], [0.4, 0.4]),
            _Batches([0.9], [0.5], [0.3]),
        ]
        assert _spent(_pooled(runs)) == (
            "900 ms a batch: 500 in foreachBatch (400 in its Spark jobs, their planning "
            "by Spark included; 200 before and after them), 400 outside it (Spark's "
            "micro-batch)"
        )

    @pytest.mark.spark
    def test_output_check_compares_with_the_baseline(self, spark: Any, tmp_path: Path) -> None:
        """The suite's check passes when relstate's output, applied batch by
        batch, is the baseline's join, and raises when a row differs."""
        from bench.suite_fkjoin import _check_output

        rows = ["id", "fk", "payload", "rid", "rval"]
        out = [*rows, "row_kind"]
        baseline = [(1, 1, "a", 1, "r"), (2, 1, "b", 1, "r")]
        spark.createDataFrame(baseline, rows).write.parquet(str(tmp_path / "baseline"))
        spark.createDataFrame(
            [(1, 2, "a", 2, "old", "+I"), (2, 1, "b", 1, "r", "+I")], out
        ).write.parquet(str(tmp_path / "out" / "batch=0"))
        spark.createDataFrame([(1, 1, "a", 1, "r", "+U")], out).write.parquet(
            str(tmp_path / "out" / "batch=1")
        )
        _check_output(spark, tmp_path)
        spark.createDataFrame([(2, 1, "b", 1, "other", "+U")], out).write.parquet(
            str(tmp_path / "out" / "batch=2")
        )
        with pytest.raises(RuntimeError, match="1 rows missing, 1 extra"):
            _check_output(spark, tmp_path)


class TestAppendJoinSuite:
    @pytest.mark.spark
    def test_spark_floor_hands_every_row_to_python(self, spark: Any, tmp_path: Path) -> None:
        """The Spark-alone floor job runs every batch of the suite's files
        through foreachBatch and mapInArrow, and refuses a count short of the
        input."""
        from bench import append_join_workload as workload

        small = workload.AppendWorkload(rows=400, batches=2)
        dirs = workload.write_files(small.sides(), tmp_path / "input")
        assert workload.run_spark_floor(spark, small, dirs, tmp_path / "floor", 2) > 0
        more = workload.AppendWorkload(rows=800, batches=2)
        with pytest.raises(RuntimeError, match="saw 800 rows of 1600"):
            workload.run_spark_floor(spark, more, dirs, tmp_path / "short", 2)


class TestRelationalWorkload:
    def test_changelog_retracts_only_live_rows(self) -> None:
        """The aggregate and top-N suites' changelog retracts only rows that
        are live, with the old values, and keeps the batch sizes it names."""
        from bench.relational_workload import changelog_stream

        batches = changelog_stream(500, 100, 4, 20, seed=3)
        assert [b.num_rows for b in batches] == [500, 160, 160, 160]
        live: dict[int, tuple[int, int]] = {}
        for batch in batches:
            for k, v, i, kind in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                if kind in ("-U", "-D"):
                    assert live.pop(i) == (k, v)
                else:
                    assert i not in live
                    live[i] = (k, v)
        assert len(live) == 500

    def test_live_rows_counts_inserts_less_deletes(self) -> None:
        """What an upsert or top-N changelog leaves: +I less -D."""
        from bench.relational_workload import Timed, live_rows

        assert live_rows(Timed(1.0, {"+I": 7, "-U": 3, "+U": 3, "-D": 2})) == 5


class TestPipelineSuite:
    def test_workload_leaves_the_result_it_names(self) -> None:
        """The pipeline suite's changelogs retract only live rows with their
        old values, and replayed, leave the revenue per segment the workload
        names as its result."""
        from bench.suite_pipeline import QUICK, workload

        data = workload(QUICK, seed=3)
        assert len(data.orders) == len(data.customers) == QUICK.batches
        live: list[dict[int, tuple[Any, ...]]] = [{}, {}]
        for tables in zip(data.orders, data.customers, strict=True):
            for side, table in enumerate(tables):
                for row in table.to_pylist():
                    key, value = (
                        row[table.column_names[0]],
                        tuple(row[c] for c in table.column_names[1:-2]),
                    )
                    if row["row_kind"] in ("-U", "-D"):
                        assert live[side].pop(key) == value
                    else:
                        assert key not in live[side]
                        live[side][key] = value
        orders, segments = live
        totals: Counter[tuple[str, str]] = Counter()
        for customer, amount in orders.values():
            totals[(segments[customer][0], "orders")] += 1
            totals[(segments[customer][0], "revenue")] += amount
        names = {s for s, _ in totals}
        assert data.result == Counter(
            (s, totals[(s, "orders")], totals[(s, "revenue")]) for s in names
        )

    @pytest.mark.spark
    def test_one_query_and_two_chained_give_the_result(self, spark: Any, tmp_path: Path) -> None:
        """On a small input both variants of the pipeline suite leave the
        workload's result, and every job each query ran is counted: one
        Spark job per batch in the one query (the join runs in the revenue
        stage's job), one per stage and batch in the chained queries."""
        from bench.suite_pipeline import (
            WARM,
            JobCounter,
            one_query,
            two_queries,
            workload,
        )
        from operators._tools.demo import write_batches

        data = workload(WARM, seed=4)
        write_batches(tmp_path / "in" / "orders", data.orders, prefix="part")
        write_batches(tmp_path / "in" / "customers", data.customers, prefix="part")
        jobs = JobCounter(spark)
        one = one_query(spark, jobs, tmp_path / "in", tmp_path / "one", "smoke_one")
        two = two_queries(spark, jobs, tmp_path / "in", tmp_path / "two", "smoke_two")
        assert one.result == two.result == data.result
        for query in (*one.queries, *two.queries):
            assert query.batches == WARM.batches
            assert query.jobs >= sum(query.grouped.values())
        assert [q.grouped for q in one.queries] == [{"join": 0, "revenue": WARM.batches}]
        assert [q.grouped for q in two.queries] == [
            {"join": WARM.batches},
            {"revenue": WARM.batches},
        ]
        assert [sorted(q.grouped) for q in two.queries] == [["join"], ["revenue"]]


class TestDedupReadings:
    def test_batch_times_read_both_kinds_of_progress(self) -> None:
        """The per-batch reading takes Spark's progress and relstate's alike (both are dicts)."""
        from pyspark.sql.streaming.listener import StreamingQueryProgress

        assert issubclass(StreamingQueryProgress, dict)
        progress = {"durationMs": {"triggerExecution": 300, "addBatch": 200}}
        query = types.SimpleNamespace(recentProgress=[progress, progress])
        assert _batch_ms(query) == "300 ms per batch (200 ms in addBatch)"


def _one_batch_per_frame(spark: Any, tmp_path: Path, frames: list[Any], schema: str) -> Any:
    """A stream of ``frames``, each written as one Parquet file under
    ``tmp_path/in``, one file per micro-batch."""
    (tmp_path / "in").mkdir()
    for i, frame in enumerate(frames):
        frame.coalesce(1).write.parquet(str(tmp_path / f"f{i}"))
        (written,) = (tmp_path / f"f{i}").glob("*.parquet")
        written.rename(tmp_path / "in" / f"part-{i}.parquet")
    return (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
    )


class TestSparkFloor:
    @pytest.mark.spark
    def test_counts_every_row_and_times_each_batch(self, spark: Any, tmp_path: Path) -> None:
        """The Spark-alone floor runs one batch per file, hands every row to
        Python (counted) and times each batch, its time in foreachBatch and,
        within that, in its job."""
        from bench.versus import spark_floor

        frames = [spark.range(i * 10, i * 10 + 10) for i in range(3)]
        stream = _one_batch_per_frame(spark, tmp_path, frames, "id long")
        floor = spark_floor(stream, "id", 2, str(tmp_path / "checkpoint"))
        assert floor.rows == 30
        assert len(floor.batches) == 3 and all(t > 0 for t in floor.batches)
        assert floor.seconds >= sum(floor.batches)
        # Each batch's job within its time in foreachBatch, within the batch.
        assert len(floor.inside) == len(floor.jobs) == 3
        assert all(
            0 < j <= i <= b for j, i, b in zip(floor.jobs, floor.inside, floor.batches, strict=True)
        )

    @pytest.mark.spark
    def test_two_stage_floor_counts_both_stages(self, spark: Any, tmp_path: Path) -> None:
        """Spark alone in the two stages' shape, one job a batch: its second
        stage counts, from the first stage, each row with a key (passed on)
        and one response per such row, one batch per file."""
        from bench.versus import spark_two_stage_floor

        # Ten rows with a key (left rows) and five without (right rows).
        frames = [
            spark.createDataFrame(
                [(i * 10 + k, k % 3) for k in range(10)] + [(None, f) for f in range(5)],
                "id long, fk long",
            )
            for i in range(2)
        ]
        stream = _one_batch_per_frame(spark, tmp_path, frames, "id long, fk long")
        floor = spark_two_stage_floor(stream, "fk", "id", 2, str(tmp_path / "checkpoint"))
        assert floor.rows == 2 * (2 * 10)
        assert len(floor.batches) == 2 and all(t > 0 for t in floor.batches)

    @pytest.mark.spark
    def test_two_stage_floor_with_stores_commits_every_task(
        self, spark: Any, tmp_path: Path
    ) -> None:
        """With stores, each task of both stages loads its partition's store
        at the batch before and commits the batch's version on it (one commit
        per version); the rows counted are the same."""
        from bench.versus import spark_two_stage_floor
        from statestore import PartitionCheckpoint

        frames = [
            spark.createDataFrame([(i * 10 + k, k % 3) for k in range(10)], "id long, fk long")
            for i in range(3)
        ]
        stream = _one_batch_per_frame(spark, tmp_path, frames, "id long, fk long")
        state = str(tmp_path / "state")
        floor = spark_two_stage_floor(stream, "fk", "id", 2, str(tmp_path / "ck"), state)
        assert floor.rows == 3 * (2 * 10)
        for stage in ("first", "second"):
            for partition in (0, 1):
                checkpoint = PartitionCheckpoint(state, stage, partition)
                assert checkpoint.versions() == [0, 1, 2]
                parents = []
                for version in (0, 1, 2):
                    (commit,) = checkpoint.commits(version)
                    parent = checkpoint.manifest(version, commit).parent
                    parents.append(None if parent is None else parent.version)
                assert parents == [None, 0, 1]

    @pytest.mark.spark
    def test_ordered_two_stage_floor_sorts_each_stage_in_the_runners_order(
        self, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Ordered, Spark sorts the first stage's partitions by sequence
        number, retractions first (the order the runner's tasks give their
        rows, ``RowOrder``), and the second stage's by side and the first
        stage's emit order; the rows counted are the same as unordered."""
        from bench import versus
        from operators._engine.row_order import RowOrder
        from operators._spark.session import without_adaptive_execution

        batch = spark.createDataFrame(
            [(k, k % 3, 100 - k, "-U" if k % 2 else "+U") for k in range(10)]
            + [(None, f, 200 + f, "+U") for f in range(5)],
            "id long, fk long, __seq long, row_kind string",
        )
        jobs: dict[bool, Any] = {}
        for ordered in (False, True):
            # The batch function's job for one batch, not the stream around it.
            monkeypatch.setattr(
                versus, "_floor_run", lambda stream, checkpoint, each: each(batch, 1)
            )
            jobs[ordered] = versus.spark_two_stage_floor(
                None, "fk", "id", 2, str(tmp_path / "ck"), ordered=ordered
            )
        with without_adaptive_execution(spark):  # as in the floor's batches
            counts = {o: sum(r[0] for r in job.collect()) for o, job in jobs.items()}
            plans = {
                o: job._jdf.queryExecution().executedPlan().toString() for o, job in jobs.items()
            }
        assert counts == {False: 20, True: 20}
        sorts = [
            line.split("Sort [", 1)[1] for line in plans[True].splitlines() if "Sort [" in line
        ]
        sequence, _ = versus.spark_order(RowOrder(sides=False, kinds=True))
        assert len(sorts) == 2
        # The plan prints the retractions-first expression in its own way.
        assert sorts[1].startswith(sequence) and "IN (-U,-D) THEN 0 ELSE 1 END" in sorts[1]
        assert sorts[0].startswith("__side") and ", __seq" in sorts[0]
        assert "Sort [" not in plans[False]


def test_the_pytest_benchmarks_in_bench_collect() -> None:
    """Every file of ``bench/`` (``python -m pytest bench/ --benchmark-only``,
    which the test command does not run) imports and is collected: an API the
    benchmarks use cannot go away without this test failing."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "bench"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " error" not in done.stdout.splitlines()[-1]


class TestTwsSuite:
    def test_processor_and_native_operator_do_the_same_work(self) -> None:
        """The tws suite's running count gives the same rows batch by batch as
        a processor (both flavours) and as a native operator."""
        from bench.suite_tws import RunningCount, RunningCountProcessor, events, schema
        from operators.stateful import StatefulProcessorOperator
        from operators.testing import OperatorHarness

        batches = events(300, 20, 3, seed=2)
        harnesses = {
            "native": OperatorHarness(RunningCount(schema())),
            **{
                flavour: OperatorHarness(
                    StatefulProcessorOperator(
                        RunningCountProcessor(pandas=flavour == "pandas"),
                        schema(),
                        ["k"],
                        "k long, count long",
                        flavour=flavour,
                    )
                )
                for flavour in ("pandas", "rows")
            },
        }
        for batch in batches:
            (run,) = batch.to_batches()
            out = {
                name: Counter(row for _, row in h.run_batch([(0, run)]))
                for name, h in harnesses.items()
            }
            assert out["native"] == out["pandas"] == out["rows"]
            assert sum(count for _, count in out["native"]) > 0

    def test_a_goal_below_one_shows_two_decimals(self) -> None:
        """A goal that allows a slowdown (below 1) reads with two decimals."""
        c = Comparison("layer", 1_000, 3.5, 2.0, "native", goal=1 / 1.5)
        result = replace(_result(), comparisons=[c])
        assert "≥ 0.67" in markdown(result) and "not met" in markdown(result)
