"""``relstate inspect``: a state location's metadata, or a table's rows, on the
terminal, without Spark (the same reading as the ``relstate-state`` and
``relstate-metadata`` data sources)."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from operators._checkpoint.location import StateLocation
from operators._checkpoint.read import READ, metadata, read_rows
from operators.errors import InputError

__all__ = ["describe", "rows"]


def _grid(header: Sequence[str], body: Sequence[Sequence[Any]], null: str = "") -> list[str]:
    """Left-aligned columns under a header; ``None`` prints as ``null``
    (metadata leaves it empty; rows say ``null``, not an empty string)."""
    cells = [[str(h) for h in header], *[[null if v is None else str(v) for v in r] for r in body]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{size:.1f} {unit}"


def _state_operators(location: StateLocation) -> list[str]:
    """The operators with partitions at ``location``; :class:`InputError`
    when it holds no relstate state at all (no partitions, no runner
    records): its directories are not operators, whatever their names."""
    found = [name for name in location.operators() if location.partitions(name)]
    if found or location.query() is not None or location.recorded_batches():
        return found
    others = location.operators()
    nested = [
        d
        for d in others
        if location.fs.get_file_info(posixpath.join(location.root, d, "state")).type
        == pafs.FileType.Directory
    ]
    hint = f" (its directory {nested[0]!r} is one: give that)" if nested else ""
    held = f"only directories {others}" if others else "nothing"
    raise InputError(
        f"there is no relstate state at {location.path}: it holds {held} (no operator "
        f"partitions, no runner records). Give a query's checkpoint directory (the "
        f"checkpoint= of run_operator) or its state location{hint}"
    )


def describe(
    location: StateLocation, batch_id: int | None = None, operator: str | None = None
) -> str:
    """The query, its operators' tables and schemas with their rows
    (``operator``'s alone, when given), and per partition the commit read,
    the kept versions, the changelog chain, size and rows; a partition whose
    commit cannot be read is named with the reason, after the others."""
    operators = _state_operators(location)
    out = [f"state at {location.path}"]
    query = location.query()
    batches = location.recorded_batches()
    if query is not None:
        stages = ", ".join(
            f"{s.name} (key {list(s.key_types)})"
            if not s.keyless
            else f"{s.name} (no key, {s.partitions} partition)"
            for s in query.stages
        )
        out.append(f"query: {query.partitions} partitions; stages {stages}")
    if batches:
        record = location.record(batches[-1])
        watermark = None if record is None else record.watermark
        out.append(
            f"batches recorded: {batches[0]}..{batches[-1]} (latest committed {batches[-1]}, "
            f"watermark {watermark})"
        )
    meta = metadata(location, batch_id).to_pylist()
    shown = operators if operator is None else [location.operator(operator)]
    for name in shown:
        mine = [m for m in meta if m["operator"] == name and m["status"] == READ]
        out.append("")
        out.append(f"operator {name}")
        tables: dict[str, dict[str, Any]] = {}
        for m in mine:
            tables.setdefault(m["table"], m)
        for table, m in tables.items():
            counts = [r["table_rows"] for r in mine if r["table"] == table]
            rows = "rows not recorded" if None in counts else f"{sum(counts)} rows"
            out.append(
                f"  table {table} (id {m['table_id']:#x}, {m['layout']} layout): "
                f"{m['columns']}; key {m['key_columns']}; {rows}"
            )
        parts: dict[int, dict[str, Any]] = {m["partition"]: m for m in mine}
        body = [
            (
                p,
                m["batch_id"],
                m["commit_id"][:12],
                f"{m['kept_versions'][0]}..{m['kept_versions'][-1]}",
                m["snapshot_version"],
                m["changelogs"],
                _size(m["state_bytes"]),
                m["partition_rows"],
            )
            for p, m in sorted(parts.items())
        ]
        header = ("partition", "batch", "commit", "kept", "snapshot", "changelogs", "size", "rows")
        out.extend("  " + line for line in _grid(header, body))
        for m in meta:
            if m["operator"] == name and m["status"] != READ:
                out.append(f"  partition {m['partition']} not read: {m['status']}")
    return "\n".join(out) + "\n"


def rows(
    location: StateLocation,
    operator: str | None,
    table: str | None,
    batch_id: int | None,
    limit: int,
    partition: int | None = None,
) -> str:
    """Up to ``limit`` rows of a table at a batch, partition by partition;
    a null prints as ``null``."""
    _state_operators(location)
    name = location.operator(operator)
    meta = location.table(name, table, batch_id)
    found: list[pa.Table] = []
    left = limit
    shown = location.partitions(name) if partition is None else [partition]
    for p in shown:
        if left <= 0:
            break
        part = read_rows(location, name, meta, p, batch_id, limit=left)
        found.append(part)
        left -= part.num_rows
    body = [tuple(r.values()) for t in found for r in t.to_pylist()]
    batch = "latest committed batch" if batch_id is None else f"batch {batch_id}"
    head = f"operator {name}, table {meta.name}, {batch}: {len(body)} row(s) shown"
    return "\n".join([head, *_grid(meta.columns.names, body, null="null")]) + "\n"
