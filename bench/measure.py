"""Side-by-side timing, and the figures it yields.

Every figure is a ratio of two ways of doing the same work on the same data in
the same run. The two (or more) ways run round by round, interleaved, with the
order rotating from one round to the next, so that a slow spell of the machine
falls on each of them alike; a figure is the median of its rounds.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "CHECKPOINTS",
    "CODECS",
    "LAYOUTS",
    "RAW",
    "SECTIONS",
    "Figure",
    "Reading",
    "Round",
    "Section",
    "interleave",
    "ratio_text",
]

#: One round of a workload: does round ``r``'s work, returns seconds per operation.
#: Warm-up rounds have negative ``r``.
Round = Callable[[int], float]


def per_op(fn: Callable[[], object], ops: int) -> float:
    """Seconds per operation of ``fn()``, which does ``ops`` operations."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / ops


def interleave(works: Mapping[str, Round], rounds: int, warmup: int = 0) -> dict[str, list[float]]:
    """Run every work once a round, ``warmup`` rounds first (dropped), then
    ``rounds`` rounds; the seconds per operation of each round, by work."""
    names = list(works)
    times: dict[str, list[float]] = {name: [] for name in names}
    # The inputs, made before, are out of the collector's sight (as a stream's
    # rows would be), and the garbage of one work is collected before the next.
    gc.collect()
    gc.freeze()
    try:
        for r in range(-warmup, rounds):
            turn = r % len(names)
            for name in names[turn:] + names[:turn]:
                gc.collect()
                seconds = works[name](r)
                if r >= 0:
                    times[name].append(seconds)
    finally:
        gc.unfreeze()
    return times


@dataclass(frozen=True)
class Section:
    """A family of figures that compare the same two things."""

    key: str
    title: str
    subject: str
    baseline: str
    #: What the ratio (baseline time / subject time) means.
    meaning: str
    goal: float | None = None
    #: Show rows per second rather than time per operation.
    throughput: bool = False
    #: Show the subject's time minus the baseline's: the subject's own cost.
    difference: bool = False
    #: The goal is a ceiling: the ratio must not exceed it.
    ceiling: bool = False


LAYOUTS = Section(
    "layouts",
    "Row layout vs cell layout",
    "row layout",
    "cell layout",
    "cell time / row time: how many times faster the row layout is",
)
RAW = Section(
    "raw",
    "StateTable vs raw rocksdict",
    "StateTable",
    "raw rocksdict",
    "raw time / StateTable time: the share of raw rocksdict's speed that StateTable keeps",
    goal=0.5,
    difference=True,
)
CODECS = Section(
    "codecs",
    "Key and value encoding, batch vs per row",
    "batch",
    "per row",
    "per-row time / batch time: how many times faster the batch entry point is",
    throughput=True,
)
CHECKPOINTS = Section(
    "checkpoints",
    "Checkpoint commit and load",
    "small state",
    "large state",
    "large-state time / small-state time: how much slower a commit of the same "
    "changes gets as the state grows",
    goal=1.5,
    ceiling=True,
)
SECTIONS = (LAYOUTS, RAW, CODECS, CHECKPOINTS)


@dataclass(frozen=True)
class Figure:
    """One ratio: the median seconds per ``unit`` of the subject and of the
    baseline, measured side by side."""

    section: Section
    workload: str
    #: What sets this figure apart from others of the same workload, or "".
    detail: str
    unit: str
    subject: float
    baseline: float
    #: This figure's own goal, where it differs from the section's.
    own_goal: float | None = None

    @classmethod
    def of(
        cls,
        section: Section,
        workload: str,
        detail: str,
        unit: str,
        subject: Sequence[float],
        baseline: Sequence[float],
        goal: float | None = None,
    ) -> Figure:
        """The figure of two lists of per-round seconds per operation."""
        return cls(
            section,
            workload,
            detail,
            unit,
            statistics.median(subject),
            statistics.median(baseline),
            goal,
        )

    @property
    def name(self) -> str:
        """The workload and the detail, as the tables show it."""
        return f"{self.workload}, {self.detail}" if self.detail else self.workload

    @property
    def ratio(self) -> float:
        """Baseline time over subject time (above 1: the subject is faster)."""
        return self.baseline / self.subject

    @property
    def goal(self) -> float | None:
        """The ratio this figure must reach: its own goal, else the section's."""
        return self.section.goal if self.own_goal is None else self.own_goal

    @property
    def goal_met(self) -> bool | None:
        """Whether the ratio reaches the goal; ``None`` without one."""
        goal = self.goal
        if goal is None:
            return None
        return self.ratio <= goal if self.section.ceiling else self.ratio >= goal


@dataclass(frozen=True)
class Reading:
    """One absolute figure of a section, a median time or rate that has no
    second way of doing the same work to be set against, with its goal."""

    section: Section
    name: str
    #: Seconds, or operations per second when ``rate``.
    value: float
    rate: bool = False
    #: A ceiling for a time, a floor for a rate; ``None``: no goal.
    goal: float | None = None

    @property
    def goal_met(self) -> bool | None:
        """Whether the value reaches the goal; ``None`` without one."""
        if self.goal is None:
            return None
        return self.value >= self.goal if self.rate else self.value <= self.goal


def ratio_text(ratio: float, goal: float | None, met: bool | None) -> str:
    """``ratio`` to two decimals; to three where a goal missed would show
    as the goal itself (1.9994 as "2.00" beside "not met")."""
    text = f"{ratio:.2f}"
    if goal is not None and met is False and float(text) == goal:
        text = f"{ratio:.3f}"
    return text
