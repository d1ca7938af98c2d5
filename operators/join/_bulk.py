"""The changelog join's emit rules over a whole input batch at once, for
the common case: a join with no condition whose input rows each touch
their own identity once.

Within one input batch (a run of one side's rows) the other side's rows do
not change, only their counts of associations: every row's matches are the
other side's rows of its join key as the batch began. And where no
identity repeats, no row finds what an earlier one wrote: each row's own
row is the one held as the batch began. So the rules of
:class:`~operators.join.StreamingJoin` come apart into steps over a span of
such rows: find every row's own row, list every row's matches, emit, then
add or retract every row. On an inner join each step is a loop in C
(``map``, ``chain``): the pairs come out as record at a time emits them,
row by row, each row's matches in key order, a match once per appearance,
with the row's kind. On an outer join one Python loop emits the pairs and
padded rows, counting each match's associations as it goes (a padded row
appears when they fall to zero and goes when they rise from it); the
associations and the own rows are then written at once.

A row the steps cannot take goes through the rules row by row in its turn
(:meth:`~operators.join.StreamingJoin._rows`): an upsert (an accumulate
whose unique key is held: it replaces the row) and a retraction of a row
the side does not hold (the stage's policy decides). A batch with a null
join key (it matches nothing, unless null-safe) or a float key (its NaNs
need folding) takes the rules row by row throughout. The differential tests
in tests/operators/join/test_join_batch.py hold both to the same output and
state.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import add

from encoding import Row
from operators._api.changelog import RowKind
from operators._api.operator import OperatorContext
from operators.join._batch import HeldSide
from operators.join._spec import LEFT

__all__ = ["JoinRun"]

INS, UPA, DEL = RowKind.INSERT, RowKind.UPDATE_AFTER, RowKind.DELETE


@dataclass(frozen=True, slots=True)
class JoinRun:
    """One input batch of ``side`` over the rows ``own`` and ``theirs``
    hold; ``nulls``: each side's row of nulls; ``by_rule``: the rules row
    by row for the input row at a position."""

    ctx: OperatorContext
    own: HeldSide
    theirs: HeldSide
    side: int
    nulls: tuple[Row, Row]
    by_rule: Callable[[int], None]

    def apply(self, rows: Sequence[Row], keys: Sequence[Row], kinds: Sequence[RowKind]) -> bool:
        """The rules for input rows ``rows`` (their join ``keys`` and
        ``kinds``, none null), as steps over each span of rows whose
        identities are distinct. Returns ``False``, having done nothing, on
        a side with float keys."""
        if self.own.floats or self.theirs.floats:
            return False
        identities = self.own.identities(rows)
        for start, stop in _distinct(identities):
            self._span(
                start,
                rows[start:stop],
                keys[start:stop],
                kinds[start:stop],
                identities[start:stop],
            )
        return True

    def _span(
        self,
        start: int,
        rows: Sequence[Row],
        keys: Sequence[Row],
        kinds: Sequence[RowKind],
        identities: Sequence[Row],
    ) -> None:
        """The rules for the span of input rows from position ``start``
        (``rows`` and their join ``keys``, ``kinds`` and distinct
        ``identities``): emit, then keep the rows. An upsert (an accumulate
        whose unique key is held) and a retraction of a row the side does
        not hold go by the rules in their turn: they change their own
        identity's row only."""
        own, theirs = self.own, self.theirs
        held = own.held(identities)
        found = own.in_side(held)
        accumulates = [k is INS or k is UPA for k in kinds]  # no enum hash per row
        upserts = own.has_unique_key
        ruled = [
            i
            for i, (a, f) in enumerate(zip(accumulates, found, strict=True))
            if (f is not None and upserts if a else f is None)
        ]
        matches = theirs.records_run(keys)
        matched = list(chain.from_iterable(matches))
        if theirs.has_unique_key:
            counts = list(map(len, matches))
        else:
            appearances = list(map(theirs.appearances, matched))
            if max(appearances, default=1) > 1:
                # A row in the side several times is matched once each time.
                matched = list(chain.from_iterable(map(repeat, matched, appearances)))
                counts = [sum(map(theirs.appearances, m)) for m in matches]
            else:
                counts = list(map(len, matches))
        # A retraction retracts the row the side holds (with a unique key,
        # its values may differ from the input row's).
        mine = [r if f is None else own.row(f) for r, f in zip(rows, found, strict=True)]
        if own.outer or theirs.outer:
            self._outer(start, mine, accumulates, matches, ruled)
        else:
            self._inner(start, mine, kinds, matched, counts, ruled)
        skip = set(ruled)
        kept = [i for i in range(len(rows)) if i not in skip] if skip else range(len(rows))
        new = [i for i in kept if held[i] is None and accumulates[i]]
        for i in kept:
            if accumulates[i]:
                if held[i] is not None:  # in the side (no unique key) or gone from it
                    own.add(self.ctx, rows[i], found[i], counts[i])
            else:
                own.retract(self.ctx, found[i])  # type: ignore[arg-type]  # not ruled: found
        # As no identity repeats, the rows' changes do not meet: the rows the
        # side never held are added at once.
        if new:
            own.add_run(
                [rows[i] for i in new],
                [identities[i] for i in new],
                [keys[i] for i in new],
                [counts[i] for i in new],
            )

    def _inner(
        self,
        start: int,
        mine: Sequence[Row],
        kinds: Sequence[RowKind],
        matched: Sequence[int],
        counts: Sequence[int],
        ruled: Sequence[int],
    ) -> None:
        """An inner join's pairs, in C loops: row ``mine[i]`` with its
        ``counts[i]`` matches, the next of ``matched``, each with the row's
        kind; the rows at positions ``ruled`` by the rules, in their turn."""
        other = list(map(self.theirs.row, matched))
        paired = list(chain.from_iterable(map(repeat, mine, counts)))
        pairs = list(map(add, paired, other) if self.side == LEFT else map(add, other, paired))
        out_kinds = list(chain.from_iterable(map(repeat, kinds, counts)))
        # Row i's pairs are pairs[at[i]:at[i + 1]].
        if not ruled:
            self.ctx.emit_rows(pairs, out_kinds)
            return
        at = [0, *itertools.accumulate(counts)]
        done = 0
        for i in ruled:
            self.ctx.emit_rows(pairs[at[done] : at[i]], out_kinds[at[done] : at[i]])
            self.by_rule(start + i)
            done = i + 1
        self.ctx.emit_rows(pairs[at[done] :], out_kinds[at[done] :])

    def _outer(
        self,
        start: int,
        mine: Sequence[Row],
        accumulates: Sequence[bool],
        matches: Sequence[Sequence[int]],
        ruled: Sequence[int],
    ) -> None:
        """An outer join's rows, in one loop: per row ``mine[i]``, its padded
        row if its side is outer and it has no match, else a pair with each
        match, once per appearance; the match's padded row is retracted
        before the pair when its associations rise from zero and emitted
        after it when they fall to zero (a retraction meeting none is no
        pair). The associations are counted as the loop goes, and written
        at its end and before each row at a position ``ruled`` by the
        rules."""
        ctx, side, theirs = self.ctx, self.side, self.theirs
        out: list[Row] = []
        out_kinds: list[RowKind] = []
        emit, emit_kind = out.append, out_kinds.append
        own_outer, other_outer = self.own.outer, theirs.outer
        own_nulls, other_nulls = self.nulls[side], self.nulls[1 - side]
        row_of, appearances, associations_of = theirs.row, theirs.appearances, theirs.associations
        once = theirs.has_unique_key
        counted: dict[int, int] = {}  # the associations of each match met
        calls = 0
        one_by_one = set(ruled)
        for i, (row, accumulate, ms) in enumerate(zip(mine, accumulates, matches, strict=True)):
            if i in one_by_one:
                theirs.set_associations_run(counted, calls)
                counted, calls = {}, 0
                ctx.emit_rows(out, out_kinds)
                out.clear()
                out_kinds.clear()
                self.by_rule(start + i)
                continue
            kind = INS if accumulate else DEL
            if not ms:
                if own_outer:
                    emit(row + other_nulls if side == LEFT else other_nulls + row)
                    emit_kind(kind)
                continue
            for m in ms:
                m_row = row_of(m)
                pair = row + m_row if side == LEFT else m_row + row
                n = 1 if once else appearances(m)
                if not other_outer:
                    for _ in range(n):
                        emit(pair)
                        emit_kind(kind)
                    continue
                before = counted.get(m)
                if before is None:
                    before = associations_of(m)
                if not accumulate and before <= 0:
                    continue  # no pair to retract
                counted[m] = before + 1 if accumulate else before - 1
                calls += 1
                # The match's padded row goes as its first association comes,
                # and comes back as its last goes.
                rows_out: tuple[Row, ...]
                kinds_out: tuple[RowKind, ...]
                if before == (0 if accumulate else 1):
                    padded = own_nulls + m_row if side == LEFT else m_row + own_nulls
                    rows_out = (padded, pair) if accumulate else (pair, padded)
                    kinds_out = (DEL, INS)  # either way: a retraction, then an insert
                else:
                    rows_out, kinds_out = (pair,), (kind,)
                for _ in range(n):
                    out.extend(rows_out)
                    out_kinds.extend(kinds_out)
        theirs.set_associations_run(counted, calls)
        ctx.emit_rows(out, out_kinds)


def _distinct(identities: Sequence[Row]) -> Iterator[tuple[int, int]]:
    """Start and stop of each longest span of ``identities`` in which none
    repeats, in order."""
    if len(set(identities)) == len(identities):
        yield 0, len(identities)
        return
    start, seen = 0, set[Row]()
    for i, identity in enumerate(identities):
        if identity in seen:
            yield start, i
            start, seen = i, set[Row]()
        seen.add(identity)
    yield start, len(identities)
