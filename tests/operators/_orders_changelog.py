"""An orders changelog for one running aggregate (revenue per customer) and
what the aggregate must emit for it, record at a time: the runner tests'
input (once the demo's, before the demo became a pipeline)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pyarrow as pa

from operators.examples import RunningAggregate
from operators.testing import OperatorHarness

ORDERS = pa.schema(
    [
        ("order_id", pa.int64()),
        ("key", pa.string()),  # the customer
        ("value", pa.int64()),  # the amount, in cents
        ("row_kind", pa.string()),
        ("seq", pa.int64()),
    ]
)


def generate(batches: int, orders_per_batch: int, customers: int, seed: int) -> list[pa.Table]:
    """The orders changelog, one table per batch: new orders, amount changes
    of live orders (``-U`` old, ``+U`` new) and cancellations (``-D``)."""
    rng = random.Random(seed)
    live: dict[int, tuple[str, int]] = {}
    next_id, seq = 0, 0
    tables = []
    for _ in range(batches):
        rows: list[tuple[int, str, int, str, int]] = []
        for _ in range(orders_per_batch):
            roll = rng.random()
            if roll < 0.6 or len(live) < 10:
                customer = f"customer-{rng.randrange(customers):04d}"
                amount = rng.randrange(500, 50_000)
                live[next_id] = (customer, amount)
                rows.append((next_id, customer, amount, "+I", seq))
                next_id += 1
            elif roll < 0.85:
                order = rng.choice(list(live))
                customer, old = live[order]
                new = max(100, old + rng.randrange(-2_000, 2_000))
                live[order] = (customer, new)
                rows.append((order, customer, old, "-U", seq))
                seq += 1
                rows.append((order, customer, new, "+U", seq))
            else:
                order = rng.choice(list(live))
                customer, amount = live.pop(order)
                rows.append((order, customer, amount, "-D", seq))
            seq += 1
        tables.append(
            pa.Table.from_pylist([dict(zip(ORDERS.names, r, strict=True)) for r in rows], ORDERS)
        )
    return tables


def reference(batches: list[pa.Table]) -> list[Counter[tuple[Any, ...]]]:
    """What each batch must output: the operator run record at a time, in
    memory, with no Spark and no failure."""
    operator = RunningAggregate()
    expected = []
    with OperatorHarness(operator) as harness:
        for table in batches:
            rows = table.select(["key", "value"]).to_pylist()
            emitted = harness.process_rows(
                [(r["key"], r["value"]) for r in rows], table.column("row_kind").to_pylist()
            )
            harness.commit()
            expected.append(Counter((k.value, *row) for k, row in emitted))
    return expected
