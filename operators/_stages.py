"""A pipeline of keyed stages that one micro-batch runs in order.

Some operators need their rows to meet under more than one key in a single
micro-batch: a foreign-key join keeps subscriptions with the right table
(keyed by the foreign key) and resolves results with the left table (keyed by
the left key). Each :class:`Stage` is an ordinary :class:`Operator` with its
own name (so its own state under the checkpoint) whose inputs each come from a
:class:`Source`: one of the query's inputs, or the output of an earlier stage
of the same batch. The rows of each stage are repartitioned by that stage's
keys and ordered by a sequence column before the stage runs.

Both drivers read this description: the Spark runner
(:func:`operators.run_stages`) and the harness without Spark
(:class:`operators.testing.StageHarness`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from operators._operator import Operator
from operators.errors import InputError

__all__ = ["Source", "Stage", "check_stages", "partition_of"]


@dataclass(frozen=True)
class Source:
    """Where the rows of one input side of a stage come from.

    ``origin`` is a query input's index, or (with ``from_stage``) an earlier
    stage's index. ``keys`` are the columns of those rows the stage is
    partitioned by. ``sequence`` is the column that orders them (default: the
    query's sequence column; required for a stage's output).
    ``drop_null_keys`` leaves out rows whose key has a null: they belong to no
    partition.
    """

    origin: int
    keys: tuple[str, ...]
    from_stage: bool = False
    sequence: str | None = None
    drop_null_keys: bool = False


@dataclass(frozen=True)
class Stage:
    """One keyed step of a batch: an operator, and one source per input.

    By default each partition's rows of all sides are merged in sequence
    order. ``sides_in_turn`` gives the operator every row of side 0 first,
    then side 1, each side in sequence order: fewer, longer runs, for an
    operator whose result does not depend on the order between sides.
    """

    operator: Operator
    sources: tuple[Source, ...]
    sides_in_turn: bool = False


def check_stages(stages: Sequence[Stage], inputs: int) -> None:
    """Raise :class:`InputError` unless every stage has one source per
    operator input, sources name existing inputs or earlier stages, each
    stage's sources have keys of one length, and operator names are distinct."""
    if not stages:
        raise InputError("a pipeline needs at least one stage")
    names = [s.operator.name for s in stages]
    if len(set(names)) != len(names):
        raise InputError(
            f"stage operators need distinct names (each keeps its state under its name); "
            f"got {names}"
        )
    for index, stage in enumerate(stages):
        op = stage.operator
        if len(stage.sources) != len(op.inputs):
            raise InputError(
                f"stage {index} ({op.name!r}) has {len(op.inputs)} input(s) but "
                f"{len(stage.sources)} source(s); give one source per input"
            )
        if len({len(s.keys) for s in stage.sources}) != 1 or not stage.sources[0].keys:
            raise InputError(
                f"stage {index} ({op.name!r}): every source needs key columns, as many on "
                f"each side; got {[s.keys for s in stage.sources]}"
            )
        for source in stage.sources:
            if source.from_stage and source.sequence is None:
                raise InputError(
                    f"stage {index} ({op.name!r}) reads stage {source.origin}'s output: name "
                    "the output column that orders it (Source.sequence)"
                )
            limit = index if source.from_stage else inputs
            if not 0 <= source.origin < limit:
                what = "an earlier stage" if source.from_stage else "a query input"
                raise InputError(
                    f"stage {index} ({op.name!r}) reads {what} {source.origin}, which does "
                    f"not exist (there are {limit})"
                )


def partition_of(key: Sequence[Any], partitions: int) -> int:
    """The partition of a key tuple in the harness (Spark hashes its own way;
    what matters is that equal keys meet and unequal ones spread)."""
    return zlib.crc32(repr(tuple(key)).encode()) % partitions
