"""A stateful query on two executor JVMs survives the SIGKILL of one of them
during a batch: same output as an undisturbed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.operators._cluster_job import WORKLOADS

pytestmark = pytest.mark.spark

REPO = Path(__file__).parents[2]


class TestExecutorKilled:
    @pytest.mark.parametrize("workload", sorted(WORKLOADS))
    def test_same_output_as_an_undisturbed_run(self, workload: str, tmp_path: Path) -> None:
        """On local-cluster[2,1,1024], a task of batch 2 commits partition 0
        and waits; its executor JVM is SIGKILLed and only then released, and
        the paused worker exits. The retry commits a second attempt, which is
        the recorded winner, and every batch's output equals an undisturbed
        run's and the reference."""
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "tests.operators._cluster_job", workload, str(tmp_path), "2"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        result = json.loads((tmp_path / "result.json").read_text())
        seconds = result["seconds"]
        exit_s = result["killed"]["exit_s"]
        print(f"{workload}: {time.monotonic() - started:.0f} s; {seconds}; worker exit {exit_s} s")
        killed = result["killed"]
        assert killed["executor"] is not None, "an executor JVM must have been killed"
        assert killed["worker_exited"], "the paused Python worker must exit"
        zombie = killed["commit_id"]
        assert len(result["attempts"]) == 2 and zombie in result["attempts"]
        retry = next(c for c in result["attempts"] if c != zombie)
        assert result["winner"] == result["recorded"] == retry
        assert result["disturbed"] == result["calm"]
        assert result["calm"] == result["reference"]
