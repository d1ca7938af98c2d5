"""The results as a terminal table and as the ``docs/performance.md`` page."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from bench.config import BenchConfig
from bench.measure import (
    CHECKPOINTS,
    CODECS,
    LAYOUTS,
    RAW,
    SECTIONS,
    Figure,
    Reading,
    Section,
    ratio_text,
)
from bench.runner import BenchResult

__all__ = ["markdown", "terminal"]


def _time(seconds: float, unit: str) -> str:
    micros = seconds * 1e6
    if micros < 10:
        return f"{micros:.2f} µs/{unit}"
    if micros < 1000:
        return f"{micros:.1f} µs/{unit}"
    return f"{micros / 1000:.2f} ms/{unit}"


def _rate(seconds: float, unit: str) -> str:
    rate = 1 / seconds
    if rate >= 1e6:
        return f"{rate / 1e6:.2f} M {unit}s/s"
    return f"{rate / 1e3:.0f} k {unit}s/s"


def _ratio(figure: Figure) -> str:
    return ratio_text(figure.ratio, figure.goal, figure.goal_met)


def _seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _goal(goal: float, ceiling: bool) -> str:
    return f"{'≤' if ceiling else '≥'} {goal:.2f}"


def _reading_cells(reading: Reading) -> list[str]:
    if reading.rate:
        value = _rate(1 / reading.value, "op") if reading.value > 0 else "not measurable"
    else:
        value = _seconds(reading.value)
    if reading.goal is None:
        return [reading.name, value, "none", ""]
    goal = _rate(1 / reading.goal, "op") if reading.rate else _seconds(reading.goal)
    return [
        reading.name,
        value,
        f"{'≥' if reading.rate else '≤'} {goal}",
        "met" if reading.goal_met else "not met",
    ]


_READING_HEADER = ["measurement", "median", "goal", ""]


def _cells(figure: Figure) -> list[str]:
    show = _rate if figure.section.throughput else _time
    cells = [figure.name, show(figure.subject, figure.unit), show(figure.baseline, figure.unit)]
    if figure.section.difference:
        cells.append(show(figure.subject - figure.baseline, figure.unit))
    cells.append(_ratio(figure))
    if figure.goal_met is not None:
        cells.append("met" if figure.goal_met else "not met")
    return cells


def _header(section: Section) -> list[str]:
    cells = ["workload", section.subject, section.baseline]
    if section.difference:
        cells.append("difference")
    cells.append("ratio")
    if section.goal is not None:
        cells.append(_goal(section.goal, section.ceiling))
    return cells


def _of(figures: Iterable[Figure], section: Section) -> list[Figure]:
    return [f for f in figures if f.section is section]


def _readings_of(result: BenchResult, section: Section) -> list[Reading]:
    return [r for r in result.readings if r.section is section]


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _machine(result: BenchResult) -> str:
    m = result.machine
    versions = ", ".join(f"{name} {version}" for name, version in m.versions)
    return f"{m.cores} cores ({m.cpu}), Python {m.python}, {versions}"


def terminal(result: BenchResult) -> str:
    """Every figure, grouped by section, as aligned plain-text tables."""
    lines = [
        f"relstate bench: {result.config.rows:,} rows in {_duration(result.seconds)}; "
        f"{_machine(result)}",
    ]
    for section in SECTIONS:
        figures = _of(result.figures, section)
        if not figures:
            continue
        lines += ["", f"{section.title} (ratio = {section.meaning})"]
        lines += _aligned([_header(section), *(_cells(f) for f in figures)])
        readings = _readings_of(result, section)
        if readings:
            lines += ["", *_aligned([_READING_HEADER, *(_reading_cells(r) for r in readings)])]
    return "\n".join(lines) + "\n"


def _md_table(rows: Sequence[Sequence[str]]) -> list[str]:
    header, *body = rows
    align = ["---"] + ["---:"] * (len(header) - 1)
    return [f"| {' | '.join(row)} |" for row in (header, align, *body)]


def _methods(result: BenchResult) -> dict[Section, str]:
    c = result.config
    reads, scans = c.reads_per_round, c.scans_per_round
    rounds = f"{c.rounds} rounds after one warm-up round"
    widths = ", ".join(str(w) for w in c.widths)
    return {
        LAYOUTS: (
            f"One table per layout and width ({widths} columns: an int64 `(group, id)` key, "
            "values cycling int64, float64, string), relaxed consistency. "
            f"**write + commit**: `insert_batch` of a RecordBatch and `commit`, {c.epochs} "
            f"epochs of {c.rows // c.epochs:,} rows in random key order, time per row. "
            f"**get_row**: {reads:,} random keys a round, {rounds}. "
            f"**prefix scan**: `scan((group,))` of {scans:,} random groups of 10 rows a round, "
            f"{rounds}, time per scan."
        ),
        RAW: (
            f"One {c.columns}-column row-layout table, and raw rocksdict databases with the "
            "same options given the keys and values already encoded. "
            f"**insert**: {c.epochs} epochs of {c.rows // c.epochs:,} rows, each a fresh "
            "StateTable per variant (`insert_batch` of a RecordBatch, or `insert` of each "
            "row tuple, then `commit`) against raw rocksdict making the reads that the "
            "consistency mode makes (what each mode reads is in "
            "[state-table.md](state-table.md#consistency-modes)), each on its own "
            "database: unchecked mode against one `WriteBatch` of every pair and `write` "
            "(nothing read: the floor of every mode); relaxed mode (whose commit reads "
            "every key once) and strict `insert_batch` (which reads every key once) against "
            "one `db.get([keys])` of every key, then that write; strict `insert` (which "
            "reads each key before its insert) against `db.get(key)` before each put. "
            f"**get_row**: {reads:,} random keys a round vs `db.get(key)`; **get_rows**: the "
            f"same keys, {c.multi_get_size:,} a call, vs `db.get([keys])`; **prefix scan**: "
            f"`list(scan((group,)))` of {scans:,} random groups a round vs ONE raw iterator "
            "per round that seeks to each prefix and steps (`seek`, `key`, `value`, `next`) "
            "until a key leaves it; "
            f"{rounds}. The difference column is StateTable's own time. RocksDB's time per "
            "read grows with the size of the table, so the ratio depends on `--rows`: it "
            "is lower on a smaller table."
        ),
        CODECS: (
            f"The {c.columns}-column table's {c.rows:,} rows: `KeyCodec.encode_batch` / "
            "`RowCodec.encode_batch` of one RecordBatch against a Python loop of `encode` "
            "over row tuples, and `decode_batch` against a loop of `decode`; "
            f"{c.codec_rounds} rounds."
        ),
        CHECKPOINTS: _checkpoint_method(c),
    }


def _checkpoint_method(c: BenchConfig) -> str:
    sizes = c.state_sizes
    changes = c.changes_per_commit
    listed = " and ".join(f"{size:,}" for size in sizes)
    larger = " and ".join(f"{size:,}" for size in sizes[1:])
    ten_m = (
        ""
        if c.large_state
        else f" (`--large-state` adds {c.rows * 10:,} rows; the issue's goal is set on "
        "10,000,000 against 100,000)"
    )
    return (
        f"One partition of one table `(k int64, a int64, b string)` in a `StateStore` "
        "on a local temporary checkpoint directory (local disk, so a load's copy is a "
        f"local file copy), unchecked consistency; states of {listed} rows{ten_m}, each "
        "built with `insert_batch` and committed as a snapshot. **commit, changelog**: "
        f"`commit` of {changes:,} changes ({changes // 2:,} inserts of new keys, "
        f"{changes - changes // 2:,} updates of random existing rows), staged untimed; "
        f"{c.commit_rounds} rounds after one warm-up round, the states taking turns. "
        f"**commit with snapshot**: the same with `snapshot_interval=1`, {c.snapshot_rounds} "
        "rounds after one warm-up round (the local RocksDB is checkpointed and the SST "
        f"files the previous snapshot lacks are copied). The small state has {sizes[0]:,} "
        f"rows, the large {'states have' if len(sizes) > 2 else 'state has'} {larger}. "
        f"**load**: `load` of the {c.rows:,}-row partition into a new, empty local "
        f"directory, from its snapshot alone and from the snapshot and the first "
        f"{c.replayed_changelogs} changelogs, {c.load_rounds} rounds "
        "after one warm-up round, alternating. **changelog replay**: the operations of "
        "those changelogs over the difference between the two loads' medians "
        "(reading, verifying, decoding and applying them). Times here are per commit "
        "and per load; a commit fsyncs its files, so the disk's fsync latency moves its "
        "absolute time, while the ratio, measured side by side, stays."
    )


def _load(load: float | None) -> str:
    return "unknown" if load is None else f"{load:.2f}"


def _bytes(size: int) -> str:
    if size >= 1 << 30 and size % (1 << 30) == 0:
        return f"{size >> 30} GiB"
    return f"{size >> 20} MiB"


def _summary(section: Section, figures: Sequence[Figure]) -> str:
    low = min(figures, key=lambda f: f.ratio)
    high = max(figures, key=lambda f: f.ratio)
    if section.goal is not None:
        met = [f for f in figures if f.goal_met]
        names = "; ".join(f.name for f in met)
        bound = "at most" if section.ceiling else "at least"
        own = "".join(f" ({f.name}: {f.own_goal:.2f})" for f in figures if f.own_goal is not None)
        return (
            f"Goal: {bound} {section.goal:.2f}{own}; met by {len(met)} of {len(figures)} figures"
            + (f": {names}." if met else ".")
        )
    faster = sum(1 for f in figures if f.ratio > 1)
    return (
        f"The {section.subject} is faster in {faster} of {len(figures)} figures; the ratio "
        f"runs from {low.ratio:.2f} ({low.name}) to {high.ratio:.2f} ({high.name})."
    )


def markdown(result: BenchResult, images: Mapping[Section, Path] | None, page: Path) -> str:
    """The ``docs/performance.md`` page; ``images`` maps a section to its chart
    (``None``: charts could not be drawn)."""
    c, m = result.config, result.machine
    versions = " / ".join(version for _, version in m.versions)
    names = " / ".join(name for name, _ in m.versions)
    cache = c.rocksdb.block_cache_bytes
    lines = [
        "<!-- Generated by `relstate bench`: do not edit; run `relstate bench` again. -->",
        "# Performance",
        "",
        f"Generated by `relstate bench` on {result.started:%Y-%m-%d %H:%M} UTC; the run "
        f"took {_duration(result.seconds)}.",
        "",
        "| | |",
        "|---|---|",
        f"| rows | {c.rows:,} |",
        f"| machine | {m.cores} cores, {m.cpu}, {m.system} |",
        f"| 1-minute load average at start / end (the run adds about 1) | "
        f"{_load(m.load)} / {_load(result.load_after)} |",
        f"| Python | {m.python} |",
        f"| code measured | commit {m.commit or 'unknown (not a git checkout)'} |",
        f"| {names} | {versions} |",
        f"| RocksDB | `RocksDBConfig` defaults ({_bytes(cache)} block cache, partitioned "
        "index and filters) |",
        "",
        "Every figure is a ratio of two ways of doing the same work on the same data in "
        "one run. The two run in alternating rounds, the order rotating from round to "
        "round so that a busy spell of the machine falls on both, and each side's time "
        "is the median of its rounds (for writes, a round is one epoch). Times are "
        "wall-clock (`time.perf_counter`) per operation. The checkpoint section adds "
        "load times and a replay rate, which have nothing to be set against: they are "
        "medians, shown with their goals.",
    ]
    if images is None:
        lines += [
            "",
            "*Charts were not drawn: matplotlib is not installed "
            "(`pip install 'relstate[bench]'`).*",
        ]
    methods = _methods(result)
    for section in SECTIONS:
        figures = _of(result.figures, section)
        if not figures:
            continue
        lines += [
            "",
            f"## {section.title}",
            "",
            f"Ratio = {section.meaning}. {_summary(section, figures)}",
            "",
            methods[section],
        ]
        if images is not None and section in images:
            link = images[section].relative_to(page.parent).as_posix()
            lines += ["", f"![{section.title}]({link})"]
        lines += ["", *_md_table([_header(section), *(_cells(f) for f in figures)])]
        readings = _readings_of(result, section)
        if readings:
            lines += ["", *_md_table([_READING_HEADER, *(_reading_cells(r) for r in readings)])]
    return "\n".join(lines) + "\n"
