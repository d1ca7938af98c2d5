"""Errors of the state-store layer, all rooted at :class:`RelstateError`."""

from __future__ import annotations

from encoding.errors import RelstateError, StateStoreError

__all__ = [
    "AmbiguousVersionError",
    "BackendClosedError",
    "BackendError",
    "CheckpointCorruptError",
    "CorruptionError",
    "EpochError",
    "IncompatibleStateError",
    "InconsistencyError",
    "InvalidVersionError",
    "LockHeldError",
    "LogConfigError",
    "RelstateError",
    "StateStoreError",
    "StoreStateError",
    "VersionNotFoundError",
    "WinnerConflictError",
]


class BackendError(RelstateError):
    """The key-value backend failed; the text carries the backend's own message."""


class LockHeldError(BackendError):
    """Another handle (in this process or another) holds the database's lock."""


class CorruptionError(BackendError):
    """The backend found damaged data on disk."""


class BackendClosedError(BackendError):
    """The backend was used after ``close()``."""


class InconsistencyError(RelstateError):
    """An operation contradicts the table's contents: an insert over an existing
    key, a delete or update of a missing key, or an old row that does not match
    what is stored. Raised in strict consistency mode."""

    def __init__(self, message: str, table: str, key: tuple[object, ...]) -> None:
        super().__init__(message)
        self.table = table
        self.key = key


class EpochError(RelstateError, ValueError):
    """A commit named an epoch that is not above the last committed one."""


class CheckpointCorruptError(CorruptionError):
    """A checkpoint file is missing, truncated or altered: its size or checksum
    differs from what the manifest that names it records, or it does not parse.

    ``path`` is the file (as the checkpoint filesystem spells it) and ``version``
    the version whose load or commit needed it.
    """

    def __init__(self, message: str, path: str, version: int | None) -> None:
        super().__init__(message)
        self.path = path
        self.version = version


class InvalidVersionError(RelstateError, ValueError):
    """A version that cannot be one: a version is a micro-batch id, an integer
    >= 0 (Spark's ``CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION``). ``version``
    is what was given. A well-formed version that was never committed raises
    :class:`VersionNotFoundError` instead."""

    def __init__(self, message: str, version: object) -> None:
        super().__init__(message)
        self.version = version


class VersionNotFoundError(RelstateError, KeyError):
    """No committed version with that number (and commit id) is in the
    checkpoint: it was never committed, or retention removed it."""

    def __init__(self, message: str, version: int, commit_id: str | None = None) -> None:
        super().__init__(message)
        self.version = version
        self.commit_id = commit_id

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class AmbiguousVersionError(RelstateError, LookupError):
    """Several commits of one version exist (a retried or speculative attempt)
    and nothing says which counts: name one with ``commit_id`` or
    :meth:`~statestore.StateStore.record_winner`."""

    def __init__(self, message: str, version: int, commit_ids: tuple[str, ...]) -> None:
        super().__init__(message)
        self.version = version
        self.commit_ids = commit_ids


class WinnerConflictError(RelstateError, ValueError):
    """A version's winning commit was already recorded as another commit."""


class IncompatibleStateError(RelstateError, ValueError):
    """The checkpoint was written with metadata this store cannot continue from:
    another partition count, a changed key, a removed or retyped column."""


class StoreStateError(RelstateError, RuntimeError):
    """A state store call came at the wrong moment: before :meth:`load`, after
    :meth:`close`, or after a failed commit that was neither aborted nor
    followed by a load."""


class LogConfigError(RelstateError, ValueError):
    """A log configuration relstate does not know: an unknown level or format
    given to ``configure_logging`` or spelled in ``RELSTATE_LOG``."""
