"""The error hierarchy shared by every relstate layer.

Every error relstate raises derives from :class:`StateStoreError`, so a caller can
catch them all; each also derives from the built-in it resembles (a bad schema is
also a ``ValueError``), so code that expects the built-in keeps working.
"""

from __future__ import annotations

__all__ = [
    "DecodingError",
    "EncodingError",
    "SchemaError",
    "StateStoreError",
]


class StateStoreError(Exception):
    """Root of every error raised by relstate."""


class SchemaError(StateStoreError, ValueError):
    """A table schema is invalid: unknown column, unsupported type, empty key."""


class EncodingError(StateStoreError, ValueError):
    """A row or key does not fit its schema: wrong arity, wrong type, null in a
    non-nullable column."""


class DecodingError(StateStoreError, ValueError):
    """Stored bytes cannot be decoded: truncated, corrupt, or an unknown format
    version."""
