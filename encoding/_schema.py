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
    tables that share one backend apart.
    """

    table_id: int
    columns: pa.Schema
    primary_key: tuple[KeyColumn, ...]
    layout: ValueLayout = ValueLayout.ROW
    name: str = ""
    key_indices: tuple[int, ...] = field(init=False, repr=False, compare=False)
    value_indices: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        table_id: int,
        columns: pa.Schema | Sequence[pa.Field],
        primary_key: Sequence[KeySpec],
        layout: ValueLayout | str = ValueLayout.ROW,
        name: str = "",
    ) -> None:
        schema = columns if isinstance(columns, pa.Schema) else pa.schema(list(columns))
        keys = tuple(k if isinstance(k, KeyColumn) else KeyColumn(k) for k in primary_key)
        object.__setattr__(self, "table_id", table_id)
        object.__setattr__(self, "columns", schema)
        object.__setattr__(self, "primary_key", keys)
        object.__setattr__(self, "layout", ValueLayout(layout))
        object.__setattr__(self, "name", name or f"table_{table_id}")
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
        return TableSchema(self.table_id, columns, self.primary_key, self.layout, self.name)
