"""``relstate bench --suite join``: the changelog join (StreamingJoin) through
the record-at-a-time harness, one partition, against a baseline in the same
run.

Two baselines, because there is no Spark operator to compare with (Spark's
stream-stream join takes no retractions): the same join written on plain
Python dicts (:class:`~bench.join_workload.DictJoin`: what a Python
operator that keeps its state itself costs, with no checkpoint and no
recovery), and relstate itself on the in-memory backend (what RocksDB and its
checkpoints cost).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.join_workload import changelog, make_join, run_dict, run_harness
from bench.versus import Comparison, SuiteResult, Work, runs, work_of
from operators.join import JoinType

__all__ = ["REPEATS", "WARM_ROWS", "measure", "run"]

_DICT = "plain-dict Python join"
_MEMORY = "relstate, memory backend"
_WHOLE = "relstate, RocksDB, sides read whole"
_PER_INPUT_BATCH = "relstate, RocksDB, joined per input batch"

#: Counted runs of each side at the default size: one run is about a second,
#: and a shared 2-core machine moves single runs by 10-20%, so the medians of
#: alternating runs are compared. At ``--scale`` above 1 each side runs once.
REPEATS = 5
#: Rows per side of the warm-up, run once per workload and side before
#: anything is counted: the first run in a process pays for first calls
#: (imports, numpy and pyarrow kernels, RocksDB's first open).
WARM_ROWS = 5_000


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds / 1e3:.1f} k rows/s"


def measure(
    rows: int,
    workdir: Path,
    progress: Callable[[str], None],
    repeats: int = REPEATS,
) -> tuple[list[Comparison], list[tuple[str, str]], list[Work]]:
    """Every workload at ``rows`` rows per side, each side ``repeats`` times
    alternating after one warm-up: comparisons of the medians, readings,
    and relstate's own work per row on RocksDB (its last run)."""
    micro = changelog(rows, batches=5, seed=1)
    warm = changelog(min(rows, WARM_ROWS), batches=5, seed=2)
    total = 2 * rows
    comparisons: list[Comparison] = []
    readings: list[tuple[str, str]] = []
    work: list[Work] = []
    for join_type in (JoinType.INNER, JoinType.FULL):
        for unique_key in (True, False):
            name = f"{join_type.value}, {'unique key' if unique_key else 'no unique key'}"
            progress(f"{name}: warm-up")
            run_dict(join_type, warm)
            for backend in ("rocksdb", "memory"):
                run_harness(
                    make_join(join_type, unique_key),
                    warm,
                    backend,
                    workdir / f"{join_type.value}-{unique_key}-{backend}-warm",
                )
            run_harness(
                make_join(join_type, unique_key, whole_micro_batch=True),
                warm,
                "rocksdb",
                workdir / f"{join_type.value}-{unique_key}-whole-warm",
            )
            sides = ("rocksdb", "dict", "memory", "by key", "whole")
            seconds: dict[str, list[float]] = {side: [] for side in sides}
            history: list[dict[str, Any]] = []
            dict_out = 0
            for i in range(repeats):
                progress(f"{name}: run {i + 1} of {repeats}")
                out: dict[str, int] = {}
                for side in sides:
                    if side == "dict":
                        took, out[side] = run_dict(join_type, micro)
                    elif side == "by key":
                        took, out[side] = run_harness(
                            make_join(join_type, unique_key, held_rows=0),
                            micro,
                            "rocksdb",
                            workdir / f"{join_type.value}-{unique_key}-by-key-{i}",
                        )
                    elif side == "whole":
                        took, out[side] = run_harness(
                            make_join(join_type, unique_key, whole_micro_batch=True),
                            micro,
                            "rocksdb",
                            workdir / f"{join_type.value}-{unique_key}-whole-{i}",
                        )
                    else:
                        history = []
                        took, out[side] = run_harness(
                            make_join(join_type, unique_key),
                            micro,
                            side,
                            workdir / f"{join_type.value}-{unique_key}-{side}-{i}",
                            history,
                        )
                    seconds[side].append(took)
                dict_out = out["dict"]
                for side in sides:
                    if out[side] != dict_out:
                        raise RuntimeError(
                            f"{name} on {side}: relstate emitted {out[side]} rows, the dict "
                            f"join {dict_out}; the comparison would not be of the same work"
                        )
            versus_dict = Comparison.of_runs(
                f"{name} (RocksDB)", total, seconds["rocksdb"], seconds["dict"], _DICT, goal=0.5
            )
            comparisons.append(versus_dict)
            work.append(work_of(versus_dict, history))
            versus_memory = Comparison.of_runs(
                f"{name} (RocksDB vs memory)",
                total,
                seconds["rocksdb"],
                seconds["memory"],
                _MEMORY,
            )
            comparisons.append(versus_memory)
            comparisons.append(
                Comparison.of_runs(
                    f"{name} (RocksDB, read by key vs read whole)",
                    total,
                    seconds["by key"],
                    seconds["rocksdb"],
                    _WHOLE,
                )
            )
            comparisons.append(
                Comparison.of_runs(
                    f"{name} (RocksDB, whole micro-batch vs per input batch)",
                    total,
                    seconds["whole"],
                    seconds["rocksdb"],
                    _PER_INPUT_BATCH,
                )
            )
            readings.append(
                (
                    f"{name}: rows per second per partition (medians)",
                    f"RocksDB {_rate(total, versus_dict.relstate_seconds)}, memory "
                    f"{_rate(total, versus_memory.baseline_seconds)}, dict "
                    f"{_rate(total, versus_dict.baseline_seconds)}; {dict_out:,} output rows",
                )
            )
            for side, label in (
                ("rocksdb", "RocksDB"),
                ("dict", "dict"),
                ("memory", "memory"),
                ("by key", "RocksDB, read by key"),
                ("whole", "RocksDB, whole micro-batch"),
            ):
                if side in seconds:
                    readings.append((f"{name}: runs, {label}", runs(seconds[side])))
    return comparisons, readings, work


