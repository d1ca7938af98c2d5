"""Crash tests: a real worker process is SIGKILLed at each fault point (and at
random moments in the soak test); a new store must then load exactly the state
of the committed operations, and go on committing from it. Each runs on a
local checkpoint and on S3 (a moto server on loopback)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from statestore import StateStore, _checkpoint, _faults, _retention, _store, _transfer
from statestore._faults import ENV_VAR
from statestore._faults import STORE_POINTS as POINTS
from statestore._filesystems import filesystem_for
from tests._s3 import MotoS3
from tests.statestore._crash_worker import (
    OPERATOR,
    TABLES,
    Model,
    apply_ops,
    config,
    empty_model,
    random_ops,
    store_state,
)

REPO = Path(__file__).parents[2]
INTERVAL, RETAIN = 3, 5
#: Points reached once per worker run; every other point is killed at its 2nd hit.
ONCE = {p for p in POINTS if p.startswith(("load.", "close."))}


@dataclass
class History:
    """The committed state per version, rebuilt from workers' output lines."""

    committed: dict[int, Model] = field(default_factory=dict)
    #: The version a worker began to commit but did not report done, and the
    #: state it would have.
    pending: tuple[int, Model] | None = None

    def latest(self) -> Model:
        return self.committed[max(self.committed)] if self.committed else empty_model()

    def feed(self, lines: list[list[Any]]) -> None:
        for line in lines:
            if line[0] == "loaded":
                self.settle(line[1])
            elif line[0] == "begin":
                self.pending = (line[1], apply_ops(self.latest(), line[2]))
            elif line[0] == "done":
                assert self.pending is not None and self.pending[0] == line[1]
                self.committed[line[1]] = self.pending[1]
                self.pending = None

    def settle(self, newest: int | None) -> None:
        """Account for a commit whose manifest was published before the crash
        although the worker could not report it."""
        if self.pending is not None and newest == self.pending[0]:
            self.committed[newest] = self.pending[1]
        self.pending = None
        known = max(self.committed) if self.committed else None
        assert newest == known, f"newest version {newest}, last committed {known}"


def run_worker(
    location: str, local: Path, versions: int, seed: int, fault: str | None = None
) -> tuple[int, list[list[Any]], str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if fault is not None:
        env[ENV_VAR] = fault
    args = [location, str(local), str(versions), str(seed), str(INTERVAL), str(RETAIN)]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.statestore._crash_worker", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, _parse(proc.stdout), proc.stderr


def _parse(stdout: str) -> list[list[Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("[")]


def _open(location: str, local: Path) -> StateStore:
    return StateStore(location, OPERATOR, 0, TABLES, config(str(local), INTERVAL, RETAIN))


def verify(history: History, location: str, local: Path, every_version: bool) -> None:
    """A new store on ``local`` loads the newest version (and, if asked, every
    kept one) exactly, then commits one more version on top of it."""
    with _open(location, local) as store:
        kept = store.versions()
        history.settle(kept[-1] if kept else None)
        newest = kept[-1]
        for version in kept if every_version else [newest]:
            store.load(version)
            assert store_state(store) == history.committed[version], f"version {version}"
        store.load(newest)
        assert store_state(store) == history.committed[newest]
        ops = random_ops(random.Random(newest), store, newest + 1)
        store.commit(newest + 1)
        history.committed[newest + 1] = apply_ops(history.committed[newest], ops)
    with _open(location, local.parent / f"{local.name}-check") as fresh:
        fresh.load(newest + 1)
        assert store_state(fresh) == history.committed[newest + 1]


#: Where the checkpoint lives: a local directory, or a bucket of the moto S3
#: server. On S3 a file is uploaded once under its final name, so the points
#: between a temporary file and its rename are never reached there.
WHERE = ("local", "s3")
CASES = [("local", p) for p in POINTS] + [
    ("s3", p) for p in POINTS if not p.endswith(".after_temp")
]


class Locations:
    """Fresh checkpoint locations on one backend, and copies of them."""

    def __init__(self, where: str, request: pytest.FixtureRequest) -> None:
        self.where = where
        self.request = request

    def new(self, root: Path) -> str:
        if self.where == "local":
            return str(root / "ckpt")
        s3: MotoS3 = self.request.getfixturevalue("s3")
        return s3.uri()

    def copy(self, src: str, dst: str) -> None:
        src_fs, src_path = filesystem_for(src)
        dst_fs, dst_path = filesystem_for(dst)
        pafs.copy_files(src_path, dst_path, source_filesystem=src_fs, destination_filesystem=dst_fs)


@dataclass
class Template:
    """A checkpoint with versions 1..4 and the clean local directory that wrote it."""

    location: str
    local: Path
    history: History


@dataclass
class Crash:
    """One worker run killed at a fault point, with its directories."""

    root: Path
    location: str
    history: History
    returncode: int
    lines: list[list[Any]]
    stderr: str


class Backend:
    """The template and the crashed copies of one backend, made once."""

    def __init__(
        self, where: str, request: pytest.FixtureRequest, factory: pytest.TempPathFactory
    ) -> None:
        self.locations = Locations(where, request)
        self.factory = factory
        root = factory.mktemp(f"template-{where}")
        location = self.locations.new(root)
        code, lines, err = run_worker(location, root / "local", 4, seed=1)
        assert code == 0, err
        history = History()
        history.feed(lines)
        assert sorted(history.committed) == [1, 2, 3, 4]
        self.template = Template(location, root / "local", history)
        self._crashes: dict[str, Crash] | None = None

    def crashes(self) -> dict[str, Crash]:
        """For every fault point of the backend, a copy of the template
        checkpoint on which a worker ran 8 more versions and was killed at the
        point. The workers run concurrently: most of their time is process
        start-up and fsync."""
        if self._crashes is None:
            points = [p for w, p in CASES if w == self.locations.where]
            with ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 1) * 2)) as pool:
                self._crashes = dict(zip(points, pool.map(self._crash, points), strict=True))
        return self._crashes

    def _crash(self, point: str) -> Crash:
        root = self.factory.mktemp(point.replace(".", "-"))
        location = self.locations.new(root)
        self.locations.copy(self.template.location, location)
        shutil.copytree(self.template.local, root / "clean-local")
        nth = 1 if point in ONCE else 2
        code, lines, err = run_worker(
            location,
            root / "crashed-local",
            8,
            seed=zlib.crc32(point.encode()),
            fault=f"{point}@{nth}",
        )
        return Crash(
            root, location, History(dict(self.template.history.committed)), code, lines, err
        )


