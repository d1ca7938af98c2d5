"""Fault points that make a process wait (arm_pause), for tests that act on
a process while it stands at a point."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from statestore import _faults

POINT = "runner.task_after_commit"


class TestArmPause:
    def test_the_armed_process_waits_until_released(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The process whose pid is armed renames the file to paused-<pid> at
        the point and goes on only once that file is removed; a second pass
        does not wait again."""
        monkeypatch.setenv(_faults.DIR_ENV_VAR, str(tmp_path))
        _faults.arm_pause(str(tmp_path), POINT, os.getpid())
        passed = threading.Event()
        thread = threading.Thread(target=lambda: (_faults.fault(POINT), passed.set()))
        thread.start()
        paused = tmp_path / f"{POINT}.paused-{os.getpid()}"
        deadline = time.monotonic() + 10
        while not paused.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert paused.exists() and not passed.wait(0.3)
        paused.unlink()
        thread.join(10)
        assert passed.is_set()
        _faults.fault(POINT)  # once only

    def test_another_pid_does_not_wait(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A pause armed for another process leaves this one running."""
        monkeypatch.setenv(_faults.DIR_ENV_VAR, str(tmp_path))
        _faults.arm_pause(str(tmp_path), POINT, os.getpid() + 1)
        _faults.fault(POINT)
        assert (tmp_path / f"{POINT}.pause-{os.getpid() + 1}").exists()
