"""A source's watermark as a value: its event-time column and delay. The
rule that turns event times into watermarks is the engine's
(:mod:`operators._engine.watermark`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Watermark"]


@dataclass(frozen=True)
class Watermark:
    """A source's event-time column and how late its rows may be (ms)."""

    column: str
    delay_ms: int
