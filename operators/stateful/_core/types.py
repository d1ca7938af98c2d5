"""Spark's schemas as Arrow: a ``StructType`` (read through its JSON form, so
PySpark is not imported here) or a DDL string (``"count bigint, name
string"``, ``"a: int"``, ``"struct<a:int>"``, or one bare type such as
``"double"``), as ``getValueState`` and ``transformWithState`` take them.

The types map as PySpark maps them to Arrow (``to_arrow_type``): ``int`` is
``int32``, ``bigint`` ``int64``, ``timestamp`` ``timestamp[us, UTC]``,
``timestamp_ntz`` ``timestamp[us]``, ``decimal(p, s)`` ``decimal128(p, s)``.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from operators.errors import InputError

__all__ = ["arrow_schema"]

_ATOMIC: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "bool": pa.bool_(),
    "byte": pa.int8(),
    "tinyint": pa.int8(),
    "short": pa.int16(),
    "smallint": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "bigint": pa.int64(),
    "float": pa.float32(),
    "real": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
    "null": pa.null(),
}
_DECIMAL = re.compile(r"(?:decimal|dec|numeric)\((\d+),(\d+)\)")
_SIZED_STRING = re.compile(r"(?:var)?char\(\d+\)")
_TOKEN = re.compile(
    r"\s*(`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*(?:\(\s*\d+\s*(?:,\s*\d+\s*)?\))?|[<>,:])"
)


def arrow_schema(schema: Any, what: str) -> pa.Schema:
    """``schema`` (a ``StructType``, a DDL string, or already an Arrow
    schema) as an Arrow schema;
    :class:`InputError` naming ``what`` if it is neither or does not parse.
    A bare type (``"double"``) is one column named ``value``."""
    if isinstance(schema, pa.Schema):
        return schema
    if isinstance(schema, str):
        try:
            return _Ddl(schema).schema()
        except _DdlError as exc:
            raise InputError(f"{what}: cannot read the DDL schema {schema!r}: {exc}") from None
    json_value = getattr(schema, "jsonValue", None)
    if json_value is None:
        raise InputError(
            f"{what}: a schema is a pyspark StructType or a DDL string, got {type(schema).__name__}"
        )
    value = json_value()
    if isinstance(value, dict) and value.get("type") == "struct":
        return pa.schema(_json_fields(value, what))
    return pa.schema([pa.field("value", _json_type(value, what))])


def _json_fields(value: dict[str, Any], what: str) -> list[pa.Field]:
    return [
        pa.field(f["name"], _json_type(f["type"], what), nullable=bool(f.get("nullable", True)))
        for f in value["fields"]
    ]


def _json_type(value: Any, what: str) -> pa.DataType:
    """A Spark type in its JSON form (``DataType.jsonValue()``) as Arrow."""
    if isinstance(value, str):
        return _atomic(value.lower().replace(" ", ""), what)
    kind = value.get("type")
    if kind == "struct":
        return pa.struct(_json_fields(value, what))
    if kind == "array":
        return pa.list_(_json_type(value["elementType"], what))
    if kind == "map":
        return pa.map_(_json_type(value["keyType"], what), _json_type(value["valueType"], what))
    raise InputError(f"{what}: Spark type {value!r} has no Arrow form here")


def _atomic(name: str, what: str) -> pa.DataType:
    t = _ATOMIC.get(name)
    if t is not None:
        return t
    m = _DECIMAL.fullmatch(name)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    if name in ("decimal", "dec", "numeric"):
        return pa.decimal128(10, 0)
    if _SIZED_STRING.fullmatch(name):
        return pa.string()
    raise InputError(f"{what}: unknown Spark type {name!r}")


class _DdlError(ValueError):
    pass


class _Ddl:
    """A small reader of Spark's DDL: ``name type [NOT NULL] [COMMENT '...']``
    fields separated by commas, ``name: type`` too, and the type forms
    ``array<t>``, ``map<k, v>``, ``struct<name: t, ...>``."""

    def __init__(self, text: str) -> None:
        text = re.sub(r"(?i)\s+comment\s+'(?:[^'\\]|\\.)*'", "", text)
        self.not_null = re.compile(r"(?i)^\s*not\s+null")
        self.text = text
        self.pos = 0

    def _peek(self) -> str | None:
        m = _TOKEN.match(self.text, self.pos)
        return None if m is None else m.group(1)

    def _next(self) -> str:
        m = _TOKEN.match(self.text, self.pos)
        if m is None:
            rest = self.text[self.pos :].strip()
            raise _DdlError(f"unexpected {rest[:20]!r}" if rest else "unexpected end")
        self.pos = m.end()
        return m.group(1)

    def _expect(self, token: str) -> None:
        got = self._next()
        if got != token:
            raise _DdlError(f"expected {token!r}, got {got!r}")

    def _at_end(self) -> bool:
        return not self.text[self.pos :].strip()

    def schema(self) -> pa.Schema:
        start = self.pos
        first = self._next()
        if self._at_end() and first.lower() not in ("struct",):
            return pa.schema([pa.field("value", self._atomic_or_fail(first))])
        if first.lower() == "struct" and self._peek() == "<":
            self.pos = start
            t = self._type()
            if not self._at_end():
                raise _DdlError(f"unexpected {self.text[self.pos :].strip()[:20]!r}")
            return pa.schema(list(t))
        if first.lower() in ("array", "map") and self._peek() == "<":
            self.pos = start
            t = self._type()
            return pa.schema([pa.field("value", t)])
        self.pos = start
        fields = self._fields(end=None)
        return pa.schema(fields)

    def _fields(self, end: str | None) -> list[pa.Field]:
        fields: list[pa.Field] = []
        while True:
            name = self._name(self._next())
            if self._peek() == ":":
                self._next()
            t = self._type()
            nullable = True
            m = self.not_null.match(self.text[self.pos :])
            if m:
                self.pos += m.end()
                nullable = False
            fields.append(pa.field(name, t, nullable=nullable))
            if end is None and self._at_end():
                return fields
            token = self._next()
            if token == end:
                return fields
            if token != ",":
                raise _DdlError(f"expected ',' after field {name!r}, got {token!r}")

    @staticmethod
    def _name(token: str) -> str:
        if token.startswith("`"):
            return token[1:-1].replace("``", "`")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
            raise _DdlError(f"expected a field name, got {token!r}")
        return token

    def _type(self) -> pa.DataType:
        token = self._next().lower()
        if token == "array":
            self._expect("<")
            element = self._type()
            self._expect(">")
            return pa.list_(element)
        if token == "map":
            self._expect("<")
            key = self._type()
            self._expect(",")
            value = self._type()
            self._expect(">")
            return pa.map_(key, value)
        if token == "struct":
            self._expect("<")
            if self._peek() == ">":
                self._next()
                return pa.struct([])
            return pa.struct(self._fields(end=">"))
        return self._atomic_or_fail(token)

    @staticmethod
    def _atomic_or_fail(token: str) -> pa.DataType:
        try:
            return _atomic(token.lower().replace(" ", ""), "")
        except InputError:
            raise _DdlError(f"unknown type {token!r}") from None
