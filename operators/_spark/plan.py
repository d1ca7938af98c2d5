"""The plan of a stage's input as Spark SQL text: which rows of which frame
each side takes, under which columns, with its side and sequence number.
Pure strings, so the plan is testable without Spark; the driver
(:mod:`operators._spark.runner`) turns them into Spark calls."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from operators._api.changelog import ROW_KIND
from operators._engine.graph import PipelineGraph
from operators._engine.row_order import SEQ, SIDE, RowOrder
from operators._spark.task import META, ORDER, PASS, passed_column, tagged

__all__ = [
    "SOURCE",
    "InputPlan",
    "QueryPlan",
    "Selection",
    "SideRows",
    "no_null_keys",
    "one_per_side",
    "one_projection",
    "passed_name",
    "passed_through",
    "quoted",
    "selections",
    "side_condition",
    "source_column",
]

#: The batch frame's column that says which source a row is of.
SOURCE = "__source"


def source_column(source: int, name: str) -> str:
    """Column ``name`` of source ``source`` as the batch frame holds it."""
    return f"q{source}__{name}"


def quoted(name: str) -> str:
    """``name`` as an identifier in a Spark SQL expression."""
    return "`" + name.replace("`", "``") + "`"


def passed_name(columns: list[str], name: str) -> str:
    """Column ``name`` of a side whose rows a fused stage passed on (of
    ``columns``), as that stage's rows hold it."""
    return passed_column(columns.index(name))


def no_null_keys(keys: Sequence[str], named: Callable[[str], str]) -> str:
    """The condition that none of a side's ``keys`` is null, each column
    ``named`` as the frame holds it."""
    return " AND ".join(f"{quoted(named(k))} IS NOT NULL" for k in keys)


@dataclass(frozen=True)
class SideRows:
    """One side of a stage's input, before it is partitioned: which source
    its rows are (``None``: an earlier stage's), which of its rows it takes
    besides (``conditions``), its columns under the side's tagged names, and
    its sequence expression."""

    source: int | None
    conditions: list[str]
    columns: list[str]
    sequence: str
    #: The rows of a stage that runs in this stage's job (its tasks' rows).
    fused: bool = False


@dataclass(frozen=True)
class Selection:
    """One selection of a stage's input rows: from the frame of side
    ``side``, the rows that meet ``condition`` (``None``: all), as
    ``columns`` (SQL expressions); a stage's input is its parts' union."""

    side: int
    condition: str | None
    columns: list[str]


def selections(sides: list[SideRows], kinds: bool, ordered: bool, sources: int) -> list[Selection]:
    """The rows of every side of a stage (the batch has ``sources``
    sources), each under its tagged columns, with ``row_kind`` (when
    ``kinds``), ``__side`` (with several sides) and the sequence (when
    ``ordered``).

    Sides that are each another source of the batch are one projection of
    the batch: a source's row holds nulls in every other source's columns,
    so a side's tagged columns are null in the other sides' rows, as a union
    would leave them. One ``where`` and one ``selectExpr`` then stand for a
    ``where``, a ``selectExpr`` and a union per side, and the stage's first
    Spark stage runs one task per batch partition instead of one per side
    and partition. Other sides (an earlier stage's rows, a source
    read by two sides) are selected each and unioned, a fused stage's side
    first: a union numbers its partitions in the order of its inputs, so
    that stage's tasks, run in this union's partitions, keep their own
    partition numbers."""
    by_source = [s.source for s in sides]
    if len(sides) > 1 and None not in by_source and len(set(by_source)) == len(sides):
        return [one_projection(sides, kinds, ordered, sources)]
    return one_per_side(sides, kinds, ordered, sources)


def side_condition(side: SideRows, sources: int) -> list[str]:
    """The conditions of the rows a side takes from its frame."""
    # With one source every row of the batch is the source's.
    mine = [f"{SOURCE} = {side.source}"] if side.source is not None and sources > 1 else []
    return mine + side.conditions


def one_projection(
    sides: list[SideRows],
    kinds: bool,
    ordered: bool,
    sources: int,
    passing: tuple[int, SideRows] | None = None,
) -> Selection:
    """Sides that are each another source, as one projection of the batch.
    With ``passing`` (a side, and the rows of its source that the stage's
    tasks pass on), those rows too, marked ``__pass``; a row taken only to
    be passed on is no side's (``__side`` null)."""
    if sources == len(sides) and not any(s.conditions for s in sides):
        condition = None  # every row of the batch is one side's
    else:
        condition = " OR ".join("(" + " AND ".join(side_condition(s, sources)) + ")" for s in sides)
    whens = []
    for i, s in enumerate(sides):
        side_of = str(i)
        if passing is not None and passing[0] == i and s.conditions:
            side_of = f"CASE WHEN {' AND '.join(s.conditions)} THEN {i} END"
        whens.append(f"WHEN {s.source} THEN {side_of}")
    sequence = " ".join(f"WHEN {s.source} THEN {s.sequence}" for s in sides)
    marked = []
    if passing is not None:
        taken = " AND ".join(side_condition(passing[1], sources))
        condition = None if condition is None else f"{condition} OR ({taken})"
        marked.append(f"{taken} AS {PASS}")
    return Selection(
        0,
        condition,
        [
            *[c for s in sides for c in s.columns],
            *([ROW_KIND] if kinds else []),
            f"CASE {SOURCE} {' '.join(whens)} END AS {SIDE}",
            *([f"CAST(CASE {SOURCE} {sequence} END AS BIGINT) AS {SEQ}"] if ordered else []),
            *marked,
        ],
    )


