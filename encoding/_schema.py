"""Table schemas: typed columns, an ordered primary key, a value layout."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from encoding.errors import SchemaError

__all__ = [
    "MAX_TABLE_ID",
    "Direction",
    "KeyColumn",
    "NullOrder",
    "PartitionBy",
    "PartitionLocal",
    "TableSchema",
    "ValueLayout",
    "check_supported_type",
]

#: Table ids are u32; the top id is reserved for relstate's own metadata rows.
MAX_TABLE_ID = 0xFFFF_FFFE


class Direction(enum.Enum):
    """Sort direction of one key column."""

    ASC = "asc"
    DESC = "desc"


class NullOrder(enum.Enum):
    """Where nulls sort in one key column, whatever its direction."""

    FIRST = "first"
    LAST = "last"


class ValueLayout(enum.Enum):
    """How a row's values become key-value pairs.

    ``ROW`` stores the whole row in one value (seed 001's choice); ``CELL`` stores
    one key-value pair per non-key column, the key extended by a column id.
    """

    ROW = "row"
    CELL = "cell"


@dataclass(frozen=True)
class KeyColumn:
    """One primary-key column with its order.

    The null order defaults to Spark's: nulls first when ascending, last when
    descending.
    """

    name: str
    direction: Direction = Direction.ASC
    nulls: NullOrder | None = None

    def __post_init__(self) -> None:
        if self.nulls is None:
            default = NullOrder.FIRST if self.direction is Direction.ASC else NullOrder.LAST
            object.__setattr__(self, "nulls", default)

    @property
    def null_order(self) -> NullOrder:
        """The resolved null order (never ``None`` after construction)."""
        assert self.nulls is not None
        return self.nulls


KeySpec = str | KeyColumn


@dataclass(frozen=True)
class PartitionLocal:
    """Marks a table of one partition's own bookkeeping, whose rows belong to
    no key of the query (a per-partition bound, a schedule).

    When the partition count changes, every new partition gets, per primary
    key, the row with the least ``least`` column among the old partitions'
    rows: right for a lower bound or a next-due time, which may only err low.
    Without ``least`` the rows cannot move, and state that holds any cannot
    be repartitioned.
    """

    least: str | None = None


#: How a table's rows map to the query's key: ``None``, its leading
#: primary-key columns hold it (as many as the query has key columns); a
#: tuple, the leading ones of these columns hold it (for a table keyed by
#: something else first, a time say); or :class:`PartitionLocal`.
PartitionBy = tuple[str, ...] | PartitionLocal | None


def check_supported_type(name: str, dtype: pa.DataType) -> None:
    """Raise :class:`SchemaError` unless relstate can encode ``dtype``."""
    if (
        pa.types.is_integer(dtype)
        or pa.types.is_float32(dtype)
        or pa.types.is_float64(dtype)
        or pa.types.is_boolean(dtype)
        or pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_binary(dtype)
        or pa.types.is_large_binary(dtype)
        or pa.types.is_date32(dtype)
        or pa.types.is_timestamp(dtype)
        or pa.types.is_null(dtype)
    ):
        return
    if pa.types.is_decimal128(dtype):
        return
    raise SchemaError(
        f"column {name!r} has type {dtype}, which relstate cannot encode; "
        "use an integer, float32/64, bool, string, binary, date32, timestamp, "
        "decimal128 or null column"
    )


@dataclass(frozen=True)
class TableSchema:
    """The shape of one state table.

    ``columns`` is the Arrow schema of a row, in row order. ``primary_key`` names
    the key columns in key order (a name means ascending); the join key of join
    state goes first so that one prefix scan finds every match. ``table_id`` keeps
    tables that share one backend apart. ``partition_by`` says which of a
    row's columns hold the query's key, so that ``relstate repartition`` can
    move the row (see :data:`PartitionBy`). ``auxiliary`` marks a table that
    only serves the operator's other tables (an expiry or time index, a
    per-partition bound): its rows are not the operator's state rows, so the
    operator's state-row metrics leave them out, as Spark counts one row per
    key (the store's own totals count every table).
    """

    table_id: int
    columns: pa.Schema
    primary_key: tuple[KeyColumn, ...]
    layout: ValueLayout = ValueLayout.ROW
    name: str = ""
    partition_by: PartitionBy = None
    auxiliary: bool = False
    key_indices: tuple[int, ...] = field(init=False, repr=False, compare=False)
    value_indices: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        table_id: int,
        columns: pa.Schema | Sequence[pa.Field],
        primary_key: Sequence[KeySpec],
        layout: ValueLayout | str = ValueLayout.ROW,
        name: str = "",
        partition_by: Sequence[str] | PartitionLocal | None = None,
        auxiliary: bool = False,
    ) -> None:
        schema = columns if isinstance(columns, pa.Schema) else pa.schema(list(columns))
        keys = tuple(k if isinstance(k, KeyColumn) else KeyColumn(k) for k in primary_key)
        object.__setattr__(self, "table_id", table_id)
        object.__setattr__(self, "columns", schema)
        object.__setattr__(self, "primary_key", keys)
        object.__setattr__(self, "layout", ValueLayout(layout))
        object.__setattr__(self, "name", name or f"table_{table_id}")
        if isinstance(partition_by, str):
            raise SchemaError(
                f"table {name!r}: partition_by is a sequence of column names, got the "
                f"string {partition_by!r}; write ({partition_by!r},)"
            )
        if partition_by is not None and not isinstance(partition_by, PartitionLocal):
            partition_by = tuple(partition_by)
        object.__setattr__(self, "partition_by", partition_by)
        object.__setattr__(self, "auxiliary", auxiliary)
        self._validate()
        names = schema.names
        key_indices = tuple(names.index(k.name) for k in keys)
        object.__setattr__(self, "key_indices", key_indices)
        object.__setattr__(
            self,
            "value_indices",
            tuple(i for i in range(len(names)) if i not in key_indices),
        )

    def _validate(self) -> None:
        if not isinstance(self.table_id, int) or not 0 <= self.table_id <= MAX_TABLE_ID:
            raise SchemaError(
                f"table id must be an integer in 0..{MAX_TABLE_ID}, got {self.table_id!r}"
            )
        names = self.columns.names
        if len(set(names)) != len(names):
            raise SchemaError(f"table {self.name!r} has duplicate column names: {names}")
        if not names:
            raise SchemaError(f"table {self.name!r} has no columns")
        if len(names) > 0xFFFF:
            raise SchemaError(f"table {self.name!r} has more than 65535 columns")
        if not self.primary_key:
            raise SchemaError(
                f"table {self.name!r} has an empty primary key; name at least one column"
            )
        seen: set[str] = set()
        for key in self.primary_key:
            if key.name not in names:
                raise SchemaError(
                    f"primary-key column {key.name!r} of table {self.name!r} is not "
                    f"one of its columns {names}"
                )
            if key.name in seen:
                raise SchemaError(f"primary-key column {key.name!r} is named twice")
            seen.add(key.name)
        for fld in self.columns:
            check_supported_type(fld.name, fld.type)
        self._validate_partition_by()

    def _validate_partition_by(self) -> None:
        by = self.partition_by
        if isinstance(by, PartitionLocal):
            named = [] if by.least is None else [by.least]
        elif by is None:
            return
        else:
            named = list(by)
            if not named:
                raise SchemaError(
                    f"table {self.name!r}: partition_by names no column; give the columns "
                    "that hold the query's key, or None for the leading primary-key columns"
                )
        missing = [n for n in named if n not in self.columns.names]
        if missing:
            raise SchemaError(
                f"table {self.name!r}: partition_by names {missing}, which are not among its "
                f"columns {self.columns.names}"
            )

    @property
    def key_names(self) -> tuple[str, ...]:
        """Names of the primary-key columns, in key order."""
        return tuple(k.name for k in self.primary_key)

    @property
    def key_types(self) -> tuple[pa.DataType, ...]:
        """Arrow types of the primary-key columns, in key order."""
        return tuple(self.columns.field(i).type for i in self.key_indices)

    @property
    def prefix(self) -> bytes:
        """The table id as the 4-byte big-endian prefix of every key."""
        return self.table_id.to_bytes(4, "big")

    def key_of(self, row: Sequence[object]) -> tuple[object, ...]:
        """The primary-key tuple of a full row."""
        return tuple(row[i] for i in self.key_indices)

    def with_columns(self, columns: pa.Schema) -> TableSchema:
        """The same table with new columns (schema evolution)."""
        return TableSchema(
            self.table_id,
            columns,
            self.primary_key,
            self.layout,
            self.name,
            self.partition_by,
            self.auxiliary,
        )
