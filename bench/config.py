"""How big the benchmark is, and the RocksDB settings it runs on."""

from __future__ import annotations

from dataclasses import dataclass, field

from statestore import RocksDBConfig

__all__ = ["BenchConfig"]


def _rocksdb() -> RocksDBConfig:
    # The defaults users get. (The first version of this benchmark needed a
    # 1 GiB cache: unpartitioned bloom filters outgrew the default cache's
    # 1 MiB shards past ~850k keys. The filters are partitioned now.)
    return RocksDBConfig()


@dataclass(frozen=True)
class BenchConfig:
    """The sizes of one benchmark run; the defaults are the full run."""

    rows: int = 1_000_000
    #: Writes are committed in this many epochs; each epoch is one round.
    epochs: int = 10
    #: Rounds of each read workload (after one warm-up round).
    rounds: int = 5
    #: Point reads (get_row, get_rows) over all rounds, at most one per row.
    reads: int = 100_000
    #: Prefix scans over all rounds, at most one per group.
    scans: int = 10_000
    #: Keys per get_rows call and per raw multi-get.
    multi_get_size: int = 1_000
    #: Rounds of the encoding workloads, each over every row.
    codec_rounds: int = 3
    #: Row widths (columns, two of them the key) of the layout comparison.
    widths: tuple[int, ...] = (4, 8, 16)
    #: Row width of the StateTable-vs-raw and encoding comparisons.
    columns: int = 8
    rocksdb: RocksDBConfig = field(default_factory=_rocksdb)
    seed: int = 20240601
    #: Checkpoints: also build a state of ``rows * 10`` rows (minutes at 1M rows).
    large_state: bool = False
    #: Checkpoints: changes (half inserts, half updates) per timed commit.
    changes: int = 10_000
    #: Checkpoints: rounds of changelog commits (after one warm-up round).
    commit_rounds: int = 20
    #: Checkpoints: rounds of commits that take a snapshot (after one warm-up round).
    snapshot_rounds: int = 10
    #: Checkpoints: rounds of each load (after one warm-up round).
    load_rounds: int = 5
    #: Checkpoints: changelogs replayed by the second load (at most ``commit_rounds + 1``).
    changelogs: int = 9

    @classmethod
    def quick(cls, rows: int = 50_000, large_state: bool = False) -> BenchConfig:
        """A run of a few seconds, for a smoke test of the whole benchmark."""
        return cls(
            rows=rows,
            reads=20_000,
            scans=2_000,
            large_state=large_state,
            commit_rounds=5,
            snapshot_rounds=3,
            load_rounds=3,
            changelogs=5,
        )

    def __post_init__(self) -> None:
        if self.rows < 100:
            raise ValueError(f"the benchmark needs at least 100 rows, got {self.rows}")

    @property
    def reads_per_round(self) -> int:
        """Point reads in one round."""
        return max(1, min(self.reads, self.rows) // self.rounds)

    @property
    def scans_per_round(self) -> int:
        """Prefix scans in one round."""
        return max(1, min(self.scans, self.rows // 10) // self.rounds)

    @property
    def state_sizes(self) -> tuple[int, ...]:
        """Rows of the checkpointed states, smallest first: ``rows / 10`` and
        ``rows``, and ``rows * 10`` with :attr:`large_state`."""
        sizes = (self.rows // 10, self.rows)
        return (*sizes, self.rows * 10) if self.large_state else sizes

    @property
    def changes_per_commit(self) -> int:
        """Changes a timed commit writes: :attr:`changes`, at most a tenth of the rows
        (so that the updates of the smallest state touch distinct rows)."""
        return max(2, min(self.changes, self.rows // 10))

    @property
    def replayed_changelogs(self) -> int:
        """Changelogs the second load replays: :attr:`changelogs`, at most as many
        as the changelog commits (the warm-up round's included) wrote."""
        return min(self.changelogs, self.commit_rounds + 1)