@pytest.fixture(scope="module")
def backends(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Backend]]:
    """Each backend's template and crashes, made on first use."""
    made: dict[str, Backend] = {}

    def get(where: str) -> Backend:
        if where not in made:
            made[where] = Backend(where, request, tmp_path_factory)
        return made[where]

    yield get


class TestCrashAtEachFaultPoint:
    @pytest.mark.parametrize(("where", "point"), CASES)
    def test_recovers_committed_state(
        self, where: str, point: str, backends: Callable[[str], Backend]
    ) -> None:
        """Killed at the point, the worker's committed versions all load exactly,
        from its own local directory, an older clean one, and a fresh one."""
        crash = backends(where).crashes()[point]
        assert crash.returncode == -signal.SIGKILL, (
            f"the worker was not killed at {point}: {crash.stderr[-2000:]}"
        )
        assert ["closed"] not in crash.lines
        history = crash.history
        history.feed(crash.lines)
        verify(history, crash.location, crash.root / "crashed-local", every_version=True)
        verify(history, crash.location, crash.root / "clean-local", every_version=False)

    @pytest.mark.parametrize("where", WHERE)
    def test_every_point_is_reached_by_the_workload(
        self,
        where: str,
        backends: Callable[[str], Backend],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The crash workload passes every fault point of the backend often
        enough to be killed there (so no parametrized case above is vacuous)."""
        seen: list[str] = []

        def spy(name: str) -> None:
            seen.append(name)
            _faults.fault(name)

        for module in (_checkpoint, _retention, _store, _transfer):
            monkeypatch.setattr(module, "fault", spy)
        backend = backends(where)
        ckpt = backend.locations.new(tmp_path)
        backend.locations.copy(backend.template.location, ckpt)
        store = _open(ckpt, tmp_path / "local")
        store.load(store.versions()[-1])
        for version in range(5, 13):
            random_ops(random.Random(version), store, version)
            info = store.commit(version)
            store.record_winner(version, info.commit_id)
        store.close()
        for w, point in CASES:
            if w == where:
                assert seen.count(point) >= (1 if point in ONCE else 2), point


class TestSoak:
    def _soak(self, ckpt: str, root: Path, rounds: int, seed: int) -> None:
        rng = random.Random(seed)
        local = root / "local"
        history = History()
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        kills = 0
        for round_no in range(rounds):
            args = [ckpt, str(local), "40", str(seed * 1000 + round_no), str(INTERVAL)]
            stderr_path = root / f"worker-{round_no}.err"
            with open(stderr_path, "w") as stderr:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.statestore._crash_worker", *args, str(RETAIN)],
                    cwd=REPO,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
                assert proc.stdout is not None
                first = proc.stdout.readline()  # the worker has loaded: start the clock
                time.sleep(rng.uniform(0.0, 0.8))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                # Read on through the same buffered reader that read the first line.
                out = first + proc.stdout.read()
                proc.wait(timeout=120)
            err = stderr_path.read_text()
            assert proc.returncode in (0, -signal.SIGKILL), err[-2000:]
            kills += proc.returncode == -signal.SIGKILL
            history.feed(_parse(out))
            if history.committed or history.pending:
                verify(history, ckpt, local, every_version=round_no == rounds - 1)
        assert kills >= rounds // 2, f"only {kills} of {rounds} workers were killed mid-run"

    @pytest.mark.parametrize("where", WHERE)
    def test_random_kills(self, where: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        """Workers killed at random moments never lose or double a committed
        row, on a local checkpoint and on S3."""
        self._soak(Locations(where, request).new(tmp_path), tmp_path, rounds=4, seed=7)

    @pytest.mark.slow
    def test_random_kills_long(self, tmp_path: Path) -> None:
        """The same over many more kills."""
        self._soak(str(tmp_path / "ckpt"), tmp_path, rounds=40, seed=11)
