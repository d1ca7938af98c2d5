"""Flink's deduplication emit rules (seed 002, ``DeduplicateFunctionHelper``),
one function per case: given the row stored for a key (``None``: no row, or
an expired one) and the row that arrives, what to emit and what to store.

Each returns ``(emitted, state)``: the ``(kind, row)`` pairs to output, in
order, and the new state of the key: a row to store, :data:`CLEAR` to delete
it, or :data:`KEEP` to leave it as it is.
"""

from __future__ import annotations

from typing import Any, Final

from encoding import Row
from operators._api.changelog import RowKind

__all__ = [
    "CLEAR",
    "KEEP",
    "Emitted",
    "first_on_proctime",
    "keeps_on_rowtime",
    "last_on_changelog",
    "last_on_proctime",
    "on_rowtime",
]

Emitted = list[tuple[RowKind, Row]]


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: The key's state stays as it is.
KEEP: Final = _Marker("KEEP")
#: The key's state is deleted.
CLEAR: Final = _Marker("CLEAR")

State = Row | _Marker

_INSERT, _BEFORE, _AFTER, _DELETE = (
    RowKind.INSERT,
    RowKind.UPDATE_BEFORE,
    RowKind.UPDATE_AFTER,
    RowKind.DELETE,
)


def first_on_proctime(previous: Row | None, row: Row) -> tuple[Emitted, State]:
    """``processFirstRowOnProcTime``: the first row of a key is ``+I``; every
    later one is dropped."""
    if previous is not None:
        return [], KEEP
    return [(_INSERT, row)], row


def last_on_proctime(
    previous: Row | None,
    row: Row,
    update_before: bool,
    insert: bool,
    ttl: bool,
) -> tuple[Emitted, State]:
    """``processLastRowOnProcTime`` (insert-only input). Without either flag
    nothing is stored and every row is ``+U``; else the first row is ``+I``,
    a later one ``-U`` old (with update-before) and ``+U`` new, and an identical
    row emits nothing unless state TTL is on (then it is re-emitted, so that
    downstream state is not evicted too early)."""
    if not (update_before or insert):
        return [(_AFTER, row)], KEEP
    return _accumulate(previous, row, update_before, ttl)


def last_on_changelog(
    previous: Row | None,
    row: Row,
    kind: RowKind,
    update_before: bool,
    ttl: bool,
) -> tuple[Emitted, State]:
    """``processLastRowOnChangelog``. ``+I``/``+U``: as :func:`last_on_proctime`
    with the insert flag on, the row stored as an insert. ``-U``/``-D``: ``-D``
    of the *stored* row (the input may carry only the key), and the key is
    cleared; a retraction of a key with no row emits nothing."""
    if kind.is_retract:
        if previous is None:
            return [], KEEP
        return [(_DELETE, previous)], CLEAR
    return _accumulate(previous, row, update_before, ttl)


def keeps_on_rowtime(previous_time: Any, time: Any, keep_last: bool) -> bool:
    """``isDuplicate``: does a row at ``time`` replace one at ``previous_time``?
    Keep-last replaces on ``>=`` (of equal times, the later arrival wins);
    keep-first only on ``<`` (the earlier arrival wins)."""
    return bool(previous_time <= time if keep_last else time < previous_time)


def on_rowtime(
    previous: Row | None,
    row: Row,
    time_index: int,
    keep_last: bool,
    update_before: bool,
    insert: bool,
) -> tuple[Emitted, State]:
    """``deduplicateOnRowTime`` with ``updateDeduplicateResult``: a row that
    replaces the stored one is emitted (``+I`` first, then ``-U``/``+U``, or
    ``+U`` alone without either flag) and stored; any other is dropped. Row time
    has no identical-row rule: an equal row at an equal time is re-emitted."""
    if previous is not None and not keeps_on_rowtime(
        previous[time_index], row[time_index], keep_last
    ):
        return [], KEEP
    if not (update_before or insert):
        return [(_AFTER, row)], row
    if previous is None:
        return [(_INSERT, row)], row
    return _update(previous, row, update_before), row


def _accumulate(
    previous: Row | None, row: Row, update_before: bool, ttl: bool
) -> tuple[Emitted, State]:
    """A row that is kept on processing time: ``+I`` if first, nothing if
    identical to the stored one while TTL is off, else an update."""
    if previous is None:
        return [(_INSERT, row)], row
    if not ttl and previous == row:
        return [], KEEP
    return _update(previous, row, update_before), row


def _update(previous: Row, row: Row, update_before: bool) -> Emitted:
    if update_before:
        return [(_BEFORE, previous), (_AFTER, row)]
    return [(_AFTER, row)]
