"""When state expires: the one boundary every operator uses.

Flink's state TTL (``TtlUtils.expired``: ``t + d <= now``): a row written or
last updated at processing time ``t`` with a TTL of ``d`` ms is visible while
``now < t + d``, and gone from ``now >= t + d`` on. The same boundary serves
state that the watermark expires (Spark's ``dropDuplicates`` and
``dropDuplicatesWithinWatermark`` evict an entry once the watermark reaches
its time): an entry that expires at ``e`` is live while the clock is below
``e``. ``StreamingJoin``'s side TTLs, ``Deduplicate``'s state TTL and the
dedup operators' watermark eviction all decide here.
"""

from __future__ import annotations

__all__ = ["expired", "expiry_time", "live_from"]


def expiry_time(written: int, ttl: int) -> int:
    """When a row written at ``written`` with a time to live of ``ttl``
    expires (same unit for both)."""
    return written + ttl


def live_from(now: int) -> int:
    """The earliest expiry time still live at ``now``: entries expiring before
    it are gone, so it is the exclusive end of an index range of expired
    entries."""
    return now + 1


def expired(expires_at: int, now: int) -> bool:
    """Whether an entry that expires at ``expires_at`` is gone at ``now``:
    ``expires_at < live_from(now)``, written out (it runs per row read)."""
    return expires_at <= now
