"""Flink SQL for ``relstate bench --suite flink``: its own virtual
environment, made on first use, and a warm Flink process to talk to.

PyFlink pins pyarrow and py4j versions that clash with PySpark's, so Flink
lives in a virtual environment of its own under the cache directory (the
bench's extra: the tests never install it), and relstate talks to it through
files (changelogs in, changelogs out) and a pipe of commands
(:mod:`bench.flink_worker`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

__all__ = [
    "FLINK",
    "FlinkError",
    "FlinkStopped",
    "FlinkWorker",
    "cpu_seconds",
    "flink_python",
    "venv_dir",
]

#: The PyFlink release the suite runs (Java 17).
FLINK = "apache-flink==2.3.0"
_MARK = "RELSTATE-FLINK "


class FlinkError(RuntimeError):
    """Flink could not be installed, started, or run a statement."""


class FlinkStopped(FlinkError):
    """A statement ran past its time limit and was cancelled: it would have
    taken at least ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"stopped after {seconds:.0f} s, at its time limit")
        self.seconds = seconds


def venv_dir() -> Path:
    """Where Flink's virtual environment lives: ``$RELSTATE_FLINK_VENV``, or
    ``relstate/flink-venv`` under the user's cache directory."""
    given = os.environ.get("RELSTATE_FLINK_VENV")
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "relstate" / "flink-venv"


def flink_python(progress: Callable[[str], None]) -> Path:
    """The Python of Flink's virtual environment, made and filled on first
    use (a few hundred MB from the package index)."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    if not python.exists():
        progress(f"making Flink's virtual environment in {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    found = subprocess.run([str(python), "-c", "import pyflink"], capture_output=True, check=False)
    if found.returncode != 0:
        progress(f"installing {FLINK} into {venv} (a few minutes)")
        installed = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", FLINK], capture_output=True, text=True
        )
        if installed.returncode != 0:
            raise FlinkError(f"pip could not install {FLINK} into {venv}:\n{installed.stderr}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise FlinkError("Flink needs Java 17: no java on PATH and no JAVA_HOME")
    return python


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system, every thread) that process ``pid`` and
    its living descendants have used, from ``/proc``: Flink's JVM is a
    child of the worker, and on a loaded machine its threads get a share of
    the cores that wall time alone does not show."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:  # ended meanwhile
            continue
        # Fields 14 and 15 of stat (utime, stime), counted after the name.
        total += (int(fields[11]) + int(fields[12])) / tick
        pending.extend(int(c) for c in children)
    return total


class FlinkWorker:
    """One warm Flink process (:mod:`~bench.flink_worker`) for a
    whole suite: its table environments and statements, each run to its
    end and timed in the worker. Flink's log goes to ``log``."""

    def __init__(self, python: Path, log: Path) -> None:
        script = Path(__file__).with_name("flink_worker.py")
        self._log: IO[str] = log.open("w", encoding="utf-8")
        self._process = subprocess.Popen(
            [str(python), str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self._answer()  # ready
        self.log = log

    def _answer(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(_MARK):
                answer: dict[str, Any] = json.loads(line[len(_MARK) :])
                if "error" in answer:
                    raise FlinkError(f"Flink failed (its log: {self.log}):\n{answer['error']}")
                return answer
            self._log.write(line)
        raise FlinkError(f"the Flink process ended (code {self._process.wait()}); see {self.log}")

    def _send(self, **command: Any) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        return self._answer()

    def environment(self, name: str, config: Mapping[str, object]) -> None:
        """A streaming table environment ``name`` with ``config``."""
        self._send(op="env", name=name, config=dict(config))

    def ddl(self, env: str, sql: str) -> None:
        """Run a statement that defines something (``CREATE TABLE``)."""
        self._send(op="ddl", env=env, sql=sql)

    def run(self, env: str, sql: str, limit: float | None = None) -> float:
        """Run an ``INSERT`` to its end; its seconds from submission. Given
        ``limit`` (seconds), a statement still running then is cancelled
        and raises :class:`FlinkStopped`."""
        command = {"op": "run", "env": env, "sql": sql}
        answer = self._send(**command) if limit is None else self._send(**command, limit=limit)
        if answer.get("stopped"):
            raise FlinkStopped(float(answer["seconds"]))
        return float(answer["seconds"])

    def cpu_seconds(self) -> float:
        """CPU seconds the Flink processes (the worker and its JVM) have used."""
        return cpu_seconds(self._process.pid)

    def close(self) -> None:
        """Stop the Flink process."""
        try:
            if self._process.poll() is None:
                self._send(op="quit")
                self._process.wait(timeout=60)
        except (FlinkError, OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        finally:
            self._log.close()

    def __enter__(self) -> FlinkWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
