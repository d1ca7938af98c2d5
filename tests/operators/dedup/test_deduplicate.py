"""Flink's deduplication through the harness: the issue's exact cases, seed
002's rules per case, row time, changelog input and state TTL, on both
backends."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from operators import InputError, RowKind
from operators.dedup import Deduplicate
from operators.testing import OperatorHarness

INS, UB, UA, D = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])
TIMED = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("t", pa.int64())])


@pytest.fixture(params=["memory", "rocksdb"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each test runs on the in-memory backend and on RocksDB."""
    return str(request.param)


def harness(operator: Deduplicate, backend: str) -> OperatorHarness:
    return OperatorHarness(operator, backend=backend, consistency="strict")


def feed(h: OperatorHarness, rows: list[tuple[Any, ...]]) -> list[tuple[RowKind, Any]]:
    out = []
    for row in rows:
        out += h.process_element(row)
    return out


class TestIssueCases:
    """The issue's three keep-last cases, exactly (TTL on)."""

    @pytest.mark.parametrize("mini_batch", [False, True])
    def test_insert_on_update_before_off(self, backend: str, mini_batch: bool) -> None:
        """(1,12), (2,11), (1,13) -> +I(1,12), +I(2,11), +U(1,13)."""
        op = Deduplicate(KV, ["k"], state_ttl_ms=60_000, mini_batch=mini_batch)
        with harness(op, backend) as h:
            assert feed(h, [(1, 12), (2, 11), (1, 13)]) == [
                (INS, (1, 12)),
                (INS, (2, 11)),
                (UA, (1, 13)),
            ]

    @pytest.mark.parametrize("mini_batch", [False, True])
    def test_both_flags_off(self, backend: str, mini_batch: bool) -> None:
        """(1,12), (2,11), (1,13) -> +U(1,12), +U(2,11), +U(1,13)."""
        op = Deduplicate(
            KV, ["k"], generate_insert=False, state_ttl_ms=60_000, mini_batch=mini_batch
        )
        with harness(op, backend) as h:
            assert feed(h, [(1, 12), (2, 11), (1, 13)]) == [
                (UA, (1, 12)),
                (UA, (2, 11)),
                (UA, (1, 13)),
            ]

    @pytest.mark.parametrize("mini_batch", [False, True])
    def test_both_flags_on(self, backend: str, mini_batch: bool) -> None:
        """(1,12), (2,11), (1,12) -> +I(1,12), +I(2,11), -U(1,12), +U(1,12)."""
        op = Deduplicate(
            KV, ["k"], generate_update_before=True, state_ttl_ms=60_000, mini_batch=mini_batch
        )
        with harness(op, backend) as h:
            assert feed(h, [(1, 12), (2, 11), (1, 12)]) == [
                (INS, (1, 12)),
                (INS, (2, 11)),
                (UB, (1, 12)),
                (UA, (1, 12)),
            ]


