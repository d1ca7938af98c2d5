"""What a join is: its type, which sides are outer, its keys, and the schema
of its output rows."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from operators.errors import InputError

__all__ = ["LEFT", "RIGHT", "JoinSpec", "JoinType", "output_schema", "side_name"]

#: Input sides: the left input is side 0, the right side 1.
LEFT, RIGHT = 0, 1


class JoinType(enum.StrEnum):
    """An equi-join's type; it says which sides are outer (null-padded when
    they have no match)."""

    INNER = "inner"
    LEFT = "left"
    RIGHT = "right"
    FULL = "full"

    @classmethod
    def parse(cls, join_type: object) -> JoinType:
        """The type a string or enum names, Spark's spellings included
        (``left_outer``, ``fullOuter``, ``outer``)."""
        if isinstance(join_type, JoinType):
            return join_type
        text = str(getattr(join_type, "value", join_type)).lower().replace("_", "")
        text = {"outer": "full", "fullouter": "full"}.get(text, text.removesuffix("outer"))
        try:
            return cls(text)
        except ValueError:
            raise InputError(
                f"join type must be 'inner', 'left', 'right' or 'full'; got {join_type!r}"
            ) from None

    def is_outer(self, side: int) -> bool:
        """Whether rows of ``side`` (0 left, 1 right) are kept, null-padded,
        when nothing of the other side matches them."""
        if side == LEFT:
            return self in (JoinType.LEFT, JoinType.FULL)
        return self in (JoinType.RIGHT, JoinType.FULL)


def side_name(side: int) -> str:
    """``left`` or ``right``: the word for a side in metrics and messages."""
    return "left" if side == LEFT else "right"


@dataclass(frozen=True)
class JoinSpec:
    """An equi-join of two inputs on key columns, checked against their
    schemas: the key columns exist and have equal types pairwise."""

    join_type: JoinType
    inputs: tuple[pa.Schema, pa.Schema]
    keys: tuple[tuple[str, ...], tuple[str, ...]]

    @classmethod
    def of(
        cls,
        join_type: object,
        left: pa.Schema,
        right: pa.Schema,
        left_keys: Sequence[str],
        right_keys: Sequence[str],
    ) -> JoinSpec:
        """Check the keys against the schemas and build the spec."""
        keys = (tuple(left_keys), tuple(right_keys))
        if not keys[0] or len(keys[0]) != len(keys[1]):
            raise InputError(
                f"an equi-join needs one or more key columns per side, as many on each; "
                f"got left_keys={list(keys[0])} and right_keys={list(keys[1])}"
            )
        for side, (schema, names) in enumerate(zip((left, right), keys, strict=True)):
            for name in names:
                if name not in schema.names:
                    raise InputError(
                        f"join key {name!r} is not a column of the {side_name(side)} input; "
                        f"its columns are {schema.names}"
                    )
            if len(set(names)) != len(names):
                raise InputError(f"the {side_name(side)} join keys name a column twice: {names}")
        for a, b in zip(*keys, strict=True):
            if left.field(a).type != right.field(b).type:
                raise InputError(
                    f"join keys {a!r} ({left.field(a).type}) and {b!r} "
                    f"({right.field(b).type}) have different types; cast one of them"
                )
        return cls(JoinType.parse(join_type), (left, right), keys)

    def is_outer(self, side: int) -> bool:
        """Whether ``side`` is an outer side of this join."""
        return self.join_type.is_outer(side)


def output_schema(spec: JoinSpec, left_prefix: str = "", right_prefix: str = "") -> pa.Schema:
    """The join's output row: the left input's columns then the right's, each
    name prefixed; a side's columns are nullable when the *other* side is
    outer (they are null in its padded rows). Raises :class:`InputError` when
    two output columns would share a name."""
    fields: list[pa.Field] = []
    for side, prefix in ((LEFT, left_prefix), (RIGHT, right_prefix)):
        padded = spec.is_outer(1 - side)
        for fld in spec.inputs[side]:
            renamed = fld.with_name(prefix + fld.name)
            fields.append(renamed.with_nullable(True) if padded else renamed)
    names = [f.name for f in fields]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise InputError(
            f"the join's output would have columns {clashes} twice (left columns "
            f"{spec.inputs[LEFT].names} with prefix {left_prefix!r}, right columns "
            f"{spec.inputs[RIGHT].names} with prefix {right_prefix!r}); set left_prefix "
            "or right_prefix so that every output name is distinct"
        )
    return pa.schema(fields)
