"""Rows a stage cannot take, found and described for the dead-letter table.

Under ``bad_rows="set_aside"`` a task sets aside the rows its operator
cannot take (an unknown row kind, a null in a column its input declares not
nullable, a row its own input check refuses) instead of failing the batch;
this module finds them and describes each as a dead letter. The table they
go to is :mod:`operators._checkpoint.dead_letters`.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from operators._api.changelog import ROW_KIND, RowKind

__all__ = ["SET_ASIDE", "letters", "row_faults"]

#: The counter of rows a stage set aside in a batch.
SET_ASIDE = "numRowsSetAside"

_KINDS = pa.array([k.value for k in RowKind])


def row_faults(declared: pa.Schema, batch: pa.RecordBatch) -> list[str | None]:
    """Per row of ``batch`` (an input of an operator that declares
    ``declared``), why the operator cannot take it, or ``None``: an unknown
    row kind, or a null in a column declared not nullable. Worked in Arrow;
    only the rows found bad become Python objects."""
    bad = pa.repeat(pa.scalar(False), batch.num_rows)
    masks: list[tuple[pa.Array, str]] = []
    index = batch.schema.get_field_index(ROW_KIND)
    if index >= 0:
        kinds = batch.column(index)
        unknown = pc.invert(pc.fill_null(pc.is_in(kinds, value_set=_KINDS), False))
        masks.append((unknown, "unknown row kind"))
    for fld in declared:
        at = batch.schema.get_field_index(fld.name)
        if at >= 0 and not fld.nullable and batch.column(at).null_count:
            masks.append((pc.is_null(batch.column(at)), f"null in non-nullable {fld.name!r}"))
    for mask, _ in masks:
        bad = pc.or_(bad, mask)
    if not pc.any(bad).as_py():
        return [None] * batch.num_rows
    reasons: list[str | None] = [None] * batch.num_rows
    for mask, reason in masks:
        for i in pc.indices_nonzero(mask).to_pylist():
            if reasons[i] is None:
                reasons[i] = reason
    return reasons


def as_json(row: Mapping[str, Any]) -> str:
    """A row as the dead-letter table holds it."""
    return json.dumps(dict(row), default=_plain, sort_keys=False)


def _plain(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time, dt.timedelta, decimal.Decimal)):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not a value a row holds")


def letters(
    sources: Sequence[str],
    partition: int,
    side: int,
    batch: pa.RecordBatch,
    reasons: Sequence[str | None],
) -> list[dict[str, Any]]:
    """The dead letters of ``batch``'s rows with a reason (input ``side``
    of a stage whose inputs read ``sources``), without batch and stage."""
    source = sources[side] if side < len(sources) else f"input {side}"
    picked = [i for i, r in enumerate(reasons) if r is not None]
    rows = batch.take(pa.array(picked, pa.int64())).to_pylist() if picked else []
    return [
        {
            "source": source,
            "input": side,
            "partition": partition,
            "reason": reasons[i],
            "row": as_json(row),
        }
        for i, row in zip(picked, rows, strict=True)
    ]
