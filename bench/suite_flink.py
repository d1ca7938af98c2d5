"""``relstate bench --suite flink``: the changelog operators against Flink
SQL, the engine whose semantics they follow, on the same changelogs.

relstate runs each operator through the harness on one partition over the
Arrow micro-batches, RocksDB state, a commit after each micro-batch. Flink
runs the same rows from files in one warm process, streaming mode,
parallelism 1, on its RocksDB and its heap state backend. Flink's operator
time is the query's time less that of a query that only scans the same
files, both in the same round. The suite fails unless, per workload,
relstate's output and Flink's leave the same final table.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import pyarrow as pa

from bench.debezium import FinalTable, check_same, final_table, read_debezium
from bench.flink import FlinkStopped, FlinkWorker, flink_python
from bench.flink_workloads import Workload, workloads
from bench.phases import PHASES, ROCKSDB, PhaseTimer
from bench.versus import Comparison, SuiteResult, runs
from operators._api.changelog import ROW_KIND, row_kinds
from operators.testing import OperatorHarness

__all__ = ["ROUNDS", "Measured", "Rounds", "configurations", "run", "summarise"]

#: Counted rounds: each runs every workload on every side, the sides'
#: order reversed from one round to the next.
ROUNDS = 3
_COMMON = {
    "parallelism.default": 1,
    "table.exec.resource.default-parallelism": 1,
    "pipeline.object-reuse": "true",
}
_MINI_BATCH = {
    "table.exec.mini-batch.enabled": "true",
    "table.exec.mini-batch.allow-latency": "1 s",
    "table.exec.mini-batch.size": 10_000,
}
_BACKENDS = {"RocksDB": "rocksdb", "heap": "hashmap"}
#: Goals against Flink's heap state, by workload kind (join, the rest).
_HEAP_GOALS = {"join": 0.25, "other": 0.6}
_ROCKSDB_GOAL = 1.5


def configurations() -> dict[str, dict[str, object]]:
    """Flink's table environments by name: each backend, with and without
    mini-batch."""
    out: dict[str, dict[str, object]] = {}
    for backend, kind in _BACKENDS.items():
        base = {**_COMMON, "state.backend.type": kind}
        out[backend] = base
        out[f"{backend}, mini-batch"] = {**base, **_MINI_BATCH}
    return out


def _env(name: str) -> str:
    return name.replace(", ", "_").replace("-", "_")


@dataclass
class Rounds:
    """One workload's timings over the rounds."""

    relstate: list[float] = field(default_factory=list)
    #: The same operator on plain Python dicts, where the workload has one.
    in_dicts: list[float] = field(default_factory=list)
    #: Per backend: Flink's query and scan seconds per round.
    query: dict[str, list[float]] = field(default_factory=dict)
    scan: list[float] = field(default_factory=list)
    #: The same in CPU seconds (every thread of each side's processes).
    relstate_cpu: list[float] = field(default_factory=list)
    query_cpu: dict[str, list[float]] = field(default_factory=dict)
    scan_cpu: list[float] = field(default_factory=list)
    #: Per backend: whether Flink's query was stopped at the time limit in
    #: each round (its time then a lower bound).
    stopped: dict[str, list[bool]] = field(default_factory=dict)

    def flink(self, backend: str) -> list[float]:
        """Flink's operator seconds per round: the query less the scan."""
        return [q - s for q, s in zip(self.query[backend], self.scan, strict=True)]

    def flink_cpu(self, backend: str) -> list[float]:
        """Flink's operator CPU seconds per round: the query's less the scan's."""
        return [q - s for q, s in zip(self.query_cpu[backend], self.scan_cpu, strict=True)]