def run(quick: bool, workdir: Path, progress: Callable[[str], None], scale: int = 1) -> SuiteResult:
    """The suite: 10,000 rows per side with ``quick``, else 50,000; ``scale``
    times that."""
    rows = (10_000 if quick else 50_000) * scale
    repeats = REPEATS if scale == 1 else 1
    comparisons, readings, work = measure(rows, workdir, progress, repeats)
    timing = (
        f"Each side first runs once on {WARM_ROWS:,} rows per side, not counted (the first "
        "run in a process pays for first calls); then the sides run "
        f"{repeats} times, alternating (RocksDB, dict, memory, RocksDB read by key, and for "
        "the inner joins RocksDB joined whole per micro-batch), and "
        "the table compares their medians; every run is listed below."
        if repeats > 1
        else f"Each side first runs once on {WARM_ROWS:,} rows per side, not counted (the "
        "first run in a process pays for first calls); then each side runs once, so a "
        "ratio carries the machine's noise (10-20% on a shared 2-core machine)."
    )
    description = f"""
A changelog join of two inputs `(id, k, v)` on `k`, {rows:,} rows per side (about
one in six a delete of a live row; keys from {rows // 2:,} values, so each row
meets a couple of rows of the other side), in 5 micro-batches of alternating
runs of 1,000 rows per side, through `OperatorHarness` on one partition, a
commit after each micro-batch; relstate's output is kept as the Arrow batches
the Spark runner hands on (`process_arrow`), not turned back into Python rows.
Inner and full outer joins; each side with a unique key (`id`: rows keyed
`(k, id)`) or without (rows keyed `(k, row)` with a count). Time is wall time
of the whole run, commits included. {timing}

Baselines, measured in the same run on the same rows: **{_DICT}** (the same
emit rules on `dict`s, rows read from the same Arrow batches; no state store,
no checkpoint, no recovery), and **{_MEMORY}** (the same operator with its
state tables on the in-memory backend). A ratio below 1 means relstate on
RocksDB is slower than the baseline: the price of durable, checkpointed state.
The operator's output is checked to be the same size as the dict join's.

**Read by key**: relstate on RocksDB once more, with `held_rows=0`, so that no
side is ever read whole and held: each input batch reads the rows its keys
touch (a multi-get of its own side's rows, one prefix read per join key of the
other side), as a side of more than `held_rows` rows (a million by default)
in one partition always does. Its time over the same join reading its sides
whole is what a partition past that size pays per row.

**Whole micro-batch**: relstate on RocksDB once more, with
`whole_micro_batch=True`: each micro-batch is joined whole in Arrow at its end
(one hash join of its rows against the other side's stored rows and changes),
rather than each input batch by the emit rules over rows held in Python. The
same rows in the same order (the output size is checked here, the order by
the tests), emitted at the end of the micro-batch.
"""
    return SuiteResult(
        suite="join",
        title="Changelog join: StreamingJoin through the harness",
        description=description,
        comparisons=comparisons,
        readings=readings,
        work=work,
    )
