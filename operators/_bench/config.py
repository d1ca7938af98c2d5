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

    @classmethod
    def quick(cls, rows: int = 50_000) -> BenchConfig:
        """A run of a few seconds, for a smoke test of the whole benchmark."""
        return cls(rows=rows, reads=20_000, scans=2_000)

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