class TestProcTime:
    """Seed 002 on processing time: processFirstRowOnProcTime and
    processLastRowOnProcTime."""

    def test_keep_first_emits_first_row_only(self, backend: str) -> None:
        """Keep-first emits each key's first row as +I and drops the rest,
        counting them."""
        with harness(Deduplicate(KV, ["k"], keep="first"), backend) as h:
            out = feed(h, [(1, 12), (2, 11), (1, 13), (2, 11)])
            assert out == [(INS, (1, 12)), (INS, (2, 11))]
            h.commit()
            assert h.last_metrics["numDroppedDuplicateRows"] == 2
            assert h.last_metrics["numTotalStateRows"] == 2

    def test_keep_first_stores_only_the_key(self, backend: str) -> None:
        """Keep-first on processing time keeps only the key in state, as
        Flink keeps a flag."""
        with harness(Deduplicate(KV, ["k"], keep="first"), backend) as h:
            feed(h, [(1, 12)])
            assert list(h.table("rows").scan()) == [(1,)]

    def test_identical_row_without_ttl_emits_nothing(self, backend: str) -> None:
        """Keep-last, both flags on, TTL off: an identical row emits nothing;
        a changed one emits -U old, +U new."""
        op = Deduplicate(KV, ["k"], generate_update_before=True)
        with harness(op, backend) as h:
            assert feed(h, [(1, 12), (2, 11), (1, 12)]) == [(INS, (1, 12)), (INS, (2, 11))]
            assert feed(h, [(1, 13)]) == [(UB, (1, 12)), (UA, (1, 13))]

    def test_update_before_only_still_inserts_first(self, backend: str) -> None:
        """With update-before on and insert off, the first row is still +I
        (either flag needs state)."""
        op = Deduplicate(KV, ["k"], generate_update_before=True, generate_insert=False)
        with harness(op, backend) as h:
            assert feed(h, [(1, 12), (1, 13)]) == [(INS, (1, 12)), (UB, (1, 12)), (UA, (1, 13))]

    def test_both_flags_off_keeps_no_state(self, backend: str) -> None:
        """Keep-last with both flags off declares no table at all."""
        assert Deduplicate(KV, ["k"], generate_insert=False).tables == []

    @pytest.mark.parametrize("keep", ["first", "last"])
    def test_insert_only_rejects_retractions_before_state(self, backend: str, keep: str) -> None:
        """An insert-only deduplication refuses -U/-D with an InputError and
        leaves state untouched."""
        with harness(Deduplicate(KV, ["k"], keep=keep), backend) as h:
            feed(h, [(1, 12)])
            with pytest.raises(InputError, match="insert-only"):
                h.process_rows([(2, 1), (1, 12)], [INS, D])
            assert list(h.table("rows").scan()) == ([(1,)] if keep == "first" else [(1, 12)])


class TestChangelog:
    """Seed 002's processLastRowOnChangelog, record at a time."""

    def op(self, **kw: Any) -> Deduplicate:
        return Deduplicate(KV, ["k"], changelog=True, mini_batch=False, **kw)

    def test_accumulate_then_delete_of_key_only(self, backend: str) -> None:
        """+I then +U are +I then -U/+U; a -D carrying only the key emits -D of
        the stored full row and clears the key."""
        with harness(self.op(generate_update_before=True), backend) as h:
            out = h.process_rows([(1, 12), (1, 13), (1, None)], [INS, UA, D])
            assert out == [(INS, (1, 12)), (UB, (1, 12)), (UA, (1, 13)), (D, (1, 13))]
            assert list(h.table("rows").scan()) == []

    def test_update_before_input_deletes(self, backend: str) -> None:
        """-U input is a delete too: -D of the stored row; a later +U of the
        key is then +I."""
        with harness(self.op(), backend) as h:
            out = h.process_rows([(1, 12), (1, 12), (1, 14)], [INS, UB, UA])
            assert out == [(INS, (1, 12)), (D, (1, 12)), (INS, (1, 14))]

    def test_retraction_of_unknown_key_emits_nothing(self, backend: str) -> None:
        """A retraction of a key with no state emits nothing."""
        with harness(self.op(), backend) as h:
            assert h.process_rows([(7, None), (7, 1)], [D, UB]) == []

    def test_stored_row_normalised_to_insert(self, backend: str) -> None:
        """A +U first row is emitted and stored as an insert."""
        with harness(self.op(), backend) as h:
            assert h.process_rows([(1, 5)], [UA]) == [(INS, (1, 5))]
            assert list(h.table("rows").scan()) == [(1, 5)]

    @pytest.mark.parametrize(
        ("ttl", "expected"), [(None, []), (60_000, [(UB, (1, 5)), (UA, (1, 5))])]
    )
    def test_identical_row_depends_on_ttl(
        self, backend: str, ttl: int | None, expected: list[Any]
    ) -> None:
        """An identical accumulate emits nothing with TTL off and -U/+U with
        TTL on."""
        with harness(self.op(generate_update_before=True, state_ttl_ms=ttl), backend) as h:
            h.process_rows([(1, 5)], [INS])
            assert h.process_rows([(1, 5)], [UA]) == expected