def passed_through(sides: list[SideRows], kinds: bool, ordered: bool) -> Selection:
    """The two sides of a stage whose fused side's stage passed the other
    side's rows on: one selection of that stage's rows, the rows passed on
    (``__pass``) as the other side's."""
    fused = next(i for i, s in enumerate(sides) if s.fused)
    own, theirs = sides[fused], sides[1 - fused]
    condition = None
    if own.conditions:
        condition = f"{PASS} OR (" + " AND ".join(own.conditions) + ")"
    sequence = f"CASE WHEN {PASS} THEN {theirs.sequence} ELSE {own.sequence} END"
    return Selection(
        fused,
        condition,
        [
            *own.columns,
            *theirs.columns,
            *([ROW_KIND] if kinds else []),
            f"CASE WHEN {PASS} THEN {1 - fused} ELSE {fused} END AS {SIDE}",
            *([f"CAST({sequence} AS BIGINT) AS {SEQ}"] if ordered else []),
        ],
    )


def one_per_side(
    sides: list[SideRows], kinds: bool, ordered: bool, sources: int
) -> list[Selection]:
    """Any sides, each selected from its frame, to be unioned by name."""
    several = len(sides) > 1
    return [
        Selection(
            index,
            " AND ".join(side_condition(s, sources)) or None,
            [
                *s.columns,
                *([ROW_KIND] if kinds else []),
                *([f"{index} AS {SIDE}"] if several else []),
                *([f"CAST({s.sequence} AS BIGINT) AS {SEQ}"] if ordered else []),
            ],
        )
        for index, s in sorted(enumerate(sides), key=lambda p: not p[1].fused)
    ]


@dataclass(frozen=True)
class InputPlan:
    """A stage's input frame as Spark SQL text: its ``parts`` unioned by
    name, then repartitioned by ``by`` (no expression: one partition)."""

    parts: list[Selection]
    by: list[str]


