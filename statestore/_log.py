"""relstate's log events: quiet by default, configured in one place.

Every module gets its logger from :func:`get_logger`. Those loggers do not use
structlog's global configuration (which belongs to the application): they
render through relstate's own processors, which read the current
:class:`LogConfig` at each event, so a configuration made after a logger was
created still applies to it.

The configuration, in order of precedence: :func:`configure_logging` (or
:func:`apply_log_config`), then the ``RELSTATE_LOG`` environment variable
(``info``, ``info,json``, ``debug``, ``json``), then the default: warnings
and errors only, one console line each on stderr. Spark's Python workers do
not share the driver's configuration; the runner pickles
:func:`current_log_config` into its plan and calls :func:`apply_log_config` in
each task.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from statestore.errors import LogConfigError

__all__ = [
    "ENV_VAR",
    "LogConfig",
    "apply_log_config",
    "capture_events",
    "configure_logging",
    "current_log_config",
    "get_logger",
]

#: The environment variable that configures relstate's log events.
ENV_VAR = "RELSTATE_LOG"

LogFormat = Literal["console", "json"]
_FORMATS: dict[str, LogFormat] = {"console": "console", "json": "json"}

#: Level names as ``RELSTATE_LOG`` and :func:`configure_logging` take them.
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

#: The level of each logger method (structlog calls the sink's method of the
#: same name).
_METHOD_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "msg": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


def _level(value: int | str) -> int:
    if isinstance(value, bool):
        raise LogConfigError(f"a log level is a name or a logging level, not {value!r}")
    if isinstance(value, int):
        return value
    try:
        return _LEVELS[value.strip().lower()]
    except KeyError:
        raise LogConfigError(
            f"unknown log level {value!r}: expected one of {', '.join(sorted(_LEVELS))}"
        ) from None


def _format(value: str) -> LogFormat:
    try:
        return _FORMATS[value.strip().lower()]
    except KeyError:
        raise LogConfigError(
            f"unknown log format {value!r}: expected 'console' or 'json'"
        ) from None


@dataclass(frozen=True)
class LogConfig:
    """What relstate logs and how: the least ``level`` of the events shown (a
    ``logging`` level) and their ``format``, ``"console"`` (one readable line)
    or ``"json"`` (one JSON object a line). Picklable, so the driver's setting
    can travel to Spark's Python workers."""

    level: int = logging.WARNING
    format: LogFormat = "console"

    def __post_init__(self) -> None:
        if self.format not in _FORMATS:
            raise LogConfigError(
                f"unknown log format {self.format!r}: expected 'console' or 'json'"
            )
        if isinstance(self.level, bool) or not isinstance(self.level, int):
            raise LogConfigError(f"a log level is a logging level (int), not {self.level!r}")

    @classmethod
    def parse(cls, spec: str) -> LogConfig:
        """The configuration ``RELSTATE_LOG`` spells: comma-separated words, a
        level (``debug``, ``info``, ``warning``, ``error``, ``critical``)
        and/or a format (``console``, ``json``); what is left out keeps its
        default."""
        level, form = cls.level, cls.format
        for word in (w.strip().lower() for w in spec.split(",")):
            if not word:
                continue
            if word in _FORMATS:
                form = _FORMATS[word]
            elif word in _LEVELS:
                level = _LEVELS[word]
            else:
                raise LogConfigError(
                    f"{ENV_VAR}={spec!r}: unknown word {word!r}; expected a level "
                    f"({', '.join(sorted(_LEVELS))}) and/or a format (console, json), "
                    "for example 'info' or 'info,json'"
                )
        return cls(level, form)


#: The configuration set in code (``None``: from the environment).
_configured: LogConfig | None = None
#: The last ``RELSTATE_LOG`` value parsed and its configuration.
_from_env: tuple[str | None, LogConfig] = (None, LogConfig())
#: The event lists of the active :func:`capture_events` blocks, innermost last.
_captures: list[list[dict[str, Any]]] = []


def _env_config() -> LogConfig:
    global _from_env
    spec = os.environ.get(ENV_VAR)
    if spec == _from_env[0]:
        return _from_env[1]
    try:
        config = LogConfig.parse(spec or "")
    except LogConfigError as exc:
        # Logging must not fail a query: keep the default and say so (once
        # per value, as the value is cached before the warning is emitted).
        _from_env = (spec, LogConfig())
        get_logger(__name__).warning("relstate.log_config_invalid", error=str(exc))
        return _from_env[1]
    _from_env = (spec, config)
    return config


def current_log_config() -> LogConfig:
    """The configuration in force: the one set in code, else ``RELSTATE_LOG``'s,
    else the default (warnings and errors, console)."""
    return _configured if _configured is not None else _env_config()


def apply_log_config(config: LogConfig | None) -> None:
    """Make ``config`` the configuration in force (``None``: back to
    ``RELSTATE_LOG`` and the default). A Spark task calls it with the driver's
    :func:`current_log_config`."""
    global _configured
    if config is not None and not isinstance(config, LogConfig):
        raise LogConfigError(f"expected a LogConfig or None, got {type(config).__name__}")
    _configured = config


def configure_logging(
    level: int | str | None = None, format: LogFormat | str | None = None
) -> LogConfig:
    """Show relstate's events from ``level`` on (a name such as ``"info"`` or a
    ``logging`` level) in ``format`` (``"console"`` or ``"json"``); what is
    not given comes from ``RELSTATE_LOG`` or the default. Returns the
    configuration now in force."""
    base = _env_config()
    form = base.format if format is None else _format(format)
    config = LogConfig(base.level if level is None else _level(level), form)
    apply_log_config(config)
    return config


@contextmanager
def capture_events() -> Iterator[list[dict[str, Any]]]:
    """Collect relstate's events (every level, whatever the configuration)
    instead of showing them, for tests: each an event dict with ``event`` and
    ``log_level``, as ``structlog.testing.capture_logs`` gives them."""
    events: list[dict[str, Any]] = []
    _captures.append(events)
    try:
        yield events
    finally:
        _captures.remove(events)


def _route(_: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Capture the event, or drop it when below the configured level."""
    if _captures:
        _captures[-1].append({**event, "log_level": "warning" if method == "warn" else method})
        raise structlog.DropEvent
    if _METHOD_LEVELS.get(method, logging.INFO) < current_log_config().level:
        raise structlog.DropEvent
    return event


_CONSOLE = structlog.dev.ConsoleRenderer(colors=False)
_JSON = structlog.processors.JSONRenderer()


def _render(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    if current_log_config().format == "json":
        return str(
            _JSON(logger, method, structlog.processors.format_exc_info(logger, method, event))
        )
    return _CONSOLE(logger, method, event)


_PROCESSORS: list[structlog.typing.Processor] = [
    _route,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _render,
]


class _StderrLine:
    """Writes each rendered event as a line to the current ``sys.stderr``
    (looked up per event, so redirections and test captures see it)."""

    def msg(self, line: str) -> None:
        stream = sys.stderr
        stream.write(line + "\n")
        stream.flush()

    debug = info = warning = warn = error = exception = critical = fatal = msg


def get_logger(name: str, **bindings: Any) -> structlog.BoundLogger:
    """The logger of module ``name`` (pass ``__name__``), with ``bindings``
    in every event; it follows relstate's configuration, not structlog's."""
    return structlog.BoundLogger(_StderrLine(), _PROCESSORS, {"logger": name, **bindings})