def _relstate(
    work: Workload,
    path: Path,
    kept: list[pa.RecordBatch] | None = None,
    timer: PhaseTimer | None = None,
) -> float:
    """Seconds to run the workload's micro-batches through one harness
    partition on RocksDB, commits included, the output kept in Arrow as
    the Spark runner hands it on; with ``kept``, it goes there. With
    ``timer`` (installed), its phases count that time only: on return they
    hold the run's."""
    harness = OperatorHarness(work.operator(), backend="rocksdb", path=path)
    spent: dict[str, float] = {}
    try:
        if timer is not None:
            timer.reset()
        started = time.perf_counter()
        for micro in work.micro:
            for side, batch in micro:
                out = harness.process_arrow(batch, side)
                if kept is not None:
                    kept.append(out)
            _, out = harness.commit_arrow()
            if kept is not None:
                kept.append(out)
        seconds = time.perf_counter() - started
        if timer is not None:
            spent = dict(timer.seconds)
        return seconds
    finally:
        harness.close()
        shutil.rmtree(path, ignore_errors=True)
        if timer is not None:
            timer.seconds.update(spent)


def _read_floor(work: Workload, emitted: list[pa.RecordBatch]) -> float:
    """Seconds of the smallest Python loop over the workload's input: read
    each row of each micro-batch into Python values with its kind, and
    build ``emitted`` (the output relstate emitted) back into Arrow."""
    started = time.perf_counter()
    for micro in work.micro:
        for _, batch in micro:
            names = [n for n in batch.schema.names if n != ROW_KIND]
            columns = [batch.column(n).to_pylist() for n in names]
            for _row in zip(row_kinds(batch), *columns, strict=True):
                pass
    for batch in emitted:
        columns = [c.to_pylist() for c in batch.columns]
        pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, batch.schema, strict=True)],
            schema=batch.schema,
        )
    return time.perf_counter() - started


def _split(work: Workload, path: Path) -> tuple[float, dict[str, float]]:
    """One more relstate run with the phase timers in: its seconds and
    each phase's."""
    timer = PhaseTimer()
    with timer.installed():
        seconds = _relstate(work, path, timer=timer)
    return seconds, dict(timer.seconds)


def _flink_run(
    flink: FlinkWorker, env: str, sql: str, limit: float | None = None
) -> tuple[float, float, bool]:
    """Run ``sql`` on Flink: its wall seconds, the CPU seconds Flink's
    processes used meanwhile, and whether it was stopped at ``limit``
    seconds (its time then a lower bound)."""
    before = flink.cpu_seconds()
    try:
        seconds, stopped = flink.run(env, sql, limit), False
    except FlinkStopped as stop:
        seconds, stopped = stop.seconds, True
    return seconds, flink.cpu_seconds() - before, stopped


def _calibrate(
    flink: FlinkWorker,
    work: Workload,
    backend: str,
    insert: str,
    chosen: dict[tuple[str, str], str],
    t: Rounds,
    readings: list[tuple[str, str]],
    limit: float | None,
) -> None:
    """The first round on ``backend``: Flink with and without mini-batch
    (where it applies), the faster chosen for the rounds after, and its
    time this round's."""
    candidates = [backend] + ([f"{backend}, mini-batch"] if work.mini_batch else [])
    runs = {c: _flink_run(flink, _env(c), insert, limit) for c in candidates}
    took = {c: wall for c, (wall, _, _) in runs.items()}
    best = min(took, key=took.__getitem__)
    chosen[(work.name, backend)] = best
    _count(t, backend, runs[best])
    readings.append(
        (
            f"{work.name}: Flink {backend}, round 1, each configuration (the faster "
            "chosen and counted)",
            ", ".join(
                f"{c}: {_stopped_at(wall) if stopped else f'{wall:.2f} s'}"
                for c, (wall, _, stopped) in runs.items()
            ),
        )
    )


def _count(t: Rounds, backend: str, run: tuple[float, float, bool]) -> None:
    """Count one of Flink's runs on ``backend`` in the round."""
    wall, cpu, stopped = run
    t.query.setdefault(backend, []).append(wall)
    t.query_cpu.setdefault(backend, []).append(cpu)
    t.stopped.setdefault(backend, []).append(stopped)


def _stopped_at(seconds: float) -> str:
    return f"stopped after {seconds:.0f} s"


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (5 min {five:.1f})"


