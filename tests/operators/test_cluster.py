"""A stateful query on two executor JVMs survives the SIGKILL of one of them
during a batch: same output as an undisturbed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.operators._cluster_job import WORKLOADS

pytestmark = pytest.mark.spark

REPO = Path(__file__).parents[2]


class TestExecutorKilled:
    @pytest.mark.parametrize("workload", sorted(WORKLOADS))
    def test_same_output_as_an_undisturbed_run(self, workload: str, tmp_path: Path) -> None:
        """On local-cluster[2,1,1024], with one executor JVM SIGKILLed while a
        task of batch 2 is in the operator, the query finishes and every
        batch's output equals an undisturbed run's and the reference."""
        env = {**os.environ, "PYTHONPATH": str(REPO)}
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
        assert len(result["killed"]) == 1, "an executor JVM must have been killed"
        assert result["disturbed"] == result["calm"]
        assert result["calm"] == result["reference"]
