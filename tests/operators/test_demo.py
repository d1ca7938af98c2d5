"""``relstate demo``: a driver killed with SIGKILL mid-batch and started again
ends with the same output as an uninterrupted run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from operators.demo import DemoConfig, _Progress, check_java, generate, reference, revenue_table
from operators.errors import RunnerError

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
        """--crash-after 2 kills the driver process during batch 2; --resume
        finishes from the checkpoint, and every batch's output matches; with
        the state in the checkpoint, and on S3 (a moto server)."""
        state: list[str] = []
        if where == "s3":
            state = ["--state-location", request.getfixturevalue("s3").uri()]
        crashed = _demo("--dir", str(tmp_path), "--crash-after", "2", *state)
        assert crashed.returncode == -9, crashed.stdout + crashed.stderr
        out = crashed.stdout
        assert "batch 1 done (2 of 4)" in out and "batch 2 done" not in out
        assert "batch 2: output written; --crash-after 2 kills the pipeline now" in out
        assert f"finish it from the checkpoint {tmp_path / 'checkpoint'}: " in out
        assert f"relstate demo --resume --dir {tmp_path} --batches 4 --orders 300" in out
        resumed = _demo("--dir", str(tmp_path), "--resume", *state)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"resuming from the checkpoint {tmp_path / 'checkpoint'}" in resumed.stdout
        assert "batch 2 done (3 of 4)" in resumed.stdout
        assert "batch 3 done (4 of 4)" in resumed.stdout
        assert "matches the same operator run" in resumed.stdout

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
        progress = _Progress(None, 6, None, "")  # type: ignore[arg-type]
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

    def test_revenue_is_shown_in_dollars_and_says_so(self) -> None:
        """Amounts are stored in cents; the report shows dollars and says
        both, top revenue first."""
        lines = revenue_table({"customer-0001": (2, 12_345), "customer-0002": (1, 99_900)})
        assert "stored in cents, shown in dollars" in lines[0]
        assert lines[1].split() == ["customer", "orders", "revenue", "($)"]
        assert [line.split() for line in lines[2:]] == [
            ["customer-0002", "1", "999.00"],
            ["customer-0001", "2", "123.45"],
        ]

    def test_missing_java_is_a_clear_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without Java the demo raises RunnerError saying how to install one."""
        monkeypatch.delenv("JAVA_HOME", raising=False)
        monkeypatch.setenv("PATH", "/nonexistent")
        with pytest.raises(RunnerError, match="Java 17"):
            check_java()

    def test_generated_changelog_is_consistent(self) -> None:
        """The demo's source only retracts orders that exist, with their current amount."""
        live: dict[int, int] = {}
        for table in generate(DemoConfig(batches=3, orders_per_batch=500)):
            for r in table.to_pylist():
                if r["row_kind"] in ("+I", "+U"):
                    live[r["order_id"]] = r["value"]
                else:
                    assert live.pop(r["order_id"]) == r["value"]

    def test_reference_has_one_output_set_per_batch(self) -> None:
        """The record-at-a-time reference gives one multiset of rows per batch."""
        batches = generate(DemoConfig(batches=2, orders_per_batch=50))
        expected = reference(batches)
        assert len(expected) == 2 and all(sum(c.values()) > 0 for c in expected)