def _sinks(flink: FlinkWorker, env: str, work: Workload, out: Path | None) -> None:
    columns = work.sink_columns()
    flink.ddl(env, f"CREATE TABLE bh_{work.name} ({columns}) WITH ('connector'='blackhole')")
    flink.ddl(
        env,
        f"CREATE TABLE bh_scan_{work.name} ({work.scan_columns()}) WITH ('connector'='blackhole')",
    )
    if out is not None:
        flink.ddl(
            env,
            f"CREATE TABLE out_{work.name} ({columns}) WITH ('connector'='filesystem', "
            f"'path'='{out}', 'format'='debezium-json')",
        )


def run(
    quick: bool,
    workdir: Path,
    progress: Callable[[str], None],
    scale: int = 1,
    only: Collection[str] | None = None,
    rounds: int | None = None,
    stop_after: float | None = None,
) -> SuiteResult:
    """The suite: 1M changelog rows per workload (20k with ``quick``),
    ``scale`` times that; ``only``: the workloads named (of
    :data:`~bench.flink_workloads.NAMES`), ``rounds``: counted rounds
    (:data:`ROUNDS`, 1 with ``quick``); ``stop_after``: minutes after which
    a counted Flink query is cancelled, its time then a lower bound."""
    limit = None if stop_after is None else stop_after * 60
    rows = (20_000 if quick else 1_000_000) * scale
    rounds = rounds or (1 if quick else ROUNDS)
    progress(f"making the changelogs ({rows:,} rows a workload)")
    works = workloads(rows, only=only)  # before Flink: a wrong name fails at once
    python = flink_python(progress)
    folders = {}
    for work in works:
        for source in work.inputs:
            folders[source.name] = source.write(workdir / "in")
    configs = configurations()
    readings: list[tuple[str, str]] = [("load average before Flink starts", _load())]
    times = {w.name: Rounds() for w in works}
    chosen: dict[tuple[str, str], str] = {}
    splits: dict[str, tuple[float, dict[str, float]]] = {}
    floors: dict[str, float] = {}
    progress("starting Flink")
    with FlinkWorker(python, workdir / "flink.log") as flink:
        for name, config in configs.items():
            env = _env(name)
            flink.environment(env, config)
            for work in works:
                for source in work.inputs:
                    flink.ddl(env, source.ddl(folders[source.name]))
                out = workdir / "out" / env / work.name
                _sinks(flink, env, work, out)
        # The outputs, compared: relstate's against Flink's on the heap, a
        # run that also warms Flink up.
        mine: dict[str, FinalTable] = {}

        def check(work: Workload, name: str) -> None:
            """Fail unless Flink's output in configuration ``name`` leaves relstate's."""
            env = _env(name)
            flink.run(env, f"INSERT INTO out_{work.name} {work.sql}")
            theirs = read_debezium(workdir / "out" / env / work.name, work.output.names)
            check_same(mine[work.name], theirs, f"{work.name} at {rows:,} rows, Flink {name}")

        for work in works:
            progress(f"{work.name}: the outputs of relstate and Flink, compared")
            kept: list[pa.RecordBatch] = []
            _relstate(work, workdir / "rs" / "check", kept)
            mine[work.name] = final_table(kept, work.output.names, work.upsert_key)
            floors[work.name] = _read_floor(work, kept)
            check(work, "heap")
            readings.append(
                (
                    f"{work.name}: final table, the same on both sides",
                    f"{sum(mine[work.name].values()):,} rows",
                )
            )
        for r in range(rounds):
            readings.append((f"load average at round {r + 1}", _load()))
            for work in works:
                t = times[work.name]

                def flink_side(work: Workload = work, t: Rounds = t, r: int = r) -> None:
                    insert = f"INSERT INTO bh_{work.name} {work.sql}"
                    for backend in _BACKENDS:
                        if r == 0:
                            _calibrate(flink, work, backend, insert, chosen, t, readings, limit)
                        else:
                            env = _env(chosen[(work.name, backend)])
                            _count(t, backend, _flink_run(flink, env, insert, limit))
                    scan = f"INSERT INTO bh_scan_{work.name} {work.scan()}"
                    wall, cpu, _ = _flink_run(flink, _env("heap"), scan)
                    t.scan.append(wall)
                    t.scan_cpu.append(cpu)

                def relstate_side(work: Workload = work, t: Rounds = t, r: int = r) -> None:
                    cpu = time.process_time()
                    t.relstate.append(_relstate(work, workdir / "rs" / f"{work.name}-{r}"))
                    t.relstate_cpu.append(time.process_time() - cpu)
                    if work.in_dicts is not None:
                        t.in_dicts.append(work.in_dicts())

                sides = [relstate_side, flink_side]
                for side in sides if r % 2 == 0 else reversed(sides):
                    side()
                progress(
                    f"round {r + 1} of {rounds}: {work.name}: relstate {t.relstate[-1]:.2f} s, "
                    + ", ".join(
                        f"Flink {chosen[(work.name, b)]} {t.query[b][-1]:.2f} s" for b in _BACKENDS
                    )
                    + f", scan {t.scan[-1]:.2f} s, load {_load()}"
                )
        readings.append(("load average after the rounds", _load()))
    progress("where relstate's time goes: one run with timers")
    for work in works:
        splits[work.name] = _split(work, workdir / "rs" / f"{work.name}-split")
    measured = [
        Measured(w.name, w.label, w.rows, times[w.name], chosen, splits[w.name], floors[w.name])
        for w in works
    ]
    return summarise(measured, rows, rounds, scale, readings, stop_after)


