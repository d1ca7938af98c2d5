"""What the generated encoders of the row and cell layouts share.

:class:`RowCodec` and :class:`CellCodec` compile an encoder per schema, the way
:mod:`dataclasses` and ``attrs`` generate methods: straight-line source with
one variable per column and no loop. Anything unusual (a None where it may not
be, a value of an odd type, one out of range) leaves that code for
:func:`diagnose`, which checks the row column by column and says what is wrong.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

from encoding._value_columns import NAN, ColumnPlan, value_repr
from encoding.errors import EncodingError

__all__ = ["compile_encoder", "compile_function", "diagnose", "namespace", "normalise", "validate"]


def validate(table: str, columns: Sequence[ColumnPlan], row: Sequence[Any]) -> None:
    """Raise EncodingError if ``row`` does not fit ``columns``."""
    if len(row) != len(columns):
        raise arity_error(table, columns, row)
    for col, value in zip(columns, row, strict=True):
        if value is None:
            if not col.nullable:
                raise not_null_error(col)
        else:
            col.check(value)


def diagnose(table: str, columns: Sequence[ColumnPlan], row: Sequence[Any]) -> EncodingError:
    """The error for a row that a compiled encoder gave up on."""
    try:
        validate(table, columns, row)
    except EncodingError as exc:
        return exc
    return EncodingError(f"a row of table {table!r} does not fit: {value_repr.repr(row)}")


def arity_error(table: str, columns: Sequence[ColumnPlan], row: Sequence[Any]) -> EncodingError:
    names = ", ".join(c.name for c in columns)
    return EncodingError(
        f"a row of table {table!r} has {len(columns)} values ({names}); got {len(row)}: "
        f"{value_repr.repr(row)}"
    )


def not_null_error(col: ColumnPlan) -> EncodingError:
    return EncodingError(f"{col.describe()} is not nullable; got None")


def namespace(table: str, columns: Sequence[ColumnPlan]) -> dict[str, Any]:
    """Globals for a compiled encoder of rows of ``columns``."""
    ns: dict[str, Any] = {
        "struct": struct,
        "NAN": NAN,
        "arity": lambda row: arity_error(table, columns, row),
        "diagnose": lambda row: diagnose(table, columns, row),
    }
    for col in columns:
        ns[f"ck{col.index}"] = col.check
        ns[f"nn{col.index}"] = functools.partial(not_null_error, col)
    return ns


def normalise(col: ColumnPlan, ns: dict[str, Any]) -> list[str]:
    """Source lines that turn a non-None value ``c{i}`` into its stored form, or
    call the column's check (which raises) when it is not the common type.

    Integer ranges are left to struct.pack, which raises struct.error; bools pass
    struct's integer codes, so they are caught here.
    """
    c, ck = f"c{col.index}", f"ck{col.index}"
    if col.kind == "int":
        return [f"if {c} is True or {c} is False: {c} = {ck}({c})"]
    if col.kind == "float":
        return [f"if {c}.__class__ is not float: {c} = {ck}({c})", f"elif {c} != {c}: {c} = NAN"]
    if col.kind == "bool":
        return [f"if {c} is not True and {c} is not False: {c} = {ck}({c})"]
    if col.kind == "str":
        return [f"if {c}.__class__ is str: {c} = {c}.encode()", f"else: {c} = {ck}({c})"]
    if col.kind == "bin":
        return [f"if {c}.__class__ is not bytes: {c} = {ck}({c})"]
    return [f"{c} = {ck}({c})"]


def compile_encoder(columns: Sequence[ColumnPlan], body: list[str], ns: dict[str, Any]) -> Any:
    """The function ``encode(row)``: it unpacks a row of ``columns`` into ``c0``,
    ``c1``, ... and runs ``body`` (lines indented for its ``try`` block, with
    globals ``ns`` from :func:`namespace`). What ``body`` leaves to struct or
    ``str.encode`` to refuse becomes the error that :func:`diagnose` finds."""
    lines = [
        "def encode(row):",
        f"    if len(row) != {len(columns)}:",
        "        raise arity(row)",
        f"    {', '.join(f'c{c.index}' for c in columns)}, = row",
        "    try:",
        *body,
        "    except (struct.error, OverflowError, UnicodeError):",
        "        pass",
        "    raise diagnose(row)",
    ]
    return compile_function("encode", lines, ns)


def compile_function(name: str, lines: list[str], ns: dict[str, Any]) -> Any:
    """The function ``name`` that the source ``lines`` define, with globals ``ns``."""
    exec(compile("\n".join(lines), f"<relstate {name}>", "exec"), ns)
    return ns[name]