class TestChangelogMiniBatch:
    """processLastRowOnChangelog with the mini-batch fold: the exact output."""

    def test_exact_output(self, backend: str) -> None:
        """Per key the fold keeps the last row, and the last accumulate before
        a last retraction; keys come out in order of first arrival, and a
        retraction of a key with no row emits nothing."""
        op = Deduplicate(KV, ["k"], changelog=True, generate_update_before=True)
        with harness(op, backend) as h:
            out = h.process_rows(
                [(1, 12), (2, 5), (1, 13), (1, None), (3, 1)], [INS, INS, UA, D, INS]
            )
            assert out == [(INS, (1, 13)), (D, (1, 13)), (INS, (2, 5)), (INS, (3, 1))]
            h.commit()
            out = h.process_rows([(2, 5), (2, 6), (9, None), (3, 1)], [UB, UA, D, D])
            assert out == [(UB, (2, 5)), (UA, (2, 6)), (D, (3, 1))]
            h.commit()
            assert list(h.table("rows").scan()) == [(2, 6)]
            assert h.last_metrics["numRetractionsOfUnknownRows"] == 1


class TestRowTime:
    """Seed 002's deduplicateOnRowTime: keep-last on >=, keep-first on <."""

    def test_keep_last_replaces_on_equal_or_later_time(self, backend: str) -> None:
        """Keep-last: a row at an equal or later time replaces the stored one;
        an earlier one is dropped."""
        op = Deduplicate(TIMED, ["k"], order_by="t", generate_update_before=True)
        with harness(op, backend) as h:
            assert feed(h, [(1, 1, 10)]) == [(INS, (1, 1, 10))]
            assert feed(h, [(1, 2, 9)]) == []
            assert feed(h, [(1, 3, 10)]) == [(UB, (1, 1, 10)), (UA, (1, 3, 10))]
            assert feed(h, [(1, 4, 11)]) == [(UB, (1, 3, 10)), (UA, (1, 4, 11))]

    def test_keep_first_replaces_only_on_earlier_time(self, backend: str) -> None:
        """Keep-first: only a strictly earlier row replaces the stored one."""
        op = Deduplicate(TIMED, ["k"], keep="first", order_by="t")
        with harness(op, backend) as h:
            assert feed(h, [(1, 1, 10)]) == [(INS, (1, 1, 10))]
            assert feed(h, [(1, 2, 10), (1, 3, 11)]) == []
            assert feed(h, [(1, 4, 9)]) == [(UA, (1, 4, 9))]

    def test_flags_off_emit_update_after_only(self, backend: str) -> None:
        """Row time with both flags off emits +U for every kept row, the
        first one included."""
        op = Deduplicate(TIMED, ["k"], order_by="t", generate_insert=False)
        with harness(op, backend) as h:
            assert feed(h, [(1, 1, 10), (1, 2, 11)]) == [(UA, (1, 1, 10)), (UA, (1, 2, 11))]

    def test_mini_batch_keeps_the_rule_winner(self, backend: str) -> None:
        """In one mini-batch keep-last keeps the latest time (the later arrival
        on ties), keep-first the earliest (the earlier arrival on ties)."""
        rows = [(1, 1, 10), (1, 2, 12), (1, 3, 12), (1, 4, 8), (1, 5, 8)]
        with harness(Deduplicate(TIMED, ["k"], order_by="t"), backend) as h:
            assert h.process_rows(rows) == [(INS, (1, 3, 12))]
        with harness(Deduplicate(TIMED, ["k"], keep="first", order_by="t"), backend) as h:
            assert h.process_rows(rows) == [(INS, (1, 4, 8))]

    @pytest.mark.parametrize("kind", [UB, D])
    def test_retractions_are_refused_before_state(self, backend: str, kind: RowKind) -> None:
        """Row time takes an insert-only input: a -U or -D is an InputError and
        the batch leaves state as it was."""
        op = Deduplicate(TIMED, ["k"], order_by="t")
        with harness(op, backend) as h:
            feed(h, [(1, 1, 10)])
            with pytest.raises(InputError, match="insert-only"):
                h.process_rows([(2, 1, 10), (1, 1, 10)], [INS, kind])
            assert list(h.table("rows").scan()) == [(1, 1, 10)]

    def test_null_row_time_is_refused(self, backend: str) -> None:
        """A row without a row time gets an InputError."""
        with (
            harness(Deduplicate(TIMED, ["k"], order_by="t"), backend) as h,
            pytest.raises(InputError, match="nulls"),
        ):
            h.process_element((1, 1, None))


