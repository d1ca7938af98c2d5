"""Operator benchmark suites: relstate against a baseline, end to end.

A suite (``relstate bench --suite NAME``) runs one operator's workloads through
relstate and through a baseline (Spark's own operator, or the naive alternative
a Spark user has) on the same data in the same run, and reports each as a
:class:`Comparison`: the baseline's time over relstate's, so a ratio above 1 is
a speed-up. Absolute figures that have no baseline are readings.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

import pyarrow as pa

from operators._bench.runner import Machine
from operators._operator import Operator, OperatorContext

__all__ = ["Comparison", "Discard", "SuiteResult", "ceiling", "markdown", "runs", "terminal"]


@dataclass(frozen=True)
class Comparison:
    """The same work done by relstate and by a baseline, timed in one run."""

    name: str
    #: Input rows the work processed (each side counted).
    rows: int
    relstate_seconds: float
    baseline_seconds: float
    #: What the baseline is, e.g. "Spark stream-stream join".
    baseline: str
    #: The least speed-up that meets the goal (``None``: no goal).
    goal: float | None = None

    @classmethod
    def of_runs(
        cls,
        name: str,
        rows: int,
        relstate_runs: Sequence[float],
        baseline_runs: Sequence[float],
        baseline: str,
        goal: float | None = None,
    ) -> Comparison:
        """The comparison of the medians of several runs of each side."""
        return cls(name, rows, median(relstate_runs), median(baseline_runs), baseline, goal)

    def __post_init__(self) -> None:
        if self.relstate_seconds <= 0 or self.baseline_seconds <= 0:
            raise ValueError(
                f"comparison {self.name!r}: times must be positive, got "
                f"{self.relstate_seconds} and {self.baseline_seconds}"
            )

    @property
    def ratio(self) -> float:
        """The baseline's time over relstate's: relstate's speed-up."""
        return self.baseline_seconds / self.relstate_seconds

    @property
    def goal_met(self) -> bool | None:
        """Whether the speed-up reaches the goal (``None`` without one)."""
        return None if self.goal is None else self.ratio >= self.goal


@dataclass(frozen=True)
class SuiteResult:
    """Everything one suite measured."""

    suite: str
    title: str
    #: What was run, on what data, and how it was timed (markdown).
    description: str
    comparisons: Sequence[Comparison]
    #: Absolute figures: (what, value as text).
    readings: Sequence[tuple[str, str]] = ()
    machine: Machine = field(default_factory=Machine.current)
    finished: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))


class Discard(Operator):
    """Takes its inputs, keeps no state, emits nothing: run through the runner
    on a suite's data, it times what the runner costs around any operator
    (reading the files, the shuffle, Arrow to Python, opening and committing
    the store, Spark's micro-batch)."""

    name = "discard"

    def __init__(self, inputs: Sequence[pa.Schema], output: pa.Schema) -> None:
        self.inputs = list(inputs)
        self.output = output

    def process_batch(self, ctx: OperatorContext, batch: pa.RecordBatch, side: int) -> None:
        """Nothing: the rows only pass through the runner."""


def runs(seconds: Sequence[float]) -> str:
    """Several runs' times as a reading: each, in order."""
    return ", ".join(f"{s:.2f} s" for s in seconds)


def ceiling(baseline_seconds: float, floor_seconds: float, bound: str = "any operator") -> str:
    """A reading: the most that ``bound`` could reach against the baseline,
    since the part of the work it cannot avoid already takes
    ``floor_seconds`` (for any operator, the runner alone: :class:`Discard`)."""
    return (
        f"{floor_seconds:.2f} s; the baseline's {baseline_seconds:.2f} s over it: at most "
        f"{baseline_seconds / floor_seconds:.2f}x for {bound}"
    )


def _rate(rows: int, seconds: float) -> str:
    rate = rows / seconds
    return f"{rate / 1e6:.2f} M rows/s" if rate >= 1e6 else f"{rate / 1e3:.1f} k rows/s"


def _cells(c: Comparison) -> list[str]:
    goal = "" if c.goal is None else f"≥ {c.goal:.1f}"
    verdict = {None: "", True: "met", False: "not met"}[c.goal_met]
    return [
        c.name,
        f"{c.rows:,}",
        f"{c.relstate_seconds:.2f} s",
        f"{c.baseline_seconds:.2f} s ({c.baseline})",
        _rate(c.rows, c.relstate_seconds),
        f"{c.ratio:.2f}x",
        goal,
        verdict,
    ]


_HEADER = ["workload", "rows", "relstate", "baseline", "relstate rate", "speed-up", "goal", ""]


def _machine(m: Machine) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in m.versions)
    load = "" if m.load is None else f", load {m.load:.1f} at start"
    return f"{m.cores} cores ({m.cpu}), Python {m.python}, {versions}{load}"


def terminal(result: SuiteResult) -> str:
    """The comparisons and readings as aligned plain-text tables."""
    rows = [_HEADER, *(_cells(c) for c in result.comparisons)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    lines = [f"relstate bench --suite {result.suite}: {result.title}", _machine(result.machine)]
    lines += [""] + [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]
    if result.readings:
        lines += ["", *(f"  {what}: {value}" for what, value in result.readings)]
    return "\n".join(lines) + "\n"


def markdown(result: SuiteResult) -> str:
    """The page ``docs/bench/<suite>.md``."""
    lines = [
        f"# {result.title}",
        "",
        f"*Generated by `relstate bench --suite {result.suite}` on "
        f"{result.finished:%Y-%m-%d %H:%M} UTC; do not edit by hand.*",
        "",
        result.description.strip(),
        "",
        f"Machine: {_machine(result.machine)}.",
        "",
        "| " + " | ".join(_HEADER[:-1]) + " | |",
        "|" + "---|" * len(_HEADER),
    ]
    lines += ["| " + " | ".join(_cells(c)) + " |" for c in result.comparisons]
    if result.readings:
        lines += ["", "| measurement | value |", "|---|---|"]
        lines += [f"| {what} | {value} |" for what, value in result.readings]
    return "\n".join(lines) + "\n"
