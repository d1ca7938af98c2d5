"""Checkpoints: commit latency against state size, load time, changelog replay.

Each state is one partition of one table ``(k int64, a int64, b string)`` in a
:class:`~statestore.StateStore` on a local temporary checkpoint directory. A
commit writes the epoch's changes, never the state, so its cost should follow
the changes: the figures set the same commit on a small and a large state side
by side. Loads and replay have no second way to be set against; they are
reported as times and rates, with their goals.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import structlog

from bench.config import BenchConfig
from bench.measure import CHECKPOINTS, Figure, Reading, interleave
from bench.sections import WARMUP, Progress
from encoding import TableSchema
from statestore import CommitInfo, ConsistencyMode, StateStore, StoreConfig

__all__ = ["LOAD_GOAL", "checkpoints"]

SCHEMA = TableSchema(
    1,
    pa.schema([("k", pa.int64()), ("a", pa.int64()), ("b", pa.string())]),
    ["k"],
    name="state",
)
#: Seconds a load of the partition may take (the issue's goal).
LOAD_GOAL = 5.0
#: Rows per insert_batch while a state is built (spills happen on their own).
_BUILD_CHUNK = 250_000
#: Snapshot interval of the changelog commits: never reached.
_NO_SNAPSHOT = 1_000_000
_LABELS = [f"row-{i:03d}-" + "x" * (i % 40) for i in range(1000)]
_LABEL_ARRAY = pa.array(_LABELS, pa.string())


def _rows(keys: np.ndarray, generation: int) -> pa.RecordBatch:
    """Rows ``(k, generation, label of k)`` for ``keys``."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.int64()),
            pa.array(np.full(len(keys), generation, np.int64)),
            _LABEL_ARRAY.take(pa.array(keys % len(_LABELS))),
        ],
        schema=SCHEMA.columns,
    )