@dataclass(frozen=True)
class Measured:
    """What the suite measured of one workload."""

    name: str
    label: str
    rows: int
    times: Rounds
    #: Flink's configuration per (workload, backend).
    chosen: dict[tuple[str, str], str]
    #: One run with the phase timers: its seconds and each phase's.
    split: tuple[float, dict[str, float]]
    #: Seconds of the smallest Python loop over the input and output.
    floor: float

    @property
    def is_join(self) -> bool:
        return self.name.startswith("join")


def _us(seconds: float, rows: int) -> str:
    return f"{seconds * 1e6 / rows:.2f}"


def summarise(
    measured: list[Measured],
    rows: int,
    rounds: int,
    scale: int,
    readings: list[tuple[str, str]],
    stop_after: float | None = None,
) -> SuiteResult:
    """The suite's page from what it measured: the comparisons of medians,
    tables of microseconds per row and of where relstate's time goes, and
    every round as a reading (``stop_after``: the minutes after which a
    Flink query was stopped, if there was a limit)."""
    comparisons: list[Comparison] = []
    per_row = [
        "| workload | rows | relstate | Flink RocksDB | Flink heap | floor | plain-dict operator |",
        "|---|---|---|---|---|---|---|",
    ]
    cpu = [
        "| workload | relstate | Flink RocksDB | Flink heap | speed-up, RocksDB | speed-up, heap |",
        "|---|---|---|---|---|---|",
    ]
    split = [
        "| workload | relstate, timed run | operator and harness Python | "
        + " | ".join(PHASES)
        + " |",
        "|---" * (3 + len(PHASES)) + "|",
    ]
    readings = list(readings)
    for m in measured:
        t = m.times
        cells = [m.name, f"{m.rows:,}", _us(median(t.relstate), m.rows)]
        for backend in _BACKENDS:
            best = m.chosen[(m.name, backend)]
            flink_runs = t.flink(backend)
            heap_goal = _HEAP_GOALS["join" if m.is_join else "other"] if scale == 1 else None
            stopped = t.stopped.get(backend, [])
            comparisons.append(
                Comparison.of_runs(
                    f"{m.name} vs Flink {backend}",
                    m.rows,
                    t.relstate,
                    # A round where the scan outran the query counts as 1 ms.
                    [max(f, 1e-3) for f in flink_runs],
                    f"Flink {best}",
                    _ROCKSDB_GOAL if backend == "RocksDB" else heap_goal,
                    stopped=any(stopped),
                )
            )
            at_least = "≥ " if any(stopped) else ""
            cells.append(f"{at_least}{_us(median(flink_runs), m.rows)} ({best})")
            readings.append(
                (
                    f"{m.name}: rounds, Flink {best} (query - scan)",
                    ", ".join(
                        f"{q:.2f} - {s:.2f} = {q - s:.2f} s" + (" (stopped)" if stop else "")
                        for q, s, stop in zip(
                            t.query[backend], t.scan, stopped or [False] * len(t.scan), strict=True
                        )
                    ),
                )
            )
        readings.append((f"{m.name}: rounds, relstate", runs(t.relstate)))
        if t.relstate_cpu:
            mine = median(t.relstate_cpu)
            theirs = [median(t.flink_cpu(b)) for b in _BACKENDS]
            bound = ["≥ " if any(t.stopped.get(b, [])) else "" for b in _BACKENDS]
            cpu.append(
                "| "
                + " | ".join(
                    [m.name, _us(mine, m.rows)]
                    + [f"{a}{_us(f, m.rows)}" for a, f in zip(bound, theirs, strict=True)]
                    + [f"{a}{f / mine:.2f}x" for a, f in zip(bound, theirs, strict=True)]
                )
                + " |"
            )
        cells.append(_us(m.floor, m.rows))
        cells.append(_us(median(t.in_dicts), m.rows) if t.in_dicts else "-")
        if t.in_dicts:
            readings.append((f"{m.name}: rounds, plain-dict operator", runs(t.in_dicts)))
        per_row.append("| " + " | ".join(cells) + " |")
        seconds, phases = m.split
        own = seconds - sum(phases.values())
        split.append(
            "| "
            + " | ".join(
                [m.name, _us(seconds, m.rows), _us(own, m.rows)]
                + [_us(phases[p], m.rows) for p in PHASES]
            )
            + " |"
        )
    tables = (
        "Microseconds per changelog row, medians over the rounds (Flink's: its "
        "query less its scan; the configuration in brackets; the floor: the "
        "smallest Python loop and the plain-dict operator, see above):\n\n"
        + "\n".join(per_row)
        + "\n\nThe same in CPU microseconds per changelog row (every thread of "
        "each side's processes: relstate's process, Flink's JVM and its worker; "
        "Flink's query less its scan), medians over the rounds: on a loaded "
        "machine a process of many threads, as Flink's JVM is, gets a larger "
        "share of the cores than wall time shows:\n\n"
        + "\n".join(cpu)
        + "\n\nWhere relstate's time goes, microseconds per changelog row, from "
        "one more run with the timers in:\n\n"
        + "\n".join(split)
        + (_heap_floors(measured) if scale == 1 else "")
    )
    return SuiteResult(
        suite="flink",
        title="Changelog operators against Flink SQL",
        description=_description(measured, rows, rounds) + _limit(stop_after) + "\n" + tables,
        comparisons=comparisons,
        readings=readings,
    )