@pytest.mark.parametrize("mini_batch", [False, True])
class TestNullKeys:
    """A null key is one key like any other value (Flink's keyed state and
    Spark's dropDuplicates group nulls together)."""

    def test_keep_first_deduplicates_null_keys(self, backend: str, mini_batch: bool) -> None:
        """Rows whose key is null are duplicates of the first one, in its
        batch and after a commit."""
        with harness(Deduplicate(KV, ["k"], keep="first", mini_batch=mini_batch), backend) as h:
            assert h.process_rows([(None, 1), (None, 2), (1, 3)]) == [
                (INS, (None, 1)),
                (INS, (1, 3)),
            ]
            h.commit()
            assert h.process_rows([(None, 4)]) == []
            assert list(h.table("rows").scan()) == [(None,), (1,)]

    def test_changelog_retracts_the_null_key(self, backend: str, mini_batch: bool) -> None:
        """On a changelog a null key is updated and deleted as any key."""
        op = Deduplicate(KV, ["k"], changelog=True, mini_batch=mini_batch)
        with harness(op, backend) as h:
            assert h.process_rows([(None, 1)], [INS]) == [(INS, (None, 1))]
            h.commit()
            assert h.process_rows([(None, 2)], [UA]) == [(UA, (None, 2))]
            h.commit()
            assert h.process_rows([(None, 2)], [D]) == [(D, (None, 2))]
            assert list(h.table("rows").scan()) == []


