"""Dirty input has a policy, never a silent effect.

Two kinds of dirty input, each with one setting for every operator, chosen
per stage (``pipeline.stage(..., unknown_retractions=, bad_rows=)``) or per
query (the query options of the same names):

- a retraction (``-U`` / ``-D``) of a row the operator does not hold (a
  change log started mid-stream, a replayed file): ``drop`` (the default)
  does nothing with it, counts it in :data:`UNKNOWN_RETRACTIONS` and logs
  one warning per batch and stage naming the source and an example row;
  ``fail`` stops the batch with an :class:`InputError` naming the source,
  the key and the row, nothing of the batch recorded; ``apply`` does what
  Flink's changelog join does (it retracts the pairs the row would have
  made). The anchors differ, and docs/dirty-input.md says what each
  operator does under each;
- a row the operator cannot take (an unknown row kind, a null where the key
  may not be null, a value that fails the operator's input check):
  ``fail`` (the default) stops the batch; ``set_aside`` writes it to the
  stage's dead-letter table and goes on (:mod:`operators._checkpoint.dead_letters`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from operators._api.metrics import UNKNOWN_RETRACTIONS
from operators.errors import InputError

__all__ = [
    "BadRows",
    "InputPolicy",
    "UnknownRetractions",
    "unknown_retraction_error",
    "warn_unknown_retractions",
]


class UnknownRetractions(enum.Enum):
    """What a retraction of a row the operator does not hold does."""

    #: Nothing: counted, and warned of once per batch and stage.
    DROP = "drop"
    #: The batch stops with an InputError; nothing of it is recorded.
    FAIL = "fail"
    #: What Flink's changelog join does: it retracts what the row would have made.
    APPLY = "apply"


class BadRows(enum.Enum):
    """What a row the operator cannot take does."""

    #: The batch stops with an InputError; nothing of it is recorded.
    FAIL = "fail"
    #: The row goes to the stage's dead-letter table; the batch goes on.
    SET_ASIDE = "set_aside"


@dataclass(frozen=True)
class InputPolicy:
    """How one stage treats dirty input, and the names its messages give:
    the stage's name and each input's source as the user named it."""

    unknown_retractions: UnknownRetractions = UnknownRetractions.DROP
    bad_rows: BadRows = BadRows.FAIL
    stage: str = "operator"
    #: Per input: the name of the stream it reads (a source's, or a stage's).
    sources: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        unknown_retractions: UnknownRetractions | str | None,
        bad_rows: BadRows | str | None,
        stage: str,
        sources: Sequence[str] = (),
    ) -> InputPolicy:
        """The policy from settings as a user gives them (``None``: the
        default); a value outside the choices is an :class:`InputError`."""
        return cls(
            _choice(UnknownRetractions, unknown_retractions, UnknownRetractions.DROP),
            _choice(BadRows, bad_rows, BadRows.FAIL),
            stage,
            tuple(sources),
        )

    def where(self, side: int) -> str:
        """Input ``side`` as a message names it:
        ``source 'users' (input 1 of stage 'join')``."""
        if side < len(self.sources):
            return f"source {self.sources[side]!r} (input {side} of stage {self.stage!r})"
        return f"input {side} of stage {self.stage!r}"


def warn_unknown_retractions(
    log: Any,
    policy: InputPolicy,
    batch_id: int,
    metrics: Mapping[str, int],
    example: tuple[int, str] | None,
) -> None:
    """The stage's one warning of a batch whose partitions met retractions
    of rows they do not hold (``metrics``: the batch's counters, summed over
    partitions; ``example``: the side and ``repr`` of one such row)."""
    if example is None:
        return
    count = sum(v for k, v in metrics.items() if k.endswith(UNKNOWN_RETRACTIONS))
    side, row = example
    log.warning(
        "relstate.unknown_retractions",
        stage=policy.stage,
        source=policy.where(side),
        batch_id=batch_id,
        count=count,
        example=row,
        policy=policy.unknown_retractions.value,
        meaning=(
            "retractions of rows the stage does not hold (a change log started mid-stream, "
            "a file read twice?)"
            + (
                ""
                if policy.unknown_retractions is UnknownRetractions.APPLY
                else ": dropped; unknown_retractions='fail' stops at the first"
            )
        ),
    )


def unknown_retraction_error(
    policy: InputPolicy, side: int, row: Sequence[Any], key: Sequence[Any] | None
) -> InputError:
    """The error of a retraction of an unknown row under ``fail``."""
    held = "" if key is None else f" with key {tuple(key)!r}"
    return InputError(
        f"{policy.where(side)}: a retraction of a row the stage does not hold{held}: "
        f"{tuple(row)!r} (unknown_retractions='fail'). The input retracts a row it never "
        "inserted (a change log started mid-stream, a file read twice?); fix the input, or "
        "run the stage with unknown_retractions='drop' to skip such rows"
    )


def _choice(kind: type[enum.Enum], given: Any, default: Any) -> Any:
    """``given`` as a member of ``kind`` (``None``: ``default``)."""
    if given is None:
        return default
    if isinstance(given, kind):
        return given
    try:
        return kind(given)
    except ValueError:
        choices = [m.value for m in kind]
        raise InputError(f"{kind.__name__} is one of {choices}, got {given!r}") from None
