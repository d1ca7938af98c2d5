"""``relstate demo``: one pipeline (join, revenue per segment, top customers)
whose driver, killed with SIGKILL mid-batch and started again, ends with the
outputs Spark batch SQL gives over the inputs; and the demo's parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from operators._tools.demo import (
    CUSTOMERS,
    ORDERS,
    DemoConfig,
    _Progress,
    _table,
    build_pipeline,
    check_batches,
    check_java,
    expected_tables,
    generate,
    materialise,
    segment_table,
    top_table,
    write_batches,
)
from operators.errors import InputError, RunnerError
from operators.testing import PipelineHarness

pytestmark = pytest.mark.spark


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "operators.cli",
        "demo",
        "--batches",
        "4",
        "--orders",
        "300",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


class TestDemo:
    @pytest.mark.parametrize("where", ["local", "s3"])
    def test_crash_and_resume_match_an_uninterrupted_run(
        self, tmp_path: Path, where: str, request: pytest.FixtureRequest
    ) -> None:
        """--crash-after 2 kills the driver process during batch 2, after
        both outputs were written; --resume finishes from the checkpoint, and
        after every batch (those before the crash too) revenue per segment and
        the top 5 match Spark batch SQL over the inputs so far; with the state
        in the checkpoint, and on S3 (a moto server)."""
        state: list[str] = []
        if where == "s3":
            state = ["--state-location", request.getfixturevalue("s3").uri()]
        crashed = _demo("--dir", str(tmp_path), "--crash-after", "2", *state)
        assert crashed.returncode == -9, crashed.stdout + crashed.stderr
        out = crashed.stdout
        assert "batch 1 done (2 of 4)" in out and "batch 2 done" not in out
        assert "--crash-after 2: the pipeline is killed (SIGKILL) during batch 2" in out
        assert f"finish it from the checkpoint {tmp_path / 'checkpoint'}: " in out
        assert f"relstate demo --resume --dir {tmp_path} --batches 4 --orders 300" in out
        resumed = _demo("--dir", str(tmp_path), "--resume", *state)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"resuming from the checkpoint {tmp_path / 'checkpoint'}" in resumed.stdout
        assert "batch 2 done (3 of 4)" in resumed.stdout
        assert "batch 3 done (4 of 4)" in resumed.stdout
        assert "Revenue per segment (amounts are stored in cents" in resumed.stdout
        assert "Top 5 customers by revenue" in resumed.stdout
        # The resumed run checks every batch, those of the killed run too.
        for batch in range(4):
            assert (
                f"batch {batch}: revenue per segment and the top 5 match Spark batch SQL "
                f"over the inputs of batches 0..{batch}"
            ) in resumed.stdout
        assert "DO NOT MATCH" not in resumed.stdout
        assert "top 5 customers match Spark batch SQL after every batch (0..3)" in resumed.stdout

    def test_resume_without_a_run_is_a_clear_error(self, tmp_path: Path) -> None:
        """--resume in an empty directory says what to do, without a traceback."""
        result = _demo("--dir", str(tmp_path / "nothing"), "--resume")
        assert result.returncode == 2
        assert "run `relstate demo` first" in result.stderr
        assert "Traceback" not in result.stderr


class TestDemoParts:
    @pytest.mark.parametrize(
        ("args", "says"),
        [
            (["--batches", "6", "--crash-after", "6"], "this run has batches 0..5"),
            (["--crash-after", "-1"], "this run has batches 0..5"),
            (["--crash-after", "1", "--resume"], "--crash-after kills a fresh run"),
            (["--batches", "0"], "--batches must be at least 1"),
        ],
    )
    def test_settings_the_run_cannot_honour_are_refused(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
    ) -> None:
        """A --crash-after beyond the run's batches (which would never crash),
        --crash-after with --resume, or no batches: exit 2 with a clear error,
        before Spark starts or the directory is touched."""
        from operators.cli import main

        assert main(["demo", "--dir", str(tmp_path / "demo"), *args]) == 2
        captured = capsys.readouterr()
        assert says in captured.err and "starting Spark" not in captured.out
        assert not (tmp_path / "demo").exists()

    def test_progress_counts_batches_from_zero(self) -> None:
        """The progress line names the batch as the tables do (from 0) and
        how many of the run's batches are done."""
        progress = _Progress(6)
        line = progress.line(2, 1.25)
        assert line.startswith("batch 2 done (3 of 6) [###############...............]")

    def test_resume_command_repeats_the_runs_settings(self) -> None:
        """The resume hint gives the directory and the settings that differ
        from the defaults, which the reference check needs again."""
        config = DemoConfig(directory=Path("elsewhere"), batches=4, orders_per_batch=300)
        assert config.resume_command() == (
            "relstate demo --resume --dir elsewhere --batches 4 --orders 300"
        )
        assert DemoConfig().resume_command() == "relstate demo --resume"
        assert DemoConfig().checkpoint == Path("relstate-demo").resolve() / "checkpoint"

    def test_tables_show_dollars_and_say_so(self) -> None:
        """Amounts are stored in cents; both tables show dollars and say
        both, the most revenue first, the top customers ranked from 1."""
        segments = segment_table([("smb", 2, 12_345), ("enterprise", 1, 99_900)])
        assert "stored in cents, shown in dollars" in segments[0]
        assert [line.split() for line in segments[2:]] == [
            ["enterprise", "1", "999.00"],
            ["smb", "2", "123.45"],
        ]
        top = top_table([("customer-0001", "smb", 2, 12_345), ("customer-0002", "smb", 1, 99_900)])
        assert top[0].startswith("Top 5 customers by revenue") and "shown in dollars" in top[0]
        assert [line.split() for line in top[2:]] == [
            ["1", "customer-0002", "smb", "1", "999.00"],
            ["2", "customer-0001", "smb", "2", "123.45"],
        ]

    def test_missing_java_is_a_clear_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without Java the demo raises RunnerError saying how to install one."""
        monkeypatch.delenv("JAVA_HOME", raising=False)
        monkeypatch.setenv("PATH", "/nonexistent")
        with pytest.raises(RunnerError, match="Java 17"):
            check_java()

    def test_generated_changelogs_are_consistent(self) -> None:
        """The demo's sources only retract orders and customers that exist,
        with their current values; customers do change segment, and some
        orders come before their customer."""
        orders: dict[int, int] = {}
        segments: dict[str, str] = {}
        moves, early = 0, 0
        for order_changes, customer_changes in generate(
            DemoConfig(batches=3, orders_per_batch=500)
        ):
            for c in customer_changes.to_pylist():
                if c["row_kind"] == "+I":
                    assert c["customer"] not in segments
                    segments[c["customer"]] = c["segment"]
                elif c["row_kind"] == "-U":
                    assert segments.pop(c["customer"]) == c["segment"]
                else:
                    assert c["row_kind"] == "+U"
                    segments[c["customer"]] = c["segment"]
                    moves += 1
            for r in order_changes.to_pylist():
                early += r["customer"] not in segments
                if r["row_kind"] in ("+I", "+U"):
                    orders[r["order_id"]] = r["amount"]
                else:
                    assert orders.pop(r["order_id"]) == r["amount"]
        assert moves > 0 and early > 0

    def test_materialise_nets_out_retractions(self) -> None:
        """An output changelog's current rows: additions minus retractions,
        whatever the order of the rows."""
        rows = [
            {"row_kind": "-U", "k": "a", "v": 1},
            {"row_kind": "+I", "k": "a", "v": 1},
            {"row_kind": "+U", "k": "a", "v": 2},
            {"row_kind": "+I", "k": "b", "v": 3},
            {"row_kind": "-D", "k": "b", "v": 3},
        ]
        assert materialise(rows, ["k", "v"]) == [("a", 2)]

    def test_materialise_upsert_stream_by_key(self) -> None:
        """An upsert stream (+U with no -U) materialises by its key: each
        key's row of the latest batch, a -D leaving nothing."""
        rows = [
            {"row_kind": "+U", "k": "a", "v": 2, "batch": 1},
            {"row_kind": "+I", "k": "a", "v": 1, "batch": 0},
            {"row_kind": "+I", "k": "b", "v": 3, "batch": 0},
            {"row_kind": "-D", "k": "b", "v": 3, "batch": 2},
            {"row_kind": "+I", "k": "c", "v": 4, "batch": 2},
        ]
        assert materialise(rows, ["k", "v"], key=["k"]) == [("a", 2), ("c", 4)]

    def test_materialise_refuses_upsert_stream_without_key(self) -> None:
        """Counting rows of an upsert stream would keep each old row beside
        its new one: without the key it is refused with an InputError."""
        rows = [
            {"row_kind": "+I", "k": "a", "v": 1},
            {"row_kind": "+U", "k": "a", "v": 2},
        ]
        with pytest.raises(InputError, match="upsert stream"):
            materialise(rows, ["k", "v"])


