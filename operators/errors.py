"""Errors of the operator layer, rooted at :class:`StateStoreError`."""

from __future__ import annotations

from encoding.errors import StateStoreError

__all__ = ["InputError", "RunnerError", "StateStoreError"]


class InputError(StateStoreError, ValueError):
    """An input batch does not fit the operator: a missing or retyped column,
    an unknown row kind, a null key, a changed key type or partition count.
    Raised before anything of the batch is committed."""


class RunnerError(StateStoreError, RuntimeError):
    """The Spark runner cannot go on: a missing Java, a checkpoint of another
    query, a batch whose tasks did not all commit."""
