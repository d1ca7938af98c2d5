"""One benchmark run: the comparisons and checkpoint figures, and the machine they ran on."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench.checkpoints import checkpoints
from bench.config import BenchConfig
from bench.measure import Figure, Reading
from bench.sections import Progress, codecs, layouts, versus_raw

__all__ = ["BenchResult", "Machine", "run"]

_PACKAGES = ("rocksdict", "pyarrow", "numpy")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _commit() -> str | None:
    """The git commit of the code being measured (``+changes`` when tracked
    files outside ``docs/``, where the pages go, differ from it), or
    ``None`` outside a git checkout: a page says which code it measured."""
    git = ["git", "-C", str(Path(__file__).resolve().parent.parent)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode:
            return None
        changes = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if changes.stdout.strip() else "")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class Machine:
    """Where a run took place."""

    cores: int
    cpu: str
    system: str
    python: str
    versions: tuple[tuple[str, str], ...]
    #: The 1-minute load average when the run started (other work on the machine).
    load: float | None
    #: The git commit of the code measured (see :func:`_commit`).
    commit: str | None = None

    @classmethod
    def current(cls) -> Machine:
        """This machine, now."""
        return cls(
            cores=os.cpu_count() or 1,
            cpu=_cpu_model(),
            system=platform.platform(terse=True),
            python=platform.python_version(),
            versions=tuple((p, _version(p)) for p in _PACKAGES),
            load=_load(),
            commit=_commit(),
        )


@dataclass(frozen=True)
class BenchResult:
    """Every figure of one run, with when, where and how long."""

    config: BenchConfig
    machine: Machine
    started: dt.datetime
    seconds: float
    figures: tuple[Figure, ...]
    #: The 1-minute load average when the run ended (the run itself adds about 1).
    load_after: float | None = None
    #: Absolute figures (load times, replay rate), shown after their section's ratios.
    readings: tuple[Reading, ...] = ()


def run(config: BenchConfig, progress: Progress | None = None) -> BenchResult:
    """Run the whole benchmark on temporary RocksDB directories."""
    say = progress or (lambda _: None)
    machine = Machine.current()
    started = dt.datetime.now(dt.UTC)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="relstate-bench-") as tmp:
        workdir = Path(tmp)
        figures = [
            *layouts(config, workdir, say),
            *versus_raw(config, workdir, say),
            *codecs(config, say),
        ]
        commits, readings = checkpoints(config, workdir, say)
        figures += commits
    seconds = time.perf_counter() - start
    return BenchResult(config, machine, started, seconds, tuple(figures), _load(), tuple(readings))