class TestStateTtl:
    """State TTL in processing time."""

    def test_expired_key_behaves_as_new(self, backend: str) -> None:
        """Once its TTL has passed since its last write, a key's next row is
        a first row again."""
        with harness(Deduplicate(KV, ["k"], keep="first", state_ttl_ms=100), backend) as h:
            h.set_processing_time(1_000)
            assert feed(h, [(1, 1)]) == [(INS, (1, 1))]
            h.set_processing_time(1_099)
            assert feed(h, [(1, 2)]) == []
            h.set_processing_time(1_100)
            assert feed(h, [(1, 3)]) == [(INS, (1, 3))]

    @pytest.mark.parametrize("mini_batch", [False, True])
    def test_keep_last_boundary(self, backend: str, mini_batch: bool) -> None:
        """Flink's boundary for keep-last: a key written at t is still held at
        t + ttl - 1 (-U/+U, which rewrites it at that time) and gone at that
        write's time + ttl (+I)."""
        op = Deduplicate(
            KV, ["k"], generate_update_before=True, state_ttl_ms=100, mini_batch=mini_batch
        )
        with harness(op, backend) as h:
            h.set_processing_time(1_000)
            assert feed(h, [(1, 1)]) == [(INS, (1, 1))]
            h.set_processing_time(1_099)
            assert feed(h, [(1, 2)]) == [(UB, (1, 1)), (UA, (1, 2))]
            h.set_processing_time(1_199)
            assert feed(h, [(1, 3)]) == [(INS, (1, 3))]

    def test_state_leaves_at_exactly_its_expiry(self, backend: str) -> None:
        """The expiry index deletes a key written at t in the batch at t + ttl,
        not in the one at t + ttl - 1."""
        with harness(Deduplicate(KV, ["k"], keep="first", state_ttl_ms=100), backend) as h:
            h.set_processing_time(1_000)
            feed(h, [(1, 1)])
            h.commit()
            h.set_processing_time(1_099)
            h.commit()
            assert list(h.table("rows").scan()) == [(1, 1_100)]
            h.set_processing_time(1_100)
            h.commit()
            assert list(h.table("rows").scan()) == []
            assert list(h.table("expiry").scan()) == []

    def test_write_refreshes_ttl(self, backend: str) -> None:
        """Keep-last rewrites the key on each row, which restarts its TTL."""
        op = Deduplicate(KV, ["k"], generate_update_before=True, state_ttl_ms=100)
        with harness(op, backend) as h:
            h.set_processing_time(0)
            feed(h, [(1, 1)])
            h.set_processing_time(90)
            assert feed(h, [(1, 2)]) == [(UB, (1, 1)), (UA, (1, 2))]
            h.set_processing_time(150)
            assert feed(h, [(1, 3)]) == [(UB, (1, 2)), (UA, (1, 3))]

    @pytest.mark.parametrize("mini_batch", [False, True])
    def test_keep_last_after_expiry_is_an_insert(self, backend: str, mini_batch: bool) -> None:
        """docs/operators/dedup.md, State TTL: keep-last rewrites (and so
        refreshes) a key at each row; once expired, the key's next row is +I,
        not -U/+U of a row state no longer holds."""
        op = Deduplicate(
            KV, ["k"], generate_update_before=True, state_ttl_ms=100, mini_batch=mini_batch
        )
        with harness(op, backend) as h:
            h.set_processing_time(0)
            assert feed(h, [(1, 1)]) == [(INS, (1, 1))]
            h.set_processing_time(50)
            assert feed(h, [(1, 2)]) == [(UB, (1, 1)), (UA, (1, 2))]
            h.set_processing_time(149)
            assert feed(h, [(1, 2)]) == [(UB, (1, 2)), (UA, (1, 2))]
            h.set_processing_time(249)
            assert feed(h, [(1, 3)]) == [(INS, (1, 3))]

    def test_expired_state_is_deleted(self, backend: str) -> None:
        """Expired keys leave state at the next batch: rows and index entries
        are deleted, the others stay; a key counts once in the state metrics
        (its expiry index entry is auxiliary), as in Spark."""
        with harness(Deduplicate(KV, ["k"], state_ttl_ms=100), backend) as h:
            h.set_processing_time(0)
            feed(h, [(1, 1), (2, 2)])
            h.commit()
            assert h.last_metrics["numTotalStateRows"] == 2
            assert h.last_metrics["numUpdatedStateRows"] == 2
            h.set_processing_time(50)
            feed(h, [(2, 3)])
            h.commit()
            assert h.last_metrics["numUpdatedStateRows"] == 1
            h.set_processing_time(120)
            h.commit()
            assert list(h.table("rows").scan()) == [(2, 3, 150)]
            assert list(h.table("expiry").scan()) == [(150, 2)]
            assert h.last_metrics["numRemovedStateRows"] == 1
            assert h.last_metrics["numTotalStateRows"] == 1

    def test_bad_configurations_are_refused(self) -> None:
        """A changelog with keep-first or row time, an unknown keep, a missing
        key, order_by or sequence column, or a non-positive TTL is a
        ValueError."""
        for kw in (
            {"keep": "first", "changelog": True},
            {"order_by": "v", "changelog": True},
            {"keep": "middle"},
            {"order_by": "nope"},
            {"state_ttl_ms": 0},
            {"sequence_column": "seq"},
        ):
            with pytest.raises(ValueError):
                Deduplicate(KV, ["k"], **kw)
        with pytest.raises(ValueError):
            Deduplicate(KV, ["x"])
        assert Deduplicate(TIMED, ["k"], sequence_column="t").sequence_column == "t"


