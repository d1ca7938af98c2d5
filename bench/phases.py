"""Where an operator's time goes, without a profiler: timers around the
calls that cross into each layer, installed for one run and removed after.

Each phase's time is exclusive: a call timed inside another timed call
counts for its own phase only. A generator is timed step by step, so a
scan's reads count where they happen. What no timer covers is the
operator's own Python (and the harness around it).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from encoding import CellCodec, KeyCodec, RowCodec
from statestore import RocksDBBackend, StateStore, StateTable

__all__ = ["COMMIT", "ENCODING", "PHASES", "ROCKSDB", "TABLE", "PhaseTimer"]

#: Calls into rocksdict, in a batch or in a commit.
ROCKSDB = "RocksDB"
#: Keys and values to bytes and back.
ENCODING = "encoding"
#: The state table's own Python: MemTable merges, reads over storage.
TABLE = "state table"
#: The store's commit less its RocksDB and encoding: checkpoint files, manifest.
COMMIT = "commit"
#: The phases, in the order a page shows them.
PHASES = (TABLE, ENCODING, ROCKSDB, COMMIT)

#: (class, phase): every public method of the class, as that phase.
_LAYERS: tuple[tuple[type, str], ...] = (
    (RocksDBBackend, ROCKSDB),
    (KeyCodec, ENCODING),
    (RowCodec, ENCODING),
    (CellCodec, ENCODING),
    (StateTable, TABLE),
)


class PhaseTimer:
    """Seconds per phase, summed over every timed call while installed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        # Per open timed call: the time its timed callees took.
        self._inner: list[float] = []

    def _timed(self, function: Callable[..., Any], phase: str) -> Callable[..., Any]:
        inner = self._inner
        seconds = self.seconds
        clock = time.perf_counter

        def close(started: float) -> None:
            elapsed = clock() - started
            seconds[phase] += elapsed - inner.pop()
            if inner:
                inner[-1] += elapsed

        if inspect.isgeneratorfunction(function):

            @functools.wraps(function)
            def steps(*args: Any, **kwargs: Any) -> Iterator[Any]:
                iterator = function(*args, **kwargs)
                while True:
                    inner.append(0.0)
                    started = clock()
                    try:
                        item = next(iterator)
                    except StopIteration:
                        close(started)
                        return
                    close(started)
                    yield item

            return steps

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            inner.append(0.0)
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                close(started)

        return call

    def reset(self) -> None:
        """Start counting again from zero (a run's set-up left out)."""
        self.seconds.update(dict.fromkeys(PHASES, 0.0))

    @contextmanager
    def installed(self) -> Iterator[PhaseTimer]:
        """The timers in place on the layers' classes, removed on exit.
        Objects built while installed keep what they bound: build the run's
        operator and store inside."""
        saved: list[tuple[type, str, Any]] = []
        targets = [*_LAYERS, (StateStore, COMMIT)]
        try:
            for owner, phase in targets:
                names = ["commit"] if owner is StateStore else _methods(owner)
                for name in names:
                    original = owner.__dict__[name]
                    saved.append((owner, name, original))
                    setattr(owner, name, self._timed(original, phase))
            yield self
        finally:
            for owner, name, original in reversed(saved):
                setattr(owner, name, original)


def _methods(owner: type) -> list[str]:
    """The public plain methods ``owner`` itself defines."""
    return [
        name
        for name, value in vars(owner).items()
        if not name.startswith("_") and inspect.isfunction(value)
    ]
