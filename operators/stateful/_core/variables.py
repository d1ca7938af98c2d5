"""The state variables a processor declares, and the state tables they are.

A processor's ``init`` declares its variables through the handle; relstate
calls it once with a :class:`RecordingHandle` when the operator is built, so
that its tables are known before the query starts and a declaration relstate
cannot hold is an :class:`~operators.errors.InputError` then, naming the
variable and the call, never a failure inside a batch.

The tables of a variable ``n`` (``G`` the grouping key columns):

=========== ============================================== ======================
variable    table ``n``: columns (primary key first)        with a TTL
=========== ============================================== ======================
value       ``G``, value fields                             ``$expires_at`` column
list        ``G``, ``$position``, value fields              ``$expires_at`` column
map         ``G``, user key fields, value fields            ``$expires_at`` column
=========== ============================================== ======================

With a TTL, table ``n$ttl`` indexes the entries by ``($expires_at, G, ...)``
so that expiry costs what it removes. Processing-time and event-time timers
live in relstate's timers table; table ``$timers`` (``G``, ``$expiry``) finds
a key's timers for ``listTimers``. Table ids come from the table's name, so a
variable keeps its tables when others are added or removed.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from encoding import EncodingError, RowCodec, SchemaError, TableSchema
from operators.errors import InputError
from operators.stateful._core.types import arrow_schema

__all__ = [
    "EXPIRES_AT",
    "POSITION",
    "TIMERS_BY_KEY",
    "RecordingHandle",
    "StateVariable",
    "declare",
]

EXPIRES_AT = "$expires_at"
POSITION = "$position"
EXPIRY = "$expiry"
TIMERS_BY_KEY = "$timers"
_TTL_SUFFIX = "$ttl"
_KINDS = {"value": "getValueState", "list": "getListState", "map": "getMapState"}


def _table_id(name: str) -> int:
    """A stable id for the table named ``name``, below relstate's own ids."""
    return 1 + zlib.crc32(name.encode()) % 0xFFFE_FFFF


def _encodable(fields: Sequence[pa.Field], what: str) -> None:
    """Raise unless every field is a type a state table holds."""
    for f in fields:
        try:
            RowCodec(TableSchema(1, [pa.field("$", pa.int8()), f], ["$"]))
        except (EncodingError, SchemaError):
            raise InputError(
                f"{what}: field {f.name!r} has type {f.type}; relstate's state tables hold "
                "scalar columns (numbers, strings, binary, bool, date, timestamp, decimal), "
                "not arrays, maps or structs: flatten it into fields of their own"
            ) from None


@dataclass(frozen=True)
class StateVariable:
    """One declared state variable: its kind, schemas and TTL."""

    name: str
    kind: str
    value: pa.Schema
    user_key: pa.Schema | None = None
    ttl_ms: int | None = None
    #: The stored field names of the user key and value (renamed where a
    #: name is taken by a grouping column or the other part).
    stored_user_key: tuple[str, ...] = field(default=(), compare=False)
    stored_value: tuple[str, ...] = field(default=(), compare=False)

    @property
    def call(self) -> str:
        return _KINDS[self.kind]

    @property
    def ttl_table(self) -> str:
        return self.name + _TTL_SUFFIX

    def tables(self, grouping: Sequence[pa.Field]) -> list[TableSchema]:
        """This variable's state tables for grouping key columns ``grouping``."""
        keys = [f.name for f in grouping]
        middle: list[pa.Field] = []
        if self.kind == "list":
            middle = [pa.field(POSITION, pa.int64(), nullable=False)]
        elif self.kind == "map":
            assert self.user_key is not None
            middle = [
                f.with_name(n) for f, n in zip(self.user_key, self.stored_user_key, strict=True)
            ]
        values = [f.with_name(n) for f, n in zip(self.value, self.stored_value, strict=True)]
        primary = [*keys, *(f.name for f in middle)]
        # Nullable in the variable's table: a TTL added to a variable that
        # has rows adds the column at the end, and its old rows (null) never
        # expire until they are written again.
        expiry = [pa.field(EXPIRES_AT, pa.int64(), nullable=False)] if self.ttl_ms else []
        expires = [pa.field(EXPIRES_AT, pa.int64())] if self.ttl_ms else []
        tables = [
            TableSchema(
                _table_id(self.name),
                [*grouping, *middle, *values, *expires],
                primary,
                name=self.name,
            )
        ]
        if self.ttl_ms:
            tables.append(
                TableSchema(
                    _table_id(self.ttl_table),
                    [*expiry, *grouping, *middle],
                    [EXPIRES_AT, *primary],
                    name=self.ttl_table,
                    partition_by=keys,
                    auxiliary=True,
                )
            )
        return tables


