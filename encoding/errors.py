"""The error hierarchy shared by every relstate layer.

Every error relstate raises derives from :class:`RelstateError`, so a caller
can catch them all (``StateStoreError`` is its earlier name, kept as an
alias); each also derives from the built-in it resembles (a bad schema is
also a ``ValueError``), so code that expects the built-in keeps working.
"""

from __future__ import annotations

__all__ = [
    "DecodingError",
    "EncodingError",
    "RelstateError",
    "SchemaError",
    "StateStoreError",
]


class RelstateError(Exception):
    """Root of every error raised by relstate, of every layer."""


#: The root's earlier name: code that catches it keeps catching every error.
StateStoreError = RelstateError


class SchemaError(RelstateError, ValueError):
    """A table schema is invalid: unknown column, unsupported type, empty key."""


class EncodingError(RelstateError, ValueError):
    """A row or key does not fit its schema: wrong arity, wrong type, null in a
    non-nullable column."""


class DecodingError(RelstateError, ValueError):
    """Stored bytes cannot be decoded: truncated, corrupt, or an unknown format
    version."""
