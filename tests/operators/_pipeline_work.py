"""The bench's two-stage pipeline (``bench/revenue_pipeline.py``:
orders joined with customers, a changelog ``StreamingJoin`` on the customer,
then revenue per segment) as the tests run it, with a running aggregate of
their own as the revenue stage; revenue per customer (keyed by the customer)
then the top customers over all of them (a keyless stage); and random
changelogs of both tables."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pyarrow as pa

from bench import revenue_pipeline
from bench.revenue_pipeline import CUSTOMERS, ORDERS
from encoding import Direction, KeyColumn, NullOrder
from operators import Pipeline, Stream
from operators.aggregate import Aggregate, GroupAggregate
from operators.examples import RunningAggregate
from operators.topn import TopN


def _pickle_by_value() -> None:
    """Spark's Python workers cannot import this test module: ship its
    operators by value."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_pickle_by_value()

KINDS = pa.field("row_kind", pa.string())


class SegmentRevenue(RunningAggregate):
    """Count and total of the joined orders' amounts per customer segment."""

    def __init__(self) -> None:
        super().__init__(pa.string(), name="revenue")
        self.inputs = [pa.schema([("c_segment", pa.string()), ("o_amount", pa.int64())])]


def build(pipeline: Pipeline, orders: Stream, customers: Stream) -> tuple[Stream, Stream]:
    """The join stage and the revenue stage (:class:`SegmentRevenue`) on ``pipeline``."""
    return revenue_pipeline.build(pipeline, orders, customers, SegmentRevenue())


def harness_pipeline() -> tuple[Pipeline, Stream, Stream]:
    """The pipeline over the two changelogs' Arrow schemas, for the harness:
    the pipeline, the join's stream and the revenue's."""
    pipeline = Pipeline()
    orders = pipeline.source(ORDERS.append(KINDS), "orders", sequence="seq")
    customers = pipeline.source(CUSTOMERS.append(KINDS), "customers", sequence="seq")
    joined, revenue = build(pipeline, orders, customers)
    return pipeline, joined, revenue


#: How many customers the keyless top keeps.
TOP = 3
#: The top customers' columns.
TOP_COLUMNS = ["customer", "orders", "revenue"]


def build_top(pipeline: Pipeline, orders: Stream) -> tuple[Stream, Stream]:
    """Revenue per customer (a stage keyed by the customer), then the
    :data:`TOP` customers by revenue over all customers (a keyless stage,
    one partition), ties by customer."""
    per_customer = GroupAggregate(
        orders.schema,
        group_by=["customer"],
        aggregates=[Aggregate.count(name="orders"), Aggregate.sum("amount", "revenue")],
        changelog=True,
        name="customer_revenue",
    )
    revenue = pipeline.stage(per_customer, orders, keys=["customer"])
    top = TopN(
        revenue.schema,
        order_by=[KeyColumn("revenue", Direction.DESC, NullOrder.LAST), "customer"],
        limit=TOP,
        name="top_customers",
    )
    return revenue, pipeline.stage(top, revenue, keys=())


def top_customers(orders: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """The :data:`TOP` customers of materialised ``(order_id, customer,
    amount)`` rows, as ``(customer, orders, revenue)``, computed directly."""
    totals: dict[int, tuple[int, int]] = {}
    for (_, customer, amount), n in orders.items():
        count, revenue = totals.get(customer, (0, 0))
        totals[customer] = (count + n, revenue + n * amount)
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP]
    return Counter((c, n, r) for c, (n, r) in ranked)


def changes(seed: int, batches: int) -> list[tuple[pa.Table, pa.Table]]:
    """Random changelogs of orders and customers (inserts, updates as
    ``-U``/``+U`` pairs, deletes; customers move between segments), one pair
    of tables per batch, sequence numbers from one counter."""
    rng = random.Random(seed)
    orders: dict[int, tuple[int, int, int]] = {}
    customers: dict[int, str] = {}
    seq = 0
    out = []
    for _ in range(batches):
        o_rows: list[dict[str, Any]] = []
        c_rows: list[dict[str, Any]] = []
        for _ in range(rng.randint(10, 30)):
            seq += 1
            if rng.random() < 0.35:
                cid, segment = rng.randrange(6), rng.choice(["retail", "smb", "enterprise"])
                old = customers.get(cid)
                if old is None:
                    c_rows.append(
                        {"customer": cid, "segment": segment, "seq": seq, "row_kind": "+I"}
                    )
                elif rng.random() < 0.2:
                    c_rows.append({"customer": cid, "segment": old, "seq": seq, "row_kind": "-D"})
                    del customers[cid]
                    continue
                else:
                    c_rows.append({"customer": cid, "segment": old, "seq": seq, "row_kind": "-U"})
                    c_rows.append(
                        {"customer": cid, "segment": segment, "seq": seq, "row_kind": "+U"}
                    )
                customers[cid] = segment
            else:
                oid = rng.randrange(30)
                row = (oid, rng.randrange(6), rng.randrange(1, 100))
                old_order = orders.get(oid)
                if old_order is None:
                    kinds = [("+I", row)]
                elif rng.random() < 0.3:
                    kinds = [("-D", old_order)]
                else:
                    kinds = [("-U", old_order), ("+U", row)]
                for kind, (o, c, a) in kinds:
                    o_rows.append(
                        {"order_id": o, "customer": c, "amount": a, "seq": seq, "row_kind": kind}
                    )
                if kinds[-1][0] == "-D":
                    del orders[oid]
                else:
                    orders[oid] = row
        out.append(
            (
                pa.Table.from_pylist(o_rows, schema=ORDERS.append(KINDS)),
                pa.Table.from_pylist(c_rows, schema=CUSTOMERS.append(KINDS)),
            )
        )
    return out
