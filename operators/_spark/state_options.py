"""The options of the ``relstate-state`` and ``relstate-metadata`` data
sources, checked on the driver before anything is read.

Spark's own state data source (``format("statestore")``) spells its options
``batchId``, ``readChangeFeed``, ``changeStartBatchId``,
``changeEndBatchId`` and ``joinSide``; relstate takes those spellings, and
its earlier ones (``batch_id``, ``startBatchId``, ``endBatchId``) as
aliases. Option names are case-insensitive, as Spark's are. An option that
is unknown, given twice under two spellings, or that contradicts another
(a start batch without the change feed, a batch id with it, a join side and
a table) is an :class:`~operators.errors.InputError` naming what to give
instead: an option silently ignored would read something else than asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from operators._checkpoint.location import StateLocation
from operators.errors import InputError
from statestore import S3_OPTIONS

__all__ = ["JOIN_SIDES", "METADATA_OPTIONS", "STATE_OPTIONS", "ReadRequest"]

JOIN_SIDES = ("left", "right")

#: Each option of ``relstate-state``: its spellings, the first preferred.
STATE_OPTIONS: dict[str, tuple[str, ...]] = {
    "path": ("path",),
    "operator": ("operator",),
    "table": ("table",),
    "join_side": ("joinSide",),
    "batch_id": ("batchId", "batch_id"),
    "partition": ("partition",),
    "change_feed": ("readChangeFeed",),
    "start": ("changeStartBatchId", "startBatchId"),
    "end": ("changeEndBatchId", "endBatchId"),
    **{name: (name,) for name in S3_OPTIONS},
}

#: Each option of ``relstate-metadata``.
METADATA_OPTIONS: dict[str, tuple[str, ...]] = {
    k: v for k, v in STATE_OPTIONS.items() if k in ("path", "batch_id", *S3_OPTIONS)
}

#: Options of Spark's state source that relstate has no counterpart of.
_NOT_HERE = {
    "operatorid": "relstate names operators: give option 'operator' (a name; "
    "`relstate inspect` lists them)",
    "storename": "give option 'table' (a join's side: option 'joinSide')",
    "snapshotstartbatchid": "every kept batch can be read directly: give option 'batchId'",
    "snapshotpartitionid": "give option 'partition'",
}


def _spellings(allowed: Mapping[str, tuple[str, ...]]) -> list[str]:
    return [s for spellings in allowed.values() for s in spellings]


def _given(
    options: Mapping[str, Any], source: str, allowed: Mapping[str, tuple[str, ...]]
) -> dict[str, str]:
    """The options by their canonical name; an error for an unknown option or
    one given under two spellings."""
    by_spelling = {s.lower(): name for name, spellings in allowed.items() for s in spellings}
    out: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for key, value in options.items():
        if value is None:
            continue
        name = by_spelling.get(str(key).lower())
        if name is None:
            hint = _NOT_HERE.get(str(key).lower(), "")
            raise InputError(
                f"{source} has no option {key!r}{f': {hint}' if hint else ''}; its options "
                f"are {', '.join(_spellings(allowed))}"
            )
        if name in out:
            raise InputError(
                f"{source}: options {spelled[name]!r} and {key!r} are the same option; give one"
            )
        out[name], spelled[name] = str(value), str(key)
    return out


def _int(given: Mapping[str, str], name: str) -> int | None:
    if name not in given:
        return None
    text = given[name]
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"option {STATE_OPTIONS[name][0]} must be an integer >= 0, got {text!r}")
    return value


@dataclass(frozen=True)
class ReadRequest:
    """A read's options, checked once on the driver and pickled to the tasks."""

    path: str
    s3: dict[str, str]
    operator: str | None = None
    table: str | None = None
    join_side: str | None = None
    batch_id: int | None = None
    partition: int | None = None
    change_feed: bool = False
    start: int | None = None
    end: int | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any], source: str = "relstate-state") -> ReadRequest:
        """Check ``options`` of ``source`` (``relstate-state`` or
        ``relstate-metadata``)."""
        allowed = STATE_OPTIONS if source == "relstate-state" else METADATA_OPTIONS
        given = _given(options, source, allowed)
        path = given.get("path")
        if not path:
            raise InputError(
                f'give the checkpoint: spark.read.format("{source}").option("path", ...)'
            )
        feed = given.get("change_feed", "false").lower()
        if feed not in ("true", "false"):
            raise InputError(f"option readChangeFeed is 'true' or 'false', got {feed!r}")
        request = cls(
            path=path,
            s3={k: given[k] for k in S3_OPTIONS if k in given},
            operator=given.get("operator"),
            table=given.get("table"),
            join_side=given.get("join_side"),
            batch_id=_int(given, "batch_id"),
            partition=_int(given, "partition"),
            change_feed=feed == "true",
            start=_int(given, "start"),
            end=_int(given, "end"),
        )
        request._check()
        return request

    def _check(self) -> None:
        if self.change_feed:
            if self.start is None:
                raise InputError("readChangeFeed needs option changeStartBatchId (the first batch)")
            if self.batch_id is not None:
                raise InputError(
                    "option batchId reads the state after one batch, readChangeFeed the "
                    "changes of a range: give changeStartBatchId and changeEndBatchId "
                    "instead of batchId"
                )
        elif self.start is not None or self.end is not None:
            raise InputError(
                "options changeStartBatchId and changeEndBatchId belong to the change "
                "feed: add option readChangeFeed=true, or give batchId to read the state "
                "after one batch"
            )
        if self.join_side is not None:
            if self.join_side not in JOIN_SIDES:
                raise InputError(f"option joinSide is 'left' or 'right', got {self.join_side!r}")
            if self.table is not None:
                raise InputError("options joinSide and table both name the table to read; give one")

    def location(self) -> StateLocation:
        return StateLocation(self.path, self.s3)

    @property
    def version(self) -> int | None:
        """The batch whose tables (and their schemas) the read follows: the
        change feed's end, else the batch read."""
        return self.end if self.change_feed else self.batch_id