def _heap_floors(measured: list[Measured]) -> str:
    """For each goal against Flink's heap state not met: the time per row
    the goal allows relstate, against what its calls into RocksDB alone took
    in the timed run, a floor no faster Python lowers."""
    lines = []
    for m in measured:
        goal = _HEAP_GOALS["join" if m.is_join else "other"]
        heap = max(median(m.times.flink("heap")), 1e-3)
        if heap / median(m.times.relstate) >= goal:
            continue
        allowed = heap / goal
        rocksdb = m.split[1][ROCKSDB]
        verdict = (
            "more than the goal allows: with state in RocksDB, no faster Python meets it"
            if rocksdb > allowed
            else f"which leaves {_us(allowed - rocksdb, m.rows)} for everything else"
        )
        lines.append(
            f"- `{m.name}`: {goal}x Flink's heap time ({_us(heap, m.rows)} µs a row) "
            f"allows relstate {_us(allowed, m.rows)} µs a row; its calls into RocksDB "
            f"alone took {_us(rocksdb, m.rows)}, {verdict}."
        )
    if not lines:
        return ""
    return (
        "\n\nThe goals against Flink's heap state not met, and the floor under "
        "them (relstate's time in RocksDB, from the timed run above):\n\n" + "\n".join(lines)
    )


