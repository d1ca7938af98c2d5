"""``relstate demo``: a driver killed with SIGKILL mid-batch and started again
ends with the same output as an uninterrupted run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from operators.demo import DemoConfig, check_java, generate, reference
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
        assert "batch 2/4" in crashed.stdout and "batch 3/4" not in crashed.stdout
        resumed = _demo("--dir", str(tmp_path), "--resume", *state)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "batch 4/4" in resumed.stdout
        assert "matches the same operator run" in resumed.stdout

    def test_resume_without_a_run_is_a_clear_error(self, tmp_path: Path) -> None:
        """--resume in an empty directory says what to do, without a traceback."""
        result = _demo("--dir", str(tmp_path / "nothing"), "--resume")
        assert result.returncode == 2
        assert "run `relstate demo` first" in result.stderr
        assert "Traceback" not in result.stderr


class TestDemoParts:
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
