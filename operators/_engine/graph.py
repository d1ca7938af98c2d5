"""Pipelines: several keyed stages, built-in operators or users' own, in one
streaming query.

A pipeline (:class:`PipelineGraph`; :class:`operators.Pipeline` starts it)
is built from sources (streaming DataFrames) and stages (an operator, one
input stream per operator input, the key its rows are partitioned by); each
source and each stage is a :class:`Stream` that later stages read.
Everything that can be checked without running a batch is checked here, as
the pipeline is built: every column an operator declares is in its input
with its type, keys exist and have one type on every side, sequence and
event-time columns exist. A mistake is an
:class:`~operators.errors.InputError` from the call that made it.

``Pipeline.start`` runs it in Spark (:mod:`operators._spark.pipeline`);
:class:`operators.testing.PipelineHarness` runs the same pipeline without
Spark, record at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from operators._api.changelog import ROW_KIND
from operators._api.operator import Operator
from operators._api.watermark import Watermark
from operators._engine.watermark import DELAY_KEY, StageInputs
from operators.errors import InputError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["PipelineGraph", "Stream", "arrow_schema_of", "same_type"]


def arrow_schema_of(frame: DataFrame) -> pa.Schema:
    """The Arrow schema of a DataFrame's rows as an operator sees them:
    timestamps in UTC whatever the session's time zone (the runner converts
    them; the instant is the same), ``row_kind`` left out."""
    from pyspark.sql.pandas.types import to_arrow_type

    fields = []
    for f in frame.schema.fields:
        if f.name == ROW_KIND:
            continue
        fields.append(pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC"), f.nullable))
    return pa.schema(fields)


def same_type(declared: pa.DataType, given: pa.DataType) -> bool:
    """Whether a column of type ``given`` serves one declared ``declared``:
    the same type, or timestamps of one unit that both have a time zone (the
    runner converts between zones; the instant is the same)."""
    if declared == given:
        return True
    return (
        pa.types.is_timestamp(declared)
        and pa.types.is_timestamp(given)
        and declared.unit == given.unit
        and declared.tz is not None
        and given.tz is not None
    )


@dataclass(frozen=True, eq=False)
class Stream:
    """Rows flowing in a pipeline: a source's, or a stage's output (with its
    row kinds). ``schema`` holds its columns (without ``row_kind``);
    ``sequence`` the column that orders its rows, if any."""

    pipeline: PipelineGraph = field(repr=False)
    name: str
    schema: pa.Schema = field(repr=False)
    #: A source's index (``stage`` is then ``None``), or the stage's.
    index: int
    is_stage: bool
    sequence: str | None = None

    def ordered_by(self, column: str) -> Stream:
        """This stream, its rows ordered by ``column`` for the stages that read
        it (an int64 column that numbers changes)."""
        if column not in self.schema.names:
            raise InputError(
                f"stream {self.name!r} has no column {column!r} to order by; it has "
                f"{self.schema.names}"
            )
        return Stream(self.pipeline, self.name, self.schema, self.index, self.is_stage, column)


@dataclass(frozen=True)
class Source:
    """A query input: a streaming DataFrame and what relstate knows of it."""

    name: str
    frame: Any = field(repr=False)  # DataFrame; None once pickled
    schema: pa.Schema = field(repr=False)
    changelog: bool
    watermark: Watermark | None


@dataclass(frozen=True)
class StageInput:
    """Where one input side of a stage comes from, and how it is keyed."""

    stream: Stream
    keys: tuple[str, ...]
    drop_null_keys: bool


@dataclass(frozen=True)
class Stage:
    """One keyed step of every batch: an operator and one input per side.

    By default each partition's rows of all sides are merged in sequence
    order; ``sides_in_turn`` gives the operator every row of side 0 first,
    then side 1 (fewer, longer runs, for an operator whose result does not
    depend on the order between sides)."""

    operator: Operator
    inputs: tuple[StageInput, ...]
    sequence: str | None
    sides_in_turn: bool

    @property
    def name(self) -> str:
        return self.operator.name

    @property
    def keyless(self) -> bool:
        """A stage without a key (``keys=()``): every row goes to partition 0
        of one task, as Spark runs a global aggregate."""
        return not self.inputs[0].keys

    def partitions(self, query_partitions: int) -> int:
        """The stage's partition count in a query of ``query_partitions``:
        that count for a keyed stage, one for a keyless stage."""
        return 1 if self.keyless else query_partitions


class PipelineGraph:
    """Sources and keyed stages that run in one streaming query: the graph,
    which the runner and the harness run; :class:`operators.Pipeline` adds
    starting it in Spark."""

    def __init__(self) -> None:
        self.sources: list[Source] = []
        self.stages: list[Stage] = []

    # -- building -----------------------------------------------------------------------

    def source(
        self,
        data: DataFrame | pa.Schema,
        name: str | None = None,
        sequence: str | None = None,
        watermark: Watermark | None = None,
    ) -> Stream:
        """A streaming DataFrame as an input of the pipeline (or, for a
        pipeline run by the harness without Spark, the Arrow schema of its
        rows).

        A ``row_kind`` column makes it a changelog (else every row is an
        insert). ``sequence`` names the integer column that orders its rows.
        The event-time watermark is taken from ``withWatermark`` on the frame
        (Spark records the delay on the column) unless ``watermark`` gives
        one."""
        name = name or f"source{len(self.sources)}"
        if name in {s.name for s in self.sources}:
            raise InputError(f"the pipeline has a source named {name!r} already")
        frame: DataFrame | None = None
        if isinstance(data, pa.Schema):
            changelog = ROW_KIND in data.names
            schema = pa.schema([f for f in data if f.name != ROW_KIND])
        else:
            frame = data
            changelog = ROW_KIND in frame.columns
            schema = arrow_schema_of(frame)
            marked = [f for f in frame.schema.fields if DELAY_KEY in (f.metadata or {})]
            if watermark is None and marked:
                watermark = Watermark(marked[0].name, int(marked[0].metadata[DELAY_KEY]))
        if watermark is not None:
            if watermark.column not in schema.names:
                raise InputError(
                    f"source {name!r} has no event-time column {watermark.column!r}; it has "
                    f"{schema.names}"
                )
            kind = schema.field(watermark.column).type
            if not (pa.types.is_timestamp(kind) or pa.types.is_integer(kind)):
                raise InputError(
                    f"the event-time column {watermark.column!r} of source {name!r} is {kind}; "
                    "it must be a timestamp or integer milliseconds"
                )
            if watermark.delay_ms < 0:
                raise InputError(f"a watermark delay cannot be negative: {watermark}")
        if sequence is not None:
            _check_sequence(name, schema, sequence)
        self.sources.append(Source(name, frame, schema, changelog, watermark))
        return Stream(self, name, schema, len(self.sources) - 1, False, sequence)

    def stage(
        self,
        operator: Operator,
        *inputs: Stream,
        keys: Sequence[str] | Sequence[Sequence[str]],
        sequence: str | None = None,
        sides_in_turn: bool = False,
        drop_null_keys: bool | Sequence[bool] = False,
    ) -> Stream:
        """Run ``operator`` over ``inputs`` (one stream per operator input),
        its rows partitioned by ``keys`` (one list for every side, or one per
        side, of one length and one type); the stage's output stream.
        ``keys=()`` makes a keyless stage: all its rows go to partition 0 of
        one task and its state is one partition, whatever the query's
        partition count (a global top-N or aggregate, as Spark runs one).

        Each input's rows are ordered by its stream's sequence column, else
        by ``sequence`` (default: the operator's ``sequence_column``), at one
        number retractions first; a stage's output without one comes in the
        order its partitions emitted it. ``drop_null_keys`` (per side, or for all) leaves
        out rows whose key has a null: they can meet no other row."""
        label = f"stage {operator.name!r}"
        if operator.name in {s.name for s in self.stages}:
            raise InputError(
                f"the pipeline has a stage named {operator.name!r} already; each stage keeps "
                "its state under its operator's name, so give operators distinct names"
            )
        if len(inputs) != len(operator.inputs):
            raise InputError(
                f"{label} takes {len(operator.inputs)} input(s), got {len(inputs)} stream(s)"
            )
        for stream in inputs:
            if not isinstance(stream, Stream) or stream.pipeline is not self:
                raise InputError(f"{label}: its inputs must be streams of this pipeline")
            upstream = self.stages[stream.index] if stream.is_stage else None
            _check_update_before(label, operator, upstream)
        key_lists = _key_lists(keys, len(inputs), label)
        nulls = (
            [bool(drop_null_keys)] * len(inputs)
            if isinstance(drop_null_keys, bool)
            else [bool(d) for d in drop_null_keys]
        )
        if len(nulls) != len(inputs):
            raise InputError(f"{label}: give drop_null_keys once or once per input")
        for stream, cols in zip(inputs, key_lists, strict=True):
            if stream.is_stage:
                _check_upsert_partitions(label, self.stages[stream.index], cols)
        sequence = sequence or operator.sequence_column
        key_types: list[list[pa.DataType]] = []
        for side, (stream, declared, cols) in enumerate(
            zip(inputs, operator.inputs, key_lists, strict=True)
        ):
            where = f"input {side} ({stream.name!r}) of {label}"
            _check_declared(where, stream.schema, declared)
            missing = [c for c in cols if c not in stream.schema.names]
            if missing:
                raise InputError(
                    f"{where} has no key column(s) {missing}; it has {stream.schema.names}"
                )
            key_types.append([stream.schema.field(c).type for c in cols])
            order = stream.sequence or sequence
            if order is not None:
                _check_sequence(where, stream.schema, order)
        for types in key_types[1:]:
            if not all(same_type(a, b) for a, b in zip(key_types[0], types, strict=True)):
                raise InputError(
                    f"{label}: the key columns of its inputs have types "
                    f"{[[str(t) for t in ts] for ts in key_types]}; rows with equal keys must "
                    "hash alike, so cast them to one type"
                )
        stage = Stage(
            operator,
            tuple(
                StageInput(s, tuple(k), n) for s, k, n in zip(inputs, key_lists, nulls, strict=True)
            ),
            sequence,
            sides_in_turn,
        )
        self.stages.append(stage)
        return Stream(self, operator.name, operator.output, len(self.stages) - 1, True)

    # -- reading ------------------------------------------------------------------------

    def consumers(self, stream: Stream) -> list[int]:
        """The stages that read ``stream``."""
        return [
            i
            for i, stage in enumerate(self.stages)
            for inp in stage.inputs
            if inp.stream.is_stage == stream.is_stage and inp.stream.index == stream.index
        ]

    def check_complete(self, outputs: Sequence[Stream]) -> None:
        """Refuse a pipeline that cannot run: no stage, an output that is not
        a stage's (or is given twice), a source or stage whose rows go nowhere."""
        if not self.stages:
            raise InputError("a pipeline needs at least one stage")
        for output in outputs:
            if not isinstance(output, Stream) or output.pipeline is not self or not output.is_stage:
                raise InputError("the pipeline's outputs must be its stages' streams")
        indices = [o.index for o in outputs]
        if len(set(indices)) != len(indices):
            raise InputError("a stage's stream is given as an output twice; give it once")
        for index, source in enumerate(self.sources):
            if not any(
                not i.stream.is_stage and i.stream.index == index
                for s in self.stages
                for i in s.inputs
            ):
                raise InputError(f"source {source.name!r} is read by no stage")
        for index, stage in enumerate(self.stages):
            if index not in indices and not any(
                i.stream.is_stage and i.stream.index == index for s in self.stages for i in s.inputs
            ):
                raise InputError(
                    f"the output of stage {stage.name!r} goes nowhere: read it in a later "
                    "stage or make it one of the pipeline's outputs"
                )

    def watermark_delays(self) -> dict[str, int]:
        """Each watermarked source's delay (ms), by source name."""
        return {s.name: s.watermark.delay_ms for s in self.sources if s.watermark is not None}

    def watermark_inputs(self) -> list[StageInputs]:
        """The stages as the watermark rule sees them: each operator and where
        its inputs come from (a source's name, or an earlier stage's index)."""
        return [
            StageInputs(
                stage.operator,
                [i.stream.index if i.stream.is_stage else i.stream.name for i in stage.inputs],
            )
            for stage in self.stages
        ]

    def sequenced(self, stage: Stage) -> list[str | None]:
        """The column ordering each input of ``stage`` (the stream's own, else
        the stage's), ``None`` where it has none."""
        return [i.stream.sequence or stage.sequence for i in stage.inputs]


def _key_lists(
    keys: Sequence[str] | Sequence[Sequence[str]], sides: int, label: str
) -> list[list[str]]:
    """One list of key columns per side (a flat list serves every side); an
    empty list, or one empty list per side, for a keyless stage."""
    if isinstance(keys, str):
        keys = [keys]
    if keys is None:
        raise InputError(f"{label}: give its key columns, or keys=() for a keyless stage")
    if all(isinstance(k, str) for k in keys):
        lists = [[str(k) for k in keys]] * sides
    else:
        lists = [[str(c) for c in k] for k in keys if not isinstance(k, str)]
    if len(lists) != sides or len({len(k) for k in lists}) != 1:
        raise InputError(
            f"{label}: give its key columns once, or once per input ({sides}), each list "
            f"of one length (keys=() for a keyless stage); got {keys!r}"
        )
    return lists


def _check_update_before(label: str, operator: Operator, upstream: Stage | None) -> None:
    """Refuse an upsert stream (``+U`` without ``-U``) as the input of an
    operator that needs each ``-U`` to retract the row it names: it would
    keep every old row beside its new one."""
    if upstream is None or not operator.needs_update_before:
        return
    key = upstream.operator.output_upsert_key
    if key is not None:
        raise InputError(
            f"{label} reads the output of stage {upstream.name!r}, an upsert stream keyed by "
            f"{list(key)} with no -U rows; {label} needs the -U before each +U to retract "
            f"the row it replaces: build {upstream.name!r} with update_before=True"
        )


def _check_upsert_partitions(label: str, upstream: Stage, keys: Sequence[str]) -> None:
    """Refuse to partition an upsert stream by columns outside its key: the
    rows of one key would reach different tasks, and a ``+U`` could not find
    the row it replaces."""
    key = upstream.operator.output_upsert_key
    outside = [c for c in keys if key is not None and c not in key]
    if outside:
        raise InputError(
            f"{label} reads the upsert stream of stage {upstream.name!r} (keyed by "
            f"{list(key or ())}) partitioned by {outside}: each key's rows must reach one "
            "task, so partition it by columns of its key, or build the stage with "
            "update_before=True"
        )


def _check_declared(where: str, given: pa.Schema, declared: pa.Schema) -> None:
    for fld in declared:
        if fld.name not in given.names:
            raise InputError(f"{where} has no column {fld.name!r}; it has {given.names}")
        actual = given.field(fld.name).type
        if not same_type(fld.type, actual):
            raise InputError(
                f"column {fld.name!r} of {where} has type {actual}, the operator expects "
                f"{fld.type}; cast it in Spark first (or declare the operator's input with "
                "the stream's schema)"
            )


def _check_sequence(where: str, schema: pa.Schema, column: str) -> None:
    if column not in schema.names:
        raise InputError(f"{where} has no sequence column {column!r}; it has {schema.names}")
    if not pa.types.is_integer(schema.field(column).type):
        raise InputError(
            f"the sequence column {column!r} of {where} is {schema.field(column).type}; it "
            "must be an integer that numbers the changes"
        )
