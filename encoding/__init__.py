"""Bytes: table schemas, order-preserving keys, row and cell values."""

from encoding._cell import CellCodec
from encoding._keys import KeyCodec, arrow_equal, key_equal_values, prefix_successor
from encoding._row import RowCodec
from encoding._schema import (
    MAX_TABLE_ID,
    Direction,
    KeyColumn,
    NullOrder,
    PartitionBy,
    PartitionLocal,
    TableSchema,
    ValueLayout,
)
from encoding._value_columns import FORMAT_VERSION, Row
from encoding.errors import (
    DecodingError,
    EncodingError,
    RelstateError,
    SchemaError,
    StateStoreError,
)

__all__ = [
    "FORMAT_VERSION",
    "MAX_TABLE_ID",
    "CellCodec",
    "DecodingError",
    "Direction",
    "EncodingError",
    "KeyCodec",
    "KeyColumn",
    "NullOrder",
    "PartitionBy",
    "PartitionLocal",
    "RelstateError",
    "Row",
    "RowCodec",
    "SchemaError",
    "StateStoreError",
    "TableSchema",
    "ValueLayout",
    "arrow_equal",
    "key_equal_values",
    "prefix_successor",
]
