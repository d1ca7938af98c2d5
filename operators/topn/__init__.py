"""Top-N per partition key over a changelog, with an offset and WITH TIES,
and the changelog of the top-N set out. docs/operators/topn.md has the rules."""

from operators.topn._top_n import TopN

__all__ = ["TopN"]
