"""State store checkpoints: commit latency against state size, load time of a
1M-row partition, changelog replay. Run with
``python -m pytest bench/test_checkpoint.py --benchmark-only``; set
``RELSTATE_BENCH_10M=1`` to add the 10M-row state (minutes to build)."""

from __future__ import annotations

import itertools
import os
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from encoding import TableSchema
from statestore import CommitInfo, RocksDBBackend, StateStore, StoreConfig, _changelog

SCHEMA = TableSchema(
    1,
    pa.schema([("k", pa.int64()), ("a", pa.int64()), ("b", pa.string())]),
    ["k"],
    name="state",
)
CHANGES = 10_000
BUILD_CHUNK = 100_000
SIZES = [100_000, 1_000_000] + ([10_000_000] if os.environ.get("RELSTATE_BENCH_10M") else [])


def _rows(start: int, count: int) -> pa.RecordBatch:
    keys = pa.array(range(start, start + count), pa.int64())
    return pa.RecordBatch.from_arrays(
        [keys, pa.array(range(count), pa.int64()), pa.array([f"row-{i}" for i in range(count)])],
        schema=SCHEMA.columns,
    )


class Built:
    """A checkpoint holding ``size`` rows, and the store that wrote it (open)."""

    def __init__(self, root: Path, size: int, interval: int) -> None:
        self.root = root
        self.location = str(root / "ckpt")
        self.size = size
        self._locals = itertools.count()
        self.store = self.open(interval)
        self.store.load(None)
        self.version = 0
        self.next_key = 0
        self.infos: list[CommitInfo] = []
        while self.next_key < size:
            self.store.table("state").insert_batch(_rows(self.next_key, BUILD_CHUNK))
            self.next_key += BUILD_CHUNK
            self.version += 1
            self.store.commit(self.version)
        # Reopen on the same local directory (a flush, no copying), so that
        # the build's memtable flushes do not compete with the measured commits.
        self.store.close()
        self.store = self.open(interval, local=0)
        self.store.load(self.version)

    def open(self, interval: int, local: int | None = None) -> StateStore:
        """A store on the checkpoint: on local directory number ``local``, or a new one."""
        cfg = StoreConfig(
            snapshot_interval=interval,
            retain_versions=1_000,
            local_dir=str(self.root / f"local{next(self._locals) if local is None else local}"),
        )
        return StateStore(self.location, "op", 0, [SCHEMA], cfg)

    def change(self) -> None:
        """Stage CHANGES inserts of new keys (not timed)."""
        self.store.table("state").insert_batch(_rows(self.next_key, CHANGES))
        self.next_key += CHANGES

    def commit(self) -> None:
        self.version += 1
        self.infos.append(self.store.commit(self.version))

    def steps(self) -> dict[str, float]:
        """Median milliseconds of each commit step over the recorded commits."""
        names = ("changelog_ms", "local_write_ms", "snapshot_ms", "upload_ms", "manifest_ms")
        return {n: statistics.median(getattr(i, n) for i in self.infos) for n in names}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int, int], Built]]:
    """Checkpoints by (size, snapshot interval), each built once."""
    made: dict[tuple[int, int], Built] = {}

    def get(size: int, interval: int) -> Built:
        if (size, interval) not in made:
            made[size, interval] = Built(tmp_path_factory.mktemp(f"s{size}"), size, interval)
        return made[size, interval]

    yield get
    for b in made.values():
        b.store.close()


@pytest.mark.benchmark(group="commit 10k changes, changelog")
@pytest.mark.parametrize("size", SIZES)
def test_commit_changelog(
    benchmark: BenchmarkFixture, built: Callable[[int, int], Built], size: int
) -> None:
    """commit() of 10,000 changes as a changelog, against the state size."""
    b = built(size, 1_000_000)
    b.infos.clear()
    benchmark.pedantic(b.commit, setup=b.change, rounds=15, iterations=1)  # type: ignore[no-untyped-call]
    benchmark.extra_info.update(b.steps())


@pytest.mark.benchmark(group="commit 10k changes, snapshot")
@pytest.mark.parametrize("size", SIZES)
def test_commit_snapshot(
    benchmark: BenchmarkFixture, built: Callable[[int, int], Built], size: int
) -> None:
    """commit() of 10,000 changes that also takes and uploads a snapshot
    (only the SST files the previous snapshot lacks are uploaded)."""
    b = built(size, 1)
    b.infos.clear()
    benchmark.pedantic(b.commit, setup=b.change, rounds=8, iterations=1)  # type: ignore[no-untyped-call]
    benchmark.extra_info.update(b.steps())


@pytest.mark.benchmark(group="load 1M rows")
@pytest.mark.parametrize("changelogs", [0, 9])
def test_load_1m(
    benchmark: BenchmarkFixture,
    built: Callable[[int, int], Built],
    tmp_path: Path,
    changelogs: int,
) -> None:
    """load() of a 1M-row partition into an empty local directory: the
    snapshot alone, or the snapshot and 9 changelogs of 10,000 changes (the
    difference is the replay of 90,000 operations)."""
    b = built(1_000_000, 10)
    target = b.version
    if changelogs:
        for _ in range(changelogs):
            b.change()
            b.commit()
        target = b.version
    stores: list[StateStore] = []

    def fresh() -> tuple[tuple[StateStore], dict[str, int]]:
        for s in stores:
            s.close()
        stores.append(b.open(10))
        return (stores[-1],), {}

    def load(store: StateStore) -> None:
        info = store.load(target)
        assert info.rebuilt and info.changelogs_replayed == changelogs

    benchmark.pedantic(load, setup=fresh, rounds=5, iterations=1)  # type: ignore[no-untyped-call]
    for s in stores:
        s.close()


@pytest.mark.benchmark(group="changelog replay")
def test_changelog_replay(benchmark: BenchmarkFixture, tmp_path: Path) -> None:
    """Decode a changelog of 100,000 puts and apply it to RocksDB (the work of
    replaying it on load, reading the file aside)."""
    ops = [(i.to_bytes(12, "big"), b"v" * 40) for i in range(100_000)]
    data = _changelog.encode(1, "ab" * 16, ops, [])
    backend = RocksDBBackend(tmp_path / "db")

    def replay() -> None:
        log = _changelog.decode(data)
        backend.write(log.writes, log.range_deletes)

    benchmark.pedantic(replay, rounds=10, iterations=1)  # type: ignore[no-untyped-call]
    backend.close()
