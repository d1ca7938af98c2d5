"""The operator API: what an operator is written against (the operator and
its context, changelog row kinds, the watermark value, TTL, relational
helpers, the sink protocols, metric names). Imports nothing else of
``operators`` but :mod:`operators.errors`."""
