"""The foreign-key join as a user builds it: its description
(:mod:`operators._fk_join.spec`) and the two stages it adds to a pipeline
(docs/operators/fk-join.md)."""

from __future__ import annotations

from operators._api.operator import Operator
from operators._engine.graph import PipelineGraph, Stream
from operators._fk_join.spec import FK, RESPONSE_SEQUENCE, FkJoinSpec
from operators._fk_join.stages import ResultStage, SubscriptionStage

__all__ = ["FkJoin", "add_stages"]


class FkJoin(FkJoinSpec):
    __doc__ = FkJoinSpec.__doc__

    def add_to(self, pipeline: PipelineGraph, left: Stream, right: Stream) -> Stream:
        """Add the join's two stages to ``pipeline``: ``left`` carries the
        left rows with their FK (:meth:`keyed_left`), ``right`` the right
        table's rows. Returns the stream of the join's upsert changelog."""
        return add_stages(self, pipeline, left, right, SubscriptionStage(self), ResultStage(self))


def add_stages(
    join: FkJoinSpec,
    pipeline: PipelineGraph,
    left: Stream,
    right: Stream,
    subscriptions: Operator,
    results: Operator,
) -> Stream:
    """The one place the join's two stages are partitioned and ordered:
    ``subscriptions`` by FK, ``results`` by the left key, each in its place
    (:meth:`FkJoin.add_to` gives the join's own stages)."""
    responses = pipeline.stage(
        subscriptions,
        left,
        right,
        keys=[[FK], [join.right_key]],
        drop_null_keys=[True, False],
    )
    return pipeline.stage(
        results,
        left,
        responses.ordered_by(RESPONSE_SEQUENCE),
        keys=list(join.left_key),
        # The left rows, then the responses: a result is resolved at the
        # end of the batch, so their interleaving does not matter.
        sides_in_turn=True,
    )
