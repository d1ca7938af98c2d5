"""``relstate bench --suite join``: the changelog join (StreamingJoin) through
the record-at-a-time harness, one partition, against a baseline in the same
run.

Two baselines, because there is no Spark operator to compare with (Spark's
stream-stream join takes no retractions): the same join written on plain
Python dicts (:class:`~operators._bench.join_workload.DictJoin`: what a Python
operator that keeps its state itself costs, with no checkpoint and no
recovery), and relstate itself on the in-memory backend (what RocksDB and its
checkpoints cost).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from operators._bench.join_workload import changelog, make_join, run_dict, run_harness
from operators._bench.versus import Comparison, SuiteResult, Work, work_of
from operators.join import JoinType

__all__ = ["measure", "run"]

_DICT = "plain-dict Python join"
_MEMORY = "relstate, memory backend"


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds / 1e3:.1f} k rows/s"


def measure(
    rows: int, workdir: Path, progress: Callable[[str], None]
) -> tuple[list[Comparison], list[tuple[str, str]], list[Work]]:
    """Every workload at ``rows`` rows per side: comparisons, readings, and
    relstate's own work per row on RocksDB."""
    micro = changelog(rows, batches=5, seed=1)
    total = 2 * rows
    comparisons: list[Comparison] = []
    readings: list[tuple[str, str]] = []
    work: list[Work] = []
    for join_type in (JoinType.INNER, JoinType.FULL):
        dict_seconds, dict_out = run_dict(join_type, micro)
        for unique_key in (True, False):
            name = f"{join_type.value}, {'unique key' if unique_key else 'no unique key'}"
            progress(name)
            seconds: dict[str, float] = {}
            history: list[dict[str, Any]] = []
            for backend in ("rocksdb", "memory"):
                path = workdir / f"{join_type.value}-{unique_key}-{backend}"
                seconds[backend], out = run_harness(
                    make_join(join_type, unique_key),
                    micro,
                    backend,
                    path,
                    history if backend == "rocksdb" else None,
                )
                if out != dict_out:
                    raise RuntimeError(
                        f"{name} on {backend}: relstate emitted {out} rows, the dict join "
                        f"{dict_out}; the comparison would not be of the same work"
                    )
            versus_dict = Comparison(
                f"{name} (RocksDB)", total, seconds["rocksdb"], dict_seconds, _DICT, goal=0.5
            )
            comparisons.append(versus_dict)
            work.append(work_of(versus_dict, history))
            comparisons.append(
                Comparison(
                    f"{name} (RocksDB vs memory)",
                    total,
                    seconds["rocksdb"],
                    seconds["memory"],
                    _MEMORY,
                )
            )
            readings.append(
                (
                    f"{name}: rows per second per partition",
                    f"RocksDB {_rate(total, seconds['rocksdb'])}, memory "
                    f"{_rate(total, seconds['memory'])}, dict {_rate(total, dict_seconds)}; "
                    f"{dict_out:,} output rows",
                )
            )
    return comparisons, readings, work


def run(quick: bool, workdir: Path, progress: Callable[[str], None], scale: int = 1) -> SuiteResult:
    """The suite: 10,000 rows per side with ``quick``, else 50,000; ``scale``
    times that."""
    rows = (10_000 if quick else 50_000) * scale
    comparisons, readings, work = measure(rows, workdir, progress)
    description = f"""
A changelog join of two inputs `(id, k, v)` on `k`, {rows:,} rows per side (about
one in six a delete of a live row; keys from {rows // 2:,} values, so each row
meets a couple of rows of the other side), in 5 micro-batches of alternating
runs of 1,000 rows per side, through `OperatorHarness` on one partition, a
commit after each micro-batch; relstate's output is kept as the Arrow batches
the Spark runner hands on (`process_arrow`), not turned back into Python rows.
Inner and full outer joins; each side with a unique key (`id`: rows keyed
`(k, id)`) or without (rows keyed `(k, row)` with a count). Time is wall time
of the whole run, commits included.

Baselines, measured in the same run on the same rows: **{_DICT}** (the same
emit rules on `dict`s, rows read from the same Arrow batches; no state store,
no checkpoint, no recovery), and **{_MEMORY}** (the same operator with its
state tables on the in-memory backend). A ratio below 1 means relstate on
RocksDB is slower than the baseline: the price of durable, checkpointed state.
The operator's output is checked to be the same size as the dict join's.
"""
    return SuiteResult(
        suite="join",
        title="Changelog join: StreamingJoin through the harness",
        description=description,
        comparisons=comparisons,
        readings=readings,
        work=work,
    )
