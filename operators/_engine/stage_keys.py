"""A stage's partition key: the operator's to declare.

An operator that relates rows (one group, one join key, one partition of a
top-N) needs them in one partition, so it says by which columns each of its
inputs must be partitioned (:attr:`Operator.partition_keys
<operators.Operator.partition_keys>`). A stage given no ``keys=`` takes
them; a stage given ``keys=`` may take fewer of them (the rows that share
the declared key still share the fewer columns, so they still meet), but
never other columns, nor none when the operator declares some: that would
part rows the operator relates, and its result would be wrong without an
error.
"""

from __future__ import annotations

from collections.abc import Sequence

from operators._api.operator import Operator
from operators.errors import InputError

__all__ = ["check_stage_keys", "stage_keys"]


def stage_keys(
    operator: Operator,
    keys: Sequence[str] | Sequence[Sequence[str]] | None,
    sides: int,
    label: str,
) -> list[list[str]]:
    """One list of key columns per input of a stage running ``operator``:
    ``keys`` as given (a flat list serves every side), else the operator's
    :attr:`~operators.Operator.partition_keys` (checked against the
    operator by :func:`check_stage_keys`, once the columns are known to
    exist)."""
    declared = operator.partition_keys
    if declared is not None and len(declared) != sides:
        raise InputError(
            f"{label}: its operator declares partition keys for {len(declared)} input(s) "
            f"({[list(d) for d in declared]}), but it takes {sides}"
        )
    if keys is None:
        if declared is None:
            raise InputError(
                f"{label}: its operator declares no partition key "
                "(Operator.partition_keys), so give keys=..., or keys=() for a keyless stage"
            )
        return [list(d) for d in declared]
    return _key_lists(keys, sides, label)


def check_stage_keys(operator: Operator, given: list[list[str]], label: str) -> None:
    """Raise :class:`InputError` for ``given`` keys (one list per input)
    that would put rows ``operator`` relates in different partitions:
    unless they are its :attr:`~operators.Operator.partition_keys`, or
    some of them taken at the same positions on every side (rows equal on
    the declared key are then equal on the given one, and meet). None of
    them is only right when the operator declares none (it relates every
    row). An operator that declares nothing takes any keys."""
    if operator.partition_keys is None:
        return
    declared = [list(d) for d in operator.partition_keys]
    wanted = (
        f"partition it by {_shown(declared)} (the default when keys= is left out), or by "
        "some of those columns, the same ones on every side"
    )
    if not given[0]:
        if declared[0]:
            raise InputError(
                f"{label}: keys=() would run it as one partition, but its operator relates "
                f"rows by {_shown(declared)} and keeps its state by them; {wanted}"
            )
        return
    if not declared[0]:
        raise InputError(
            f"{label}: its operator relates every row of its input (it declares no partition "
            f"key), so rows partitioned by {_shown(given)} would not meet; run it as a "
            "keyless stage (leave keys= out, or keys=())"
        )
    positions = [declared[0].index(c) if c in declared[0] else -1 for c in given[0]]
    fits = -1 not in positions and len(set(positions)) == len(positions)
    fits = fits and all(
        [cols[p] for p in positions] == keys for cols, keys in zip(declared, given, strict=True)
    )
    if fits and operator.partition_keys_exact and given != declared:
        raise InputError(
            f"{label}: keys {_shown(given)} are some of {_shown(declared)}, but its operator "
            f"places rows by the whole key itself; partition it by {_shown(declared)} (the "
            "default when keys= is left out)"
        )
    if not fits:
        raise InputError(
            f"{label}: keys {_shown(given)} would put rows its operator relates in different "
            f"partitions, and its result would be wrong; {wanted}"
        )


def _key_lists(
    keys: Sequence[str] | Sequence[Sequence[str]], sides: int, label: str
) -> list[list[str]]:
    """One list of key columns per side (a flat list serves every side); an
    empty list, or one empty list per side, for a keyless stage."""
    if isinstance(keys, str):
        keys = [keys]
    if all(isinstance(k, str) for k in keys):
        lists = [[str(k) for k in keys]] * sides
    else:
        lists = [[str(c) for c in k] for k in keys if not isinstance(k, str)]
    if len(lists) != sides or len({len(k) for k in lists}) != 1:
        raise InputError(
            f"{label}: give its key columns once, or once per input ({sides}), each list "
            f"of one length (keys=() for a keyless stage); got {keys!r}"
        )
    return lists


def _shown(lists: list[list[str]]) -> str:
    """Key lists as a message shows them: one list when every side has it."""
    if all(k == lists[0] for k in lists):
        return repr(lists[0])
    return repr(lists)