class TestMetrics:
    """docs/operators/dedup.md, Metrics: each counter, in both modes."""

    @pytest.mark.parametrize("mini_batch", [False, True])
    def test_duplicates_count_alike(self, backend: str, mini_batch: bool) -> None:
        """Keep-first: every later row of a key is a duplicate, inside a batch
        or against state, with or without mini-batch; output and state rows
        count what was emitted and written."""
        op = Deduplicate(KV, ["k"], keep="first", mini_batch=mini_batch)
        with harness(op, backend) as h:
            h.process_rows([(1, 1), (1, 2), (2, 1), (1, 3)])
            h.commit()
            m = h.last_metrics
            assert (m["numDroppedDuplicateRows"], m["numFoldedRows"]) == (2, 0)
            assert (m["numOutputRows"], m["numUpdatedStateRows"]) == (2, 2)
            assert m["numTotalStateRows"] == 2
            h.process_rows([(2, 5), (3, 1)])
            h.commit()
            m = h.last_metrics
            assert (m["numDroppedDuplicateRows"], m["numOutputRows"]) == (1, 1)
            assert m["numUpdatedStateRows"] == 1

    @pytest.mark.parametrize("mini_batch", [False, True])
    def test_row_time_losers_are_duplicates(self, backend: str, mini_batch: bool) -> None:
        """Row time, keep-last: rows earlier than the stored row are
        duplicates in both modes, though the fold decides only one of them."""
        op = Deduplicate(TIMED, ["k"], order_by="t", mini_batch=mini_batch)
        with harness(op, backend) as h:
            feed(h, [(1, 1, 20)])
            h.commit()
            assert h.process_rows([(1, 2, 10), (1, 3, 12)]) == []
            h.commit()
            m = h.last_metrics
            assert (m["numDroppedDuplicateRows"], m["numFoldedRows"]) == (2, 0)
            assert (m["numOutputRows"], m["numUpdatedStateRows"]) == (0, 0)

    @pytest.mark.parametrize("mini_batch", [False, True])
    def test_unknown_retractions_counted_apart(self, backend: str, mini_batch: bool) -> None:
        """A retraction of a key with no row is counted as such, not as a
        duplicate, in both modes."""
        op = Deduplicate(KV, ["k"], changelog=True, mini_batch=mini_batch)
        with harness(op, backend) as h:
            out = h.process_rows([(7, None), (7, None), (7, 1)], [D, D, INS])
            assert out == [(INS, (7, 1))]
            h.commit()
            m = h.last_metrics
            assert m["numRetractionsOfUnknownRows"] == 2
            assert m["numDroppedDuplicateRows"] == 0
            assert (m["numOutputRows"], m["numUpdatedStateRows"]) == (1, 1)

    @pytest.mark.parametrize(("mini_batch", "suppressed", "folded"), [(False, 2, 0), (True, 0, 2)])
    def test_identical_and_folded_rows(
        self, backend: str, mini_batch: bool, suppressed: int, folded: int
    ) -> None:
        """Keep-last, TTL off: record at a time an identical row is suppressed;
        a mini-batch folds it into the batch's last row instead."""
        op = Deduplicate(KV, ["k"], mini_batch=mini_batch)
        with harness(op, backend) as h:
            assert h.process_rows([(1, 12), (1, 12), (1, 12)]) == [(INS, (1, 12))]
            h.commit()
            m = h.last_metrics
            assert m["numSuppressedIdenticalRows"] == suppressed
            assert m["numFoldedRows"] == folded
            assert m["numDroppedDuplicateRows"] == 0

    def test_replaced_rows_fold(self, backend: str) -> None:
        """Keep-last with mini-batch: a row a later one replaces within the
        batch is folded; record at a time it is emitted."""
        with harness(Deduplicate(KV, ["k"]), backend) as h:
            assert h.process_rows([(1, 12), (1, 13), (2, 1)]) == [(INS, (1, 13)), (INS, (2, 1))]
            h.commit()
            m = h.last_metrics
            assert (m["numFoldedRows"], m["numOutputRows"], m["numUpdatedStateRows"]) == (1, 2, 2)
