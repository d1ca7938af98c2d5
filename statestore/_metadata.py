"""Table metadata in a manifest, and the check that a store may continue from it.

A manifest records each table's Arrow schema, key columns (with their types and
orders), value layout, table id and which columns hold the query's key
(``partition_by``), the value format version and the partition count. A store
whose configuration differs may load it only when every row the checkpoint
holds still decodes the same way and lands in the same partition: same
partition count, same key, same layout, old columns kept in place with their
types, and new columns nullable (old rows read them as null). ``partition_by``
may change (a new relstate declares it where an old manifest has none): it
says how to move rows, not how to read them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from encoding import Direction, KeyColumn, NullOrder, PartitionBy, PartitionLocal, TableSchema
from statestore.errors import IncompatibleStateError

__all__ = ["TableMeta", "check_compatible"]


@dataclass(frozen=True)
class TableMeta:
    """What a manifest records about one table."""

    name: str
    table_id: int
    layout: str
    columns: pa.Schema
    #: ``(name, direction, null order)`` of each key column, in key order.
    key_columns: tuple[tuple[str, str, str], ...]
    #: The table's :data:`~encoding.PartitionBy`. Not part of the rows'
    #: encoding, so :func:`check_compatible` ignores it.
    partition_by: PartitionBy = None
    #: ``False`` for a manifest written before relstate recorded
    #: ``partition_by``: then nobody knows how the rows map to the query's key.
    partition_recorded: bool = True

    @classmethod
    def of(cls, schema: TableSchema) -> TableMeta:
        """The metadata of a configured table."""
        keys = tuple((k.name, k.direction.value, k.null_order.value) for k in schema.primary_key)
        return cls(
            schema.name,
            schema.table_id,
            schema.layout.value,
            schema.columns,
            keys,
            schema.partition_by,
        )

    def table_schema(self) -> TableSchema:
        """The table schema this records (the reverse of :meth:`of`)."""
        keys = [KeyColumn(n, Direction(d), NullOrder(o)) for n, d, o in self.key_columns]
        return TableSchema(
            self.table_id,
            self.columns,
            keys,
            layout=self.layout,
            name=self.name,
            partition_by=self.partition_by,
        )

    def key_types(self) -> tuple[pa.DataType, ...]:
        return tuple(self.columns.field(name).type for name, _, _ in self.key_columns)

    def to_json(self) -> dict[str, Any]:
        """A JSON object: the serialised Arrow schema for machines, the column
        and key lists for people reading the manifest."""
        return {
            "name": self.name,
            "table_id": self.table_id,
            "layout": self.layout,
            "arrow_schema": base64.b64encode(self.columns.serialize().to_pybytes()).decode(),
            "columns": [
                {"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.columns
            ],
            "key_columns": [
                {"name": n, "type": str(self.columns.field(n).type), "direction": d, "nulls": o}
                for n, d, o in self.key_columns
            ],
            "partition_by": _partition_by_json(self.partition_by),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TableMeta:
        """Parse :meth:`to_json` output (``KeyError``/``ValueError`` if malformed)."""
        raw = base64.b64decode(obj["arrow_schema"], validate=True)
        columns = pa.ipc.read_schema(pa.py_buffer(raw))
        keys = tuple(
            (str(k["name"]), str(k["direction"]), str(k["nulls"])) for k in obj["key_columns"]
        )
        recorded = "partition_by" in obj
        return cls(
            str(obj["name"]),
            int(obj["table_id"]),
            str(obj["layout"]),
            columns,
            keys,
            _partition_by_of(obj["partition_by"]) if recorded else None,
            recorded,
        )


def _partition_by_json(by: PartitionBy) -> dict[str, Any]:
    if by is None:
        return {"kind": "leading_key"}
    if isinstance(by, PartitionLocal):
        return {"kind": "local", "least": by.least}
    return {"kind": "columns", "columns": list(by)}


def _partition_by_of(obj: Mapping[str, Any]) -> PartitionBy:
    kind = obj["kind"]
    if kind == "leading_key":
        return None
    if kind == "local":
        least = obj["least"]
        return PartitionLocal(None if least is None else str(least))
    if kind == "columns":
        return tuple(str(c) for c in obj["columns"])
    raise ValueError(f"unknown partition_by kind {kind!r}")


def check_compatible(
    stored: Sequence[TableMeta],
    stored_partitions: int | None,
    stored_value_format: int,
    configured: Sequence[TableSchema],
    partition_count: int | None,
    value_format: int,
    where: str,
) -> None:
    """Raise :class:`IncompatibleStateError` unless a store configured with
    ``configured`` tables and ``partition_count`` may load state that
    ``where`` (a manifest, named in messages) describes."""
    if (
        stored_partitions is not None
        and partition_count is not None
        and stored_partitions != partition_count
    ):
        raise IncompatibleStateError(
            f"{where} was written with {stored_partitions} partitions but the store "
            f"is configured with {partition_count}: the rows of a key would be in "
            "another partition; keep the partition count, or start from a new "
            "checkpoint location"
        )
    if stored_value_format > value_format:
        raise IncompatibleStateError(
            f"{where} holds values of format version {stored_value_format}; this "
            f"relstate reads versions up to {value_format}: upgrade relstate"
        )
    by_id = {s.table_id: s for s in configured}
    for old in stored:
        new = by_id.get(old.table_id)
        if new is None:
            raise IncompatibleStateError(
                f"{where} holds table {old.name!r} (id {old.table_id}) but the store "
                f"does not configure a table with that id (it has "
                f"{sorted((s.name, s.table_id) for s in configured)}); keep every table "
                "the checkpoint holds"
            )
        _check_table(old, TableMeta.of(new), where)


def _check_table(old: TableMeta, new: TableMeta, where: str) -> None:
    what = f"table {old.name!r} (id {old.table_id}) in {where}"
    if old.name != new.name:
        raise IncompatibleStateError(
            f"{what} is named {new.name!r} in the store's configuration; a table id "
            "must keep its name"
        )
    if old.layout != new.layout:
        raise IncompatibleStateError(
            f"{what} has value layout {old.layout!r} but the store asks for "
            f"{new.layout!r}; the layout of stored rows cannot change"
        )
    if old.key_columns != new.key_columns or old.key_types() != new.key_types():
        raise IncompatibleStateError(
            f"{what} has primary key {_describe_key(old)} but the store asks for "
            f"{_describe_key(new)}; a key's columns, types and order cannot change "
            "(encoded keys would no longer match)"
        )
    n_old = len(old.columns)
    if len(new.columns) < n_old:
        raise IncompatibleStateError(
            f"{what} has columns {old.columns.names} but the store has "
            f"{new.columns.names}: columns can be added at the end, not removed"
        )
    for i, f_old in enumerate(old.columns):
        f_new = new.columns.field(i)
        if f_old.name != f_new.name or not f_old.type.equals(f_new.type):
            raise IncompatibleStateError(
                f"{what}: column {i} is {f_old.name!r} {f_old.type} in the checkpoint "
                f"but {f_new.name!r} {f_new.type} in the store; existing columns keep "
                "their name, type and place"
            )
        if f_old.nullable and not f_new.nullable:
            raise IncompatibleStateError(
                f"{what}: column {f_old.name!r} was nullable and the store makes it "
                "non-nullable; stored rows may hold nulls"
            )
    for f_new in list(new.columns)[n_old:]:
        if not f_new.nullable:
            raise IncompatibleStateError(
                f"{what}: added column {f_new.name!r} is not nullable; rows already "
                "stored have no value for it, so an added column must be nullable"
            )


def _describe_key(meta: TableMeta) -> str:
    return (
        "("
        + ", ".join(
            f"{n} {meta.columns.field(n).type} {d} nulls {o}" for n, d, o in meta.key_columns
        )
        + ")"
    )
