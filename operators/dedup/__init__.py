"""Deduplication operators: Flink's keep-first / keep-last (processing or row
time, changelog input, state TTL, mini-batch) and Spark's ``dropDuplicates``
and ``dropDuplicatesWithinWatermark``. docs/operators/dedup.md has the rules."""

from operators.dedup._deduplicate import Deduplicate
from operators.dedup._drop_duplicates import DropDuplicates, DropDuplicatesWithinWatermark

__all__ = ["Deduplicate", "DropDuplicates", "DropDuplicatesWithinWatermark"]