def timers_table(grouping: Sequence[pa.Field]) -> TableSchema:
    """The table that finds a grouping key's timers."""
    keys = [f.name for f in grouping]
    return TableSchema(
        _table_id(TIMERS_BY_KEY),
        [*grouping, pa.field(EXPIRY, pa.int64(), nullable=False)],
        [*keys, EXPIRY],
        name=TIMERS_BY_KEY,
        auxiliary=True,
    )


def _stored_names(fields: pa.Schema, taken: set[str], role: str) -> tuple[str, ...]:
    names = []
    for f in fields:
        name = f.name if f.name not in taken else f"{role}.{f.name}"
        if name in taken or name.startswith("$"):
            name = f"{role}.{f.name}"
        taken.add(name)
        names.append(name)
    return tuple(names)


class RecordingHandle:
    """The handle ``init`` gets when the operator is built: it records the
    declared variables and ``deleteIfExists`` calls, and refuses what relstate
    cannot hold, with the call and the variable named. Its state objects
    refuse to be used: state is read and written in a batch only."""

    def __init__(self, grouping: Sequence[pa.Field], time_mode: str) -> None:
        self.grouping = list(grouping)
        self.time_mode = time_mode
        self.variables: dict[str, StateVariable] = {}
        self.deleted: list[str] = []

    def _declare(
        self,
        kind: str,
        name: Any,
        schema: Any,
        ttl: Any,
        user_key: Any = None,
    ) -> _Declared:
        call = _KINDS[kind]
        if not isinstance(name, str) or not name:
            raise InputError(f"{call}: a state variable's name is a non-empty string, got {name!r}")
        what = f"state variable {name!r} ({call})"
        if name.startswith("$") or name.endswith(_TTL_SUFFIX) or name.startswith("__"):
            raise InputError(
                f"{what}: names that start with '$' or '__' or end with '$ttl' are "
                "relstate's own; rename the variable"
            )
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0):
            raise InputError(
                f"{what}: ttlDurationMs is a positive number of milliseconds or None, got {ttl!r}"
            )
        value = arrow_schema(schema, what)
        _encodable(list(value), what)
        key_schema = None
        if user_key is not None:
            key_schema = arrow_schema(user_key, what + " user key")
            _encodable(list(key_schema), what + " user key")
        taken = {f.name for f in self.grouping}
        stored_key = () if key_schema is None else _stored_names(key_schema, taken, "user_key")
        stored_value = _stored_names(value, taken, "value")
        variable = StateVariable(name, kind, value, key_schema, ttl, stored_key, stored_value)
        old = self.variables.get(name)
        if old is not None and old != variable:
            raise InputError(
                f"{what}: declared twice in init, first as {old.call} with another schema "
                "or TTL; a name declares one variable"
            )
        self.variables[name] = variable
        return _Declared(name)

    def getValueState(self, stateName: Any, schema: Any, ttlDurationMs: Any = None) -> _Declared:
        return self._declare("value", stateName, schema, ttlDurationMs)

    def getListState(self, stateName: Any, schema: Any, ttlDurationMs: Any = None) -> _Declared:
        return self._declare("list", stateName, schema, ttlDurationMs)

    def getMapState(
        self, stateName: Any, userKeySchema: Any, valueSchema: Any, ttlDurationMs: Any = None
    ) -> _Declared:
        return self._declare("map", stateName, valueSchema, ttlDurationMs, userKeySchema)

    def deleteIfExists(self, stateName: str) -> None:
        self.deleted.append(stateName)
        self.variables.pop(stateName, None)

    def _no_timers(self, call: str) -> Any:
        raise InputError(
            f"{call} in init: timers are registered for a grouping key, in "
            "handleInputRows, handleExpiredTimer or handleInitialState (as in Spark)"
        )

    def registerTimer(self, expiryTimestampMs: int) -> None:
        self._no_timers("registerTimer")

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        self._no_timers("deleteTimer")

    def listTimers(self) -> Any:
        return self._no_timers("listTimers")


class _Declared:
    """What the recording handle returns: a variable that may not be used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, call: str) -> Any:
        if call.startswith("__"):
            raise AttributeError(call)
        raise InputError(
            f"state variable {self._name!r}: {call} called in init; state is read and "
            "written in handleInputRows, handleExpiredTimer and handleInitialState"
        )


def declare(processor: Any, grouping: Sequence[pa.Field], time_mode: str) -> RecordingHandle:
    """Run ``processor.init`` (then ``close``, as Spark's driver does) on a
    recording handle and return it."""
    handle = RecordingHandle(grouping, time_mode)
    processor.init(handle)
    processor.close()
    return handle