def _limit(stop_after: float | None) -> str:
    if stop_after is None:
        return ""
    return f"""
**Time limit**: a counted Flink query still running after {stop_after:g} minutes
was cancelled (`--stop-after`), and its time counts as that long: Flink's
figure is then a lower bound, marked "≥", and so is relstate's speed-up over
it (a goal the bound does not reach is "not known").
"""


def _description(works: list[Measured], rows: int, rounds: int) -> str:
    labels = "\n".join(f"- `{w.name}`: {w.label}; {w.rows:,} changelog rows." for w in works)
    return f"""
The changelog operators against Flink SQL (PyFlink `apache-flink==2.3.0`, Java 17,
its own virtual environment), on the same changelogs, about {rows:,} rows a
workload:

{labels}

**relstate**: the operator through `OperatorHarness` on one partition over the
Arrow micro-batches (inputs already in memory), state on RocksDB, a commit
(with its checkpoint) after each micro-batch; wall time from the first batch
to the last commit. The output stays in Arrow, as the Spark runner hands it
on: rows emitted at a commit too (`commit_arrow`). Its best configuration,
as Flink gets its own: the joins take `whole_micro_batch=True` (each
micro-batch joined whole in Arrow at its end); the
joins' `held_rows` is at least the changelog rows of a side, so each side is
read whole however large (at 1M rows that is the default, a million; past
the default a side read by key costs more per row, as the join suite's "read
by key" rows show). The aggregate and the deduplication keeping the last
row write no `-U` rows (`update_before=False`, `generate_update_before`
off), as Flink's write none into the `blackhole`: its planner leaves
UPDATE_BEFORE out where the sink takes none (`EXPLAIN CHANGELOG_MODE`
shows `[I,UA,D]` for both).

**Flink**: one warm Flink process for the whole run (every query ran at full
size before anything is counted), streaming mode, parallelism 1, object reuse,
no checkpoints; the input a filesystem table over one file (`debezium-json`
for a changelog, `json` for an append stream), the output a `blackhole` sink.
Flink's time is the query's wall time less that of a query that only scans
the same files into a `blackhole` in the same round (reading and parsing
JSON, job start). On each state backend (RocksDB; heap: `hashmap`) Flink
runs its best configuration: mini-batch (`allow-latency` 1 s, `size`
10,000) or none, whichever was faster in the first round (both run there;
the faster is that round's time, and the only one run after); top-N takes
no mini-batch. The configuration used is named in each row.

**Same work**: before the rounds, each workload's output, materialised (a
filesystem sink in `debezium-json` on Flink's side), is applied from the
empty table on each side (relstate's as an upsert changelog keyed by `k`
where it writes no `-U`), and the suite fails unless relstate's final table
is Flink's (Flink on the heap without mini-batch).

**Rounds**: {rounds}, relstate and Flink alternating (the order reversed each
round); the table compares medians, and every round is listed below with the
load average. The speed-up is Flink's time over relstate's. Goals: at least
{_ROCKSDB_GOAL}x Flink on RocksDB; against Flink's heap state at 1M rows at
least {_HEAP_GOALS["join"]}x for the join and {_HEAP_GOALS["other"]}x for the others.

**Where relstate's time goes**: one more run per workload with timers around
the calls into each layer (exclusive times; the timers add their own cost,
so the run's total is shown): the state table's Python (MemTable, reads
over storage), the encoding of keys and values, RocksDB (every call into
rocksdict), the store's commit less those (checkpoint files); the rest is
the operator's and the harness's Python, decoding the input and building
the output included. The floor is the smallest Python loop over the same
input: every row read into Python values, and the rows relstate emitted
built back into Arrow. For the joins, the plain-dict operator is a floor of
another kind: the join suite's `DictJoin`, the same emit rules over plain
Python dicts, with no state store, no commit and its output left as Python
tuples, run in each round beside relstate; what a row at a time in Python
costs before any state is kept.
"""
