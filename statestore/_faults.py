"""Named fault points, for crash tests.

The state store calls :func:`fault` at each point where a crash matters: before
and after every checkpoint file it writes, around the manifest publish, in load,
in snapshot upload and in cleanup. In production the call does nothing.

When the environment variable ``RELSTATE_FAULT`` names a point, the process
kills itself with SIGKILL there, as a power cut or an OOM killer would: no
``finally`` block, no flush, no atexit handler runs. ``name@N`` kills at the
N-th time the point is reached in this process (``name`` alone is ``name@1``).

Tests that stay in one process use :func:`inject`, which makes a point raise
:class:`InjectedFault` instead.

Tests of many processes (Spark's Python workers, a driver started again) arm a
point once with :func:`arm`: a file named after the point in the directory
that ``RELSTATE_FAULT_DIR`` names. The first process to reach the point removes
the file and dies there; the others, and later runs, go on.

A test that must act on a process while it stands at a point (kill its
executor, say) makes it wait there with :func:`arm_pause`: the process of that
pid renames the file to ``{point}.paused-{pid}`` when it arrives, and waits
until the test removes that file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator

__all__ = [
    "DIR_ENV_VAR",
    "ENV_VAR",
    "POINTS",
    "RUNNER_POINTS",
    "STORE_POINTS",
    "InjectedFault",
    "arm",
    "arm_pause",
    "fault",
    "inject",
]

ENV_VAR = "RELSTATE_FAULT"
DIR_ENV_VAR = "RELSTATE_FAULT_DIR"

#: The state store's fault points, in the order a commit, a load and a close
#: reach them; except that a commit writes its changelog (the ``changelog.*``
#: points) while its local write runs (``commit.after_local_write``).
STORE_POINTS: tuple[str, ...] = (
    "spill.after_segment",
    "commit.start",
    "changelog.before_write",
    "changelog.after_temp",
    "changelog.after_write",
    "commit.after_local_write",
    "snapshot.before_checkpoint",
    "snapshot.before_write",
    "snapshot.after_temp",
    "snapshot.after_write",
    "snapshot.after_upload",
    "manifest.before_write",
    "manifest.after_temp",
    "manifest.after_write",
    "commit.after_finish",
    "cleanup.before_delete",
    "cleanup.after_manifests",
    "cleanup.after_files",
    "winner.before_write",
    "winner.after_temp",
    "winner.after_write",
    "load.before_download",
    "load.after_download",
    "load.after_replay",
    "close.before_marker",
    "close.after_marker",
)
#: The Spark runner's: a task that committed its partition but died before
#: returning its output; a driver that wrote a batch's output but died before
#: recording the batch; a driver of a batch of several Spark jobs that ran a
#: job of its stages but died before the next one.
RUNNER_POINTS: tuple[str, ...] = (
    "runner.task_after_commit",
    "runner.driver_after_sink",
    "runner.driver_between_stages",
    "runner.later_stage_after_commit",
)
#: Every fault point.
POINTS: tuple[str, ...] = STORE_POINTS + RUNNER_POINTS
_KNOWN = frozenset(POINTS)

_hits: Counter[str] = Counter()
_injected: dict[str, int] = {}


class InjectedFault(Exception):
    """Raised at a fault point that a test armed with :func:`inject`."""

    def __init__(self, point: str) -> None:
        super().__init__(f"fault injected at {point!r}")
        self.point = point


def _parse(spec: str) -> tuple[str, int]:
    point, _, nth = spec.partition("@")
    return point, int(nth) if nth else 1


def fault(name: str) -> None:
    """Crash (or raise, under :func:`inject`) here if a test asked for it."""
    if name not in _KNOWN:
        raise ValueError(f"unknown fault point {name!r}; add it to statestore._faults.POINTS")
    armed = os.environ.get(DIR_ENV_VAR)
    if armed:
        try:
            os.remove(os.path.join(armed, name))
        except FileNotFoundError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
        _pause(armed, name)
    spec = os.environ.get(ENV_VAR)
    if spec:
        point, nth = _parse(spec)
        if point == name:
            _hits[name] += 1
            if _hits[name] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
    if name in _injected:
        _injected[name] -= 1
        if _injected[name] == 0:
            del _injected[name]
            raise InjectedFault(name)


def arm(directory: str, name: str) -> None:
    """Make the first process that reaches point ``name``, with
    ``RELSTATE_FAULT_DIR=directory`` in its environment, die there (once)."""
    if name not in _KNOWN:
        raise ValueError(f"unknown fault point {name!r}; known points: {POINTS}")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "w"):
        pass


def arm_pause(directory: str, name: str, pid: int) -> None:
    """Make process ``pid`` wait at point ``name`` (once), with
    ``RELSTATE_FAULT_DIR=directory`` in its environment, until the test
    removes ``{directory}/{name}.paused-{pid}``."""
    if name not in _KNOWN:
        raise ValueError(f"unknown fault point {name!r}; known points: {POINTS}")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.pause-{pid}"), "w"):
        pass


def _pause(directory: str, name: str) -> None:
    armed = os.path.join(directory, f"{name}.pause-{os.getpid()}")
    paused = os.path.join(directory, f"{name}.paused-{os.getpid()}")
    try:
        os.rename(armed, paused)
    except FileNotFoundError:
        return
    while os.path.exists(paused):
        time.sleep(0.05)


@contextlib.contextmanager
def inject(name: str, nth: int = 1) -> Iterator[None]:
    """Within the block, the ``nth`` time point ``name`` is reached it raises
    :class:`InjectedFault` (once)."""
    if name not in _KNOWN:
        raise ValueError(f"unknown fault point {name!r}; known points: {POINTS}")
    if nth < 1:
        raise ValueError(f"nth counts hits from 1, got {nth}")
    _injected[name] = nth
    try:
        yield
    finally:
        _injected.pop(name, None)