class QueryPlan:
    """Which job runs each stage of ``pipeline``, and the plan of each
    stage's input; ``outputs`` are the stages handed to a sink. Spark-free:
    the driver turns it into Spark calls."""

    def __init__(self, pipeline: PipelineGraph, outputs: set[int]) -> None:
        self.pipeline = pipeline
        self.outputs = outputs
        #: Each stage that runs in a later stage's job, with that stage.
        self.fused = self._fused()
        #: Each fused stage whose tasks pass a source's rows on to the stage
        #: that reads it: its side of that source, and the reader's.
        self.passing = self._passing()

    def job_of(self, index: int) -> int:
        """The stage whose job runs stage ``index``: the last of its chain
        of fused readers."""
        while index in self.fused:
            index = self.fused[index]
        return index

    def _fused(self) -> dict[int, int]:
        """The stages whose rows, metadata rows included, go on into their
        one reader's job instead of a job of their own, each with that
        reader: each read by one side of the stage right after it, and
        handed to no sink. Their rows are then neither cached nor collected
        between two jobs. A job's stages are then the stages since the last
        job, the order the driver runs them in."""
        outputs = self.outputs
        sides = [
            (i.stream.index, reader)
            for reader, s in enumerate(self.pipeline.stages)
            for i in s.inputs
            if i.stream.is_stage
        ]
        readers = Counter(index for index, _ in sides)
        # Only the stage before it can run in a reader's job, so a reader runs
        # at most one fused side, whose tasks take the first partitions of its
        # input (see selections).
        return {
            index: reader
            for index, reader in sides
            if readers[index] == 1 and index not in outputs and reader == index + 1
        }

    def _passing(self) -> dict[int, tuple[int, int]]:
        """The fused stages whose tasks pass on the rows of a source they
        read, for their reader: each with its side of the source and the
        reader's. The reader then reads no batch: its job's last shuffle
        takes one frame, that stage's rows, where it took their union with
        the batch's rows of the source, which the job read a second time:
        a second wave of tasks in the job's middle Spark stage. Passing the
        rows on saves that wave and that read (docs/runner.md; the FK join's
        bench page has the figures).

        A stage passes rows on when its inputs are several sources, each
        read once (one projection of the batch, see :func:`selections`),
        and its reader has two inputs: its rows and one of those sources,
        under the same schema."""
        passing = {}
        for index, reader in self.fused.items():
            stage, after = self.pipeline.stages[index], self.pipeline.stages[reader]
            sources = [i.stream.index for i in stage.inputs if not i.stream.is_stage]
            if len(stage.inputs) < 2 or len(set(sources)) != len(stage.inputs):
                continue  # an earlier stage's rows, or a source read twice
            own = [k for k, i in enumerate(after.inputs) if not i.stream.is_stage]
            if len(after.inputs) != 2 or len(own) != 1:
                continue
            source = after.inputs[own[0]].stream
            if source.index not in sources:
                continue
            side = sources.index(source.index)
            if stage.inputs[side].stream.schema != source.schema:
                continue
            passing[index] = (side, own[0])
        return passing

    def stage_input(self, index: int) -> tuple[InputPlan, RowOrder | None]:
        """How stage ``index``'s input frame is made from its sides' frames,
        and how its tasks order the frame's rows (``None``: as they come):
        the rows of every input, under the stage's side names, repartitioned
        by the key; with ``__side`` when the stage has several inputs,
        ``row_kind`` when one of them is a changelog (a task takes a row
        without it as an insert), and ``__seq`` when the stage is ordered
        (its tasks order the rows by it, :mod:`operators._engine.row_order`).

        The frame carries nothing else into the stage's Python tasks: every
        column of it is converted to Arrow and handed over, row by row in the
        JVM, so a constant row kind, copies of the key columns and a null
        sequence of an unordered stage would cost the transfer in proportion
        to their columns. Rows are
        partitioned on the side's own key columns, and with several inputs
        on ``coalesce`` of theirs (each side's columns are null in the
        other's rows), which hashes as the key's value.

        The plan is written as SQL expression strings: Spark analyses the
        whole plan again at every DataFrame call, and every ``Column`` object
        is a call into the JVM of its own, so one ``where`` and one
        ``selectExpr`` per input cost a batch
        fewer calls than the same plan built from ``Column`` objects."""
        stage = self.pipeline.stages[index]
        orders = self.pipeline.sequenced(stage)
        ordered = any(o is not None for o in orders) or any(i.stream.is_stage for i in stage.inputs)
        kinds = any(
            i.stream.is_stage or self.pipeline.sources[i.stream.index].changelog
            for i in stage.inputs
        )
        several = len(stage.inputs) > 1
        # The side whose rows the fused stage before this one passes on.
        passed = next((k for i, (_, k) in self.passing.items() if self.fused[i] == index), None)
        sides: list[SideRows] = []
        keys: list[list[str]] = []
        for side, (inp, order) in enumerate(zip(stage.inputs, orders, strict=True)):
            stream = inp.stream
            columns = list(stream.schema.names)
            # A stage run in this job: its metadata rows come along, to be handed on.
            fused = stream.is_stage and stream.index in self.fused
            named: Callable[[str], str]
            if stream.is_stage:
                conditions = [] if fused else [f"{META} IS NULL"]
                named = str
                sequence = quoted(order) if order else ORDER
            elif side == passed:
                # Its rows come with the fused stage's, which took them
                # under this side's conditions (_passed_on).
                conditions = []
                named = partial(passed_name, columns)
                sequence = quoted(named(order)) if order else "NULL"
            else:
                conditions = []
                named = partial(source_column, stream.index)
                sequence = quoted(named(order)) if order else "NULL"
            if inp.drop_null_keys and side != passed:
                keyed = no_null_keys(inp.keys, named)
                # Metadata rows hold no key, and go on all the same.
                conditions.append(f"({META} IS NOT NULL OR {keyed})" if fused else keyed)
            keys.append([tagged(side, columns.index(k)) for k in inp.keys])
            selected = [f"{quoted(named(n))} AS {tagged(side, i)}" for i, n in enumerate(columns)]
            sides.append(
                SideRows(
                    None if stream.is_stage else stream.index,
                    conditions,
                    [*selected, META] if fused else selected,
                    sequence,
                    fused,
                )
            )
        sources = len(self.pipeline.sources)
        if index in self.passing:
            parts = [one_projection(sides, kinds, ordered, sources, self._passed_on(index))]
        elif passed is not None:
            parts = [passed_through(sides, kinds, ordered)]
        else:
            parts = selections(sides, kinds, ordered, sources)
        # Keyless (no key columns): one partition, every row in it, as
        # Spark's global aggregate gathers its input into one task.
        by = [f"coalesce({', '.join(k)})" for k in zip(*keys, strict=True)] if several else keys[0]
        row_order = RowOrder(stage.sides_in_turn and several, kinds) if ordered else None
        return InputPlan(parts, by), row_order

    def _passed_on(self, index: int) -> tuple[int, SideRows]:
        """What fused stage ``index`` passes on: its side of the source, and
        the rows of the source its reader takes (as a side of the batch
        whose conditions are on the source's columns)."""
        side, theirs = self.passing[index]
        inp = self.pipeline.stages[self.fused[index]].inputs[theirs]
        source = inp.stream.index
        conditions = [no_null_keys(inp.keys, partial(source_column, source))]
        return side, SideRows(source, conditions if inp.drop_null_keys else [], [], "NULL")