class TestExpectedTables:
    def test_sql_materialises_the_changelogs_then_groups_and_ranks(
        self, spark: Any, tmp_path: Path
    ) -> None:
        """The SQL check takes each order's and customer's latest change
        (dropping deletions), joins them, sums revenue per segment and ranks
        customers by revenue, ties by customer, keeping five."""
        orders = [
            (1, "c1", 100, 0, "+I"),
            (1, "c1", 100, 5, "-U"),
            (1, "c1", 300, 6, "+U"),
            (2, "c2", 200, 1, "+I"),
            (3, "c3", 900, 2, "+I"),
            (3, "c3", 900, 7, "-D"),
            (4, "c4", 300, 3, "+I"),
            (5, "c9", 999, 4, "+I"),  # no such customer: no join
            *[(10 + i, f"d{i}", 50 + i, 10 + i, "+I") for i in range(4)],
        ]
        customers = [
            ("c1", "smb", 0, "+I"),
            ("c2", "smb", 0, "+I"),
            ("c3", "retail", 0, "+I"),
            ("c4", "retail", 0, "+I"),
            ("c4", "retail", 8, "-U"),
            ("c4", "smb", 9, "+U"),
            *[(f"d{i}", "retail", 10, "+I") for i in range(4)],
        ]
        write_batches(tmp_path / "orders", [_table(ORDERS, orders)], "orders")
        write_batches(tmp_path / "customers", [_table(CUSTOMERS, customers)], "customers")
        segments, top = expected_tables(spark, tmp_path)
        assert sorted(segments) == [("retail", 4, 206), ("smb", 3, 800)]
        assert sorted(top, key=lambda r: (-r[3], r[0])) == [
            ("c1", "smb", 1, 300),
            ("c4", "smb", 1, 300),
            ("c2", "smb", 1, 200),
            ("d3", "retail", 1, 53),
            ("d2", "retail", 1, 52),
        ]

    def test_sql_takes_the_inputs_up_to_the_batch(self, spark: Any, tmp_path: Path) -> None:
        """Through batch N, the SQL check reads the inputs of batches 0..N
        only: a later batch's changes are not seen."""
        orders = [[(1, "c1", 100, 0, "+I")], [(1, "c1", 100, 2, "-U"), (1, "c1", 400, 3, "+U")]]
        customers = [[("c1", "smb", 1, "+I")], [("c2", "retail", 4, "+I")]]
        write_batches(tmp_path / "orders", [_table(ORDERS, b) for b in orders], "orders")
        write_batches(
            tmp_path / "customers", [_table(CUSTOMERS, b) for b in customers], "customers"
        )
        assert expected_tables(spark, tmp_path, 0) == ([("smb", 1, 100)], [("c1", "smb", 1, 100)])
        assert expected_tables(spark, tmp_path, 1) == ([("smb", 1, 400)], [("c1", "smb", 1, 400)])
        assert expected_tables(spark, tmp_path) == expected_tables(spark, tmp_path, 1)

    def test_check_batches_names_the_batch_that_differs(
        self, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Each batch's outputs so far are checked against the SQL through that
        batch: right after batch 0 and wrong after batch 1 is reported as
        such, batch by batch."""
        orders = [[(1, "c1", 100, 0, "+I")], [(1, "c1", 100, 2, "-U"), (1, "c1", 400, 3, "+U")]]
        customers = [[("c1", "smb", 1, "+I")], []]
        write_batches(tmp_path / "orders", [_table(ORDERS, b) for b in orders], "orders")
        write_batches(
            tmp_path / "customers", [_table(CUSTOMERS, b) for b in customers], "customers"
        )
        segment = {"c_segment": "smb", "orders": 1}
        top = {"c_customer": "c1", "c_segment": "smb", "orders": 1}
        segment_rows = [
            {"batch": 0, "row_kind": "+I", **segment, "revenue": 100},
            {"batch": 1, "row_kind": "-U", **segment, "revenue": 100},
            {"batch": 1, "row_kind": "+U", **segment, "revenue": 999},  # wrong: 400
        ]
        top_rows = [
            {"batch": 0, "row_kind": "+I", **top, "revenue": 100},
            {"batch": 1, "row_kind": "-D", **top, "revenue": 100},
            {"batch": 1, "row_kind": "+I", **top, "revenue": 400},
        ]
        assert check_batches(spark, tmp_path, segment_rows, top_rows, 2) == [(0, True), (1, False)]
        out = capsys.readouterr().out
        assert "batch 0: revenue per segment and the top 5 match Spark batch SQL" in out
        assert "batch 1: revenue per segment and the top 5 DO NOT MATCH Spark batch SQL" in out


class TestDemoPipeline:
    def test_harness_run_equals_the_tables_computed_directly(self) -> None:
        """The demo's pipeline run record at a time (4 partitions, Spark's
        routing) over the generated changelogs: its two materialised outputs
        equal revenue per segment and the top 5 customers computed directly
        from the final orders and customers."""
        config = DemoConfig(batches=3, orders_per_batch=400, customers=40, seed=3)
        pipeline, segments, top = build_pipeline(ORDERS, CUSTOMERS)
        outputs: dict[str, list[dict[str, Any]]] = {segments.name: [], top.name: []}
        orders: dict[int, tuple[str, int]] = {}
        customers: dict[str, str] = {}
        with PipelineHarness(pipeline, 4) as harness:
            for order_changes, customer_changes in generate(config):
                out = harness.run_batch({"orders": order_changes, "customers": customer_changes})
                for name, rows in outputs.items():
                    rows.extend(out[name].to_pylist())
                for c in customer_changes.to_pylist():
                    if c["row_kind"] in ("+I", "+U"):
                        customers[c["customer"]] = c["segment"]
                for o in order_changes.to_pylist():
                    if o["row_kind"] in ("+I", "+U"):
                        orders[o["order_id"]] = (o["customer"], o["amount"])
                    else:
                        del orders[o["order_id"]]
        per_segment: dict[str, tuple[int, int]] = {}
        per_customer: dict[str, tuple[int, int]] = {}
        for customer, amount in orders.values():
            if customer not in customers:
                continue
            for table, key in ((per_segment, customers[customer]), (per_customer, customer)):
                count, total = table.get(key, (0, 0))
                table[key] = (count + 1, total + amount)
        ranked = sorted(per_customer.items(), key=lambda kv: (-kv[1][1], kv[0]))[:5]
        assert materialise(outputs[segments.name], ["c_segment", "orders", "revenue"]) == sorted(
            (s, n, r) for s, (n, r) in per_segment.items()
        )
        assert materialise(
            outputs[top.name], ["c_customer", "c_segment", "orders", "revenue"]
        ) == sorted((c, customers[c], n, r) for c, (n, r) in ranked)