class _State:
    """A checkpoint of ``size`` rows and the open store that commits to it.

    The store is unchecked: the benchmark knows every stored row, as an
    operator that reads before it writes does, so no write reads the table.
    """

    def __init__(self, root: Path, size: int, config: BenchConfig) -> None:
        self.root = root
        self.size = size
        self.config = config
        self.rng = np.random.default_rng(config.seed + size)
        self._locals = itertools.count(1)  # 0 is the committing store's
        #: The generation (column ``a``) of every row updated so far; others hold 0.
        self._generations: dict[int, int] = {}
        self.next_key = size
        self.infos: list[CommitInfo] = []
        build = self.open(snapshot_interval=1, local=0)
        try:
            build.load(None)
            table = build.table("state")
            for start in range(0, size, _BUILD_CHUNK):
                table.insert_batch(_rows(np.arange(start, min(size, start + _BUILD_CHUNK)), 0))
            build.commit(1)  # a snapshot, the base of every later load
        finally:
            build.close()
        self.version = 1
        self.store = self.reopen(_NO_SNAPSHOT)

    def open(self, snapshot_interval: int, local: int | None = None) -> StateStore:
        """A store on the checkpoint, on local directory number ``local`` or a new one."""
        number = next(self._locals) if local is None else local
        config = StoreConfig(
            snapshot_interval=snapshot_interval,
            retain_versions=10_000,
            local_dir=str(self.root / f"local{number}"),
            rocksdb=self.config.rocksdb,
        )
        return StateStore(
            str(self.root / "checkpoint"), "bench", 0, [SCHEMA], config, ConsistencyMode.UNCHECKED
        )

    def reopen(self, snapshot_interval: int) -> StateStore:
        """The committing store again, on its local database (reused, not copied)."""
        store = self.open(snapshot_interval, local=0)
        store.load(self.version)
        return store

    def commit_round(self, _round: int) -> float:
        """Stage the changes of one commit (not timed), then commit: seconds."""
        changes = self.config.changes_per_commit
        inserts = changes // 2
        version = self.version + 1
        table = self.store.table("state")
        table.insert_batch(_rows(np.arange(self.next_key, self.next_key + inserts), version))
        self.next_key += inserts
        update = table.update
        for key in self.rng.choice(self.size, changes - inserts, replace=False).tolist():
            label = _LABELS[key % len(_LABELS)]
            update((key, self._generations.get(key, 0), label), (key, version, label))
            self._generations[key] = version
        start = time.perf_counter()
        info = self.store.commit(version)
        seconds = time.perf_counter() - start
        self.version = version
        self.infos.append(info)
        return seconds

    def load_round(self, version: int, changelogs: int, rows: int) -> float:
        """Seconds to load ``version`` (``rows`` rows, ``changelogs`` after its
        snapshot) into a new, empty local directory."""
        store = self.open(_NO_SNAPSHOT)
        try:
            start = time.perf_counter()
            info = store.load(version)
            seconds = time.perf_counter() - start
        finally:
            store.close()
            shutil.rmtree(store.local_dir, ignore_errors=True)
        if (
            not info.rebuilt
            or info.changelogs_replayed != changelogs
            or info.num_total_rows != rows
        ):
            raise RuntimeError(f"load of version {version} did not rebuild as expected: {info}")
        return seconds

    def close(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def _quiet() -> Iterator[None]:
    """Stores made inside log warnings only: one info event a commit and a load
    would bury the progress lines."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        yield
    finally:
        structlog.configure(**before)


def checkpoints(
    config: BenchConfig, workdir: Path, progress: Progress
) -> tuple[list[Figure], list[Reading]]:
    """Commits of the same changes on states of growing size (changelog commits,
    then commits that take a snapshot); loads of the ``rows``-row partition into
    an empty local directory; the replay rate of its changelogs."""
    with _quiet():
        return _checkpoints(config, workdir, progress)


def _checkpoints(
    config: BenchConfig, workdir: Path, progress: Progress
) -> tuple[list[Figure], list[Reading]]:
    sizes = config.state_sizes
    states: dict[int, _State] = {}
    try:
        for size in sizes:
            progress(f"checkpoints: building a {size:,}-row state")
            states[size] = _State(workdir / f"state-{size}", size, config)
        progress("checkpoints: commits against state size")
        works = {str(size): state.commit_round for size, state in states.items()}
        changelog = interleave(works, config.commit_rounds, WARMUP)

        progress(f"checkpoints: loads of the {config.rows:,}-row partition")
        loads, changelogs, operations = _loads(states[config.rows], config)

        progress("checkpoints: commits that take a snapshot")
        for state in states.values():
            state.store.close()
            state.store = state.reopen(1)
        snapshot = interleave(works, config.snapshot_rounds, WARMUP)
    finally:
        for state in states.values():
            state.close()
    small = sizes[0]
    timed = (("commit, changelog", changelog), ("commit with snapshot", snapshot))
    figures = [
        Figure.of(
            CHECKPOINTS,
            workload,
            f"{size:,} vs {small:,} rows",
            "commit",
            times[str(small)],
            times[str(size)],
        )
        for workload, times in timed
        for size in sizes[1:]
    ]
    return figures, _readings(config, loads, changelogs, operations)


def _loads(state: _State, config: BenchConfig) -> tuple[dict[str, list[float]], int, int]:
    """Load times of the snapshot alone and of the snapshot and the first
    changelogs; how many changelogs, and the operations they hold."""
    changelogs = config.replayed_changelogs
    chain: Sequence[CommitInfo] = state.infos[:changelogs]
    if any(info.snapshot for info in chain):
        raise RuntimeError("the changelog commits took a snapshot")
    operations = sum(info.num_updated_rows + info.num_removed_rows for info in chain)
    last = chain[-1]
    loads = interleave(
        {
            "snapshot": lambda _: state.load_round(1, 0, state.size),
            "changelogs": lambda _: state.load_round(last.version, changelogs, last.num_total_rows),
        },
        config.load_rounds,
        WARMUP,
    )
    return loads, changelogs, operations


def _readings(
    config: BenchConfig, loads: dict[str, list[float]], changelogs: int, operations: int
) -> list[Reading]:
    alone = statistics.median(loads["snapshot"])
    chained = statistics.median(loads["changelogs"])
    replay = chained - alone
    return [
        Reading(CHECKPOINTS, f"load of {config.rows:,} rows, snapshot", alone, goal=LOAD_GOAL),
        Reading(
            CHECKPOINTS,
            f"load of {config.rows:,} rows, snapshot + {changelogs} changelogs",
            chained,
            goal=LOAD_GOAL,
        ),
        Reading(
            CHECKPOINTS,
            f"changelog replay, {operations:,} operations",
            operations / replay if replay > 0 else float("nan"),
            rate=True,
        ),
    ]
