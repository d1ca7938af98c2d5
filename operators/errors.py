"""Errors of the operator layer, rooted at :class:`RelstateError`."""

from __future__ import annotations

from encoding.errors import RelstateError, StateStoreError

__all__ = ["InputError", "RelstateError", "RepartitionedError", "RunnerError", "StateStoreError"]


class InputError(RelstateError, ValueError):
    """An input batch does not fit the operator: a missing or retyped column,
    an unknown row kind, a null key, a changed key type or partition count.
    Raised before anything of the batch is committed."""


class RunnerError(RelstateError, RuntimeError):
    """The Spark runner cannot go on: a missing Java, a checkpoint of another
    query, a batch whose tasks did not all commit."""


class RepartitionedError(InputError):
    """A change feed asked for batches across a ``relstate repartition``: the
    new partitions' first version has no state before it to compare with.
    :attr:`earliest_start` is the first start batch that can be read."""

    def __init__(self, message: str, earliest_start: int) -> None:
        super().__init__(message)
        self.earliest_start = earliest_start
